#!/usr/bin/env python3
"""The baseline for libpstar's CUDA Adam kernel: PyTorch's fused AdamW on the
same GPU, in the same run of tests/gpu/run.sh.

PyTorch's fused AdamW over fp32 parameters moves the same 28 bytes per element
as libpstar's mixed-precision kernel (torch: p, m, v read and written, fp32
gradient read; libpstar: fp32 master, m, v read and written, 16-bit gradient
read and 16-bit weight written), so elements per second compare like for like.

Writes torch_adamw.json into the folder given as the first argument.  Exits 77
with "skipped: no CUDA device" where torch or a GPU is missing.
"""
import json
import os
import sys


def main() -> int:
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "."
    try:
        import torch
    except ImportError:
        print("skipped: no CUDA device (torch not importable)")
        return 77
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 77
    n = 256 << 20  # the element count adam_cuda_check uses
    p = torch.zeros(n, dtype=torch.float32, device="cuda", requires_grad=True)
    p.grad = torch.full((n,), 1e-3, dtype=torch.float32, device="cuda")
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, fused=True)
    for _ in range(3):  # warm-up: creates m and v, loads the kernel
        opt.step()
    torch.cuda.synchronize()
    times_ms = []
    for _ in range(9):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        opt.step()
        stop.record()
        stop.synchronize()
        times_ms.append(start.elapsed_time(stop))
    times_ms.sort()
    median_ms = times_ms[len(times_ms) // 2]
    gbs = 28.0 * n / (median_ms * 1e6)
    result = {
        "bench": "torch_adamw_cuda",
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "elements": n,
        "median_ms": round(median_ms, 4),
        "gbs_at_28_bytes": round(gbs, 1),
    }
    print(f"torch fused AdamW: {median_ms:.3f} ms for {n} elements, {gbs:.0f} GB/s at 28 B/element")
    with open(os.path.join(out_dir, "torch_adamw.json"), "w") as f:
        json.dump(result, f)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
