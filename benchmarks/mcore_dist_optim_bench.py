#!/usr/bin/env python3
"""Benchmark (issue 35 acceptance, docs/BENCHMARKS.md "megatron-core's own load + save"): a >= 2 GB Megatron-Core
torch_dist checkpoint WITH the distributed optimizer, written by megatron-core 0.19.2 itself, converted to another
layout by megatron-core (its own `dist_checkpointing.load` + `dist_checkpointing.save`) and by ckpt, in the same run.

Source (untimed, made once under --dir by benchmarks/mcore_dist_optim_worker.py `make` in /work/venv-mcore019): the
TinyLlama-shaped GPTModel with --layers layers (2: 219 M parameters) at tp 2, bf16 parameters, megatron-core's DDP
(one bucket, Megatron-LM's default) and DistributedOptimizer (Adam, fp32 masters), one step, saved as Megatron-LM
saves torch_dist: `dp_reshardable` (fp32 masters, exp_avg, exp_avg_sq buckets per model-parallel group + bf16 weights).

Timed commands (each round runs all of them, rotated; medians over --reps rounds; page cache warm: the source is
read before every command; each output deleted after its command):
  megatron-core load + save  worker `load-save`: torchrun --nproc-per-node 2 (tp 2, gloo, CPU shims); builds model +
                             DDP + DistributedOptimizer, dist_checkpointing.load of their sharded state dict
                             (dp_reshardable), load_state_dict, dist_checkpointing.save as `fully_reshardable`
                             (the sharding type megatron-core reshards to another tp / pp on load).
  ckpt export-megatron SRC   `ckpt export-megatron SRC OUT --format torch_dist --tp 2 --dist-opt --dp 1
                             --dist-opt-sharding fully_reshardable --local-norms`: the same conversion in one pass
                             (the source opened as any ckpt source; masters, moments, step and param groups carried).
  ckpt import + export       `ckpt reshard SRC STORE --tp 2 --pp 1 --dp 1` (the native store: masters, both moments,
                             step) then `ckpt export-megatron STORE OUT` with the same flags: two passes via the store.
  ckpt import                the first of those alone.
  ckpt reshard -> tp1        `ckpt reshard SRC OUT --tp 1 --pp 1 --dp 1`: straight to a layout megatron-core's
                             dp_reshardable cannot load into.
Wall time; peak RSS of the command's whole process tree (psutil, the sum over the live processes, sampled every
20 ms; megatron-core runs 3 processes: torchrun and 2 ranks); CPU seconds (the tree's, from getrusage of the
children). Load average before every command, uptime before and after.

    .venv/bin/python benchmarks/mcore_dist_optim_bench.py --ckpt build/ckpt [--reps 3] [--dir /work/bench-data/m35mc]

Writes its report under the key megatron_core_load_save of --json (docs/megatron_import_optim_bench.json, which
keeps the Python comparison of benchmarks/megatron_import_bench.py --formats torch_dist_optim beside it).
"""
import argparse
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import time

import psutil

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "benchmarks" / "mcore_dist_optim_worker.py"


def tree_rss(p):
    total = 0
    try:
        procs = [p] + p.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0, 0
    biggest = 0
    for q in procs:
        try:
            r = q.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        total += r
        biggest = max(biggest, r)
    return total, biggest


def run_tree(cmd, env=None):
    """(wall s, peak tree RSS MiB, peak single-process RSS MiB, CPU s, stdout) of cmd."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    ps = psutil.Process(proc.pid)
    peak = single = 0
    while proc.poll() is None:
        t, b = tree_rss(ps)
        peak, single = max(peak, t), max(single, b)
        time.sleep(0.02)
    out, err = proc.communicate()
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {err.decode()[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return dt, peak / 2**20, single / 2**20, cpu, out.decode()


def load_avg():
    return float(open("/proc/loadavg").read().split()[0])


def read_all(d):
    for p in pathlib.Path(d).rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(16 << 20):
                    pass


def dir_bytes(d):
    return sum(p.stat().st_size for p in pathlib.Path(d).rglob("*") if p.is_file())


def commands(a, src, work):
    ck = a.ckpt
    store, out = work / "store", work / "out"
    mc_env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    export = ["--format", "torch_dist", "--tp", "2", "--dist-opt", "--dp", "1", "--dist-opt-sharding", "fully_reshardable",
              "--local-norms"]
    return {
        "megatron-core load + save (fully_reshardable)": [
            ([a.mcore_python, WORKER, "load-save", src, out, "--tp", "2", "--layers", str(a.layers)], mc_env)],
        "ckpt export-megatron SRC (fully_reshardable)": [([ck, "export-megatron", src, out, *export], None)],
        "ckpt import + export (fully_reshardable)": [
            ([ck, "reshard", src, store, "--tp", "2", "--pp", "1", "--dp", "1", "--threads", str(a.threads)], None),
            ([ck, "export-megatron", store, out, *export], None)],
        "ckpt import (tp2)": [([ck, "reshard", src, store, "--tp", "2", "--pp", "1", "--dp", "1", "--threads", str(a.threads)], None)],
        "ckpt reshard -> tp1": [([ck, "reshard", src, out, "--tp", "1", "--pp", "1", "--dp", "1", "--threads", str(a.threads)], None)],
    }


def run_one(steps, src, work):
    """Runs the steps of one command; returns its figures (times and CPU added, peaks the max) and output bytes."""
    read_all(src)
    res = {"seconds": 0.0, "peak_rss_mib": 0.0, "peak_process_rss_mib": 0.0, "cpu_seconds": 0.0, "load_before": load_avg()}
    for cmd, env in steps:
        dt, peak, single, cpu, stdout = run_tree(cmd, env)
        res["seconds"] += dt
        res["cpu_seconds"] += cpu
        res["peak_rss_mib"] = max(res["peak_rss_mib"], peak)
        res["peak_process_rss_mib"] = max(res["peak_process_rss_mib"], single)
        for line in stdout.splitlines():
            if line.startswith("{\"phases\""):
                res["phases"] = json.loads(line)["phases"]
    out = work / "out" if (work / "out").exists() else work / "store"
    res["output_bytes"] = dir_bytes(out)
    for d in ("store", "out"):
        shutil.rmtree(work / d, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", default=str(ROOT / "build" / "ckpt"))
    ap.add_argument("--mcore-python", default="/work/venv-mcore019/bin/python")
    ap.add_argument("--dir", default="/work/bench-data/m35mc")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", action="append", default=[], help="command name prefix (repeatable)")
    ap.add_argument("--json", default=str(ROOT / "docs" / "megatron_import_optim_bench.json"))
    a = ap.parse_args()
    root = pathlib.Path(a.dir)
    src = root / "src"
    if not (src / "latest_checkpointed_iteration.txt").exists():
        t0 = time.perf_counter()
        subprocess.run([a.mcore_python, WORKER, "make", src, "--tp", "2", "--layers", str(a.layers)], check=True,
                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=""), capture_output=True)
        print(f"made {src} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    work = root / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    cmds = {k: v for k, v in commands(a, src, work).items() if not a.only or any(k.startswith(o) for o in a.only)}
    report = {"machine": {"uptime_before": open("/proc/loadavg").read().strip(), "nproc": os.cpu_count(),
                          "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())},
              "settings": vars(a), "source": str(src), "source_bytes": dir_bytes(src), "runs": {k: [] for k in cmds}}
    names = list(cmds)
    for r in range(a.reps):
        for k in names[r % len(names):] + names[:r % len(names)]:
            res = run_one(cmds[k], src, work)
            report["runs"][k].append(res)
            print(f"round {r}: {k}: {res['seconds']:.2f} s, tree peak {res['peak_rss_mib']:.0f} MiB "
                  f"(load {res['load_before']:.2f})", file=sys.stderr, flush=True)
    report["machine"]["uptime_after"] = open("/proc/loadavg").read().strip()
    base = statistics.median(x["seconds"] for x in report["runs"].get(names[0], [])) if names[0].startswith("megatron") else None
    summary = {}
    for k, runs in report["runs"].items():
        s = statistics.median(x["seconds"] for x in runs)
        summary[k] = {"median_seconds": s, "all_seconds": [round(x["seconds"], 2) for x in runs],
                      "peak_rss_mib": max(x["peak_rss_mib"] for x in runs),
                      "peak_process_rss_mib": max(x["peak_process_rss_mib"] for x in runs),
                      "cpu_seconds": statistics.median(x["cpu_seconds"] for x in runs),
                      "output_bytes": runs[-1]["output_bytes"], "megatron_core_over_this": base / s if base else None}
        if any("phases" in x for x in runs):
            summary[k]["phases_median"] = {p: statistics.median(x["phases"][p] for x in runs) for p in runs[0]["phases"]}
    report["summary"] = summary
    out = pathlib.Path(a.json)  # beside the issue-35 Python comparison in the same file: key megatron_core_load_save
    merged = json.loads(out.read_text()) if out.exists() else {}
    merged["megatron_core_load_save"] = report
    out.write_text(json.dumps(merged, indent=1, default=str) + "\n")
    print(f"\nsource {report['source_bytes'] / 1e9:.2f} GB, {a.reps} rounds")
    print(f"{'command':48} {'median s':>9} {'vs mcore':>9} {'CPU s':>7} {'tree peak MiB':>14}")
    for k, s in summary.items():
        ratio = f"{s['megatron_core_over_this']:.1f}x" if s["megatron_core_over_this"] else "-"
        print(f"{k:48} {s['median_seconds']:9.2f} {ratio:>9} {s['cpu_seconds']:7.1f} {s['peak_rss_mib']:14.0f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
