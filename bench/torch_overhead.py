#!/usr/bin/env python3
"""pstar.torch's overhead over plain PyTorch when every chunk fits (issue 44).

Trains the same transformers GPT-2 (random weights from a small GPT2Config,
synthetic tokens, no download) twice in one process, a step of each in
turn: through ``pstar.torch`` (``attach`` with a device capacity that holds
every chunk, ``pm.train_iteration()``, ``pm.step()``: the engine's AdamW)
and as plain PyTorch with the same recipe (the same initial weights and
batches, ``torch.optim.AdamW(fused=True)``, its fastest here, with the same
hyperparameters; in bf16 the model computes in bf16 and the optimizer
updates fp32 masters, as the engine does).  Each step is timed in three
parts: forward (``model(...).loss``, with the iteration's begin for pstar),
backward (``loss.backward()``) and optimizer (``pm.step()`` and the
iteration's end; for plain PyTorch the master gradients, ``opt.step()`` and
the copy back to the bf16 model).  The steps alternate, and which of the two
goes first alternates too, so that drift of a shared machine reaches both.

The default shape (4 layers, 256 wide, 4 heads, a vocabulary of 8192, 128
tokens, batch 4: 5.3M parameters) takes about 100-150 ms a step on a 2-core
host: enough arithmetic per parameter use that the step looks like real
training rather than a test of the Python per use, and 30 interleaved steps
of each dtype in about a minute.  The vocabulary is smaller than GPT-2's so
that the tied head does not make the step all one matrix product.

``--json`` prints one line per dtype (f32, bf16): ``ratio`` (a whole step
through pstar.torch over plain PyTorch's step beside it, the median over the
timed steps), ``forward_ratio``, ``backward_ratio``, ``optimizer_ratio``
(the same per part), the median seconds of each part for both
(``pstar_step_s``, ``plain_forward_s``...), and the losses of both runs
(``pstar_losses`` and, as exact bit patterns, ``pstar_losses_hex``).
By default the device holds every chunk (four times their bytes) and the
optimizer state stays on the host, so each step takes the chunks down for
the CPU update and back up; ``--hybrid`` puts the state on the device too
(hybrid placement, ``--hybrid-bytes-per-param`` of capacity per parameter),
as plain PyTorch keeps its AdamW state on its own device
(``hybrid_optimizer``, ``optimizer_chunks_on_device`` of
``optimizer_chunks`` say what was placed).  With
``--reference FILE`` (an earlier ``--json`` output) each line says whether
pstar's losses are the same bits as there, over the steps both ran
(``losses_match_reference``).  Plain PyTorch's losses differ slightly (its
AdamW's arithmetic is not the engine's): ``max_loss_diff_vs_plain`` says by
how much.

Where the CPU time goes (the ratios alone do not say whether pstar's extra
time is its caller's own work or waiting): ``pstar_main_cpu_s`` and
``plain_main_cpu_s``, the calling thread's CPU time per step
(``time.thread_time``, medians), and ``engine_threads_cpu_s``, the CPU time
per pstar step of the threads the engine started (its device streams, update
and optimizer threads; each thread's /proc schedstat, the total over the
timed steps divided by their count; absent without /proc), and
``engine_wait_s``, the seconds per step the caller waited in the engine for
chunk moves (the stats' wait_seconds).  ``compute_chunks`` and
``fill_ratio`` say how the model was laid out: ``attach`` sizes the chunks
to the model unless ``--chunk-elems`` names a size (0: the engine's fixed
2^22).  On a host with as many cores as PyTorch's threads, every second of
the engine's threads is taken from PyTorch's.

``--quick`` (CI): a tiny model and 2 timed steps; ``--check`` exits nonzero
when a key above is missing, when a loss is not finite, when pstar's losses drift from plain PyTorch's by
more than a tolerance, or when a reference is given and differs.  No timing
is ever checked.

    PYTHONPATH=build/default/python .venv/bin/python bench/torch_overhead.py --json
"""
import argparse
import json
import math
import os
import statistics
import struct
import sys
import time

import torch

import pstar.torch as ptorch

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
# What every --json line carries (--check: each a number).
REQUIRED_KEYS = ["ratio", "forward_ratio", "backward_ratio", "optimizer_ratio"] + [
    f"{side}_{part}_s" for side in ("pstar", "plain") for part in ("step", "forward", "backward", "optimizer")]


def thread_cpu_seconds():
    """CPU time of each of this process's threads, by id, from /proc (the
    scheduler's nanoseconds on the CPU, schedstat); {} where there is none."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[0]) * 1e-9
        except (OSError, ValueError, IndexError):
            continue
    return out


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def gpt2(args):
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging
    hf_logging.set_verbosity_error()
    config = GPT2Config(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.hidden, n_layer=args.layers,
                        n_head=args.heads, bos_token_id=0, eos_token_id=0, pad_token_id=0, attn_pdrop=0.0,
                        embd_pdrop=0.0, resid_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.train()
    return model


def batches(args):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
            for _ in range(args.warmup + args.steps)]


class PstarRun:
    def __init__(self, args, dtype):
        self.model = gpt2(args)
        # Every chunk fits: the capacity is four times the compute bytes.
        numel = sum(p.numel() for p in self.model.parameters())
        capacity = 4 * numel * (4 if dtype == "f32" else 2) + (64 << 20)
        if args.hybrid:
            # --hybrid: the optimizer state on the device beside the chunks
            # (hybrid placement), with room for it and the gradient buffers.
            capacity = args.hybrid_bytes_per_param * numel + (64 << 20)
        # attach's own chunk size unless --chunk-elems names one.
        sized = {} if args.chunk_elems is None else {"chunk_elems": args.chunk_elems}
        self.pm = ptorch.attach(self.model, device="emulated", compute_dtype=dtype, **sized,
                                device_capacity_bytes=capacity, hybrid_optimizer=1 if args.hybrid else 0, lr=args.lr,
                                beta1=args.beta1, beta2=args.beta2, eps=args.eps, weight_decay=args.weight_decay,
                                adamw=1, threads=args.engine_threads)

    def step(self, x):
        t0 = time.perf_counter()
        it = self.pm.train_iteration()
        it.__enter__()
        loss = self.model(input_ids=x, labels=x).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.pm.step()
        it.__exit__(None, None, None)
        t3 = time.perf_counter()
        return loss.item(), (t1 - t0, t2 - t1, t3 - t2)


class PlainRun:
    def __init__(self, args, dtype):
        self.model = gpt2(args)
        self.params = list(self.model.parameters())
        kw = dict(lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, weight_decay=args.weight_decay)
        if args.fused:
            kw["fused"] = True
        if dtype == "f32":
            self.masters = None
            self.opt = torch.optim.AdamW(self.params, **kw)
        else:
            self.masters = [p.detach().clone().float().requires_grad_(True) for p in self.params]
            self.model.to(DTYPES[dtype])
            self.opt = torch.optim.AdamW(self.masters, **kw)

    def step(self, x):
        t0 = time.perf_counter()
        loss = self.model(input_ids=x, labels=x).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        if self.masters is None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        else:
            for m, p in zip(self.masters, self.params):
                m.grad = p.grad.float()
                p.grad = None
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            with torch.no_grad():
                for m, p in zip(self.masters, self.params):
                    p.copy_(m)
        t3 = time.perf_counter()
        return loss.item(), (t1 - t0, t2 - t1, t3 - t2)


def hexf(v):
    return struct.pack(">d", v).hex()


def measure(args, dtype, reference):
    data = batches(args)
    # PyTorch's intra-op threads exist before the engine's are told apart
    # from them (threads that appear while attaching are the engine's).
    torch.ones(1 << 22).mul_(2)
    before = set(thread_cpu_seconds())
    pstar_run = PstarRun(args, dtype)
    engine_tids = set(thread_cpu_seconds()) - before
    runs = {"pstar": pstar_run, "plain": PlainRun(args, dtype)}
    losses = {k: [] for k in runs}
    parts = {k: [] for k in runs}
    main_cpu = {k: [] for k in runs}
    engine_cpu = 0.0
    engine_wait = 0.0
    for i, x in enumerate(data):
        order = ("pstar", "plain") if i % 2 == 0 else ("plain", "pstar")
        if i == args.warmup:
            engine_cpu = -sum(v for t, v in thread_cpu_seconds().items() if t in engine_tids)
            engine_wait = -pstar_run.pm.engine.stats["wait_seconds"]
        for k in order:
            c0 = time.thread_time()
            loss, t = runs[k].step(x)
            c1 = time.thread_time()
            losses[k].append(loss)
            if i >= args.warmup:
                parts[k].append(t)
                main_cpu[k].append(c1 - c0)
    engine_cpu += sum(v for t, v in thread_cpu_seconds().items() if t in engine_tids)
    engine_wait += pstar_run.pm.engine.stats["wait_seconds"]

    def part(t, j):
        return sum(t) if j is None else t[j]

    def med(k, j):
        return statistics.median(part(t, j) for t in parts[k])

    row = {"dtype": dtype}
    # The ratios: the median over the steps of pstar's step (or part) over
    # plain PyTorch's step beside it, so that a load that comes and goes on
    # a shared machine weighs on both sides of each ratio alike.
    for name, j in (("", None), ("forward_", 0), ("backward_", 1), ("optimizer_", 2)):
        row[f"{name}ratio"] = statistics.median(part(a, j) / part(b, j) for a, b in zip(parts["pstar"], parts["plain"]))
    for k in runs:
        for name, j in (("step", None), ("forward", 0), ("backward", 1), ("optimizer", 2)):
            row[f"{k}_{name}_s"] = med(k, j)
    for k in runs:
        row[f"{k}_main_cpu_s"] = statistics.median(main_cpu[k])
    if engine_tids:
        row["engine_threads"] = len(engine_tids)
        row["engine_threads_cpu_s"] = engine_cpu / len(parts["pstar"])
    row["engine_wait_s"] = engine_wait / len(parts["pstar"])
    row["steps_timed"] = len(parts["pstar"])
    row["warmup_steps"] = args.warmup
    row["pstar_losses"] = losses["pstar"]
    row["pstar_losses_hex"] = [hexf(v) for v in losses["pstar"]]
    row["plain_losses"] = losses["plain"]
    row["max_loss_diff_vs_plain"] = max(abs(a - b) for a, b in zip(losses["pstar"], losses["plain"]))
    row["losses_finite"] = all(math.isfinite(v) for v in losses["pstar"] + losses["plain"])
    if reference is not None:
        ref = reference.get(dtype)
        n = min(len(ref), len(row["pstar_losses_hex"])) if ref is not None else 0
        row["losses_match_reference"] = n > 0 and ref[:n] == row["pstar_losses_hex"][:n]
    row["shape"] = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab,
                    "seq": args.seq, "batch": args.batch, "chunk_elems": args.chunk_elems}
    st = pstar_run.pm.engine.stats
    row["compute_chunks"] = st["compute_chunks"]
    row["fill_ratio"] = st["fill_ratio"]
    row["hybrid_optimizer"] = bool(args.hybrid)
    row["optimizer_chunks_on_device"] = st["optimizer_chunks_on_device"]
    row["optimizer_chunks"] = st["optimizer_chunks"]
    row["torch_threads"] = torch.get_num_threads()
    row["plain_adamw"] = "fused" if args.fused else "default"
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON line per dtype on stdout")
    ap.add_argument("--quick", action="store_true", help="a tiny model and 2 timed steps (CI)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the losses are wrong (never a timing)")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30, help="timed steps of each run")
    ap.add_argument("--warmup", type=int, default=3, help="steps not timed, before them")
    ap.add_argument("--chunk-elems", type=int, default=None,
                    help="elements per chunk (default: attach's, sized to the model; 0: the engine's fixed default)")
    ap.add_argument("--engine-threads", type=int, default=0,
                    help="the engine's CPU update threads (options.threads; 0: one per hardware thread)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--hybrid", action="store_true",
                    help="hybrid placement: the optimizer state on the device too, with a capacity of "
                         "--hybrid-bytes-per-param per parameter (default: the chunks fit, the state stays on the host)")
    ap.add_argument("--hybrid-bytes-per-param", type=int, default=32,
                    help="--hybrid: device bytes per parameter, beside 64 MiB (default 32)")
    ap.add_argument("--no-fused", dest="fused", action="store_false",
                    help="plain PyTorch with torch's default AdamW instead of AdamW(fused=True), its fastest here")
    ap.add_argument("--reference", help="an earlier --json output: are pstar's losses the same bits?")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="--check: the largest loss difference to plain PyTorch (default 1e-3 f32, 5e-2 bf16)")
    args = ap.parse_args(argv)
    if args.quick:
        args.layers, args.hidden, args.heads, args.vocab, args.seq, args.batch = 2, 64, 2, 512, 32, 2
        args.steps, args.warmup = 2, 1
    reference = None
    if args.reference:
        reference = {}
        with open(args.reference) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    if "dtype" in r and "pstar_losses_hex" in r:
                        reference[r["dtype"]] = r["pstar_losses_hex"]
    ok = True
    for dtype in args.dtypes.split(","):
        row = measure(args, dtype, reference)
        if args.json:
            print(json.dumps(row), flush=True)
        else:
            log(f"{dtype}: step {row['ratio']:.3f}x (forward {row['forward_ratio']:.3f}x, backward "
                f"{row['backward_ratio']:.3f}x, optimizer {row['optimizer_ratio']:.3f}x); pstar "
                f"{row['pstar_step_s'] * 1e3:.1f} ms, plain {row['plain_step_s'] * 1e3:.1f} ms; losses differ from "
                f"plain by at most {row['max_loss_diff_vs_plain']:.2e}")
        tol = args.tolerance if args.tolerance is not None else (1e-3 if dtype == "f32" else 5e-2)
        if not row["losses_finite"]:
            log(f"{dtype}: a loss is not finite")
            ok = False
        if row["max_loss_diff_vs_plain"] > tol:
            log(f"{dtype}: pstar's losses differ from plain PyTorch's by {row['max_loss_diff_vs_plain']:.3g} "
                f"(> {tol})")
            ok = False
        missing = [k for k in REQUIRED_KEYS if not isinstance(row.get(k), (int, float))]
        if missing:
            log(f"{dtype}: keys missing from the JSON line: {missing}")
            ok = False
        if row.get("losses_match_reference") is False:
            log(f"{dtype}: pstar's losses are not the reference's bits")
            ok = False
    if args.check and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
