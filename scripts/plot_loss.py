#!/usr/bin/env python3
"""Plots the per-step losses of `ckpt train` runs (their train_log.jsonl) into one PNG.

    plot_loss.py OUT.png LABEL=RUN [LABEL=RUN ...] [--title TEXT] [--mark-step N] [--rtol X]

RUN is a run directory (holding train_log.jsonl) or the jsonl file itself. Each run is one line
(loss against step); runs that overlap (an uninterrupted run and one resumed from its checkpoint)
lie on top of each other, so later runs are drawn thinner and dashed on top of earlier ones.
--mark-step draws a vertical line at a step (the checkpoint the resumed run started from).
Every run after the first is compared with the first on the steps both logged: the largest
relative loss difference is printed, and with --rtol the exit status is 1 when it is larger
(the PNG is written either way).
A missing, empty or malformed log (a line without integer "step" and finite "loss", or a step
logged twice) is an error naming the file and line. Uses matplotlib's Agg backend (no display).
"""
import argparse
import json
import math
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def read_log(path):
    p = pathlib.Path(path)
    if p.is_dir():
        p = p / "train_log.jsonl"
    if not p.is_file():
        sys.exit(f"plot_loss: {p}: no such file (expected a run directory with train_log.jsonl)")
    steps, losses = [], []
    for i, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            step, loss = r["step"], float(r["loss"])
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"plot_loss: {p}:{i}: not a train_log line with step and loss ({e})")
        if not isinstance(step, int) or not math.isfinite(loss):
            sys.exit(f"plot_loss: {p}:{i}: step {step!r} loss {loss!r}: expected an integer step and a finite loss")
        if steps and step <= steps[-1]:
            sys.exit(f"plot_loss: {p}:{i}: step {step} after step {steps[-1]} (steps must increase)")
        steps.append(step)
        losses.append(loss)
    if not steps:
        sys.exit(f"plot_loss: {p}: no steps logged")
    return steps, losses


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="PNG to write")
    ap.add_argument("runs", nargs="+", metavar="LABEL=RUN")
    ap.add_argument("--title", default="training loss")
    ap.add_argument("--mark-step", type=int, default=None)
    ap.add_argument("--rtol", type=float, default=None, help="fail when a run differs more from the first")
    a = ap.parse_args(argv)
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    styles = [dict(lw=4.0, alpha=0.45), dict(lw=1.6, ls="--", marker="o", ms=3.5)]
    runs = []
    for k, spec in enumerate(a.runs):
        label, sep, run = spec.partition("=")
        if not sep or not label or not run:
            sys.exit(f"plot_loss: {spec!r}: expected LABEL=RUN")
        steps, losses = read_log(run)
        runs.append((label, dict(zip(steps, losses))))
        ax.plot(steps, losses, label=label, **styles[min(k, len(styles) - 1)])
    worst = compare(runs)
    if a.mark_step is not None:
        ax.axvline(a.mark_step, color="gray", lw=1, ls=":")
        ax.annotate(f"checkpoint (step {a.mark_step})", (a.mark_step, 1), xycoords=("data", "axes fraction"),
                    xytext=(4, -14), textcoords="offset points", fontsize=8, color="gray")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats)")
    ax.set_title(a.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out)
    print(f"plot_loss: wrote {a.out}")
    if a.rtol is not None and worst > a.rtol:
        print(f"plot_loss: FAIL: a relative loss difference of {worst:.3g} is above --rtol {a.rtol:g}")
        sys.exit(1)


def compare(runs):
    """Prints, for every run after the first, its largest relative loss difference from the first
    over their common steps; returns the largest of them (0 with one run)."""
    worst = 0.0
    label0, ref = runs[0]
    for label, got in runs[1:]:
        common = sorted(set(ref) & set(got))
        if not common:
            sys.exit(f"plot_loss: {label!r} and {label0!r} have no step in common")
        d = max(abs(got[s] - ref[s]) / max(abs(ref[s]), 1e-30) for s in common)
        worst = max(worst, d)
        print(f"plot_loss: {label} vs {label0}: steps {common[0]}-{common[-1]}, "
              f"largest relative loss difference {d:.2g}")
    return worst


if __name__ == "__main__":
    main()
