#!/usr/bin/env python3
"""Convergence with each Adam state format (issue 45): the GPT of
examples/python/train_gpt.py trained for --steps steps with fp32, bf16 and
int8 moments, the same data and seeds; prints each format's final held-out
loss and its relative difference to fp32's as JSON, and with --plot writes
the curves as a PNG (matplotlib).

    PYTHONPATH=build/default/python .venv/bin/python bench/state_format_convergence.py \\
        --steps 1000 --plot docs/img/state_format_convergence.png

Targets (issue 45): held-out loss with bf16 within 0.5% of fp32's, int8
within 1%.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "examples", "python", "train_gpt.py")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--formats", default="fp32,bf16,int8")
    ap.add_argument("--plot", help="write the curves here (PNG)")
    ap.add_argument("--json-out", help="write every run's curves here")
    args = ap.parse_args(argv)
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            out = os.path.join(tmp, fmt + ".json")
            cmd = [sys.executable, TRAIN, "--steps", str(args.steps), "--eval-every", str(args.eval_every),
                   "--state-format", fmt, "--json-out", out]
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            if r.returncode != 0:
                sys.exit(f"state_format_convergence: {fmt} failed:\n{r.stdout}")
            with open(out) as f:
                runs[fmt] = json.load(f)
    base = runs.get("fp32")
    summary = {"bench": "state_format_convergence", "steps": args.steps, "formats": {}}
    for fmt, run in runs.items():
        final = run["held_out"][-1][1]
        entry = {"held_out_loss": final, "train_loss_last10": sum(run["train_loss"][-10:]) / 10,
                 "peak_host_bytes_per_param": run["peak_host_bytes"] / run["params"]}
        if base is not None:
            entry["held_out_vs_fp32"] = final / base["held_out"][-1][1] - 1.0
        summary["formats"][fmt] = entry
    print(json.dumps(summary))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(runs, f)
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        for fmt, run in runs.items():
            tl = run["train_loss"]
            k = 20  # a moving average of the training loss
            smooth = [sum(tl[max(0, i - k + 1):i + 1]) / len(tl[max(0, i - k + 1):i + 1]) for i in range(len(tl))]
            line, = ax.plot(range(1, len(tl) + 1), smooth, label=f"{fmt} train (avg of {k})", linewidth=1)
            xs, ys = zip(*run["held_out"])
            ax.plot(xs, ys, "o--", color=line.get_color(), label=f"{fmt} held-out", markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.set_title(f"train_gpt.py, {base['params'] if base else ''} parameters: Adam state formats")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
