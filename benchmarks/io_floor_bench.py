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
  reshard  `ckpt reshard` tp=4 pp=2 -> tp=2 pp=3 [6,7,7] dp=1, source check on, once per --io-modes
           entry: `default` is no --io flag (the default flags: --io auto), then `--io buffered`,
           `--io direct`; their order rotates by one each round
  python   `python stack`: the same reshard the way Megatron's converters do it (io_modes_bench's
           PY_STACK: torch.load every rank file, torch.cat over tp, re-split, torch.save + fsync)
  convert  `convert mcore`: `ckpt convert --profile megatron-mcore` of the same store to the same
           layout (compared with cp src)
  hf       `cp hf` (cp -r of the HF directory + sync), `from-hf` (one rank), `to-hf 1` (from tp=1),
           `to-hf 2x3x2` (from tp=2 pp=3 dp=2)
convert and hf run in the --hf-states (default hot: their bounds are against cp hot), the others in
every --states. Every ckpt command gets --json (kept) and --max-memory when given (else ckpt's default).

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
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from hf_bench import dir_bytes, timed  # noqa: E402
from io_modes_bench import PY_STACK, State, dd_floor, stages, uptime  # noqa: E402

# Untimed preparation in a child (torch stays out of the timing process).
PREP = r'''
import json, pathlib, shutil, sys
sys.path.insert(0, sys.argv[1])
from io_modes_bench import make_llama, torch_ranks
c = json.loads(sys.argv[2])
hf, ts = pathlib.Path(c["hf"]), pathlib.Path(c["tsrc"])
if not (hf / "model.safetensors").exists():
    make_llama(hf, c["layers"], c["hidden"], c["ffn"], c["heads"], c["kv"], c["vocab"])
if not ts.exists():
    tmp = ts.with_name(ts.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    torch_ranks(hf, tmp, 4, c["per_src"])
    tmp.rename(ts)
'''

BASE_SHAPE = {"hidden": 2560, "ffn": 6912, "heads": 20, "kv": 4, "vocab": 32000}
QUICK_SHAPE = {"layers": 6, "hidden": 256, "ffn": 512, "heads": 4, "kv": 4, "vocab": 1024}

# name, baseline (a command, or a tuple: the faster of them in each round / of the medians),
# command, acceptance bound per state (None: reported only), bound applies to every round
RATIOS = [
    ("reshard vs cp+sync", "cp src", "reshard", {"hot": 1.0, "idle": 1.5}, False),
    ("reshard vs dd 2 writers (floor)", "dd2", "reshard", {"hot": 0.9, "idle": 0.9}, False),
    ("reshard vs dd 1 writer", "dd1", "reshard", None, False),
    ("reshard buffered vs cp+sync", "cp src", "reshard buffered", None, False),
    ("reshard direct vs cp+sync", "cp src", "reshard direct", None, False),
    ("reshard buffered vs dd 2 writers", "dd2", "reshard buffered", None, False),
    ("reshard direct vs dd 2 writers", "dd2", "reshard direct", None, False),
    ("auto (default) vs best of buffered/direct", ("reshard buffered", "reshard direct"), "reshard",
     {"hot": 0.95, "idle": 0.95}, True),
    ("Python stack / reshard (speed-up)", "python stack", "reshard", None, False),
    ("convert megatron-mcore vs cp+sync", "cp src", "convert mcore", {"hot": 0.9}, False),
    ("from-hf vs cp+sync", "cp hf", "from-hf", {"hot": 0.9}, False),
    ("to-hf one rank vs cp+sync", "cp hf", "to-hf 1", {"hot": 0.9}, False),
    ("to-hf tp2 pp3 dp2 vs cp+sync", "cp hf", "to-hf 2x3x2", {"hot": 0.9}, False),
]


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


def machine_state(d: pathlib.Path, brief=False):
    """Date, load, memory, the disk under d and the busiest processes, as one dict."""
    mem = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":")
        if k in ("MemTotal", "MemFree", "MemAvailable", "Cached", "Dirty", "Writeback"):
            mem[k + "_MiB"] = int(v.split()[0]) // 1024
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "uptime": uptime(),
           "loadavg": [float(x) for x in open("/proc/loadavg").read().split()[:3]], "mem": mem,
           "busiest": [ln.strip() for ln in _run(["ps", "-eo", "pcpu,etime,comm", "--sort=-pcpu"]).splitlines()[1:5]]}
    if brief:
        return out
    df = _run(["df", "-PT", str(d)]).splitlines()[-1].split()
    disk = {"device": df[0], "fstype": df[1], "size_GiB": int(df[2]) >> 20, "avail_GiB": int(df[4]) >> 20}
    dev = re.sub(r"p?\d+$", "", os.path.basename(df[0])) if re.search(r"[a-z]\d+$", df[0]) else os.path.basename(df[0])
    q = pathlib.Path("/sys/block") / dev / "queue"
    disk.update({f: (q / f).read_text().strip() for f in ("scheduler", "rotational", "max_sectors_kb", "nr_requests")
                 if (q / f).is_file()})
    out.update(disk=disk, nproc=os.cpu_count())
    return out


def say(obj):
    print(json.dumps(obj), flush=True)


def budget_mib(ckpt, max_memory):
    """--max-memory in MiB; '' = ckpt's default, read from `ckpt reshard --help` (256M if not found)."""
    if not max_memory:
        m = re.search(r"--max-memory.*?\(default (\d+[KMG])\)", _run([ckpt, "reshard", "--help"]), re.S)
        max_memory = m.group(1) if m else "256M"
    n, u = int(max_memory[:-1]), max_memory[-1].upper()
    return n * {"K": 1 / 1024, "M": 1, "G": 1024}[u]


class Case:
    def __init__(self, name, part, argv, sources, ckpt=False):
        self.name, self.part, self.argv, self.sources, self.ckpt = name, part, argv, sources, ckpt


def make_cases(a, P, out):
    """The commands, in order (reshard's --io entries in --io-modes order; main() rotates them)."""
    ck = a.ckpt
    mm = ["--max-memory", a.max_memory] if a.max_memory else []
    tgt = ["--tp", "2", "--pp", "3", "--pp-layers", ",".join(map(str, P["per_dst"])), "--dp", "1"]
    parts = set(a.parts.split(","))
    cases = []
    if "cp" in parts:
        cases.append(Case("cp src", "cp", lambda: ["cp", "-r", P["src"], out], [P["src"]]))
    if "dd" in parts:
        for w in (1, 2):
            cases.append(Case(f"dd{w}", "dd", lambda w=w: dd_floor(P["src_bytes"], out, streams=w, bs_mib=a.dd_mib), []))
    if "reshard" in parts:
        for io in a.io_modes.split(","):
            name, flag = ("reshard", []) if io == "default" else (f"reshard {io}", ["--io", io])
            cases.append(Case(name, "reshard", lambda flag=flag: [ck, "reshard", P["src"], out, *tgt, *flag, *mm, "--json"],
                              [P["src"]], ckpt=True))
    if "python" in parts:
        cfg = json.dumps({"tp": 4, "per": P["per_src"], "ntp": 2, "nper": P["per_dst"]})
        cases.append(Case("python stack", "python", lambda: [a.python, P["py_stack"], P["tsrc"], out, cfg], [P["tsrc"]]))
    if "convert" in parts:
        cases.append(Case("convert mcore", "convert", lambda: [ck, "convert", P["src"], out, "--profile", "megatron-mcore",
                                                               *tgt, *mm, "--json"], [P["src"]], ckpt=True))
    if "hf" in parts:
        cases += [Case("cp hf", "hf", lambda: ["cp", "-r", P["hf"], out], [P["hf"]]),
                  Case("from-hf", "hf", lambda: [ck, "from-hf", P["hf"], out, *mm, "--json"], [P["hf"]], ckpt=True),
                  Case("to-hf 1", "hf", lambda: [ck, "to-hf", P["one"], out, *mm, "--json"], [P["one"]], ckpt=True),
                  Case("to-hf 2x3x2", "hf", lambda: [ck, "to-hf", P["big"], out, *mm, "--json"], [P["big"]], ckpt=True)]
    return cases


def ordered(cases, rnd):
    """The cases of one round: the reshard --io entries rotated by the round number."""
    rs = [c for c in cases if c.part == "reshard"]
    if rs:
        k = rnd % len(rs)
        rs = rs[k:] + rs[:k]
    it = iter(rs)
    return [next(it) if c.part == "reshard" else c for c in cases]


def prepare(a, shape):
    """Sources for `shape`, made once and kept in --dir (untimed)."""
    per_src, per_dst = stages(shape["layers"], 2), stages(shape["layers"], 3)
    sd = pathlib.Path(a.dir) / "src_{layers}L_{hidden}h_{ffn}f_{vocab}v".format(**shape)
    sd.mkdir(parents=True, exist_ok=True)
    P = {"hf": sd / "hf", "tsrc": sd / "torch_tp4pp2", "per_src": per_src, "per_dst": per_dst, "py_stack": sd / "py_stack.py"}
    P["py_stack"].write_text(PY_STACK)
    if not (sd / "prepared").exists():
        subprocess.run([a.python, "-c", PREP, str(HERE), json.dumps({**shape, "hf": str(P["hf"]), "tsrc": str(P["tsrc"]),
                                                                      "per_src": per_src})], check=True)
    for key, flags in (("src", ["--tp", "4", "--pp", "2", "--dp", "1"]), ("one", ["--tp", "1", "--pp", "1", "--dp", "1"]),
                       ("big", ["--tp", "2", "--pp", "3", "--dp", "2"])):
        P[key] = sd / f"store_{key}"
        if not (P[key] / "manifest.json").exists():
            shutil.rmtree(P[key], ignore_errors=True)
            subprocess.run([a.ckpt, "from-hf", P["hf"], P[key], *flags, "--no-fsync"], check=True, stdout=subprocess.DEVNULL)
    (sd / "prepared").write_text("ok\n")
    P["src_bytes"], P["hf_bytes"] = dir_bytes(P["src"]), dir_bytes(P["hf"])
    return P


def _times(rows, state, cmd):
    return {r["round"]: r["s"] for r in rows if r["state"] == state and r["cmd"] == cmd}


def compute_ratios(rows, states, rounds):
    """Every RATIOS entry whose commands ran in a state: of the medians and paired per round."""
    out = []
    for s in states:
        for name, base, cmd, bound, every in RATIOS:
            bases = base if isinstance(base, tuple) else (base,)
            tc, tb = _times(rows, s, cmd), [_times(rows, s, b) for b in bases]
            if not tc or not all(tb):
                continue
            med_b = min(statistics.median(t.values()) for t in tb)
            med_c = statistics.median(tc.values())
            paired = [min(t[r] for t in tb) / tc[r] for r in range(rounds) if r in tc and all(r in t for t in tb)]
            lim = (bound or {}).get(s)
            value = med_b / med_c
            ok = None if lim is None else (min(paired) >= lim if every else value >= lim)
            out.append({"state": s, "ratio": name, "baseline": list(bases), "command": cmd, "baseline_median_s": med_b,
                        "command_median_s": med_c, "of_medians": value, "paired": paired,
                        "paired_median": statistics.median(paired), "bound": lim, "bound_every_round": every, "ok": ok})
    return out


def memory_rows(rows, budget):
    out = []
    for r in rows:
        if not r["ckpt"]:
            continue
        k = (r["state"], r["cmd"])
        prev = next((m for m in out if (m["state"], m["cmd"]) == k), None)
        if prev is None:
            out.append({"state": r["state"], "cmd": r["cmd"], "peak_rss_mib": r["rss_mib"], "budget_mib": budget})
        else:
            prev["peak_rss_mib"] = max(prev["peak_rss_mib"], r["rss_mib"])
    for m in out:
        m["rss_over_budget"] = m["peak_rss_mib"] / budget
        m["rss_minus_budget_mib"] = m["peak_rss_mib"] - budget
    return out


def report(res):
    """The tables: per state, each command's rounds and median; then the ratios and the memory."""
    rounds = res["rounds"]
    for s in res["states"]:
        names = list(dict.fromkeys(r["cmd"] for r in res["rows"] if r["state"] == s))
        if not names:
            continue
        print(f"\n{s}: command | " + " | ".join(f"round {i + 1} s" for i in range(rounds)) + " | median s | GB/s written | "
              "peak RSS MiB | RSS / budget")
        for n in names:
            rr = [r for r in res["rows"] if r["state"] == s and r["cmd"] == n]
            ts = {r["round"]: r["s"] for r in rr}
            med = statistics.median(ts.values())
            rss = max(r["rss_mib"] for r in rr)
            gbps = statistics.median(r["bytes_written"] for r in rr) / med / 1e9
            frac = f"{rss / res['budget_mib']:.2f}" if rr[0]["ckpt"] else "-"
            print(f"{n} | " + " | ".join(f"{ts[i]:.2f}" if i in ts else "-" for i in range(rounds))
                  + f" | {med:.2f} | {gbps:.2f} | {rss:.0f} | {frac}")
        print(f"\n{s}: ratio (baseline s / command s) | of medians | paired per round | paired median | bound | ok")
        for q in res["ratios"]:
            if q["state"] != s:
                continue
            bound = "-" if q["bound"] is None else (">= " if not q["bound_every_round"] else "every round >= ") + f"{q['bound']}"
            print(f"{q['ratio']} | {q['of_medians']:.2f} | " + ", ".join(f"{x:.2f}" for x in q["paired"])
                  + f" | {q['paired_median']:.2f} | {bound} | {'-' if q['ok'] is None else ('yes' if q['ok'] else 'NO')}")
    print(f"\npeak RSS vs --max-memory ({res['budget_mib']:.0f} MiB): "
          + "; ".join(f"{m['state']} {m['cmd']} {m['peak_rss_mib']:.0f} MiB ({m['rss_over_budget']:.2f}x)" for m in res["memory"]))
    sys.stdout.flush()


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
                if c.part in ("convert", "hf") and s not in hf_states:
                    continue
                shutil.rmtree(out, ignore_errors=True)  # the last output's page cache freed: part of the state
                free = shutil.disk_usage(root).free
                if free < src_bytes * 1.1 + (1 << 30):
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
                rows.append(row)
                line = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "report"}
                if isinstance(row.get("report"), dict) and "io" in row["report"]:
                    line["io"] = row["report"]["io"]  # --io auto's choice and observed rates, where ckpt reports them
                say(line)


def markdown(res):
    """The run as a docs/BENCHMARKS.md entry: its date and machine state, each state's commands, the ratios."""
    ms, me = res["machine_start"], res["machine_end"]
    ck = res["ckpt"] if isinstance(res["ckpt"], dict) else {"path": res["ckpt"], "mtime": "?", "sha256": "?"}
    d = ms["disk"]
    busy = lambda m: ", ".join(f"{b.split()[-1]} {b.split()[0]}%" for b in m["busiest"][:3])  # noqa: E731
    lines = [f"### {ms['date'][:10]}, {ms['date'][11:16]}-{me['date'][11:16]} UTC"
             + (f" (stopped after {len(res['rows'])} commands: {res['interrupted']})" if res.get("interrupted") else ""), "",
             f"`{' '.join(pathlib.Path(x).name if i == 0 else x for i, x in enumerate(res['command']))}` "
             f"({res['rounds']} rounds; source {res['src_bytes'] / 1e9:.2f} GB, {res['shape']['layers']} layers, tp=4 pp=2 -> "
             f"tp=2 pp=3 {res['per_dst']}; idle: {res['drop_method']}, {res['idle_sleep_s']:.0f} s; hot: {res['hot_gib']} GiB; "
             f"dd requests {res['dd_mib']} MiB; --max-memory {res['max_memory']} = {res['budget_mib']:.0f} MiB; ckpt "
             f"{ck['path']} of {ck['mtime']}, sha256 {ck['sha256']}).", "",
             "| machine | start | end |", "|---|---|---|",
             f"| load average (1/5/15 min) | {' / '.join(map(str, ms['loadavg']))} | {' / '.join(map(str, me['loadavg']))} |",
             f"| free / available / cached memory (MiB) | {ms['mem']['MemFree_MiB']} / {ms['mem']['MemAvailable_MiB']} / "
             f"{ms['mem']['Cached_MiB']} | {me['mem']['MemFree_MiB']} / {me['mem']['MemAvailable_MiB']} / {me['mem']['Cached_MiB']} |",
             f"| busiest processes (ps %CPU, over their life) | {busy(ms)} | {busy(me)} |",
             f"| disk | {d['device']} {d['fstype']}, {d['avail_GiB']} of {d['size_GiB']} GiB free, scheduler "
             f"{d.get('scheduler', '?')}, max_sectors_kb {d.get('max_sectors_kb', '?')}, nr_requests {d.get('nr_requests', '?')} | |",
             "", "Load average (1 min) before each round and state: "
             + "; ".join(f"{m['round'] + 1} {m['state']} {m['loadavg'][0]:.2f}" for m in res["round_states"]) + "; after each "
             "command: " + ", ".join(f"{s} {min(r['loadavg_1m'] for r in res['rows'] if r['state'] == s):.1f}-"
                                     f"{max(r['loadavg_1m'] for r in res['rows'] if r['state'] == s):.1f}"
                                     for s in res["states"] if any(r["state"] == s for r in res["rows"])) + ".", ""]
    for s in res["states"]:
        names = list(dict.fromkeys(r["cmd"] for r in res["rows"] if r["state"] == s))
        if not names:
            continue
        lines += [f"| {s} | " + " | ".join(f"round {i + 1} (s)" for i in range(res["rounds"])) + " | median (s) | peak RSS MiB |",
                  "|---|" + "---|" * (res["rounds"] + 2)]
        for n in names:
            rr = [r for r in res["rows"] if r["state"] == s and r["cmd"] == n]
            ts = {r["round"]: r["s"] for r in rr}
            rss = max(r["rss_mib"] for r in rr)
            lines.append(f"| {n} | " + " | ".join(f"{ts[i]:.2f}" if i in ts else "-" for i in range(res["rounds"]))
                         + f" | {statistics.median(ts.values()):.2f} | {rss:.0f}"
                         + (f" ({rss / res['budget_mib']:.2f}x of budget)" if rr[0]["ckpt"] else "") + " |")
        lines.append("")
    chose = [r for r in res["rows"] if r["cmd"] == "reshard" and isinstance(r.get("report"), dict) and "io" in r["report"]]
    if chose:  # what the default --io auto did, where ckpt's --json reports it
        def io(r):
            x = r["report"]["io"]
            rates = ", ".join(f"{k[:-5]} {x[k]:.2f} GB/s" for k in ("buffered_gb_s", "direct_gb_s") if k in x)
            return (f"{r['state']} round {r['round'] + 1}: writes {x.get('writes', '?')}, reads {x.get('copy_reads', '?')}"
                    + (f" ({rates})" if rates else ""))
        lines += ["`reshard` (default `--io auto`), as its `--json` reports: " + "; ".join(io(r) for r in chose) + ".", ""]
    lines += ["| ratio (baseline s / command s) | state | of medians | paired per round | bound | met |", "|---|---|---|---|---|---|"]
    for q in res["ratios"]:
        bound = "" if q["bound"] is None else ("every round >= " if q["bound_every_round"] else ">= ") + f"{q['bound']}"
        met = "" if q["ok"] is None else ("yes" if q["ok"] else "**no**")
        lines.append(f"| {q['ratio']} | {q['state']} | {q['of_medians']:.2f} | " + ", ".join(f"{x:.2f}" for x in q["paired"])
                     + f" | {bound} | {met} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default=str(ROOT / "build/ckpt"))
    ap.add_argument("--python", default=str(ROOT / ".venv/bin/python"), help="the Python stack's interpreter")
    ap.add_argument("--dir", default=str(ROOT / "tmp/io_floor_bench"), help="work dir (sources kept for the next run); "
                    "the default is under the repository's git-ignored tmp/")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--states", default="hot,idle")
    ap.add_argument("--hf-states", default="hot", help="states of the convert and hf parts")
    ap.add_argument("--parts", default="cp,dd,reshard,python,convert,hf")
    ap.add_argument("--io-modes", default="default,buffered,direct", help="reshard's --io entries (default: no --io flag)")
    ap.add_argument("--gib", type=float, default=3.0, help="model size: 3 = 20 layers, 3.08 GB; layers scale with it")
    ap.add_argument("--max-memory", default="", help="ckpt's --max-memory (default: none given, ckpt's default)")
    ap.add_argument("--dd-mib", type=int, default=32, help="dd's request size (MiB)")
    ap.add_argument("--hot-gib", type=float, default=4.0)
    ap.add_argument("--idle-sleep", type=float, default=30.0)
    ap.add_argument("--drop", dest="drop_method", default="drop_caches", choices=["drop_caches", "fadvise"],
                    help="idle: drop the whole page cache, or only the sources' pages")
    ap.add_argument("--quick", action="store_true", help="smoke test: a tiny model, one round, no idle sleep, --drop "
                    "fadvise, 0.25 GiB hot, dd in 1 MiB requests")
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
    root = pathlib.Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    binary = pathlib.Path(a.ckpt).resolve()
    bin_info = {"path": str(binary), "mtime": datetime.datetime.fromtimestamp(binary.stat().st_mtime, datetime.timezone.utc)
                .isoformat(timespec="seconds"), "sha256": hashlib.sha256(binary.read_bytes()).hexdigest()[:16]}
    if not a.no_copy:  # a build that relinks --ckpt during the run must not change the binary between rounds
        shutil.copy2(binary, root / "ckpt")
        binary = root / "ckpt"
    a.ckpt = str(binary)
    states = [s for s in a.states.split(",") if s]
    hf_states = set(a.hf_states.split(","))
    res = {"command": sys.argv, "ckpt": bin_info, "rounds": a.rounds, "states": states, "shape": shape,
           "max_memory": a.max_memory or "ckpt default", "budget_mib": budget_mib(a.ckpt, a.max_memory),
           "idle_sleep_s": a.idle_sleep, "hot_gib": a.hot_gib, "dd_mib": a.dd_mib, "drop_method": a.drop_method}
    P = prepare(a, shape)
    res.update({"src_bytes": P["src_bytes"], "hf_bytes": P["hf_bytes"], "per_src": P["per_src"], "per_dst": P["per_dst"]})
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
