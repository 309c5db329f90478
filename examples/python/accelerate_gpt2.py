#!/usr/bin/env python3
"""Training a GPT-2 with an Accelerate loop, its parameters in libpstar
chunks.  Two lines differ from the plain Accelerate script: `ptorch.attach(...)`
after the model is built, and `pm.optimizer` where `torch.optim.AdamW(...)`
was (a torch.optim.Optimizer over the engine's AdamW).

Everything else is the loop as Accelerate's docs write it:
`accelerator.prepare(model, optimizer, dataloader, scheduler)`, a linear
warmup schedule, `with accelerator.accumulate(model):` over two micro-batches
per step (the engine accumulates: attach(..., grad_accumulation=1)),
`accelerator.backward(loss)` (which divides the loss by the accumulation
steps), `accelerator.clip_grad_norm_` on the steps that update (routed to the
engine: it clips the step and returns the engine's norm), evaluation, and
`accelerator.save_state` for a checkpoint (model, pm.optimizer's engine
state, scheduler).

No download: the model is a small GPT-2 made from a config; the data is a
toy language (each token follows from the one before, with noise).

    PYTHONPATH=build/default/python .venv/bin/python examples/python/accelerate_gpt2.py --steps 40

--check exits 1 unless the evaluation loss fell, every norm clip_grad_norm_
returned is the engine's (positive, finite), the engine made one step per
two micro-batches, chunks moved between the emulated device and the host,
and save_state wrote the optimizer's state.
"""
import argparse
import math
import os
import sys
import tempfile

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel, get_linear_schedule_with_warmup
from transformers.utils import logging as hf_logging

import pstar.torch as ptorch

VOCAB, SEQ, ACCUMULATION = 128, 32, 2


def toy_language(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(n, SEQ, dtype=torch.long)
    ids[:, 0] = torch.randint(1, VOCAB, (n,), generator=g)
    for t in range(1, SEQ):
        noise = torch.randint(0, 8, (n,), generator=g) == 0
        nxt = (ids[:, t - 1] * 5 + 1) % (VOCAB - 1) + 1
        ids[:, t] = torch.where(noise, torch.randint(1, VOCAB, (n,), generator=g), nxt)
    return TensorDataset(ids)


def evaluate(model, loader):
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for (ids,) in loader:
            total += model(input_ids=ids, labels=ids).loss.item()
            n += 1
    model.train()
    return total / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps (two micro-batches each)")
    ap.add_argument("--capacity-kib", type=int, default=192, help="the emulated device's capacity")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)

    # ---- the training script ---------------------------------------------
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=3, n_head=4,
                                       bos_token_id=0, eos_token_id=0, pad_token_id=0))
    # Instead of `optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)`:
    pm = ptorch.attach(model, device="emulated", compute_dtype="bf16", chunk_elems=16384,
                       device_capacity_bytes=args.capacity_kib * 1024, grad_accumulation=1,
                       lr=3e-3, weight_decay=0.01, adamw=1)
    optimizer = pm.optimizer
    train = DataLoader(toy_language(512, 1), batch_size=4, shuffle=True)
    held_out = DataLoader(toy_language(32, 2), batch_size=8)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=4, num_training_steps=args.steps)
    model, optimizer, train, held_out, scheduler = accelerator.prepare(model, optimizer, train, held_out, scheduler)

    before = evaluate(model, held_out)
    norms, step = [], 0
    while step < args.steps:
        for (ids,) in train:
            with accelerator.accumulate(model):
                loss = model(input_ids=ids, labels=ids).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    norms.append(accelerator.clip_grad_norm_(model.parameters(), 1.0).item())
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            if accelerator.sync_gradients:
                step += 1
                if step % 10 == 0:
                    accelerator.print(f"step {step}: loss {loss.item():.4f}, grad norm {norms[-1]:.3f}, "
                                      f"lr {scheduler.get_last_lr()[0]:.2e}")
                if step == args.steps:
                    break
    after = evaluate(model, held_out)
    with tempfile.TemporaryDirectory() as out:
        accelerator.save_state(out)
        saved = sorted(os.listdir(out))
    # ---- end of the script -------------------------------------------------

    stats = pm.engine.stats
    print(f"held-out loss: {before:.4f} -> {after:.4f}; engine: {stats['steps']} steps over "
          f"{ACCUMULATION * args.steps} micro-batches, {stats['bytes_host_to_device']} bytes host->device; "
          f"save_state wrote {saved}")
    if args.check:
        ok = (after < before and len(norms) == args.steps and all(math.isfinite(n) and n > 0 for n in norms)
              and stats["steps"] == args.steps and stats["bytes_host_to_device"] > 0 and "optimizer.bin" in saved)
        if not ok:
            print("check failed", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
