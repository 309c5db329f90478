#!/usr/bin/env python3
"""Convergence with each Adam state format (issue 45): the GPT of
examples/python/train_gpt.py trained for --steps steps with fp32, bf16 and
int8 moments, and int8 moments with bf16 masters ("int8+bf16m"), the same
data and seeds per format; with --seeds N each format trains N times (seeds
0..N-1: initial weights, batches and the masters' rounding bits), and the
figure compared is the mean over seeds of the final held-out loss, since one
run's final loss moves by more than the targets from seed to seed.  Prints
each format's per-seed and mean final held-out loss and the mean's relative
difference to fp32's as JSON, and with --plot writes seed 0's curves as a
PNG (matplotlib).

    PYTHONPATH=build/default/python .venv/bin/python bench/state_format_convergence.py \\
        --steps 1000 --seeds 3 --plot docs/img/state_format_convergence.png

Targets (issue 45): held-out loss with bf16 within 0.5% of fp32's, int8
within 1%, int8 with bf16 masters within 2%.
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
    ap.add_argument("--formats", default="fp32,bf16,int8,int8+bf16m",
                    help="moment formats; '+bf16m' adds bf16 masters")
    ap.add_argument("--seeds", type=int, default=1, help="runs per format (seeds 0..N-1)")
    ap.add_argument("--plot", help="write the curves here (PNG)")
    ap.add_argument("--json-out", help="write every run's curves here")
    args = ap.parse_args(argv)
    runs = {}  # format -> the runs of seeds 0..N-1
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in args.formats.split(","):
            moments, _, masters = fmt.partition("+")
            runs[fmt] = []
            for seed in range(args.seeds):
                out = os.path.join(tmp, f"{fmt}-{seed}.json")
                cmd = [sys.executable, TRAIN, "--steps", str(args.steps), "--eval-every", str(args.eval_every),
                       "--state-format", moments, "--seed", str(seed), "--json-out", out]
                if masters == "bf16m":
                    cmd += ["--master-format", "bf16"]
                elif masters:
                    sys.exit(f"state_format_convergence: unknown masters '{masters}' in {fmt}")
                r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                if r.returncode != 0:
                    sys.exit(f"state_format_convergence: {fmt} seed {seed} failed:\n{r.stdout}")
                with open(out) as f:
                    runs[fmt].append(json.load(f))
    mean_final = {fmt: sum(r["held_out"][-1][1] for r in rs) / len(rs) for fmt, rs in runs.items()}
    summary = {"bench": "state_format_convergence", "steps": args.steps, "seeds": args.seeds, "formats": {}}
    for fmt, rs in runs.items():
        entry = {"held_out_loss": mean_final[fmt], "held_out_loss_per_seed": [r["held_out"][-1][1] for r in rs],
                 "train_loss_last10": sum(sum(r["train_loss"][-10:]) / 10 for r in rs) / len(rs),
                 "peak_host_bytes_per_param": rs[0]["peak_host_bytes"] / rs[0]["params"]}
        if "fp32" in mean_final:
            entry["held_out_vs_fp32"] = mean_final[fmt] / mean_final["fp32"] - 1.0
            entry["held_out_vs_fp32_per_seed"] = [
                r["held_out"][-1][1] / b["held_out"][-1][1] - 1.0 for r, b in zip(rs, runs["fp32"])]
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
        for fmt, rs in runs.items():
            run = rs[0]
            tl = run["train_loss"]
            k = 20  # a moving average of the training loss
            smooth = [sum(tl[max(0, i - k + 1):i + 1]) / len(tl[max(0, i - k + 1):i + 1]) for i in range(len(tl))]
            line, = ax.plot(range(1, len(tl) + 1), smooth, label=f"{fmt} train (avg of {k})", linewidth=1)
            xs, ys = zip(*run["held_out"])
            ax.plot(xs, ys, "o--", color=line.get_color(), label=f"{fmt} held-out", markersize=3)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy")
        ax.set_title(f"train_gpt.py, {next(iter(runs.values()))[0]['params']} parameters, seed 0: Adam state formats")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
