#!/usr/bin/env python3
"""Issue 15 measurements: `--io` modes and `--threads` of the compressed store, each against a
baseline timed in the same round.

1. to-hf from a tp=2 native checkpoint (row-parallel o_proj / down_proj gathered from both ranks'
   column blocks as file runs) with --io buffered / direct / auto, against `cp -r` + sync of the
   same bytes; ckpt fsyncs its output. Also from-hf (one rank) with each --io.
2. Compressed store (shuffle+zstd-1): from-hf --compress with --threads 1 and 2 (write), and
   to-hf --io buffered from that store with --threads 1 and 2 (read + decode); the compression
   ratio from `ckpt inspect --json`.
Model: hf_bench.make_model (TinyLlama-shaped, random bf16 N(0, 0.02)). Memory 'hot' (--hot-gib GiB
touched and freed before each command), page cache warm. Prints one JSON object per round and a
summary of medians; reports `uptime` before and after (the machine is shared).

  .venv/bin/python benchmarks/io15_bench.py --ckpt build/ckpt [--layers 22] [--reps 3] [--dir DIR]
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from hf_bench import dir_bytes, make_model, timed, warm_memory  # noqa: E402


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--dir", default="/tmp/io15_bench")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--hot-gib", type=float, default=4.0)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: io, zstd")
    a = ap.parse_args()
    root = pathlib.Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    hf = root / "hf"
    if not (hf / "model.safetensors").exists():
        make_model(hf, a.layers)
    nbytes = dir_bytes(hf)
    ck = a.ckpt
    tp2 = root / "tp2"
    if not tp2.exists():
        subprocess.run([ck, "from-hf", hf, tp2, "--tp", "2", "--pp", "1", "--dp", "1", "--no-fsync"], check=True)
    zst = root / "zstd"
    skip = set(a.skip.split(","))
    if "zstd" not in skip and not zst.exists():
        subprocess.run([ck, "from-hf", hf, zst, "--compress", "shuffle+zstd:1", "--no-fsync"], check=True)

    def fresh(name):
        p = root / name
        if p.exists():
            shutil.rmtree(p)
        return p

    cases = []
    if "io" not in skip:
        cases.append(("cp", lambda: ["cp", "-r", hf, fresh("cp")], True))
        for io in ("buffered", "direct", "auto"):
            cases.append((f"to-hf tp2 {io}", lambda io=io: [ck, "to-hf", tp2, fresh("out_" + io), "--io", io], False))
            cases.append((f"from-hf {io}", lambda io=io: [ck, "from-hf", hf, fresh("imp_" + io), "--io", io], False))
    if "zstd" not in skip:
        for t in (1, 2):
            cases.append((f"zstd write t{t}", lambda t=t: [ck, "from-hf", hf, fresh(f"zw{t}"), "--compress", "shuffle+zstd:1",
                                                           "--threads", str(t)], False))
            cases.append((f"zstd read t{t}", lambda t=t: [ck, "to-hf", zst, fresh(f"zr{t}"), "--threads", str(t), "--io", "buffered"],
                          False))
    print(json.dumps({"uptime_before": uptime(), "bytes": nbytes, "layers": a.layers}), flush=True)
    times = {name: [] for name, _, _ in cases}
    for rep in range(a.reps):
        row = {}
        for name, cmd, sync in cases:
            warm_memory(a.hot_gib)
            dt, rss, cpu = timed(cmd(), sync=sync)
            times[name].append(dt)
            row[name] = {"s": round(dt, 2), "rss_MiB": round(rss), "cpu_s": round(cpu, 2)}
        row["uptime"] = uptime()
        print(json.dumps({"round": rep, **row}), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    summary = {"medians_s": {k: round(v, 2) for k, v in med.items()}}
    if "cp" in med:
        summary["vs_cp"] = {k: round(med["cp"] / v, 2) for k, v in med.items() if k != "cp"}
    if "zstd write t1" in med:
        summary["zstd_write_t2_speedup"] = round(med["zstd write t1"] / med["zstd write t2"], 2)
        summary["zstd_read_t2_speedup"] = round(med["zstd read t1"] / med["zstd read t2"], 2)
        ins = json.loads(subprocess.run([ck, "inspect", zst, "--json"], capture_output=True, text=True, check=True).stdout)
        summary["inspect_totals"] = ins.get("totals", {})  # compression_ratio, bytes, stored_bytes
    summary["uptime_after"] = uptime()
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()
