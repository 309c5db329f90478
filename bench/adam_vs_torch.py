#!/usr/bin/env python3
"""libpstar's fused mixed-precision Adam step against what a PyTorch user does.

Times, in the same run, on the same problem (default: 50M elements, 2 threads):

  (a) the PyTorch user's bf16 mixed-precision update: the bf16 gradient
      upcast into the fp32 master's .grad (copy_ into a preallocated fp32
      gradient, the cheapest way), torch.optim.AdamW with its fastest CPU
      variant (fused=True where the installed torch supports it on the CPU,
      else foreach=True) stepping the fp32 masters, and the new weights cast
      back into the bf16 params (param_bf16.copy_(master));
  (b) libpstar's fused bf16 step (read the bf16 gradient from the param's
      slot, update master, m, v, write the bf16 param back into the slot:
      one pass), by running `<build-dir>/bin/pstar-bench adam --dtype bf16
      --json` and reading its median_s;
  and, for comparison with older published figures, the same user workflow
  with plain torch.optim.Adam(foreach=False) (the per-parameter loop).

The measurements are made in rounds (libpstar, then torch AdamW, then torch
Adam), so that drift of a shared machine's memory bandwidth affects them
alike; each time reported is the median of all steps of all rounds (after a
warm-up step per round).  The last line is
`speedup_vs_torch: <torch (a) time / libpstar time>`, the line before it the
same ratio against plain Adam(foreach=False).

Run it with the project's virtual environment:
  .venv/bin/python bench/adam_vs_torch.py --build-dir build/default
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# Bytes moved per element, counted pass by pass (B per element).
#  libpstar: read bf16 grad 2 + master, m, v 12; write master, m, v 12 + bf16
#  param 2 into the gradient's slot.  In place: no write-allocate read.
PSTAR_BYTES = 28
#  torch (a):
#   upcast     grad_f32.copy_(grad_bf16): read 2, write 4 (+4 write-allocate)
#   AdamW      fused: read param, grad, m, v (16); write param, m, v (12)
#   cast-back  param_bf16.copy_(master): read 4, write 2 (+2 write-allocate)
TORCH_UPCAST = (2 + 4, 4)  # (counted, write-allocate)
TORCH_FUSED_STEP = (28, 0)
TORCH_CASTBACK = (4 + 2, 2)
#  torch.optim.Adam(foreach=False), weight_decay 0 (_single_tensor_adam):
#  seven passes per step: exp_avg.lerp_(grad) r8 w4; exp_avg_sq.mul_ r4 w4;
#  .addcmul_(grad, grad) r8 w4; exp_avg_sq.sqrt() r4 w4 (new tensor, +4);
#  / bc2_sqrt r4 w4 (new tensor, +4); .add_(eps) r4 w4;
#  param.addcdiv_(exp_avg, denom) r12 w4.
TORCH_PLAIN_STEP = (12 + 8 + 12 + 8 + 8 + 8 + 16, 8)


def parse_count(text):
    mult = {"k": 10**3, "K": 10**3, "M": 10**6, "m": 10**6, "G": 10**9, "g": 10**9}
    text = text.strip()
    if text and text[-1] in mult:
        return int(round(float(text[:-1]) * mult[text[-1]]))
    return int(text)


def median(xs):
    return statistics.median(xs)


def run_pstar(bench, n, threads, reps):
    cmd = [bench, "adam", "--dtype", "bf16", "--elements", str(n), "--threads", str(threads),
           "--reps", str(reps), "--json", "--samples"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit("adam_vs_torch: %s failed (%d):\n%s%s" % (" ".join(cmd), proc.returncode, proc.stdout,
                                                           proc.stderr))
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        obj = json.loads(line)
        if obj.get("bench") == "adam" and obj.get("dtype") == "bf16":
            return obj
    sys.exit("adam_vs_torch: no bf16 line in the output of %s:\n%s" % (" ".join(cmd), proc.stdout))


class TorchUpdate:
    """One flat bf16 parameter with fp32 master, grad and optimizer state,
    stepped the way a PyTorch mixed-precision user does it."""

    def __init__(self, torch, n, make_opt):
        self.torch = torch
        gen = torch.Generator().manual_seed(0)
        self.master = torch.nn.Parameter(torch.rand(n, generator=gen) * 2 - 1)
        self.param_bf16 = self.master.detach().to(torch.bfloat16)
        self.grad_bf16 = ((torch.rand(n, generator=gen) * 2 - 1) * 0.01).to(torch.bfloat16)
        self.master.grad = torch.empty(n, dtype=torch.float32)
        self.master.grad.copy_(self.grad_bf16)  # first touch of the fp32 gradient
        self.opt = make_opt([self.master])

    def step(self):
        """One update; returns (upcast, step, cast-back) seconds."""
        t0 = time.perf_counter()
        self.master.grad.copy_(self.grad_bf16)
        t1 = time.perf_counter()
        self.opt.step()
        t2 = time.perf_counter()
        self.param_bf16.copy_(self.master.detach())
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default="build/default", help="the CMake build folder (pstar-bench in <dir>/bin)")
    ap.add_argument("--elements", default="50M", help="elements (suffixes k, M, G)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5, help="measured steps per round, libpstar and torch AdamW")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of (libpstar, torch AdamW, torch Adam)")
    ap.add_argument("--plain-reps", type=int, default=2, help="steps per round of plain Adam(foreach=False)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    args = ap.parse_args()

    import torch

    n = parse_count(args.elements)
    bench = os.path.join(args.build_dir, "bin", "pstar-bench")
    if not os.access(bench, os.X_OK):
        sys.exit("adam_vs_torch: %s not found; build the project first (or pass --build-dir)" % bench)
    torch.set_num_threads(args.threads)

    # The fastest AdamW this torch has on the CPU.
    def make_adamw(params, variant):
        return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, **{variant: True})

    variant = "fused"
    try:
        probe = torch.nn.Parameter(torch.zeros(64))
        probe.grad = torch.ones(64)
        make_adamw([probe], "fused").step()
    except (RuntimeError, TypeError, ValueError) as e:
        print("note: AdamW(fused=True) unavailable on the CPU here (%s); using foreach=True" % e)
        variant = "foreach"

    def make_plain(params):
        return torch.optim.Adam(params, lr=args.lr, foreach=False)

    pstar_runs = []
    fused_samples = []  # (upcast, step, castback)
    plain_samples = []
    for _ in range(args.rounds):
        pstar_runs.append(run_pstar(bench, n, args.threads, args.reps))

        upd = TorchUpdate(torch, n, lambda p: make_adamw(p, variant))
        upd.step()  # warm-up: allocates m and v, first touch
        upd.step()
        fused_samples += [upd.step() for _ in range(args.reps)]
        del upd

        upd = TorchUpdate(torch, n, make_plain)
        upd.step()
        plain_samples += [upd.step() for _ in range(args.plain_reps)]
        del upd

    pstar_s = median([t for r in pstar_runs for t in r.get("step_samples_s", [r["median_s"]])])
    pstar_frac = median([r["bound_fraction"] for r in pstar_runs])
    pstar_ceiling = median([r["ceiling_gbs"] for r in pstar_runs])
    isa = pstar_runs[0].get("isa", "?")

    def summarise(samples):
        total = median([sum(s) for s in samples])
        parts = [median([s[k] for s in samples]) for k in range(3)]
        return total, parts

    fused_s, fused_parts = summarise(fused_samples)
    plain_s, plain_parts = summarise(plain_samples)

    counted = TORCH_UPCAST[0] + TORCH_FUSED_STEP[0] + TORCH_CASTBACK[0]
    allocate = TORCH_UPCAST[1] + TORCH_FUSED_STEP[1] + TORCH_CASTBACK[1]

    print("adam_vs_torch: %d elements, %d threads, torch %s, %d rounds (libpstar %d reps, AdamW %d, Adam %d "
          "per round), medians" % (n, args.threads, torch.__version__, args.rounds, args.reps, args.reps,
                                   args.plain_reps))
    print("libpstar fused bf16 step (isa %s): %.2f ms  %.3f G elem/s  %d B/elem (one in-place pass)  "
          "%.2f of its %.1f GB/s ceiling" % (isa, pstar_s * 1e3, n / pstar_s / 1e9, PSTAR_BYTES, pstar_frac,
                                             pstar_ceiling))
    if variant == "fused":
        bytes_note = "%d B/elem counted (upcast 6 + AdamW 28 + cast-back 6), %d with write-allocate" % (
            counted, counted + allocate)
    else:
        bytes_note = "foreach AdamW makes several passes per step: well over %d B/elem" % counted
    print("torch (a) bf16 grad upcast + AdamW(%s=True) + bf16 cast-back: %.2f ms = %.2f + %.2f + %.2f ms  "
          "%.3f G elem/s  %s" % (variant, fused_s * 1e3, fused_parts[0] * 1e3, fused_parts[1] * 1e3,
                                 fused_parts[2] * 1e3, n / fused_s / 1e9, bytes_note))
    plain_counted = TORCH_UPCAST[0] + TORCH_PLAIN_STEP[0] + TORCH_CASTBACK[0]
    plain_allocate = TORCH_UPCAST[1] + TORCH_PLAIN_STEP[1] + TORCH_CASTBACK[1]
    print("torch plain bf16 grad upcast + Adam(foreach=False) + bf16 cast-back: %.2f ms = %.2f + %.2f + %.2f ms  "
          "%.3f G elem/s  %d B/elem counted (upcast 6 + Adam %d in seven passes + cast-back 6), %d with "
          "write-allocate" % (plain_s * 1e3, plain_parts[0] * 1e3, plain_parts[1] * 1e3, plain_parts[2] * 1e3,
                              n / plain_s / 1e9, plain_counted, TORCH_PLAIN_STEP[0],
                              plain_counted + plain_allocate))
    print("speedup_vs_torch_adam_foreach_false: %.3f" % (plain_s / pstar_s))
    print("speedup_vs_torch: %.3f" % (fused_s / pstar_s))


if __name__ == "__main__":
    main()
