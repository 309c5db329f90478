#!/usr/bin/env python3
"""The int8 Adam state format pinned to the published algorithm (issue 45).

Runs the same masters, gradients and hyperparameters through bitsandbytes'
blockwise AdamW8bit on the CPU (PyPI bitsandbytes, in the project's venv) and
through libpstar's int8 format (tests/unit/adam_states_io.cpp), for 1 and 10
steps, and reports the share of identical codes (m and v) and the largest
master difference in ulp.  Target: at least 99.9% identical codes and masters
within 4 ulp: ulp of the operands (the largest |master| of either run so
far), because where a step cancels most of the master the result is tiny and
a rounding of the operands' size is thousands of the result's own ulps (both
figures are printed).

Three bitsandbytes references:
  - "bnb": AdamW8bit as shipped.  Its CPU path (backends/cpu/ops.py,
    _optimizer_update_8bit_blockwise_cpu) quantizes through
    quantize_blockwise, whose C code (csrc/cpu_ops.cpp, quantize_cpu_impl)
    picks a code from a 65536-entry table over [-1, 1]: a value whose
    magnitude is below about 1.5e-5 of its block's absmax does not get its
    nearest code (1e-6 gets the code of 8.9e-6, not that of 7.75e-7).  The
    paper (Dettmers et al. 2022, section 2) rounds to the nearest value of
    the map, and libpstar follows the paper, so codes differ there, and
    later steps inherit the difference.  Reported, not asserted.
  - "bnb-nearest": the same AdamW8bit with that one function
    (_quant_blockwise_fp32_direct) replaced by the nearest code (exact
    midpoints of the map, ties to the smaller magnitude, as libpstar): the
    update arithmetic stays bitsandbytes' own.  The issue's targets apply
    to it, and are asserted.
  - "bnb-nearest-sqrt": bnb-nearest with torch's float32 square root (the
    one call in the update, state2.sqrt()) replaced by the correctly rounded
    one (numpy's).  Torch's CPU square root is not correctly rounded: on
    this project's machine (torch 2.15, AVX-512) it is 1 ulp off for about
    17% of inputs.  Everything else is the same arithmetic in the same
    order on both sides (optim/adam.h, adam_element_int8: torch's add_ with
    alpha and addcmul_ are fused multiply-adds, the bias correction a
    division, addcdiv_ (value * m) / denom), so libpstar's masters, codes
    and block maxima must equal this reference's bit for bit: asserted.

The hyperparameters are float32 values, passed to bitsandbytes as those
exact numbers.

Usage: test_bnb_pin.py <adam_states_io> [--json]
Exit 77 (skipped) without numpy, torch or bitsandbytes; 1 when a target fails.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile


def skip(why):
    print("skipped: %s" % why)
    sys.exit(77)


try:
    import numpy as np
except ImportError:
    skip("numpy not installed")
try:
    import torch
except ImportError:
    skip("torch not installed")
try:
    import logging
    logging.disable(logging.WARNING)  # bitsandbytes' notes about optional GPU kernels
    import bitsandbytes as bnb
    import bitsandbytes.functional as bnbF
    import bitsandbytes.backends.cpu.ops as bnb_cpu_ops
    logging.disable(logging.NOTSET)
except ImportError:
    skip("bitsandbytes not installed")

BLOCK = 256  # libpstar's kInt8BlockElems, bitsandbytes' blocksize


def ordered(x):
    """float32 -> integers in the order of the floats (for ulp distances)."""
    i = np.ascontiguousarray(x, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulps(a, b):
    return np.abs(ordered(a) - ordered(b))


def nearest_codes(y, code):
    """Index of the map value nearest to each y (float32), libpstar's rule."""
    c = code.astype(np.float64)
    mid = (c[:-1] + c[1:]) / 2.0  # exact: sums of two float32 in float64
    y64 = y.astype(np.float64)
    up = np.searchsorted(mid, y64, side="left")     # midpoints strictly below y
    down = np.searchsorted(mid, y64, side="right")  # midpoints at or below y
    # A tie goes to the smaller magnitude: down for y < 0, up otherwise.
    idx = np.where(y64 < 0, down, up)
    return np.where(np.isnan(y64), np.argmin(np.abs(c)), idx).astype(np.uint8)


def quant_nearest(A_fp32, code, absmax_out, out_uint8, blocksize):
    """bitsandbytes' _quant_blockwise_fp32_direct with the paper's rounding."""
    x = A_fp32.detach().reshape(-1).to(torch.float32).cpu().numpy()
    n = x.size
    nb = -(-n // blocksize)
    pad = np.zeros(nb * blocksize, dtype=np.float32)
    pad[:n] = np.abs(x)
    amax = pad.reshape(nb, blocksize).max(axis=1).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(1.0) / amax, np.float32(0.0)).astype(np.float32)
    y = (x * np.repeat(inv, blocksize)[:n]).astype(np.float32)
    codes = nearest_codes(y, code.detach().cpu().numpy().astype(np.float32))
    out_uint8.copy_(torch.from_numpy(codes.reshape(out_uint8.shape)))
    absmax_out.copy_(torch.from_numpy(amax))


def exact_sqrt(t):
    """The correctly rounded float32 square root (numpy's), as a tensor."""
    return torch.from_numpy(np.sqrt(t.detach().cpu().numpy()))


def run_bnb(master, grads, hp, nearest, correct_sqrt=False):
    lr, b1, b2, eps, wd = hp
    original = bnb_cpu_ops._quant_blockwise_fp32_direct
    original_sqrt = torch.Tensor.sqrt
    if nearest:
        bnb_cpu_ops._quant_blockwise_fp32_direct = quant_nearest
    if correct_sqrt:
        torch.Tensor.sqrt = exact_sqrt
    try:
        p = torch.nn.Parameter(torch.from_numpy(master.copy()))
        opt = bnb.optim.AdamW8bit([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
        out = []
        for g in grads:
            p.grad = torch.from_numpy(g.copy())
            opt.step()
            st = opt.state[p]
            if st["state1"].dtype != torch.uint8:
                raise SystemExit("bitsandbytes did not use 8-bit state (min_8bit_size?)")
            out.append(dict(master=p.detach().numpy().copy(), m=st["state1"].numpy().copy(),
                            v=st["state2"].numpy().copy(), am=st["absmax1"].numpy().copy(),
                            av=st["absmax2"].numpy().copy()))
        return out
    finally:
        bnb_cpu_ops._quant_blockwise_fp32_direct = original
        torch.Tensor.sqrt = original_sqrt


def run_pstar(io, master, grads, hp):
    n = master.size
    steps = len(grads)
    blocks = -(-n // BLOCK)
    with tempfile.TemporaryDirectory() as d:
        fin, fout = os.path.join(d, "in.bin"), os.path.join(d, "out.bin")
        with open(fin, "wb") as f:
            f.write(b"PSTARIO1" + struct.pack("<QQ", n, steps) + np.array(hp, dtype=np.float32).tobytes())
            f.write(master.astype(np.float32).tobytes())
            for g in grads:
                f.write(g.astype(np.float32).tobytes())
        subprocess.run([io, "run", fin, fout], check=True)
        raw = open(fout, "rb").read()
    out, off = [], 0
    for _ in range(steps):
        rec = {}
        for key, dt, cnt in (("master", np.float32, n), ("m", np.uint8, n), ("v", np.uint8, n),
                             ("am", np.float32, blocks), ("av", np.float32, blocks)):
            size = np.dtype(dt).itemsize * cnt
            rec[key] = np.frombuffer(raw[off:off + size], dtype=dt).copy()
            off += size
        out.append(rec)
    return out


def compare(a, b, mag, same_so_far):
    """a, b: one step's results; mag: per element, the largest |master| of
    either run so far (the initial one included); same_so_far: per element,
    whether its m and v codes agreed at every step up to this one."""
    same_m = float(np.mean(a["m"] == b["m"]))
    same_v = float(np.mean(a["v"] == b["v"]))
    u = ulps(a["master"], b["master"])
    # The same difference in ulps of the operands: where a step cancels
    # most of the master (|p| and lr * m / denom both near 1e-3), the result
    # is tiny and an operand-sized rounding is thousands of its own ulps.
    op = np.abs(a["master"].astype(np.float64) - b["master"].astype(np.float64)) / np.spacing(mag).astype(np.float64)
    agreed = same_so_far
    return dict(identical_codes=(same_m + same_v) / 2, identical_m=same_m, identical_v=same_v,
                max_master_ulp=int(u.max()), masters_over_4ulp=int((u > 4).sum()),
                max_master_operand_ulp=float(op.max()),
                codes_always_agreed=int(agreed.sum()),
                max_master_operand_ulp_where_codes_agreed=float(op[agreed].max()) if agreed.any() else 0.0,
                p999_master_operand_ulp=float(np.quantile(op, 0.999)),
                max_absmax_ulp=int(max(ulps(a["am"], b["am"]).max(), ulps(a["av"], b["av"]).max())))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("io", help="the adam_states_io program")
    ap.add_argument("--json", action="store_true", help="one JSON object with every figure")
    ap.add_argument("--elements", type=int, default=4 * 16384 + 77)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()

    # The maps, bit for bit.
    with tempfile.TemporaryDirectory() as d:
        fm = os.path.join(d, "maps.bin")
        subprocess.run([args.io, "maps", fm], check=True)
        mine = np.fromfile(fm, dtype=np.float32)
    theirs = np.concatenate([bnbF.create_dynamic_map(True).numpy(), bnbF.create_dynamic_map(False).numpy()])
    maps_equal = bool(np.array_equal(mine.view(np.uint32), theirs.astype(np.float32).view(np.uint32)))

    rng = np.random.default_rng(45)
    n = args.elements
    master = (rng.standard_normal(n) * 0.02).astype(np.float32)
    # Gradients with a scale per block from 1e-3 to 1: small values inside
    # a block sit far below its absmax, as in training.
    scale = 10.0 ** rng.uniform(-3.0, 0.0, size=-(-n // BLOCK))
    grads = [(rng.standard_normal(n) * np.repeat(scale, BLOCK)[:n]).astype(np.float32) for _ in range(args.steps)]
    f32 = lambda x: float(np.float32(x))
    hp = (f32(1e-3), f32(0.9), f32(0.999), f32(1e-8), f32(0.01))

    ours = run_pstar(args.io, master, grads, hp)
    shipped = run_bnb(master, grads, hp, nearest=False)
    paper = run_bnb(master, grads, hp, nearest=True)
    paper_sqrt = run_bnb(master, grads, hp, nearest=True, correct_sqrt=True)

    report = dict(bnb_version=bnb.__version__, torch_version=torch.__version__, elements=n, steps=args.steps,
                  maps_identical=maps_equal, steps_reported={})
    ok = maps_equal
    agreed = {name: np.ones(n, dtype=bool) for name in ("bnb-nearest-sqrt", "bnb-nearest", "bnb")}
    mag = {name: np.abs(master) for name in agreed}
    target_met = True
    for t in range(1, args.steps + 1):
        refs = (("bnb-nearest-sqrt", paper_sqrt), ("bnb-nearest", paper), ("bnb", shipped))
        # Every step: the same bits as bnb-nearest-sqrt.
        same = all(np.array_equal(ours[t - 1][k].view(np.uint8), paper_sqrt[t - 1][k].view(np.uint8))
                   for k in ("master", "m", "v", "am", "av"))
        report.setdefault("bit_identical_to_bnb_nearest_sqrt_steps", 0)
        report["bit_identical_to_bnb_nearest_sqrt_steps"] += int(same)
        ok = ok and same
        for name, ref in refs:
            agreed[name] &= (ours[t - 1]["m"] == ref[t - 1]["m"]) & (ours[t - 1]["v"] == ref[t - 1]["v"])
            mag[name] = np.maximum(mag[name], np.maximum(np.abs(ours[t - 1]["master"]), np.abs(ref[t - 1]["master"])))
        if t not in (1, args.steps):
            continue
        report["steps_reported"][t] = {name: compare(ours[t - 1], ref[t - 1], mag[name], agreed[name])
                                       for name, ref in refs}
        vs_nearest = report["steps_reported"][t]["bnb-nearest"]
        # Asserted: the issue's target against bitsandbytes' own arithmetic
        # (torch's square root included).
        worst = vs_nearest["max_master_operand_ulp"]
        target_met = target_met and vs_nearest["identical_codes"] >= 0.999 and worst <= 4
    ok = ok and target_met
    report["issue_target_met"] = target_met
    report["pass"] = ok
    if args.json:
        print(json.dumps(report))
    else:
        print("bitsandbytes %s, torch %s, %d elements (%d blocks of %d), lr 1e-3, betas 0.9/0.999, eps 1e-8, wd 0.01"
              % (bnb.__version__, torch.__version__, n, -(-n // BLOCK), BLOCK))
        print("dynamic maps (signed and unsigned) identical bit for bit: %s" % maps_equal)
        for t, r in report["steps_reported"].items():
            for name, c in r.items():
                print("step %2d vs %-12s identical codes %.5f%% (m %.5f%%, v %.5f%%)"
                      % (t, name + ":", 100 * c["identical_codes"], 100 * c["identical_m"], 100 * c["identical_v"]))
                print("         masters, in ulp of the operands (the largest |master| so far): max %.2f where the codes "
                      "agreed at every step "
                      "(%d of %d elements), max %.2f over all, 99.9th percentile %.2f; in ulp of the result: max %d "
                      "(%d over 4); absmax: max %d ulp"
                      % (c["max_master_operand_ulp_where_codes_agreed"], c["codes_always_agreed"], n,
                         c["max_master_operand_ulp"], c["p999_master_operand_ulp"], c["max_master_ulp"],
                         c["masters_over_4ulp"], c["max_absmax_ulp"]))
        print("bit for bit the same as bnb-nearest-sqrt (masters, codes, block maxima) at %d of %d steps"
              % (report["bit_identical_to_bnb_nearest_sqrt_steps"], args.steps))
        print("issue 45's target (vs bnb-nearest, steps 1 and %d: >= 99.9%% identical codes, masters within 4 ulp): "
              "%s" % (args.steps, "met" if target_met else "not met"))
        print("this test: %s" % ("pass" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
