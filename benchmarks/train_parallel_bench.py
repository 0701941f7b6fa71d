#!/usr/bin/env python3
"""Benchmark of the parallel trainer (docs/BENCHMARKS.md "Parallel trainer"): `ckpt train` on one process against 2 ranks.

    python3 benchmarks/train_parallel_bench.py [--ckpt build/ckpt] [--dir /tmp/ckpt_train_bench]
                                               [--steps 6] [--small]

Config (written by the script): LLaMA, 4 layers, hidden 512, 8 heads (8 KV heads), ffn 1376,
vocab 2048, seq 128; global batch 8 sequences per step everywhere (one process: micro-batch 2 x
grad-accum 4). Runs, each a fresh run dir:
  one process with 1 and 2 OpenBLAS threads; 2 ranks (1 thread each) as dp=2, tp=2, pp=2 (m=4
  micro-batches per step) and pp=2 with m=8 (micro-batch 1); every run saves once, synchronously,
  at its last step (--save-every 0 --sync-save), so that step's save_blocked_s is the whole save
  (max over ranks).
  Then a dp=4 zero-0 run (4 ranks, 1 step) whose shard files are compared: largest / mean.
Figures from train_log.jsonl: tokens/s = global tokens / median step seconds over the steps after
the first, the last (saving) excluded; comm and idle shares = median comm_s / seconds and idle_s / seconds
(max over ranks, as the trainer logs them). The bubble of pp=2 is compared with (p-1)/(m+p-1).
Prints the machine state (uptime, free -g) before and after and a markdown table. stdlib only.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import time

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2048,
    "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 64, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False,
    "hidden_act": "silu",
}
SMALL = dict(CONFIG, hidden_size=128, intermediate_size=352, head_dim=16, vocab_size=512)
SEQ = 128
GLOBAL_BATCH = 8

# name -> (processes, threads, layout flags, micro-batches per step m); every one is 8 sequences/step.
RUNS = [
    ("one, 1 thread", 1, 1, ["--micro-batch", 2, "--grad-accum", 4], 4),
    ("one, 2 threads", 1, 2, ["--micro-batch", 2, "--grad-accum", 4], 4),
    ("dp=2", 2, 1, ["--dp", 2, "--micro-batch", 2, "--grad-accum", 2], 2),
    ("tp=2", 2, 1, ["--tp", 2, "--micro-batch", 2, "--grad-accum", 4], 4),
    ("pp=2, m=4", 2, 1, ["--pp", 2, "--micro-batch", 2, "--grad-accum", 4], 4),
    ("pp=2, m=8", 2, 1, ["--pp", 2, "--micro-batch", 1, "--grad-accum", 8], 8),
]


def mpirun(n):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
            "--mca", "pml", "ob1", "-np", str(n)] if n > 1 else []


def machine_state():
    up = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    free = subprocess.run(["free", "-g"], capture_output=True, text=True).stdout.strip()
    return f"{up}\n{free}"


def train(args, cfg, out, n, threads, flags, extra=()):
    shutil.rmtree(out, ignore_errors=True)
    cmd = mpirun(n) + [args.ckpt, "train", "--config", str(cfg), "--seq-len", str(SEQ), "--threads", str(threads),
                       "--seed", "1", "--warmup", "2", "--out", str(out), *map(str, flags), *map(str, extra)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    log = [json.loads(l) for l in (out / "train_log.jsonl").read_text().splitlines()]
    return log, wall


def summarize(log, save_step):
    steady = [r for r in log if r["step"] > 1 and r["step"] != save_step] or log
    sec = statistics.median(r["seconds"] for r in steady)
    share = lambda key: statistics.median(r.get(key, 0.0) / r["seconds"] for r in steady)  # noqa: E731
    saved = [r.get("save_blocked_s", 0.0) for r in log if r["step"] == save_step]
    return {"seconds": sec, "tokens_per_s": GLOBAL_BATCH * SEQ / sec, "comm": share("comm_s"),
            "idle": share("idle_s"), "compute": share("compute_s"), "save_s": saved[0] if saved else float("nan")}


def shard_balance(args, cfg, root):
    """dp=4 zero-0, one step: bytes of the shard files of the saved checkpoint, largest / mean."""
    out = root / "dp4_zero0"
    train(args, cfg, out, 4, 1, ["--dp", 4, "--zero", 0, "--micro-batch", 2, "--grad-accum", 1, "--steps", 1])
    files = sorted((out / "step-00000001" / "shards").glob("*"))
    sizes = [f.stat().st_size for f in files]
    return sizes, max(sizes) / (sum(sizes) / len(sizes))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default=str(pathlib.Path(__file__).resolve().parents[1] / "build" / "ckpt"))
    ap.add_argument("--dir", default="/tmp/ckpt_train_bench")
    ap.add_argument("--steps", type=int, default=6, help="steps per run (>= 3)")
    ap.add_argument("--small", action="store_true", help="hidden 128 smoke-test config (not for figures)")
    args = ap.parse_args()
    root = pathlib.Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    cfg = root / "config.json"
    cfg.write_text(json.dumps(SMALL if args.small else CONFIG))
    print("machine state before:\n" + machine_state(), flush=True)
    rows = []
    for name, n, threads, flags, m in RUNS:
        log, wall = train(args, cfg, root / name.replace(" ", "").replace(",", "_").replace("=", ""), n, threads, flags,
                          ["--steps", args.steps, "--save-every", 0, "--sync-save"])
        s = summarize(log, args.steps)
        rows.append((name, n, threads, m, s, wall))
        print(f"done: {name} ({wall:.1f} s)", flush=True)
    sizes, ratio = shard_balance(args, cfg, root)
    base = rows[0][4]
    print("\n| run | ranks | BLAS threads | m | step s | tokens/s | vs one 1-thr | compute | comm | idle | "
          "(p-1)/(m+p-1) | save s | save vs one |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, n, threads, m, s, _ in rows:
        bubble = f"{1 / (m + 1):.3f}" if name.startswith("pp") else "-"
        print(f"| {name} | {n} | {threads} | {m} | {s['seconds']:.3f} | {s['tokens_per_s']:.0f} | "
              f"{s['tokens_per_s'] / base['tokens_per_s']:.2f}x | {s['compute']:.1%} | {s['comm']:.1%} | "
              f"{s['idle']:.1%} | {bubble} | {s['save_s']:.3f} | {s['save_s'] / base['save_s']:.2f}x |")
    print(f"\ndp=4 zero-0 shard files (bytes): {sizes}; largest / mean = {ratio:.3f} (goal <= 1.25)")
    print("\nmachine state after:\n" + machine_state())


if __name__ == "__main__":
    main()
