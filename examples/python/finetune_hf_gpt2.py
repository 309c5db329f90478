#!/usr/bin/env python3
"""Fine-tuning a Hugging Face GPT-2 the way the transformers docs write the
loop, with its parameters in libpstar chunks.  Two lines differ from the
plain PyTorch script: `ptorch.attach(...)` where the optimizer was created,
and `pm.step()` where `optimizer.step(); optimizer.zero_grad()` were.

Everything else is the usual script: `from_pretrained`, freezing a part of
the model, gradient checkpointing (reentrant or not), a DataLoader of padded
batches with `attention_mask` and -100 labels, `batch.to(model.device)`,
evaluation under `torch.no_grad()`, `generate()` and `save_pretrained`.

No download: the "pretrained" model is a small GPT-2 made from a config and
saved with save_pretrained first.  The data is a toy language (each token
follows from the one before, with noise), so that the loss can fall.

    PYTHONPATH=build/default/python .venv/bin/python examples/python/finetune_hf_gpt2.py --steps 60

--check exits 1 unless the evaluation loss fell, chunks were evicted, and
the saved model, loaded with from_pretrained into plain PyTorch, gives the
same logits as the attached one.
"""
import argparse
import sys
import tempfile

import torch
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging as hf_logging

import pstar.torch as ptorch

VOCAB, SEQ = 128, 32


def toy_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.empty(n, SEQ, dtype=torch.long)
    ids[:, 0] = torch.randint(1, VOCAB, (n,), generator=g)
    for t in range(1, SEQ):
        noise = torch.randint(0, 8, (n,), generator=g) == 0
        nxt = (ids[:, t - 1] * 5 + 1) % (VOCAB - 1) + 1
        ids[:, t] = torch.where(noise, torch.randint(1, VOCAB, (n,), generator=g), nxt)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=g)
    mask = (torch.arange(SEQ)[None, :] < lengths[:, None]).long()
    ids = ids * mask                       # pad token 0 after each sequence's end
    labels = ids.masked_fill(mask == 0, -100)
    return TensorDataset(ids, mask, labels)


def collate(rows):
    ids, mask, labels = (torch.stack(x) for x in zip(*rows))
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def evaluate(model, loader):
    model.eval()
    total, n = 0.0, 0
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(model.device) for k, v in batch.items()}
            total += model(**batch).loss.item()
            n += 1
    model.train()
    return total / n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reentrant", action="store_true", help="reentrant gradient checkpointing")
    ap.add_argument("--capacity-kib", type=int, default=160, help="the emulated device's capacity")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as tmp:
        config = GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=3, n_head=4, bos_token_id=0,
                            eos_token_id=0, pad_token_id=0)
        GPT2LMHeadModel(config).save_pretrained(f"{tmp}/base")

        # ---- the fine-tuning script -------------------------------------
        model = GPT2LMHeadModel.from_pretrained(f"{tmp}/base", dtype=torch.bfloat16)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": args.reentrant})
        for param in model.transformer.wpe.parameters():        # freeze the position embedding
            param.requires_grad = False
        train = DataLoader(toy_dataset(512, seed=1), batch_size=8, shuffle=True, collate_fn=collate)
        held_out = DataLoader(toy_dataset(64, seed=2), batch_size=16, collate_fn=collate)

        # Instead of `optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)`:
        pm = ptorch.attach(model, device="emulated", compute_dtype="bf16", chunk_elems=16384,
                           device_capacity_bytes=args.capacity_kib << 10, lr=3e-3, weight_decay=0.01, adamw=1)

        first_eval = evaluate(model, held_out)
        model.train()
        step = 0
        while step < args.steps:
            for batch in train:
                batch = {k: v.to(model.device) for k, v in batch.items()}
                outputs = model(**batch)
                loss = outputs.loss
                loss.backward()
                pm.step()                  # instead of optimizer.step(); optimizer.zero_grad()
                step += 1
                if step % 20 == 0:
                    print(f"step {step}: loss {loss.item():.4f}")
                if step == args.steps:
                    break
        last_eval = evaluate(model, held_out)
        print(f"held-out loss: {first_eval:.4f} -> {last_eval:.4f}")
        model.eval()
        prompt = next(iter(held_out))["input_ids"][:1, :6].to(model.device)
        print("generated:", model.generate(prompt, max_new_tokens=10, do_sample=False)[0].tolist())
        model.save_pretrained(f"{tmp}/finetuned")
        # ---- end of the script ----------------------------------------

        stats = pm.engine.stats
        print(f"engine: {stats['steps']} steps, {stats['evictions']} evictions")
        plain = GPT2LMHeadModel.from_pretrained(f"{tmp}/finetuned", dtype=torch.bfloat16).eval()
        batch = next(iter(held_out))
        with torch.no_grad():
            same = torch.equal(plain(**batch).logits, model(**batch).logits)
        print("from_pretrained of the saved model gives the same logits:", same)
        if args.check:
            ok = last_eval < first_eval - 0.2 and stats["evictions"] > 0 and same
            if not ok:
                print("check failed", file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
