#!/usr/bin/env python3
"""What the source checks cost: two ckpt binaries (a base, e.g. a build of the commit before the
checks, and the new one) timed side by side, interleaved round by round, on the same 3.08 GB
bf16 LLaMA (io_modes_bench's model: 20 layers, hidden 2560, FFN 6912, GQA 20/4, vocab 32000).

Each binary works on a store it wrote itself (the base may not read the new manifest version;
the shard bytes are the same): `from-hf` then `reshard` to tp=4 pp=2, untimed. Timed, per round
and binary, in the state --state says (io_modes_bench's State: hot = memory touched and freed, the
sources read once; idle = caches dropped and a sleep):
  verify       `ckpt verify SRC`
  reshard      `ckpt reshard SRC OUT --tp 2 --pp 3` (source check on: the default)
  to-hf        `ckpt to-hf SRC OUT` (the new binary checks SRC's digests before it commits)
  to-hf nv     the new binary's `to-hf --no-verify` (the export alone)
Prints one JSON line per command, then the medians and the ratios new / base.

  .venv/bin/python benchmarks/check_cost_bench.py --base /work/old/build/ckpt --new build/ckpt --reps 3
"""
import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from hf_bench import timed  # noqa: E402
from io_modes_bench import State, make_llama, uptime  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the ckpt binary to compare against")
    ap.add_argument("--new", default="build/ckpt")
    ap.add_argument("--dir", default="/tmp/check_cost_bench")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--state", default="hot", choices=["hot", "idle"])
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--hot-gib", type=float, default=4.0)
    ap.add_argument("--only", default="", help="comma list of commands to time (verify, reshard, to-hf); default all")
    ap.add_argument("--idle-sleep", type=float, default=30.0)
    a = ap.parse_args()
    d = pathlib.Path(a.dir)
    d.mkdir(parents=True, exist_ok=True)
    hf = d / "hf"
    if not (hf / "model.safetensors").exists():
        make_llama(hf, a.layers, 2560, 6912, 20, 4, 32000)
    bins = {"base": a.base, "new": a.new}
    for name, b in bins.items():
        src = d / f"src_{name}"
        if not src.exists():
            subprocess.run([b, "from-hf", hf, d / f"one_{name}"], check=True, stdout=subprocess.DEVNULL)
            subprocess.run([b, "reshard", d / f"one_{name}", src, "--tp", "4", "--pp", "2", "--dp", "1"], check=True,
                           stdout=subprocess.DEVNULL)
            shutil.rmtree(d / f"one_{name}")
    out = d / "out"
    cases = [("verify", "base", ["verify", "{src}"]), ("verify", "new", ["verify", "{src}"]),
             ("reshard", "base", ["reshard", "{src}", "{out}", "--tp", "2", "--pp", "3", "--dp", "1"]),
             ("reshard", "new", ["reshard", "{src}", "{out}", "--tp", "2", "--pp", "3", "--dp", "1"]),
             ("to-hf", "base", ["to-hf", "{src}", "{out}"]), ("to-hf", "new", ["to-hf", "{src}", "{out}"]),
             ("to-hf nv", "new", ["to-hf", "{src}", "{out}", "--no-verify"])]
    if a.only:
        keep = set(a.only.split(","))
        cases = [c for c in cases if c[0] in keep or (c[0] == "to-hf nv" and "to-hf" in keep)]
    state = State(a)
    res = {}
    for r in range(a.reps):
        print(f"# round {r + 1}: {uptime()}", flush=True)
        for what, who, args in cases:
            shutil.rmtree(out, ignore_errors=True)
            src = d / f"src_{who}"
            state.enter(a.state, [src])
            cmd = [bins[who]] + [x.format(src=src, out=out) for x in args]
            sec, rss, cpu = timed(cmd, sync=True)
            res.setdefault((what, who), []).append(sec)
            print(json.dumps({"round": r + 1, "command": what, "binary": who, "seconds": round(sec, 3),
                              "rss_mib": round(rss, 1), "cpu_s": round(cpu, 2), "state": a.state}), flush=True)
    shutil.rmtree(out, ignore_errors=True)
    print(f"\nmedians of {a.reps} rounds ({a.state}):")
    for what in ("verify", "reshard", "to-hf"):
        if (what, "base") not in res:
            continue
        b, n = statistics.median(res[(what, "base")]), statistics.median(res[(what, "new")])
        print(f"  {what:8s} base {b:6.2f} s  new {n:6.2f} s  new/base {n / b:5.2f}")
    if ("to-hf nv", "new") not in res:
        return
    nv = statistics.median(res[("to-hf nv", "new")])
    print(f"  to-hf --no-verify (new) {nv:6.2f} s; with the check / without {statistics.median(res[('to-hf', 'new')]) / nv:5.2f}")


if __name__ == "__main__":
    main()
