"""benchmarks/io_floor_bench.py's output: per state the command tables and the ratios (printed), and the run
as a docs/BENCHMARKS.md entry (markdown; also of an earlier run's --json file)."""
import pathlib
import statistics
import sys


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
            gbps = "-" if "blocked" in n or not gbps else f"{gbps:.2f}"  # blocking times, dd read: no write of their own
            frac = f"{rss / res['budget_mib']:.2f}" if rr[0]["ckpt"] else "-"
            print(f"{n} | " + " | ".join(f"{ts[i]:.2f}" if i in ts else "-" for i in range(rounds))
                  + f" | {med:.2f} | {gbps} | {rss:.0f} | {frac}")
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


def trainer_lines(res):
    """trainer_bench's saves (its medians of 3 per run) and the checkpoint's size, where the run has them."""
    tr = [r for r in res["rows"] if r["cmd"] == "trainer save (write)" and isinstance(r.get("report"), dict)]
    if not tr:
        return []

    def one(r):
        sv = r["report"]["save"]
        return (f"{r['state']} round {r['round'] + 1}: synchronous save blocks {sv['sync_blocked_s']:.3f} s, asynchronous "
                f"{sv['async_blocked_s']:.3f} s, the write {sv['write_s']:.3f} s ({sv['write_gb_s']:.2f} GB/s), run {r['run_s']:.1f} s")
    return [f"`trainer_bench --save-only {res.get('trainer_args', '')}` (checkpoint {tr[0]['bytes_written'] / 1e9:.2f} GB, "
            "weights + 2 Adam moments, fp32; each figure the median of its 3 saves): " + "; ".join(one(r) for r in tr) + ".", ""]


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
    lines += trainer_lines(res)
    lines += ["| ratio (baseline s / command s) | state | of medians | paired per round | bound | met |", "|---|---|---|---|---|---|"]
    for q in res["ratios"]:
        bound = "" if q["bound"] is None else ("every round >= " if q["bound_every_round"] else ">= ") + f"{q['bound']}"
        met = "" if q["ok"] is None else ("yes" if q["ok"] else "**no**")
        lines.append(f"| {q['ratio']} | {q['state']} | {q['of_medians']:.2f} | " + ", ".join(f"{x:.2f}" for x in q["paired"])
                     + f" | {bound} | {met} |")
    return "\n".join(lines) + "\n"
