//! A two-layer MLP (tanh hidden layer, linear output) fitted to a smooth
//! function of its inputs, in plain Rust: the weights live in libpstar
//! chunks on the emulated device, which holds only part of them, so chunks
//! move every iteration.  The forward and backward passes read the weights
//! through the views the engine hands out; the gradients go to the engine,
//! whose AdamW updates the weights at each step.  Prints the loss and the
//! chunk traffic, and fails (exit 1) if the loss does not fall.
use pstar::{Device, Dtype, Engine, Options, Stage};

const IN: usize = 32;
const HIDDEN: usize = 64;
const OUT: usize = 8;
const BATCH: usize = 64;
const STEPS: usize = 300;

fn matmul(a: &[f32], b: &[f32], n: usize, k: usize, m: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; n * m];
    for i in 0..n {
        for p in 0..k {
            let aip = a[i * k + p];
            for j in 0..m {
                c[i * m + j] += aip * b[p * m + j];
            }
        }
    }
    c
}

fn transpose(a: &[f32], n: usize, m: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; n * m];
    for i in 0..n {
        for j in 0..m {
            t[j * n + i] = a[i * m + j];
        }
    }
    t
}

fn main() -> Result<(), pstar::Error> {
    // Chunks of 1024 f32 elements: W1 (2048) spans two, W2 (512) one; the
    // device holds two chunks beside the gradient buffers.
    let capacity = 2 * 1024 * 4 + (IN * HIDDEN + HIDDEN * OUT) as u64 * 4;
    let options = Options::new()
        .device(Device::Emulated)
        .device_capacity(capacity)
        .chunk_elems(1024)
        .compute_dtype(Dtype::F32)
        .lr(3e-3)
        .weight_decay(0.0);
    let mut engine = Engine::new(&options)?;
    let w1 = engine.register("w1", &[IN as i64, HIDDEN as i64], false)?;
    let w2 = engine.register("w2", &[HIDDEN as i64, OUT as i64], false)?;
    engine.build()?;

    let mut seed = 2024u64;
    let mut rnd = move || {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) - 0.5
    };
    let init1: Vec<f32> = (0..IN * HIDDEN).map(|_| rnd() * 0.4).collect();
    let init2: Vec<f32> = (0..HIDDEN * OUT).map(|_| rnd() * 0.4).collect();
    engine.write_f32(w1, &init1)?;
    engine.write_f32(w2, &init2)?;
    let x: Vec<f32> = (0..BATCH * IN).map(|_| rnd() * 2.0).collect();
    // The target: a smooth function of the inputs.
    let y: Vec<f32> = (0..BATCH * OUT)
        .map(|i| {
            let (b, o) = (i / OUT, i % OUT);
            (x[b * IN + o] * x[b * IN + o + OUT]).sin() * 0.5
        })
        .collect();

    let mut first = 0.0f32;
    let mut last = 0.0f32;
    for step in 0..STEPS {
        engine.begin_train()?;
        let v1 = engine.acquire(w1, Stage::Forward)?;
        let h: Vec<f32> = matmul(&x, v1.as_f32().unwrap(), BATCH, IN, HIDDEN).iter().map(|a| a.tanh()).collect();
        v1.release()?;
        let v2 = engine.acquire(w2, Stage::Forward)?;
        let out = matmul(&h, v2.as_f32().unwrap(), BATCH, HIDDEN, OUT);
        v2.release()?;
        let err: Vec<f32> = out.iter().zip(&y).map(|(a, b)| a - b).collect();
        let loss = err.iter().map(|d| d * d).sum::<f32>() / err.len() as f32;
        let dout: Vec<f32> = err.iter().map(|d| 2.0 * d / err.len() as f32).collect();
        // Backward, in reverse order of use.
        let v2 = engine.acquire(w2, Stage::Backward)?;
        engine.grad_write_f32(w2, &matmul(&transpose(&h, BATCH, HIDDEN), &dout, HIDDEN, BATCH, OUT))?;
        let dh = matmul(&dout, &transpose(v2.as_f32().unwrap(), HIDDEN, OUT), BATCH, OUT, HIDDEN);
        v2.release()?;
        let dz: Vec<f32> = dh.iter().zip(&h).map(|(g, a)| g * (1.0 - a * a)).collect();
        let v1 = engine.acquire(w1, Stage::Backward)?;
        engine.grad_write_f32(w1, &matmul(&transpose(&x, BATCH, IN), &dz, IN, BATCH, HIDDEN))?;
        v1.release()?;
        engine.step()?;
        if step == 0 {
            first = loss;
        }
        last = loss;
        if step % 50 == 0 || step == STEPS - 1 {
            let s = engine.stats()?;
            println!("step {:4}  loss {:.6}  evictions {}  MB to device {:.2}", step + 1, loss, s.evictions,
                     s.bytes_host_to_device as f64 / 1e6);
        }
    }
    println!("final loss: {:.6} (first: {:.6})", last, first);
    if !(last < 0.5 * first) {
        eprintln!("the loss did not fall by half");
        std::process::exit(1);
    }
    Ok(())
}
