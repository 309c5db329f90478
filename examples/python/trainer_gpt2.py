#!/usr/bin/env python3
"""Fine-tuning a GPT-2 with transformers' Trainer, its parameters in libpstar
chunks.  Two lines differ from the plain Trainer script: `ptorch.attach(...)`
after the model is built, and `optimizers=(pm.optimizer, scheduler)` in the
Trainer (pm.optimizer is a torch.optim.Optimizer over the engine's AdamW).

Everything else is Trainer as its docs write it: TrainingArguments with a
linear warmup schedule, max_grad_norm clipping (routed to the engine, whose
norm Trainer logs), gradient_accumulation_steps (the engine accumulates:
attach(..., grad_accumulation=1)), evaluation, checkpoints and save_model.

No download: the model is a small GPT-2 made from a config; the data is a
toy language (each token follows from the one before, with noise).

    PYTHONPATH=build/default/python .venv/bin/python examples/python/trainer_gpt2.py --steps 40

--check exits 1 unless the evaluation loss fell, the logged gradient norms
are the engine's (positive, finite), chunks moved between the emulated
device and the host, and the saved model loaded into plain PyTorch gives the
attached model's logits.
"""
import argparse
import math
import sys
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments,
                          get_linear_schedule_with_warmup)
from transformers.utils import logging as hf_logging

import pstar.torch as ptorch

VOCAB, SEQ = 128, 32


class ToyLanguage(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.empty(n, SEQ, dtype=torch.long)
        ids[:, 0] = torch.randint(1, VOCAB, (n,), generator=g)
        for t in range(1, SEQ):
            noise = torch.randint(0, 8, (n,), generator=g) == 0
            nxt = (ids[:, t - 1] * 5 + 1) % (VOCAB - 1) + 1
            ids[:, t] = torch.where(noise, torch.randint(1, VOCAB, (n,), generator=g), nxt)
        self.ids = ids

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--capacity-kib", type=int, default=192, help="the emulated device's capacity")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=3, n_head=4,
                                       bos_token_id=0, eos_token_id=0, pad_token_id=0))
    pm = ptorch.attach(model, device="emulated", compute_dtype="bf16", chunk_elems=16384,
                       device_capacity_bytes=args.capacity_kib * 1024, grad_accumulation=1,
                       lr=3e-3, weight_decay=0.01, adamw=1)
    scheduler = get_linear_schedule_with_warmup(pm.optimizer, num_warmup_steps=4, num_training_steps=args.steps)
    train, held_out = ToyLanguage(256, 1), ToyLanguage(32, 2)
    with tempfile.TemporaryDirectory() as out:
        targs = TrainingArguments(output_dir=out, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                  max_steps=args.steps, max_grad_norm=1.0, logging_steps=5, save_strategy="steps",
                                  save_steps=max(1, args.steps // 2), report_to=[], use_cpu=True, seed=0,
                                  disable_tqdm=True, per_device_eval_batch_size=8)
        trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=held_out,
                          optimizers=(pm.optimizer, scheduler))
        before = trainer.evaluate()["eval_loss"]
        trainer.train()
        after = trainer.evaluate()["eval_loss"]
        norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
        trainer.save_model(out + "/final")
        plain = GPT2LMHeadModel.from_pretrained(out + "/final", torch_dtype=torch.bfloat16)
        x = held_out.ids[:2]
        with torch.no_grad():
            same = torch.equal(plain(x).logits, model(x).logits)
    stats = pm.engine.stats
    print(f"eval loss {before:.4f} -> {after:.4f}; grad norms logged {['%.3f' % n for n in norms]}; "
          f"bytes host->device {stats['bytes_host_to_device']}; saved model gives the same logits: {same}")
    if args.check:
        ok = (after < before and norms and all(math.isfinite(n) and n > 0 for n in norms)
              and stats["bytes_host_to_device"] > 0 and same)
        if not ok:
            print("check failed", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
