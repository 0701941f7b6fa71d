#!/usr/bin/env python3
"""The I/O floor, by day (issue 34; docs/BENCHMARKS.md "I/O floor, by day"): ckpt's writers against
the disk's own floor and a plain copy, interleaved in one run, in both memory states, with the
machine's state recorded. The disk of this (shared, virtual) machine changes from day to day, and
which I/O path is faster changes with it: every run is a record of its day, not the best day.

Model: io_modes_bench's bf16 LLaMA (hidden 2560, FFN 6912, GQA 20/4, vocab 32000); --gib 3 (the
default) is its 20 layers, 3.08 GB (2.87 GiB); the layer count scales with --gib (round(gib * 20 / 3)).
Sources, made once per shape in --dir (untimed, in a child: this harness never imports torch): the
HF directory, `ckpt from-hf` stores tp=4 pp=2 (the reshard source), tp=1 and tp=2 pp=3 dp=2 (the
to-hf sources), and the tp=4 pp=2 rank files of the Python stack.

Commands (--parts, comma list; default all), in this order in every round and state:
  cp       `cp src`: cp -r of the tp=4 pp=2 store + sync
  dd       `dd1` / `dd2`: `dd if=/dev/zero oflag=direct conv=fsync bs=32M` (--dd-mib), one writer / two
           writers at once, of as many bytes as the store (rounded up to whole 32 MiB requests):
           the disk's write floor, no read, no CPU work
           `dd copy`: every data file of the tp=4 pp=2 store (shards/*.h5) copied by `dd iflag=direct oflag=direct
           conv=fsync bs=32M`, two dd at a time until all are done: the read + write floor (the store's shard
           bytes read and written; an idle-state reshard reads its source from the disk too). iflag=direct reads
           the disk in the hot state as well (the source is page-cached there): a floor for the idle state mainly
           `dd read`: the same files read by `dd iflag=direct of=/dev/null bs=32M`, two at a time: the read floor
           (dd2 s / dd read s: the most against dd2 that a job reading its source cold can reach)
  reshard  `ckpt reshard` tp=4 pp=2 -> tp=2 pp=3 [6,7,7] dp=1, source check on, once per --io-modes
           entry: `default` is no --io flag (the default flags: --io auto), then `--io buffered`,
           `--io direct`; their order rotates by one each round
  python   `python stack`: the same reshard the way Megatron's converters do it (io_modes_bench's
           PY_STACK: torch.load every rank file, torch.cat over tp, re-split, torch.save + fsync)
  convert  `convert mcore`: `ckpt convert --profile megatron-mcore` of the same store to the same
           layout (compared with cp src)
  hf       `cp hf` (cp -r of the HF directory + sync), `from-hf` (one rank), `to-hf 1` (from tp=1),
           `to-hf 2x3x2` (from tp=2 pp=3 dp=2)
  trainer  `trainer_bench --save-only` (--trainer-bench, default next to --ckpt; --trainer-args: a 1.12 GB
           checkpoint): the trainer's save, rows `trainer save (write)` (a synchronous save less its snapshot
           copy), `(sync blocked)`, `(async blocked)` (the loop's blocking time; each its medians of 3 saves);
           then `dd2 trainer`: dd2 of the checkpoint's bytes, the write's floor
convert, hf and trainer run in the --hf-states (default hot: their bounds are against cp / dd hot), the others
in every --states. Every ckpt command gets --json (kept) and --max-memory when given (else ckpt's default).

States (io_modes_bench's State, before EVERY timed command, the previous output removed): hot =
--hot-gib GiB touched and freed, the sources read once; idle = sync, page cache dropped (root; with
--drop fadvise or where refused, the sources' pages only), then --idle-sleep s (30). Wall seconds
include a final `sync`; peak RSS and CPU s are the command's (wait4). --rounds (3) of every state.

Printed: the machine's state (date, load, memory, disk queue, busiest processes) at the start, per
round and state, and at the end; a JSON line per command; per state a table (rounds, median, peak
RSS / budget) and the ratios baseline s / command s (> 1: faster) of the medians and paired per
round, with the issue's bounds. --json FILE: all of it (rows: every timed command's raw seconds).

  .venv/bin/python benchmarks/io_floor_bench.py --ckpt build/ckpt --json /tmp/io_floor.json
  .venv/bin/python benchmarks/io_floor_bench.py --quick --dir /tmp/iofq   # smoke test: tiny model, one round
"""
import argparse
import datetime
import hashlib
import json
import os
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from hf_bench import dir_bytes, timed  # noqa: E402
from io_modes_bench import State  # noqa: E402
from io_floor.cases import BASE_SHAPE, QUICK_SHAPE, QUICK_TRAINER_ARGS, TRAINER_ARGS, make_cases, ordered, prepare  # noqa: E402
from io_floor.machine import budget_mib, machine_state, say  # noqa: E402
from io_floor.ratios import compute_ratios, memory_rows  # noqa: E402
from io_floor.render import markdown, report  # noqa: E402


def run_rounds(a, cases, st, states, hf_states, root, out, rows, res, src_bytes):
    """Every round: every state in turn, every command after its state is set up; appends to rows. Stops
    before a command when the disk has less free space than its output needs (the machine is shared)."""
    for rnd in range(a.rounds):
        for s in states:
            ms = dict(machine_state(root, brief=True), round=rnd, state=s)
            res["round_states"].append(ms)
            say({"round": rnd, "state": s, "uptime": ms["uptime"], "MemFree_MiB": ms["mem"]["MemFree_MiB"],
                 "busiest": ms["busiest"][:3]})
            for c in ordered(cases, rnd):
                if c.part in ("convert", "hf", "trainer") and s not in hf_states:
                    continue
                shutil.rmtree(out, ignore_errors=True)  # the last output's page cache freed: part of the state
                free = shutil.disk_usage(root).free
                if free < (c.space() if c.space else src_bytes * 1.1) + (1 << 30):
                    raise RuntimeError(f"{free / 2**30:.1f} GiB free under {root}: not enough for the output of {c.name}")
                argv = c.argv()
                st.enter(s, c.sources)
                with tempfile.TemporaryFile("w+") as f:
                    dt, rss, cpu = timed(argv, sync=True, stdout=f)
                    f.seek(0)
                    text = f.read()
                row = {"round": rnd, "state": s, "cmd": c.name, "s": dt, "rss_mib": rss, "cpu_s": cpu,
                       "bytes_written": dir_bytes(out) if out.exists() else 0, "ckpt": c.ckpt,
                       "drop": st.drop if s == "idle" else None, "loadavg_1m": os.getloadavg()[0]}
                if c.ckpt:
                    try:
                        row["report"] = json.loads(text)
                    except ValueError:
                        row["report"] = text[-2000:]
                for row in c.derive(row, text) if c.derive else [row]:
                    rows.append(row)
                    line = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "report"}
                    if isinstance(row.get("report"), dict) and "io" in row["report"]:
                        line["io"] = row["report"]["io"]  # --io auto's choice and observed rates, where ckpt reports them
                    say(line)


def bin_record(binary):
    return {"path": str(binary), "mtime": datetime.datetime.fromtimestamp(binary.stat().st_mtime, datetime.timezone.utc)
            .isoformat(timespec="seconds"), "sha256": hashlib.sha256(binary.read_bytes()).hexdigest()[:16]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default=str(ROOT / "build/ckpt"))
    ap.add_argument("--python", default=str(ROOT / ".venv/bin/python"), help="the Python stack's interpreter")
    ap.add_argument("--dir", default=str(ROOT / "tmp/io_floor_bench"), help="work dir (sources kept for the next run); "
                    "the default is under the repository's git-ignored tmp/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--states", default="hot,idle")
    ap.add_argument("--hf-states", default="hot", help="states of the convert, hf and trainer parts")
    ap.add_argument("--trainer-bench", default="", help="the trainer part's binary (default: trainer_bench next to --ckpt)")
    ap.add_argument("--trainer-args", default=TRAINER_ARGS, help="trainer_bench's model flags (default: a 1.12 GB checkpoint)")
    ap.add_argument("--parts", default="cp,dd,reshard,python,convert,hf,trainer")
    ap.add_argument("--io-modes", default="default,buffered,direct", help="reshard's --io entries (default: no --io flag)")
    ap.add_argument("--gib", type=float, default=3.0, help="model size: 3 = 20 layers, 3.08 GB; layers scale with it")
    ap.add_argument("--max-memory", default="", help="ckpt's --max-memory (default: none given, ckpt's default)")
    ap.add_argument("--dd-mib", type=int, default=32, help="dd's request size (MiB)")
    ap.add_argument("--hot-gib", type=float, default=4.0)
    ap.add_argument("--idle-sleep", type=float, default=30.0)
    ap.add_argument("--drop", dest="drop_method", default="drop_caches", choices=["drop_caches", "fadvise"],
                    help="idle: drop the whole page cache, or only the sources' pages")
    ap.add_argument("--quick", action="store_true", help="smoke test: a tiny model, one round, no idle sleep, --drop "
                    "fadvise, 0.25 GiB hot, dd in 1 MiB requests, a 19 MB trainer checkpoint")
    ap.add_argument("--json", default="", help="write every row, ratio and machine state to this file")
    ap.add_argument("--no-copy", action="store_true", help="run --ckpt in place (default: a copy in --dir, taken at the start)")
    ap.add_argument("--md", default="", help="write the run as a docs/BENCHMARKS.md entry (markdown) to this file")
    ap.add_argument("--render", default="", help="print an earlier run's --json FILE as markdown, and exit")
    a = ap.parse_args()
    if a.render:
        sys.stdout.write(markdown(json.loads(pathlib.Path(a.render).read_text())))
        return
    shape = dict(BASE_SHAPE, layers=max(3, round(a.gib * 20 / 3)))
    if a.quick:
        shape = dict(QUICK_SHAPE)
        a.rounds, a.idle_sleep, a.drop_method, a.hot_gib, a.dd_mib = 1, 0.0, "fadvise", 0.25, 1
        a.trainer_args = QUICK_TRAINER_ARGS
    root = pathlib.Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    trainer = "trainer" in a.parts.split(",")
    binary = pathlib.Path(a.ckpt).resolve()
    tb = pathlib.Path(a.trainer_bench or binary.with_name("trainer_bench")).resolve()
    bin_info, tb_info = bin_record(binary), bin_record(tb) if trainer else None
    if not a.no_copy:  # a build that relinks --ckpt during the run must not change the binary between rounds
        shutil.copy2(binary, root / "ckpt")
        binary = root / "ckpt"
        if trainer:
            shutil.copy2(tb, root / "trainer_bench")
            tb = root / "trainer_bench"
    a.ckpt, a.trainer_bench = str(binary), str(tb)
    states = [s for s in a.states.split(",") if s]
    hf_states = set(a.hf_states.split(","))
    res = {"command": sys.argv, "ckpt": bin_info, "trainer_bench": tb_info, "trainer_args": a.trainer_args, "rounds": a.rounds,
           "states": states, "shape": shape,
           "max_memory": a.max_memory or "ckpt default", "budget_mib": budget_mib(a.ckpt, a.max_memory),
           "idle_sleep_s": a.idle_sleep, "hot_gib": a.hot_gib, "dd_mib": a.dd_mib, "drop_method": a.drop_method}
    P = prepare(a, shape)
    res.update({k: P[k] for k in ("src_bytes", "src_shard_bytes", "hf_bytes", "per_src", "per_dst")})
    res["machine_start"] = machine_state(root)
    say({"machine_start": res["machine_start"]})
    say({"src_bytes": P["src_bytes"], "hf_bytes": P["hf_bytes"], "layers": shape["layers"], "budget_mib": res["budget_mib"]})
    out = root / "out"
    cases = make_cases(a, P, out)
    st = State(a)
    rows, res["round_states"] = [], []
    failed = None
    try:
        run_rounds(a, cases, st, states, hf_states, root, out, rows, res, P["src_bytes"])
    except (KeyboardInterrupt, Exception) as e:  # SIGINT, a failed command, a full disk: the rows so far are still a record
        failed = e
        res["interrupted"] = f"{type(e).__name__}: {str(e)[:600]}"
        say({"interrupted": res["interrupted"], "rows": len(rows)})
    shutil.rmtree(out, ignore_errors=True)
    res["rows"] = rows
    res["ratios"] = compute_ratios(rows, states, a.rounds)
    res["memory"] = memory_rows(rows, res["budget_mib"])
    res["machine_end"] = machine_state(root)
    say({"machine_end": res["machine_end"]})
    report(res)
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(res, indent=1))
    if a.md:
        pathlib.Path(a.md).write_text(markdown(res))
    if failed is not None:
        sys.exit(f"io_floor_bench: stopped after {len(rows)} commands: {res['interrupted']}")


if __name__ == "__main__":
    main()
