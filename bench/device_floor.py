#!/usr/bin/env python3
"""The device floor, confirmed on real models: `pstar-plan --min-capacity`
predicts the smallest device capacity at which a model shape trains (model
data only); this script trains the real model of each shape through
pstar.torch on the emulated device at that capacity, and at an unlimited
capacity, and checks that the weights come out bit-identical.

    PYTHONPATH=build/default/python .venv/bin/python bench/device_floor.py \\
        --plan build/default/bin/pstar-plan [--models gpt2-small,vit-b-16] [--dtype bf16]

One JSON line per model: bench "device_floor", model, floor_bytes,
compute_chunk_bytes, floor_fraction (the planner's), trained (at
floor_bytes), peak_device_bytes (of that run), same_bits_as_unlimited,
compute_list_bytes_match (the real model's layout is the planner's), and
trained_at_90_percent (informative: the torch binding acquires one tensor
at a time, the planner's schedule a module's weight and bias together, so
the real floor may be lower; null with --no-below-floor, as the ctest runs
it, to keep its time well inside the limit).  Exit 1 if a model does not train at its
floor or its bits differ.
"""
import argparse
import json
import subprocess
import sys
import time

import torch

import pstar.torch as ptorch
from pstar import PstarError

MODELS = {}


def gpt2(name, layers, hidden, heads):
    def make(dtype):
        from transformers import GPT2Config, GPT2LMHeadModel
        m = GPT2LMHeadModel(GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads))
        x = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(1))
        return m, lambda: m(input_ids=x, labels=x).loss
    MODELS[name] = make


def vit(name, ctor):
    def make(dtype):
        import torchvision
        m = getattr(torchvision.models, ctor)()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(1, 3, 224, 224, generator=g).to(ptorch._TORCH_DTYPES[dtype])
        y = torch.tensor([3])
        return m, lambda: torch.nn.functional.cross_entropy(m(x).float(), y)
    MODELS[name] = make


gpt2("gpt2-small", 12, 768, 12)
gpt2("gpt2-medium", 24, 1024, 16)
vit("vit-b-16", "vit_b_16")
vit("vit-l-16", "vit_l_16")


def train(model, dtype, capacity, iters):
    """Trains `iters` iterations at `capacity`; returns (ok, stats, weights or error)."""
    torch.manual_seed(0)
    m, run = MODELS[model](dtype)
    # The engine's fixed default chunk size, as the planner's floor assumes
    # (attach's own, searched size would lay the model out otherwise).
    pm = ptorch.attach(m, compute_dtype=dtype, device_capacity_bytes=capacity, chunk_elems=0)
    try:
        for _ in range(iters):
            with pm.train_iteration():
                loss = run()
                loss.backward()
                pm.step()
        weights = [pm.read(name).clone() for name, _ in m.named_parameters()]
        return True, pm.engine.stats, weights
    except PstarError as e:
        return False, pm.engine.stats, str(e).splitlines()[0][:300]
    finally:
        del pm, m


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--plan", required=True, help="the pstar-plan executable")
    ap.add_argument("--models", default="gpt2-small,vit-b-16", help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--iters", type=int, default=2)
    ap.add_argument("--no-below-floor", action="store_true",
                    help="skip the informative run at 90%% of the floor (trained_at_90_percent is then null)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    out = subprocess.run([args.plan, "--min-capacity", "--json", "--dtype", args.dtype], check=True,
                         capture_output=True, text=True).stdout
    plan = {row["model"]: row for row in map(json.loads, out.splitlines())}
    failed = False
    for model in args.models.split(","):
        if model not in MODELS or model not in plan:
            sys.exit(f"device_floor.py: unknown model {model!r}")
        p = plan[model]
        t0 = time.time()
        ok_u, st_u, w_u = train(model, args.dtype, 0, args.iters)
        ok_f, st_f, w_f = train(model, args.dtype, p["floor_bytes"], args.iters)
        ok_90 = None
        if not args.no_below_floor:
            ok_90, _, _ = train(model, args.dtype, int(p["floor_bytes"] * 0.9), args.iters)
        same = ok_u and ok_f and all(torch.equal(a.view(torch.int32), b.view(torch.int32)) for a, b in zip(w_u, w_f))
        row = {"bench": "device_floor", "model": model, "dtype": args.dtype, "floor_bytes": p["floor_bytes"],
               "compute_chunk_bytes": p["compute_chunk_bytes"], "floor_fraction": p["floor_fraction"],
               "trained": ok_f, "peak_device_bytes": st_f["peak_device_bytes"],
               "peak_fraction": round(st_f["peak_device_bytes"] / p["compute_chunk_bytes"], 4),
               "unlimited_peak_device_bytes": st_u["peak_device_bytes"], "same_bits_as_unlimited": same,
               "compute_list_bytes_match": st_f["compute_list_bytes"] == p["compute_chunk_bytes"],
               "bytes_moved_at_floor": st_f["bytes_host_to_device"] + st_f["bytes_device_to_host"],
               "trained_at_90_percent": ok_90, "iterations": args.iters, "seconds": round(time.time() - t0, 1)}
        if not ok_f:
            row["error"] = w_f
        print(json.dumps(row), flush=True)
        failed |= not (ok_f and same and row["compute_list_bytes_match"])
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
