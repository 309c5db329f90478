#!/usr/bin/env python3
"""End-to-end training through pstar.torch, against plain PyTorch and FSDP2 offload.

Trains a transformers GPT-2 (random weights, synthetic tokens) and prints one
JSON line per measurement (issue 22):

1. ``plain_pytorch``: the model resident, bf16 compute, fp32 masters,
   ``torch.optim.AdamW(fused=True)``: tokens/s.
2. ``pstar`` at each ``--capacities`` fraction of the compute chunk bytes:
   tokens/s and ``offload_vs_resident`` (over plain PyTorch's), the bytes
   moved per step, and the losses, which must be the same bits at every
   capacity (``losses_identical`` in the summary).
3. ``fsdp2_offload``: the same model under FSDP2 (``fully_shard`` per block
   and at the root) with ``CPUOffloadPolicy`` at world size 1; the summary's
   ``vs_fsdp2_offload`` is pstar at the smallest capacity over it.
4. ``max_params``: the largest GPT shape pstar-plan finds for the device and
   host memory given (``--plan``), trained for 3 real steps; the summary's
   ``max_params_trained`` (null when those steps fail or no planner is given).

On ``--device emulated`` every part runs on the CPU: the engine's emulated
device and plain PyTorch both compute on the host, FSDP2 keeps its shards on
the CPU without pinned memory, and the planner is given a small made-up
device and host (``--quick``: 64 MiB each), so the figures check that the
script runs and that the engine's results do not depend on its capacity;
they are not GPU throughput.  On ``--device cuda`` (tests/gpu/run.sh) they
are the figures issue 22 asks for.

    PYTHONPATH=build/default/python .venv/bin/python bench/e2e_train.py --device emulated --quick --json \\
        --plan build/default/bin/pstar-plan
"""
import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time
import zlib

import torch

import pstar.torch as ptorch


def log(msg):
    print(msg, file=sys.stderr, flush=True)


CHECKPOINTING = False  # --checkpointing: every model built below recomputes its blocks in backward


def gpt2(layers, hidden, heads, vocab, seq):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    config = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=hidden, n_layer=layers, n_head=heads,
                        bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_pdrop=0.0, embd_pdrop=0.0,
                        resid_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    if CHECKPOINTING:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def batches(steps, batch, seq, vocab, device):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, vocab, (batch, seq), generator=g).to(device) for _ in range(steps)]


def timed(run, data, warmup):
    """Runs one step per batch; returns (losses, seconds of the steps after `warmup`)."""
    losses, t0 = [], None
    for i, x in enumerate(data):
        if i == warmup:
            sync()
            t0 = time.perf_counter()
        losses.append(run(x))
    sync()
    return losses, (time.perf_counter() - t0) if t0 is not None else float("nan")


def sync():
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def plain_pytorch(args, data):
    """bf16 model, fp32 masters, fused AdamW: the usual mixed-precision loop."""
    model = gpt2(args.layers, args.hidden, args.heads, args.vocab, args.seq).to(args.torch_device)
    masters = [p.detach().clone().float().requires_grad_(True) for p in model.parameters()]
    model.to(torch.bfloat16)
    opt = torch.optim.AdamW(masters, lr=args.lr, weight_decay=args.weight_decay, fused=True)
    params = list(model.parameters())

    def step(x):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        for m, p in zip(masters, params):
            m.grad = p.grad.float()
            p.grad = None
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for m, p in zip(masters, params):
                p.copy_(m)
        return loss.item()

    return timed(step, data, args.warmup)


def pstar_run(args, data, capacity):
    model = gpt2(args.layers, args.hidden, args.heads, args.vocab, args.seq).to(torch.bfloat16)
    pm = ptorch.attach(model, device=args.device, compute_dtype="bf16", chunk_elems=args.chunk_elems,
                       device_capacity_bytes=capacity, lr=args.lr, weight_decay=args.weight_decay, adamw=1)

    def step(x):
        with pm.train_iteration():
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            pm.step()
        return loss.item()

    losses, seconds = timed(step, data, args.warmup)
    return losses, seconds, pm.engine.stats


def fsdp2_offload(args, data):
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:  # a free port (world size 1: only this process connects)
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    cuda = args.device == "cuda"
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    try:
        model = gpt2(args.layers, args.hidden, args.heads, args.vocab, args.seq)
        if cuda:
            model.to("cuda")
        offload = CPUOffloadPolicy(pin_memory=cuda)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            fully_shard(block, offload_policy=offload, mp_policy=mp)
        fully_shard(model, offload_policy=offload, mp_policy=mp)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

        def step(x):
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()

        return timed(step, data, args.warmup)
    finally:
        dist.destroy_process_group()


def max_params(args):
    """pstar-plan's largest shape at --hidden for the memory given, then 3 steps of it."""
    if not args.plan:
        return {"skipped": "no --plan (the pstar-plan binary) given"}
    hidden, heads = args.max_hidden, args.max_heads
    cmd = [args.plan, "--json", "--gpus-per-node", "1", "--gpu-mem", str(args.plan_gpu_mem), "--host-mem",
           str(args.plan_host_mem), "--host-reserve", str(args.plan_host_reserve), "--hidden", str(hidden),
           "--heads", str(heads), "--vocab", str(args.vocab), "--seq", str(args.seq), "--batch",
           str(args.batch), "--layers", str(args.layers), "--flops", str(args.plan_flops)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"skipped": f"pstar-plan failed: {out.stderr.strip()[:300]}"}
    plan = json.loads(out.stdout.strip().splitlines()[-1])
    shape = plan.get("max_shape")
    if not shape:
        return {"skipped": "pstar-plan found no shape that fits", "plan_max_params": plan.get("max_params")}
    row = {"plan_max_params": plan["max_params"], "layers": shape["layers"], "hidden": hidden,
           "chunk_elems": plan["chunk_elems"],
           "gpu_mem_bytes": args.plan_gpu_mem, "host_mem_bytes": args.plan_host_mem}
    reserve = args.plan_gpu_mem // 10  # pstar-plan's default --gpu-reserve
    # Built on the meta device and initialised inside the engine, one
    # parameter at a time (attach(init=...)): the host holds the engine's
    # lists, not a second copy of the model.
    with torch.device("meta"):
        model = gpt2(shape["layers"], hidden, heads, args.vocab, args.seq).to(torch.bfloat16)
    row["params"] = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    layers = shape["layers"]

    def init(name, t):  # GPT-2's initialisation, seeded by the parameter's name
        g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        if name.endswith("bias"):
            t.zero_()
        elif ".ln_" in name or name.startswith("transformer.ln_f"):
            t.fill_(1.0)
        else:
            std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
            t.normal_(0.0, std, generator=g)

    try:
        # The planner's chunk size, device capacity (less its reserve) and
        # hybrid placement (its default).
        # The host is the machine's memory, not an engine budget (a host
        # capacity makes the build allocate every list at once, which the
        # planner does not model): the engine's host peak must stay within
        # it, less the reserve per rank.
        pm = ptorch.attach(model, device=args.device, compute_dtype="bf16", chunk_elems=plan["chunk_elems"],
                           device_capacity_bytes=args.plan_gpu_mem - reserve, hybrid_optimizer=1, lr=args.lr,
                           weight_decay=args.weight_decay, adamw=1, init=init)
        losses = []
        for x in batches(3, args.batch, args.seq, args.vocab, args.torch_device):
            with pm.train_iteration():
                loss = model(input_ids=x, labels=x).loss
                loss.backward()
                pm.step()
            losses.append(loss.item())
        st = pm.engine.stats
        row["losses"] = losses
        row["peak_device_bytes"] = st["peak_device_bytes"]
        row["peak_host_bytes"] = st["peak_host_bytes"]
        row["host_budget_bytes"] = args.plan_host_mem - args.plan_host_reserve
        row["trained"] = all(math.isfinite(v) for v in losses) and st["peak_host_bytes"] <= row["host_budget_bytes"]
    except Exception as e:  # the figure is then absent, with why
        row["trained"] = False
        row["error"] = f"{type(e).__name__}: {e}"[:300]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["emulated", "cuda"],
                    default="cuda" if torch.cuda.is_available() else "emulated")
    ap.add_argument("--quick", action="store_true", help="a tiny shape and few steps (CI on the emulated device)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=12, help="steps per run, warm-up included")
    ap.add_argument("--warmup", type=int, default=2, help="steps not timed")
    ap.add_argument("--capacities", default="1.0,0.5", help="fractions of the compute chunk bytes")
    ap.add_argument("--chunk-elems", type=int, default=0, help="0: the engine's default")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--no-fsdp2", action="store_true")
    ap.add_argument("--checkpointing", action="store_true",
                    help="activation checkpointing (transformers' gradient_checkpointing_enable, non-reentrant) in "
                         "every run")
    ap.add_argument("--plan", help="the pstar-plan binary, for max_params")
    ap.add_argument("--max-hidden", type=int, default=0,
                    help="hidden size of the largest-model search (default 4096 on CUDA, else --hidden)")
    ap.add_argument("--max-heads", type=int, default=0, help="its heads (default 32 on CUDA, else --heads)")
    ap.add_argument("--plan-gpu-mem", type=int, default=0, help="bytes (default: the GPU's, or 64 MiB emulated)")
    ap.add_argument("--plan-host-mem", type=int, default=0, help="bytes (default: MemTotal, or 64 MiB emulated)")
    ap.add_argument("--plan-host-reserve", type=int, default=-1,
                    help="bytes per rank kept from the model (default: pstar-plan's 4 GiB; 0 emulated)")
    ap.add_argument("--plan-flops", type=float, default=0.0,
                    help="sustained FLOP/s for the planner's step time (default 4e14 on CUDA: 40%% of an H200's "
                         "dense bf16 peak; 1e12 emulated); it does not change what fits")
    ap.add_argument("--json", action="store_true", help="JSON lines on stdout (progress on stderr)")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless every part ran: the same losses at every capacity, an FSDP2 figure and "
                         "the planner's largest shape trained")
    args = ap.parse_args(argv)
    global CHECKPOINTING
    CHECKPOINTING = args.checkpointing
    if args.quick:
        args.layers, args.hidden, args.heads, args.vocab, args.seq, args.batch = 2, 64, 4, 512, 32, 4
        args.steps, args.warmup = min(args.steps, 4), min(args.warmup, 1)
        args.chunk_elems = args.chunk_elems or 16384
    if args.device == "cuda" and not torch.cuda.is_available():
        log("skipped: no CUDA device (use --device emulated)")
        return 77
    args.torch_device = "cuda" if args.device == "cuda" else "cpu"
    emulated = args.device == "emulated"
    if not args.plan_gpu_mem:
        args.plan_gpu_mem = (64 << 20) if emulated else torch.cuda.get_device_properties(0).total_memory
    if not args.plan_host_mem:
        args.plan_host_mem = (64 << 20) if emulated else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if not args.max_hidden:
        args.max_hidden, args.max_heads = (args.hidden, args.heads) if emulated else (4096, 32)
    args.max_heads = args.max_heads or args.heads
    if not args.plan_flops:
        args.plan_flops = 1e12 if emulated else 4e14
    if args.plan_host_reserve < 0:
        args.plan_host_reserve = 0 if emulated else 4 << 30
    tokens = args.batch * args.seq * (args.steps - args.warmup)
    rows = []

    def emit(row):
        row = {"bench": "e2e_train", "device": args.device, **row}
        rows.append(row)
        print(json.dumps(row) if args.json else " ".join(f"{k}={v}" for k, v in row.items()), flush=True)

    data = batches(args.steps, args.batch, args.seq, args.vocab, args.torch_device)
    shape = {"layers": args.layers, "hidden": args.hidden, "vocab": args.vocab, "seq": args.seq, "batch": args.batch,
             "checkpointing": args.checkpointing}

    log("plain PyTorch ...")
    losses, seconds = plain_pytorch(args, data)
    plain_tps = tokens / seconds
    emit({"mode": "plain_pytorch", **shape, "steps": args.steps, "tokens_per_s": plain_tps, "losses": losses})

    # The compute chunk bytes as the engine packs them (an engine built and
    # dropped: attach registers and builds).
    probe = gpt2(args.layers, args.hidden, args.heads, args.vocab, args.seq).to(torch.bfloat16)
    chunk_bytes = ptorch.attach(probe, device=args.device, compute_dtype="bf16",
                                chunk_elems=args.chunk_elems).engine.stats["compute_list_bytes"]
    del probe
    pstar_losses, pstar_tps = {}, {}
    for f in (float(v) for v in args.capacities.split(",")):
        capacity = int(chunk_bytes * f)
        log(f"pstar at {f:g} of the compute chunk bytes ({capacity} bytes) ...")
        losses, seconds, st = pstar_run(args, data, capacity)
        pstar_losses[f], pstar_tps[f] = losses, tokens / seconds
        emit({"mode": "pstar", **shape, "capacity_fraction": f, "device_capacity_bytes": capacity,
              "compute_list_bytes": st["compute_list_bytes"], "tokens_per_s": pstar_tps[f],
              "offload_vs_resident": pstar_tps[f] / plain_tps,
              "bytes_host_to_device_per_step": st["bytes_host_to_device"] / args.steps,
              "bytes_device_to_host_per_step": st["bytes_device_to_host"] / args.steps,
              "evictions": st["evictions"], "losses": losses})
    smallest = min(pstar_tps)

    fsdp_tps = None
    if not args.no_fsdp2:
        log("FSDP2 with CPUOffloadPolicy ...")
        try:
            losses, seconds = fsdp2_offload(args, data)
            fsdp_tps = tokens / seconds
            emit({"mode": "fsdp2_offload", **shape, "tokens_per_s": fsdp_tps, "losses": losses})
        except Exception as e:
            emit({"mode": "fsdp2_offload", "skipped": f"{type(e).__name__}: {e}"[:300]})

    log("the largest model ...")
    mp = max_params(args)
    emit({"mode": "max_params", **mp})

    reference = pstar_losses[max(pstar_losses)]
    summary = {
        "mode": "summary",
        "offload_vs_resident": pstar_tps[smallest] / plain_tps,
        "capacity_fraction": smallest,
        "vs_fsdp2_offload": pstar_tps[smallest] / fsdp_tps if fsdp_tps else None,
        "max_params_trained": mp.get("params") if mp.get("trained") else None,
        "losses_identical": all(v == reference for v in pstar_losses.values()),
        "figures_are_gpu": not emulated,
    }
    emit(summary)
    if not summary["losses_identical"]:
        log("failed: the losses differ between capacities")
        return 1
    if args.check and (summary["vs_fsdp2_offload"] is None or summary["max_params_trained"] is None):
        log("check failed: " + ("no FSDP2 figure" if summary["vs_fsdp2_offload"] is None else
                                f"the planner's largest shape did not train ({mp})"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
