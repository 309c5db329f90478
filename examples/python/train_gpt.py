#!/usr/bin/env python3
"""A small GPT-style model (plain PyTorch modules) trained with its
parameters in libpstar chunks, through pstar.torch.

The text is generated (a deterministic toy language: sentences from a small
grammar), tokenized by characters.  The engine's emulated device holds less
than the model's compute-dtype chunk bytes, so chunks move every iteration;
libpstar's AdamW updates fp32 masters while the model computes in bf16.

    PYTHONPATH=build/default/python .venv/bin/python examples/python/train_gpt.py --steps 200

Prints a progress bar (tqdm) with the loss; --check exits 1 unless the loss
fell by a fifth and chunks moved
(more than one eviction per step).  --state-format stores Adam's moments as
bf16 or int8 codes (docs/user-guide.md); --eval-every N measures the loss on
held-out text (sentences of another seed) every N steps and at the end;
--json-out FILE writes the curves.
"""
import argparse
import json
import math
import random
import sys

import torch

import pstar
import pstar.torch as ptorch

try:
    from tqdm import tqdm
except ImportError:  # the bar is a nicety
    tqdm = None


def toy_text(n_sentences=400, seed=7):
    rnd = random.Random(seed)
    subjects = ["the cat", "a dog", "the old man", "my sister", "the engine", "a small bird"]
    verbs = ["sees", "moves", "likes", "carries", "finds", "follows"]
    objects = ["the chunk", "a red ball", "the river", "some bread", "the last train", "a quiet house"]
    endings = [".", " today.", " again.", " at night."]
    return " ".join(f"{rnd.choice(subjects)} {rnd.choice(verbs)} {rnd.choice(objects)}{rnd.choice(endings)}"
                    for _ in range(n_sentences))


class Block(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.fc = torch.nn.Linear(dim, 4 * dim)
        self.out = torch.nn.Linear(4 * dim, dim)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, dim=64, layers=4, heads=4, context=64):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, dim)
        self.pos = torch.nn.Embedding(context, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(dim)
        for emb in (self.tok, self.pos):
            torch.nn.init.normal_(emb.weight, std=0.02)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return self.ln(x) @ self.tok.weight.t()  # tied head


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--state-format", choices=["fp32", "bf16", "int8"], default="fp32",
                    help="Adam's moments' format (pstar_engine_options.state_format)")
    ap.add_argument("--master-format", choices=["fp32", "bf16"], default="fp32",
                    help="the masters' format (pstar_engine_options.master_format; bf16: stochastic rounding)")
    ap.add_argument("--seed", type=int, default=0, help="the initial weights' and the batches' seed")
    ap.add_argument("--eval-every", type=int, default=0, help="held-out loss every N steps (0: at the end only)")
    ap.add_argument("--json-out", help="write the training and held-out losses here")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 unless the loss fell by a fifth and chunks moved (more than one eviction per step)")
    args = ap.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(max(1, torch.get_num_threads()))

    text = toy_text()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)
    # Held out: sentences of the same grammar drawn with another seed.
    held = torch.tensor([chars.index(c) for c in toy_text(n_sentences=100, seed=11)], dtype=torch.long)
    model = GPT(len(chars), context=args.context)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    model.to(dtype)  # the model computes in the engine's compute dtype
    n_params = sum(p.numel() for p in model.parameters())
    chunk_elems = 1 << 14
    elem_bytes = 2 if args.dtype == "bf16" else 4
    compute_bytes = math.ceil(n_params / chunk_elems) * chunk_elems * elem_bytes
    # Below the compute chunks' bytes: chunks and gradient buffers share 70%
    # of what the chunks alone would take.
    capacity = compute_bytes * 7 // 10
    pm = ptorch.attach(model, device="emulated", compute_dtype=args.dtype, chunk_elems=chunk_elems,
                       device_capacity_bytes=capacity, lr=3e-3, weight_decay=0.01, state_format=args.state_format,
                       master_format=args.master_format, master_seed=45 + args.seed)
    print(f"{n_params} parameters, {len(pm.slots)} tensors, compute chunks {compute_bytes / 1e6:.2f} MB, "
          f"device capacity {capacity / 1e6:.2f} MB ({args.dtype} compute, {args.master_format} masters, "
          f"{args.state_format} Adam moments)")

    # The held-out loss: fixed windows, every one of them, in EVAL iterations.
    held_starts = list(range(0, len(held) - args.context - 1, args.context))

    def held_out_loss():
        total = 0.0
        with torch.no_grad():
            for i in range(0, len(held_starts), args.batch):
                starts = held_starts[i:i + args.batch]
                x = torch.stack([held[s:s + args.context] for s in starts])
                y = torch.stack([held[s + 1:s + args.context + 1] for s in starts])
                with pm.eval_iteration():
                    logits = model(x)
                total += torch.nn.functional.cross_entropy(logits.float().reshape(-1, len(chars)), y.reshape(-1),
                                                           reduction="sum").item()
        return total / (len(held_starts) * args.context)

    held_curve = []

    rng = torch.Generator().manual_seed(1 + args.seed)
    steps = range(args.steps)
    bar = tqdm(steps, desc="train", ncols=80) if tqdm is not None else steps
    losses = []
    for step in bar:
        starts = torch.randint(0, len(data) - args.context - 1, (args.batch,), generator=rng)
        x = torch.stack([data[s:s + args.context] for s in starts])
        y = torch.stack([data[s + 1:s + args.context + 1] for s in starts])
        with pm.train_iteration():
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, len(chars)), y.reshape(-1))
            loss.backward()
            pm.step()
        losses.append(loss.item())
        if args.eval_every and (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            held_curve.append((step + 1, held_out_loss()))
        if tqdm is not None:
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        elif step % 20 == 0:
            print(f"step {step:4d}  loss {losses[-1]:.4f}")
    held_curve.append((args.steps, held_out_loss()))
    stats = pm.engine.stats
    first = sum(losses[:5]) / min(5, len(losses))
    last = sum(losses[-5:]) / min(5, len(losses))
    print(f"loss {first:.4f} -> {last:.4f}; held-out loss {held_curve[-1][1]:.4f}; evictions {stats['evictions']}, "
          f"{stats['bytes_host_to_device'] / 1e6:.1f} MB to the device in {args.steps} steps; "
          f"peak host {stats['peak_host_bytes'] / n_params:.2f} bytes per parameter")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"state_format": args.state_format, "master_format": args.master_format, "seed": args.seed,
                       "dtype": args.dtype, "steps": args.steps,
                       "params": n_params, "train_loss": losses, "held_out": held_curve,
                       "peak_host_bytes": stats["peak_host_bytes"]}, f)
    if args.check and not (last < first * 0.8 and stats["evictions"] > args.steps):
        print("check failed: the loss did not fall by a fifth, or chunks did not move every step")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
