#!/usr/bin/env python3
"""libpstar's int8 Adam state format against bitsandbytes' AdamW8bit on the CPU.

Times, in the same run, on the same element count (default 16 Mi, 2 threads):

  (a) bitsandbytes' blockwise AdamW8bit (PyPI bitsandbytes, its CPU path:
      backends/cpu/ops.py, _optimizer_update_8bit_blockwise_cpu) stepping one
      fp32 parameter of that many elements, its gradient set beforehand,
      torch limited to the same thread count;
  (b) libpstar's update with the moments in the int8 format, and in the fp32
      and bf16 formats, by running `<build-dir>/bin/pstar-bench adam --json
      --state-formats fp32,bf16,int8` and reading its per-format lines
      (bf16 compute dtype: the gradient read from and the weight written to a
      2-byte slot; fp32 masters).

The two are not the same workload byte for byte: bitsandbytes reads an fp32
gradient and writes only the fp32 parameter (no compute-dtype copy);
libpstar reads a bf16 gradient and writes both.  Both keep m and v as 8-bit
codes with an fp32 absmax per 256 elements.  Rounds alternate (libpstar,
then bitsandbytes); each figure is the median over all rounds.  The output is
one JSON object; `int8_vs_bnb` is libpstar int8's elements/s over
bitsandbytes'.

Run it with the project's virtual environment:
  .venv/bin/python bench/adam_vs_bnb.py --build-dir build/default
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def parse_count(text):
    mult = {"k": 10**3, "K": 10**3, "M": 10**6, "m": 10**6, "G": 10**9, "g": 10**9, "Mi": 2**20, "Gi": 2**30}
    text = text.strip()
    for suffix in ("Mi", "Gi"):
        if text.endswith(suffix):
            return int(float(text[:-2]) * mult[suffix])
    if text and text[-1] in mult:
        return int(float(text[:-1]) * mult[text[-1]])
    return int(text)


def run_pstar(bench, n, threads, reps):
    cmd = [bench, "adam", "--dtype", "bf16", "--elements", str(n), "--threads", str(threads), "--reps", str(reps),
           "--json", "--state-formats", "fp32,bf16,int8"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit("adam_vs_bnb: %s failed (%d):\n%s%s" % (" ".join(cmd), proc.returncode, proc.stdout, proc.stderr))
    out = {}
    for line in proc.stdout.splitlines():
        obj = json.loads(line)
        if obj.get("bench") == "adam_states":
            out[obj["state_format"]] = obj
    if "int8" not in out:
        sys.exit("adam_vs_bnb: no int8 line in the output of %s:\n%s" % (" ".join(cmd), proc.stdout))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default="build/default", help="the CMake build folder (pstar-bench in <dir>/bin)")
    ap.add_argument("--elements", default="16Mi", help="elements (suffixes k, M, G, Mi, Gi)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5, help="measured steps per round and side")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (libpstar, bitsandbytes)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    args = ap.parse_args()

    try:
        import logging
        logging.disable(logging.WARNING)  # bitsandbytes' notes about optional GPU kernels
        import torch
        import bitsandbytes as bnb
        logging.disable(logging.NOTSET)
    except ImportError as e:
        print("skipped: %s (bitsandbytes and torch are needed)" % e)
        sys.exit(77)

    n = parse_count(args.elements)
    bench = os.path.join(args.build_dir, "bin", "pstar-bench")
    if not os.access(bench, os.X_OK):
        sys.exit("adam_vs_bnb: %s not found; build the project first (or pass --build-dir)" % bench)
    torch.set_num_threads(args.threads)

    gen = torch.Generator().manual_seed(45)
    p = torch.nn.Parameter(torch.randn(n, generator=gen) * 0.02)
    p.grad = torch.randn(n, generator=gen) * 0.01
    opt = bnb.optim.AdamW8bit([p], lr=args.lr, weight_decay=args.weight_decay)
    opt.step()  # warm-up: allocates the 8-bit state
    if opt.state[p]["state1"].dtype != torch.uint8:
        sys.exit("adam_vs_bnb: bitsandbytes did not use 8-bit state")

    pstar_runs, bnb_samples = [], []
    for _ in range(args.rounds):
        pstar_runs.append(run_pstar(bench, n, args.threads, args.reps))
        opt.step()
        for _ in range(args.reps):
            t0 = time.perf_counter()
            opt.step()
            bnb_samples.append(time.perf_counter() - t0)

    med = statistics.median
    bnb_eps = n / med(bnb_samples)
    result = {"bench": "adam_vs_bnb", "elements": n, "threads": args.threads, "rounds": args.rounds,
              "reps": args.reps, "bnb_version": bnb.__version__, "torch_version": torch.__version__,
              "bnb_adamw8bit_median_s": med(bnb_samples), "bnb_adamw8bit_eps": bnb_eps}
    for fmt in ("int8", "bf16", "fp32"):
        runs = [r[fmt] for r in pstar_runs if fmt in r]
        if not runs:
            continue
        eps = med([r["elems_per_s"] for r in runs])
        result["pstar_%s_eps" % fmt] = eps
        result["pstar_%s_bound_fraction" % fmt] = med([r["bound_fraction"] for r in runs])
        result["%s_vs_bnb" % fmt] = eps / bnb_eps
    result["pstar_isa"] = pstar_runs[0]["int8"].get("isa")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
