"""The ratios baseline s / command s (> 1: the command is faster) with issue 34's bounds, and peak memory."""
import statistics

# name, baseline (a command, or a tuple: the faster of them in each round / of the medians),
# command, acceptance bound per state (None: reported only), bound applies to every round
RATIOS = [
    ("reshard vs cp+sync", "cp src", "reshard", {"hot": 1.0, "idle": 1.5}, False),
    ("reshard vs dd 2 writers (floor)", "dd2", "reshard", {"hot": 0.9, "idle": 0.9}, False),
    # idle: the reshard reads its source from the disk as well; dd copy reads and writes the same bytes
    ("reshard vs read+write floor (dd copy, 2 at once)", "dd copy", "reshard", {"idle": 0.9}, False),
    # a job reading the store cold and writing as many bytes takes at least the longer of dd read and dd2:
    # where dd read is the longer, dd2 s / dd read s (< 0.9) is as near to dd2 as any such job can come
    ("ceiling vs dd 2 writers of a cold-source job (dd2 s / dd read s)", "dd2", "dd read", None, False),
    ("reshard vs read floor (dd read, 2 at once)", "dd read", "reshard", None, False),
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
    ("trainer background write vs dd 2 writers", "dd2 trainer", "trainer save (write)", {"hot": 0.8}, False),
    ("trainer save blocking: sync / async (speed-up)", "trainer save (sync blocked)", "trainer save (async blocked)",
     None, False),
]


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
