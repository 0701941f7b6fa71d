"""Smoke test of benchmarks/io_floor_bench.py (docs/BENCHMARKS.md "I/O floor, by day"): one --quick
run on a tiny model (one round, hot and idle, the idle state without sleep and dropping only the
sources' pages) must time every command it lists, and every ratio it prints and writes must follow
from the raw times of the same run, recomputed here independently."""
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "io_floor_bench.py"

EVERY_STATE = ["cp src", "dd1", "dd2", "reshard", "reshard buffered", "reshard direct", "python stack"]
HOT_ONLY = ["convert mcore", "cp hf", "from-hf", "to-hf 1", "to-hf 2x3x2"]
CKPT_CMDS = {"reshard", "reshard buffered", "reshard direct", "convert mcore", "from-hf", "to-hf 1", "to-hf 2x3x2"}
# ratio name -> (baselines (the faster of them), command, bound per state, bound on every round)
EXPECTED = {
    "reshard vs cp+sync": (["cp src"], "reshard", {"hot": 1.0, "idle": 1.5}, False),
    "reshard vs dd 2 writers (floor)": (["dd2"], "reshard", {"hot": 0.9, "idle": 0.9}, False),
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
}


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def test_quick_run_has_every_row_and_consistent_ratios(ckpt_bin, tmp_path):
    out = tmp_path / "run.json"
    p = subprocess.run([sys.executable, str(BENCH), "--quick", "--ckpt", ckpt_bin, "--python", sys.executable,
                        "--dir", str(tmp_path / "work"), "--json", str(out), "--md", str(tmp_path / "run.md")],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert res["rounds"] == 1 and res["states"] == ["hot", "idle"]

    # Every command in every state it belongs to, once per round, with its measurements.
    want = {("hot", c) for c in EVERY_STATE + HOT_ONLY} | {("idle", c) for c in EVERY_STATE}
    got = [(r["state"], r["cmd"]) for r in rows]
    assert sorted(got) == sorted(want), (sorted(set(got) ^ want), len(got))
    for r in rows:
        assert r["round"] == 0 and r["s"] > 0 and r["rss_mib"] > 0 and r["bytes_written"] > 0, r
        assert r["ckpt"] == (r["cmd"] in CKPT_CMDS), r
        if r["ckpt"]:
            assert isinstance(r["report"], dict), r  # ckpt --json's report, parsed
        assert r["drop"] == ("fadvise" if r["state"] == "idle" else None), r
    # The reshards wrote the same bytes whatever the --io; dd wrote at least the store's bytes.
    for s in ("hot", "idle"):
        nb = {r["cmd"]: r["bytes_written"] for r in rows if r["state"] == s}
        assert nb["reshard"] == nb["reshard buffered"] == nb["reshard direct"], nb
        assert nb["dd1"] >= res["src_bytes"] and nb["dd2"] >= res["src_bytes"], (nb, res["src_bytes"])

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
    names_by_state = {"hot": set(EXPECTED), "idle": {n for n, e in EXPECTED.items()
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
        bases, cmd, bounds, every = EXPECTED[name]
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
    assert all(f"| {c} |" in md for c in EVERY_STATE + HOT_ONLY) and all(f"| {n} |" in md for n in EXPECTED), md

    # Peak RSS of every ckpt command against the budget (ckpt's default --max-memory, read from its --help).
    budget = res["budget_mib"]
    assert 0 < budget and res["max_memory"] == "ckpt default"
    mem = {(m["state"], m["cmd"]): m for m in res["memory"]}
    assert set(mem) == {(r["state"], r["cmd"]) for r in rows if r["ckpt"]}
    for (s, c), m in mem.items():
        peak = max(r["rss_mib"] for r in rows if (r["state"], r["cmd"]) == (s, c))
        assert m["peak_rss_mib"] == peak and abs(m["rss_over_budget"] - peak / budget) < 1e-12, m
