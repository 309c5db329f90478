#!/usr/bin/env python3
"""A LoRA fine-tune of a GPT-2 with PEFT, its parameters in libpstar chunks.
Two lines differ from the plain PEFT script: `ptorch.attach(...)` after
`get_peft_model`, and `pm.optimizer` where `torch.optim.AdamW(...)` was (a
torch.optim.Optimizer over the engine's AdamW).

Everything else is the usual script: `get_peft_model(model, LoraConfig(...))`
(the base frozen, only the adapters trainable), a torch LR schedule,
`torch.nn.utils.clip_grad_norm_` (routed to the engine), evaluation under
`torch.no_grad()`, and `save_pretrained`, which writes the adapter alone.

What it shows: the frozen base costs only its compute copy in the engine
(no fp32 master, no Adam state: `pm.engine.stats` has fp32 lists for the
adapters' chunks only), the base weights do not change, and the saved
adapter, loaded with `PeftModel.from_pretrained` into plain PyTorch, gives
the attached model's logits.

No download: the "pretrained" base is a small GPT-2 made from a config and
saved with save_pretrained first; the data is a toy language (each token
follows from the one before, with noise).

    PYTHONPATH=build/default/python .venv/bin/python examples/python/lora_gpt2.py --steps 40

--check exits 1 unless the evaluation loss fell, the base weights are the
same bits as before, the engine keeps fp32 state for the adapters' chunks
only, and the saved adapter gives the same logits in plain PyTorch.
"""
import argparse
import os
import sys
import tempfile
import warnings

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

import pstar.torch as ptorch

VOCAB, SEQ = 128, 32


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
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # transformers' deprecation, via PEFT
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=3, n_head=4, bos_token_id=0,
                            eos_token_id=0, pad_token_id=0)
        GPT2LMHeadModel(config).save_pretrained(f"{tmp}/base")

        # ---- the fine-tuning script -------------------------------------
        base = GPT2LMHeadModel.from_pretrained(f"{tmp}/base", dtype=torch.bfloat16)
        lora = LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn", "c_fc"], lora_dropout=0.0,
                          fan_in_fan_out=True, task_type="CAUSAL_LM")  # GPT-2's Conv1D: fan_in_fan_out
        model = get_peft_model(base, lora)
        model.print_trainable_parameters()
        # Instead of `optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)`:
        pm = ptorch.attach(model, device="emulated", compute_dtype="bf16", chunk_elems=16384, lr=1e-2,
                           weight_decay=0.0, adamw=1)
        optimizer = pm.optimizer
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))
        train = DataLoader(toy_language(512, 1), batch_size=8, shuffle=True)
        held_out = DataLoader(toy_language(32, 2), batch_size=16)
        frozen = {n: pm.read(n) for n, p in model.named_parameters() if not p.requires_grad}

        first_eval = evaluate(model, held_out)
        step = 0
        while step < args.steps:
            for (ids,) in train:
                loss = model(input_ids=ids, labels=ids).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                step += 1
                if step % 20 == 0:
                    print(f"step {step}: loss {loss.item():.4f}")
                if step == args.steps:
                    break
        last_eval = evaluate(model, held_out)
        print(f"held-out loss: {first_eval:.4f} -> {last_eval:.4f}")
        model.save_pretrained(f"{tmp}/adapter")              # the adapter alone
        # ---- end of the script ----------------------------------------

        print("saved:", sorted(os.listdir(f"{tmp}/adapter")))
        base_same = all(torch.equal(pm.read(n), v) for n, v in frozen.items())
        print("frozen base weights unchanged (bit for bit):", base_same)
        stats = pm.engine.stats
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        print(f"engine: {total} elements, {trainable} trainable; compute list {stats['compute_list_bytes']} bytes "
              f"({stats['compute_chunks']} chunks), each fp32 list (master, m, v) {stats['optimizer_list_bytes']} "
              f"bytes ({stats['optimizer_chunks']} chunks: the adapters'), host {stats['host_bytes']} bytes")
        fp32_for_adapters_only = stats["optimizer_list_bytes"] == 4 * 16384 * stats["optimizer_chunks"] and \
            stats["optimizer_chunks"] == -(-trainable // 16384)
        plain = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(f"{tmp}/base", dtype=torch.bfloat16),
                                          f"{tmp}/adapter", autocast_adapter_dtype=False).eval()
        model.eval()
        ids = next(iter(held_out))[0]
        with torch.no_grad():
            same = torch.equal(plain(input_ids=ids).logits, model(input_ids=ids).logits)
        print("the saved adapter in plain PyTorch gives the same logits:", same)
        if args.check:
            ok = last_eval < first_eval - 0.2 and base_same and fp32_for_adapters_only and same
            if not ok:
                print("check failed", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
