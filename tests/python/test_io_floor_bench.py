"""Smoke test of benchmarks/io_floor_bench.py (docs/BENCHMARKS.md "I/O floor, by day"): one --quick
run on a tiny model (one round, hot and idle, the idle state without sleep and dropping only the
sources' pages) must time every command it lists, and every ratio it prints and writes must follow
from the raw times of the same run, recomputed here independently. The trainer part runs
trainer_bench from the build dir (CKPT_BINARY_DIR; `ninja` builds it)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "io_floor_bench.py"

EVERY_STATE = ["cp src", "dd1", "dd2", "dd copy", "dd read", "reshard", "reshard buffered", "reshard direct", "python stack"]
HOT_ONLY = ["convert mcore", "cp hf", "from-hf", "to-hf 1", "to-hf 2x3x2"]
# trainer_bench's JSON "save" key of each trainer row; dd2 trainer: dd2 of the checkpoint's bytes
TRAINER = {"trainer save (write)": "write_s", "trainer save (sync blocked)": "sync_blocked_s",
           "trainer save (async blocked)": "async_blocked_s"}
CKPT_CMDS = {"reshard", "reshard buffered", "reshard direct", "convert mcore", "from-hf", "to-hf 1", "to-hf 2x3x2"}
# ratio name -> (baselines (the faster of them), command, bound per state, bound on every round)
EXPECTED = {
    "reshard vs cp+sync": (["cp src"], "reshard", {"hot": 1.0, "idle": 1.5}, False),
    "reshard vs dd 2 writers (floor)": (["dd2"], "reshard", {"hot": 0.9, "idle": 0.9}, False),
    "reshard vs read+write floor (dd copy, 2 at once)": (["dd copy"], "reshard", {"idle": 0.9}, False),
    "ceiling vs dd 2 writers of a cold-source job (dd2 s / dd read s)": (["dd2"], "dd read", {}, False),
    "reshard vs read floor (dd read, 2 at once)": (["dd read"], "reshard", {}, False),
    "reshard vs dd 1 writer": (["dd1"], "reshard", {}, False),
    "reshard buffered vs cp+sync": (["cp src"], "reshard buffered", {}, False),
    "reshard direct vs cp+sync": (["cp src"], "reshard direct", {}, False),
    "reshard buffered vs dd 2 writers": (["dd2"], "reshard buffered", {}, False),
    "reshard direct vs dd 2 writers": (["dd2"], "reshard direct", {}, False),
    "auto (default) vs best of buffered/direct": (["reshard buffered", "reshard direct"], "reshard",
                                                  {"hot": 0.95, "idle": 0.95}, True),
    "Python stack / reshard (speed-up)": (["python stack"], "reshard", {}, False),
    "convert megatron-mcore vs cp+sync": (["cp src"], "convert mcore", {"hot": 0.9}, False),
    "from-hf vs cp+sync": (["cp hf"], "from-hf", {"hot": 0.9}, False),
    "to-hf one rank vs cp+sync": (["cp hf"], "to-hf 1", {"hot": 0.9}, False),
    "to-hf tp2 pp3 dp2 vs cp+sync": (["cp hf"], "to-hf 2x3x2", {"hot": 0.9}, False),
    "trainer background write vs dd 2 writers": (["dd2 trainer"], "trainer save (write)", {"hot": 0.8}, False),
    "trainer save blocking: sync / async (speed-up)": (["trainer save (sync blocked)"], "trainer save (async blocked)", {}, False),
}


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def test_quick_run_has_every_row_and_consistent_ratios(ckpt_bin, tmp_path):
    out = tmp_path / "run.json"
    tb = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", ROOT / "build")) / "trainer_bench"
    parts = [] if tb.is_file() else ["--parts", "cp,dd,reshard,python,convert,hf"]  # without it: skipped at the end
    p = subprocess.run([sys.executable, str(BENCH), "--quick", "--ckpt", ckpt_bin, "--python", sys.executable, "--trainer-bench",
                        str(tb), *parts, "--dir", str(tmp_path / "work"), "--json", str(out), "--md", str(tmp_path / "run.md")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert res["rounds"] == 1 and res["states"] == ["hot", "idle"]
    hot_only = HOT_ONLY + ([*TRAINER, "dd2 trainer"] if tb.is_file() else [])
    expected = {n: e for n, e in EXPECTED.items() if all(c in EVERY_STATE + hot_only for c in [*e[0], e[1]])}

    # Every command in every state it belongs to, once per round, with its measurements.
    want = {("hot", c) for c in EVERY_STATE + hot_only} | {("idle", c) for c in EVERY_STATE}
    got = [(r["state"], r["cmd"]) for r in rows]
    assert sorted(got) == sorted(want), (sorted(set(got) ^ want), len(got))
    for r in rows:
        assert r["round"] == 0 and r["s"] > 0 and r["rss_mib"] > 0 and (r["bytes_written"] > 0) == (r["cmd"] != "dd read"), r
        assert r["ckpt"] == (r["cmd"] in CKPT_CMDS), r
        if r["ckpt"]:
            assert isinstance(r["report"], dict), r  # ckpt --json's report, parsed
        assert r["drop"] == ("fadvise" if r["state"] == "idle" else None), r
    # The reshards wrote the same bytes whatever the --io; dd wrote at least the store's bytes.
    for s in ("hot", "idle"):
        nb = {r["cmd"]: r["bytes_written"] for r in rows if r["state"] == s}
        assert nb["reshard"] == nb["reshard buffered"] == nb["reshard direct"], nb
        assert nb["dd1"] >= res["src_bytes"] and nb["dd2"] >= res["src_bytes"], (nb, res["src_bytes"])
        # dd copy: every shard of the tp=4 pp=2 store copied whole (its short last block with iflag=direct too)
        shards = list((tmp_path / "work").glob("src_*/store_src/shards/*.h5"))
        assert len(shards) == 8 and nb["dd copy"] == sum(f.stat().st_size for f in shards) == res["src_shard_bytes"], nb
        assert any(f.stat().st_size % (1 << 20) for f in shards)  # a short last block (--quick: 1 MiB requests)

    # The trainer rows: its JSON's medians; dd2 trainer wrote at least the checkpoint's bytes.
    tr = {r["cmd"]: r for r in rows if r["cmd"] in TRAINER}
    if tb.is_file():
        save = tr["trainer save (write)"]["report"]["save"]
        assert 1e7 < save["bytes"] < 1e8, save  # --quick: a 19 MB checkpoint
        for name, key in TRAINER.items():
            assert tr[name]["s"] == save[key] and tr[name]["bytes_written"] == save["bytes"], (tr[name], save)
            assert tr[name]["run_s"] > 3 * save["sync_blocked_s"], tr[name]  # the run: 3 synchronous saves and more
        assert save["async_blocked_s"] < save["sync_blocked_s"], save
        assert abs(save["write_s"] - (save["sync_blocked_s"] - save["async_blocked_s"])) < 1e-9, save
        dd2t = next(r for r in rows if r["cmd"] == "dd2 trainer")
        assert save["bytes"] <= dd2t["bytes_written"] < save["bytes"] + 2 * (1 << 20), (dd2t, save)

    # The machine's state at both ends and per round and state.
    for k in ("machine_start", "machine_end"):
        m = res[k]
        assert m["date"].startswith("20") and "load average" in m["uptime"] and m["mem"]["MemTotal_MiB"] > 0, m
        assert m["disk"]["device"] and m["disk"]["fstype"], m
    assert [(m["round"], m["state"]) for m in res["round_states"]] == [(0, "hot"), (0, "idle")]

    # The per-command lines it printed carry the same times (rounded to 3 decimals).
    printed = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{") and '"cmd"' in ln]
    assert len(printed) == len(rows)
    for ln, r in zip(printed, rows):
        assert (ln["state"], ln["cmd"]) == (r["state"], r["cmd"]) and abs(ln["s"] - r["s"]) <= 0.0005 + 1e-9, (ln, r)

    # Every ratio recomputed from the raw times: baseline seconds / command seconds.
    t = {(r["state"], r["cmd"], r["round"]): r["s"] for r in rows}
    ratios = {(q["state"], q["ratio"]): q for q in res["ratios"]}
    names_by_state = {"hot": set(expected), "idle": {n for n, e in expected.items()
                                                     if e[1] in EVERY_STATE and all(b in EVERY_STATE for b in e[0])}}
    assert set(ratios) == {(s, n) for s, ns in names_by_state.items() for n in ns}
    table = {}
    state = None
    for ln in p.stdout.splitlines():  # "STATE: ratio ..." header, then "name | of medians | paired | ..." rows
        if ln.startswith(("hot: ratio", "idle: ratio")):
            state = ln.split(":")[0]
        elif not ln.strip() or ": command" in ln:
            state = None
        elif state and " | " in ln:
            f = ln.split(" | ")
            table[(state, f[0])] = f
    for (s, name), q in ratios.items():
        bases, cmd, bounds, every = expected[name]
        med_b = min(_median([t[(s, b, 0)]]) for b in bases)
        med_c = _median([t[(s, cmd, 0)]])
        paired = [min(t[(s, b, 0)] for b in bases) / t[(s, cmd, 0)]]
        assert q["baseline"] == bases and q["command"] == cmd
        assert abs(q["of_medians"] - med_b / med_c) <= 1e-9 * med_b / med_c, (q, med_b, med_c)
        assert len(q["paired"]) == 1 and abs(q["paired"][0] - paired[0]) <= 1e-9 * paired[0], q
        assert abs(q["paired_median"] - _median(paired)) <= 1e-9 * paired[0], q
        bound = bounds.get(s)
        assert q["bound"] == bound
        if bound is None:
            assert q["ok"] is None
        else:
            assert q["ok"] == ((min(paired) if every else med_b / med_c) >= bound), q
        # ... and the table printed the same figures (2 decimals).
        row = table[(s, name)]
        assert abs(float(row[1]) - med_b / med_c) <= 0.0051, (row, med_b / med_c)
        assert abs(float(row[2]) - paired[0]) <= 0.0051, (row, paired)

    # The docs entry (--md): dated, and every command and ratio in it.
    md = (tmp_path / "run.md").read_text()
    assert md.startswith("### " + res["machine_start"]["date"][:10]), md[:200]
    assert all(f"| {c} |" in md for c in EVERY_STATE + hot_only) and all(f"| {n} |" in md for n in expected), md
    assert ("`trainer_bench --save-only --hidden 256" in md) == tb.is_file(), md
    # --render of the run's JSON: the same entry.
    r = subprocess.run([sys.executable, str(BENCH), "--render", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == md, r.stderr

    # Peak RSS of every ckpt command against the budget (ckpt's default --max-memory, read from its --help).
    budget = res["budget_mib"]
    assert 0 < budget and res["max_memory"] == "ckpt default"
    mem = {(m["state"], m["cmd"]): m for m in res["memory"]}
    assert set(mem) == {(r["state"], r["cmd"]) for r in rows if r["ckpt"]}
    for (s, c), m in mem.items():
        peak = max(r["rss_mib"] for r in rows if (r["state"], r["cmd"]) == (s, c))
        assert m["peak_rss_mib"] == peak and abs(m["rss_over_budget"] - peak / budget) < 1e-12, m
    if not tb.is_file():
        pytest.skip(f"the trainer part not run: no {tb} (`ninja -C build trainer_bench`)")
