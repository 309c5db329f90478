"""Accelerate over pm.optimizer (issue 44): prepare(model, pm.optimizer,
dataloader, scheduler), accumulate, backward, clip_grad_norm_ and
save_state/load_state, against the same loop written with the engine
directly (the same bits), each with a control that fails when the feature
is off."""
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")
from accelerate import Accelerator  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pstar.torch as ptorch  # noqa: E402
from common import same, schedule, weights  # noqa: E402

transformers.logging.set_verbosity_error()
LR, WD, CLIP, ACCUMULATION = 1e-2, 0.1, 0.05, 2
STEPS = 4  # optimizer steps: 8 micro-batches of 2 sequences


def gpt2():
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                                  eos_token_id=0, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def attach(model):
    return ptorch.attach(model, device="emulated", compute_dtype="bf16", chunk_elems=4096, lr=LR, weight_decay=WD,
                         adamw=1, grad_accumulation=1)


def dataset():
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randint(1, 64, (2 * ACCUMULATION * STEPS, 12), generator=g))


def loader():
    # No shuffling: Accelerate's prepared loader and the engine loop read
    # the same batches in the same order.
    return DataLoader(dataset(), batch_size=2, shuffle=False)





@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    # Accelerate keeps its state in process-wide singletons: each run here
    # starts as a new script would.
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def new_accelerator():
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    return Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)


def prepared(sched=True):
    model = gpt2()
    pm = attach(model)
    accelerator = new_accelerator()
    opt = pm.optimizer
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if sched else None
    if scheduler is not None:
        model, opt, dl, scheduler = accelerator.prepare(model, opt, loader(), scheduler)
    else:
        model, opt, dl = accelerator.prepare(model, opt, loader())
    return accelerator, model, pm, opt, dl, scheduler


def train(accelerator, model, opt, dl, scheduler, clip=True, steps=STEPS):
    """The loop as Accelerate's docs write it; returns the losses of the
    micro-batches and the norms clip_grad_norm_ returned."""
    losses, norms, done = [], [], 0
    for (ids,) in dl:
        with accelerator.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss
            accelerator.backward(loss)  # divides by gradient_accumulation_steps
            if accelerator.sync_gradients:
                if clip:
                    norms.append(accelerator.clip_grad_norm_(model.parameters(), CLIP).item())
                done += 1
            opt.step()
            if scheduler is not None:
                scheduler.step()
            opt.zero_grad()
        losses.append(loss.item())
        if done == steps and accelerator.sync_gradients:
            break
    return losses, norms


def run_accelerate(clip=True, sched=True):
    accelerator, model, pm, opt, dl, scheduler = prepared(sched)
    losses, norms = train(accelerator, model, opt, dl, scheduler, clip)
    pm.last_result = opt.optimizer.last_result  # opt: Accelerate's wrapper of pm.optimizer
    return pm, losses, norms


def run_engine():
    """The same with the engine's own calls: two micro-batches per
    iteration, each loss halved as Accelerate does; the step's lr and clip
    set after the backward."""
    model = gpt2()
    pm = attach(model)
    base = pm.engine.hparam("lr")
    batches = [ids for (ids,) in loader()]
    losses, norms = [], []
    for s in range(STEPS):
        with pm.train_iteration():
            for mb in range(ACCUMULATION):
                ids = batches[ACCUMULATION * s + mb]
                loss = model(input_ids=ids, labels=ids).loss
                (loss / ACCUMULATION).backward()
                losses.append(loss.item())
            pm.engine.set_hparam("lr", base * schedule(s))
            pm.engine.set_hparam("clip_norm", CLIP)
            r = pm.step()
        norms.append(r.grad_norm)
    return pm, losses, norms


def test_prepare_accumulate_clip_and_schedule_are_the_engine_loop_bit_for_bit():
    pm_a, losses_a, norms_a = run_accelerate()
    pm_b, losses_b, norms_b = run_engine()
    assert pm_a.engine.hparam("step") == STEPS  # one engine step per two micro-batches
    assert losses_a == losses_b
    # Accelerate's clip_grad_norm_ returns the engine's norm (float32).
    assert norms_a == [float(torch.tensor(n, dtype=torch.float32)) for n in norms_b]
    assert all(n > CLIP for n in norms_b)  # every step clipped
    assert pm_a.last_result.clip_coef < 1.0
    assert same(weights(pm_a), weights(pm_b))
    # Controls: clipping ignored, or the schedule ignored, and the bits differ.
    pm_c, _, _ = run_accelerate(clip=False)
    assert not same(weights(pm_a), weights(pm_c))
    pm_d, _, _ = run_accelerate(sched=False)
    assert not same(weights(pm_a), weights(pm_d))


def test_save_state_and_load_state_resume_bit_for_bit(tmp_path):
    half = STEPS // 2
    # Uninterrupted.
    pm_full, losses_full, _ = run_accelerate()
    want = weights(pm_full)

    # Interrupted after `half` steps: save_state, then a new script.
    accelerator, model, pm, opt, dl, scheduler = prepared()
    losses_first, _ = train(accelerator, model, opt, dl, scheduler, steps=half)
    accelerator.save_state(str(tmp_path / "ckpt"))
    assert pm.engine.hparam("step") == half

    def resumed(load):
        accelerator, model, pm, opt, dl, scheduler = prepared()
        if load == "state":
            accelerator.load_state(str(tmp_path / "ckpt"))
        elif load == "weights":  # control: the model's weights alone
            from safetensors.torch import load_file
            model.load_state_dict(load_file(str(tmp_path / "ckpt" / "model.safetensors")), strict=False)
        rest = accelerator.skip_first_batches(dl, num_batches=ACCUMULATION * half)
        losses, _ = train(accelerator, model, opt, rest, scheduler, steps=STEPS - half)
        return pm, losses

    pm_r, losses_r = resumed("state")
    assert pm_r.engine.hparam("step") == STEPS
    assert pm_r.engine.hparam("lr") == pm_full.engine.hparam("lr")  # the scheduler's state came back
    assert losses_first + losses_r == losses_full
    assert same(want, weights(pm_r))
    # Controls: without load_state, or with the weights but no optimizer and
    # scheduler state, the bits differ.
    assert not same(want, weights(resumed(None)[0]))
    assert not same(want, weights(resumed("weights")[0]))


def test_clip_grad_norm_at_every_micro_batch_clips_the_step():
    # Accelerate's docs clip only when sync_gradients.  A loop that clips
    # at every micro-batch gets the norm of the gradients so far, and the
    # step is clipped at max_norm as when clipped once: the same bits.
    accelerator, model, pm, opt, dl, scheduler = prepared()
    norms, done = [], 0
    for (ids,) in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(input_ids=ids, labels=ids).loss)
            norms.append(accelerator.clip_grad_norm_(model.parameters(), CLIP).item())
            done += accelerator.sync_gradients
            opt.step()
            scheduler.step()
            opt.zero_grad()
        if done == STEPS:
            break
    assert pm.engine.hparam("step") == STEPS
    assert all(n > 0 for n in norms) and len(norms) == ACCUMULATION * STEPS
    pm_b, _, norms_b = run_engine()
    assert norms[1::ACCUMULATION] == [float(torch.tensor(n, dtype=torch.float32)) for n in norms_b]
    assert same(weights(pm), weights(pm_b))
