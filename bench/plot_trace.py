#!/usr/bin/env python3
"""Plots the accelerator memory of a libpstar timeline per moment.

Reads the Chrome-trace JSON that pstar_trace_export() writes (for example
`pstar-example-mlp --timeline trace.json`) and draws, per moment (one moment
= one parameter acquire), the accelerator bytes held by chunks, gradient
buffers, non-model memory and buffers still being freed, stacked, with the
host tier's bytes on a second axis; moves to and from the accelerator are
marked along the bottom.  Writes a PNG.

    python bench/plot_trace.py trace.json -o memory.png [--capacity BYTES]

Needs matplotlib (packaging/setup-venv.sh installs it in the project's
virtual environment).
"""
import argparse
import bisect
import json
import sys


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    table = doc.get("pstarMoments")
    if not table or not table.get("rows"):
        raise SystemExit(f"{path}: no per-moment table (was the timeline recorded with record_timeline?)")
    cols = table["columns"]
    rows = table["rows"]
    series = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
    moves = [e for e in doc.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") == "move"]
    return doc, series, moves


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", help="Chrome-trace JSON written by pstar_trace_export()")
    ap.add_argument("-o", "--output", default="memory.png", help="PNG to write (default memory.png)")
    ap.add_argument("--capacity", type=float, default=None, help="draw the accelerator capacity (bytes)")
    ap.add_argument("--title", default=None)
    args = ap.parse_args(argv)

    try:
        import matplotlib
    except ImportError:
        print("plot_trace: matplotlib is missing (run packaging/setup-venv.sh)", file=sys.stderr)
        return 77
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc, s, moves = load(args.trace)
    x = s["moment"]
    mib = 1.0 / (1 << 20)
    layers = [("chunks", "chunks"), ("gradient_buffers", "gradient buffers"), ("non_model", "non-model"),
              ("freeing", "being freed")]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.stackplot(x, *[[v * mib for v in s[k]] for k, _ in layers], labels=[label for _, label in layers],
                 step="post", alpha=0.85)
    if args.capacity:
        ax.axhline(args.capacity * mib, color="black", linestyle="--", linewidth=1, label="capacity")
    ax.set_xlabel("moment (parameter acquires since the engine was created)")
    ax.set_ylabel("accelerator MiB")
    host = ax.twinx()
    host.plot(x, [v * mib for v in s["host"]], color="gray", linewidth=1, label="host (held)")
    host.set_ylabel("host MiB")

    # Moves: a tick per move at the moment in which it was issued.
    times = s["seconds"]
    for tid, color, y in ((1, "tab:green", 0.02), (2, "tab:red", 0.05)):
        ms = [x[min(bisect.bisect_right(times, e["ts"] * 1e-6), len(x) - 1)] for e in moves if e.get("tid") == tid]
        ax.plot(ms, [y * ax.get_ylim()[1]] * len(ms), "|", color=color, markersize=6,
                label="moves to accelerator" if tid == 1 else "evictions")
    clock = doc.get("otherData", {}).get("clock", "?")
    ax.set_title(args.title or f"libpstar memory per moment ({len(moves)} moves, {clock} clock)")
    lines, labels = ax.get_legend_handles_labels()
    l2, lb2 = host.get_legend_handles_labels()
    ax.legend(lines + l2, labels + lb2, loc="upper left", fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"plot_trace: wrote {args.output} ({len(x)} moments, {len(moves)} moves)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
