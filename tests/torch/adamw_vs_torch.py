#!/usr/bin/env python3
"""libpstar's AdamW against torch.optim.AdamW, 100 steps on the same data.

libpstar runs with the F32 compute dtype (no rounding of weights or
gradients), through its C API loaded with ctypes; PyTorch runs
torch.optim.AdamW (foreach=False, one thread) on float32 tensors.  Both
start from the same weights and get the same gradients each step (a function
of the current weights, so the two trajectories stay coupled).

Tolerance: both compute in float32 but with different association of the
same terms (PyTorch divides sqrt(v) by sqrt(1 - beta2^t); libpstar multiplies
by the precomputed reciprocal inside one fma, and folds lr / (1 - beta1^t) in
double before rounding), so each step differs by a few ulp of the update.
Over 100 steps at lr 1e-3 that stays far below 1e-6 absolute; we require
|w_pstar - w_torch| <= 1e-6 + 1e-5 * |w_torch| for every element.

Usage: adamw_vs_torch.py LIBPSTAR_SO      exit 77 (skipped) without torch.
"""
import ctypes
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # the venv of packaging/setup-venv.sh is missing
    print(f"skipped: {e}")
    sys.exit(77)

LIB = ctypes.CDLL(sys.argv[1])

F32, BF16 = 0, 2
TRAIN, FORWARD, BACKWARD, HOST = 0, 0, 1, 0


class Options(ctypes.Structure):
    """Mirror of pstar_engine_options (version 6) in pstar.h."""

    _fields_ = [
        ("size", ctypes.c_uint32), ("version", ctypes.c_uint32),
        ("device", ctypes.c_int32), ("device_ordinal", ctypes.c_int32),
        ("device_capacity_bytes", ctypes.c_uint64), ("host_capacity_bytes", ctypes.c_uint64),
        ("chunk_elems", ctypes.c_uint64), ("threads", ctypes.c_uint32), ("strict", ctypes.c_int32),
        ("strict_seed", ctypes.c_uint64), ("compute_dtype", ctypes.c_int32),
        ("lr", ctypes.c_float), ("beta1", ctypes.c_float), ("beta2", ctypes.c_float),
        ("eps", ctypes.c_float), ("weight_decay", ctypes.c_float), ("adamw", ctypes.c_int32),
        ("clip_norm", ctypes.c_float), ("loss_scale_initial", ctypes.c_float),
        ("loss_scale_growth_factor", ctypes.c_float), ("loss_scale_backoff_factor", ctypes.c_float),
        ("loss_scale_growth_interval", ctypes.c_uint32), ("loss_scale_hysteresis", ctypes.c_uint32),
        ("loss_scale_min", ctypes.c_float), ("grad_accumulation", ctypes.c_int32),
        ("placement_policy", ctypes.c_int32), ("warmup_iterations", ctypes.c_uint32), ("prefetch", ctypes.c_int32),
        ("virtual_clock", ctypes.c_int32), ("dry_run", ctypes.c_int32),
        ("h2d_bytes_per_s", ctypes.c_double), ("d2h_bytes_per_s", ctypes.c_double),
        ("device_margin_bytes", ctypes.c_uint64), ("record_timeline", ctypes.c_int32),
        ("hybrid_optimizer", ctypes.c_int32),
        ("rank", ctypes.c_int32), ("world_size", ctypes.c_int32), ("comm_timeout_ms", ctypes.c_uint32),
        ("state_format", ctypes.c_int32), ("master_format", ctypes.c_int32), ("master_seed", ctypes.c_uint64),
    ]


def check(status, what):
    if status != 0:
        LIB.pstar_last_error_message.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: status {status}: {LIB.pstar_last_error_message().decode()}")


def main():
    torch.set_num_threads(1)
    steps, shapes = 100, [(64, 33), (33,), (1000,)]
    lr, wd, betas, eps = 1e-3, 0.01, (0.9, 0.999), 1e-8
    rng = np.random.default_rng(7)
    init = [rng.standard_normal(s).astype(np.float32) * 0.5 for s in shapes]

    opts = Options()
    check(LIB.pstar_engine_options_init(ctypes.byref(opts)), "options_init")
    if opts.size != ctypes.sizeof(Options):
        raise RuntimeError(f"Options mirror is {ctypes.sizeof(Options)} bytes, library says {opts.size}")
    opts.compute_dtype, opts.chunk_elems, opts.threads = F32, 4096, 1
    opts.lr, opts.weight_decay, opts.beta1, opts.beta2, opts.eps, opts.adamw = lr, wd, *betas, eps, 1
    engine = ctypes.c_void_p()
    check(LIB.pstar_engine_create(ctypes.byref(opts), ctypes.byref(engine)), "create")
    ids = []
    for i, s in enumerate(shapes):
        shape = (ctypes.c_int64 * len(s))(*s)
        pid = ctypes.c_uint32()
        check(LIB.pstar_param_register(engine, f"p{i}".encode(), len(s), shape, 0, ctypes.byref(pid)), "register")
        ids.append(pid.value)
    check(LIB.pstar_engine_build(engine), "build")
    for pid, w in zip(ids, init):
        check(LIB.pstar_param_write(engine, pid, w.ctypes.data, ctypes.c_uint64(w.size), F32), "write")

    params = [torch.nn.Parameter(torch.from_numpy(w.copy())) for w in init]
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=wd, foreach=False)

    def grad_of(w, step):  # depends on the weights: couples the trajectories
        return (np.sin(w * 3.0 + step * 0.1) * 0.1 + 0.01 * w).astype(np.float32)

    ptr = ctypes.c_void_p()
    for step in range(steps):
        check(LIB.pstar_iteration_begin(engine, TRAIN), "iteration_begin")
        for pid in ids:
            check(LIB.pstar_param_acquire(engine, pid, FORWARD, None, ctypes.byref(ptr)), "acquire")
            check(LIB.pstar_param_release(engine, pid, None), "release")
        for pid, p in zip(reversed(ids), reversed(params)):
            n = p.numel()
            check(LIB.pstar_param_acquire(engine, pid, BACKWARD, None, ctypes.byref(ptr)), "acquire")
            w = np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr.value)).reshape(p.shape).copy()
            g = grad_of(w, step)
            check(LIB.pstar_grad_write(engine, pid, g.ctypes.data, ctypes.c_uint64(n), F32, HOST, None),
                  "grad_write")
            check(LIB.pstar_param_release(engine, pid, None), "release")
            p.grad = torch.from_numpy(grad_of(p.detach().numpy(), step))
        check(LIB.pstar_step(engine, None), "step")
        opt.step()

    worst = 0.0
    for pid, p in zip(ids, params):
        got = np.empty(p.numel(), dtype=np.float32)
        check(LIB.pstar_param_read(engine, pid, got.ctypes.data, ctypes.c_uint64(got.size), F32), "read")
        ref = p.detach().numpy().reshape(-1)
        excess = np.abs(got - ref) - (1e-6 + 1e-5 * np.abs(ref))
        worst = max(worst, float(np.max(np.abs(got - ref))))
        if np.any(excess > 0):
            i = int(np.argmax(excess))
            print(f"FAIL: param {pid} element {i}: libpstar {got[i]!r}, torch {ref[i]!r}")
            print("0 passed, 1 failed")
            return 1
    check(LIB.pstar_engine_destroy(engine), "destroy")
    print(f"torch {torch.__version__}: {steps} AdamW steps, max |difference| {worst:.3g}")
    print("1 passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
