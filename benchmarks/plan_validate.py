#!/usr/bin/env python3
"""Measured against predicted (docs/PLAN.md): the planner's cost model (`ckpt plan`) against
`ckpt train --emulate` on this machine.

    python benchmarks/plan_validate.py [--ckpt build/ckpt] [--out docs/plan_validation.json]
        [--steps 8] [--warmup 2] [--repeat 2] [--calibration FILE] [--slow-factor 2] [--smoke]

1. Calibration: `ckpt plan --calibrate -o DIR/calibration.json` (sgemm FLOP/s at the trainer's
   shapes and 1 thread, the trainer's efficiency, MPI bandwidth/latency between 2 ranks), or the
   file given with --calibration.
2. Cluster (DIR/cluster.json): two device types, "fast" = the calibrated type and "slow" = the same
   with peak_flops / --slow-factor; rank 0 fast, rank 1 slow (world size 2: the machine's 2 cores
   are not oversubscribed).
3. Model (DIR/model.json): LLaMA, 6 layers, hidden 256, ffn 704, 8 heads / 4 KV heads, vocab 264
   (the calibration model), seq 128, global batch 8 sequences.
4. Layouts (general form, layout files in DIR): pp=2 splits [1,5] [2,4] [3,3] [4,2] [5,1]
   (4 micro-batches of 2), tp=2 (4 micro-batches of 2), dp=2 with micro-batches [3,1] [2,2] [1,3]
   (2 micro-batches per step each), plus the planner's choice (`ckpt plan --json -o FILE`) and the
   hand-written layout it compares with.
   For each: predicted step seconds (`ckpt plan --evaluate LAYOUT --cluster C --model M
   --global-batch 8 --seq-len 128 --json`) and measured ones (`mpirun -np 2 ckpt train --emulate
   --cluster C --layout LAYOUT`, --steps steps, the first --warmup excluded, median of the
   per-step seconds over --repeat runs; the runs go round robin over the layouts, so that a
   machine load that drifts during the script spreads over all of them).
5. Figures: Spearman rank correlation of predicted vs measured (acceptance >= 0.8), the planner's
   choice vs the hand-written layout: predicted gain and measured gain (step-time ratios;
   acceptance: within 25% of each other), the machine's load average before and after every run.
   Writes --out (JSON) and prints a markdown table. --smoke: 3 layouts, 3 steps (a quick check
   that the pipeline of commands works; its figures mean nothing).
Every `ckpt plan` call gets `--calibration DIR/calibration.json` (the measured cost terms:
concurrency of the ranks on the node, TP all-reduce per call, per-micro-batch and pipeline-message
costs; docs/PLAN.md "Calibrated terms"); --no-calibrated-terms leaves them out (the cluster file's
figures alone). The script runs at the niceness it is started with (run it as `nice -n 0`), and
records `uptime` before and after every run. stdlib only.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 264,
    "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 6,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
    "hidden_act": "silu", "bos_token_id": 256, "eos_token_id": 257,
}
SEQ = 128
GLOBAL_BATCH = 8


def pp_layout(a, b, mb=2):
    return {"pipelines": [{"micro_batch": mb, "stages": [{"layers": a, "tp": 1, "device": "fast"},
                                                         {"layers": b, "tp": 1, "device": "slow"}]}], "zero": 0}


def dp_layout(m0, m1):
    return {"pipelines": [{"micro_batch": m0, "stages": [{"layers": 6, "tp": 1, "device": "fast"}]},
                          {"micro_batch": m1, "stages": [{"layers": 6, "tp": 1, "device": "slow"}]}], "zero": 0}


def tp_layout(mb=2):
    return {"pipelines": [{"micro_batch": mb, "stages": [{"layers": 6, "tp": 2}]}], "zero": 0}


LAYOUTS = [(f"pp=2 [{a},{6 - a}]", pp_layout(a, 6 - a)) for a in range(1, 6)] + [
    ("tp=2", tp_layout()), ("dp=2 mb [3,1]", dp_layout(3, 1)), ("dp=2 mb [2,2]", dp_layout(2, 2)),
    ("dp=2 mb [1,3]", dp_layout(1, 3))]
SMOKE = ["pp=2 [3,3]", "pp=2 [4,2]", "dp=2 mb [3,1]"]


def mpirun(n, *args):
    cmd = [shutil.which("mpirun") or "mpirun"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["--oversubscribe", "--mca", "btl", "self,vader", "--mca", "pml", "ob1", "-np", str(n),
                  *map(str, args)]


def run(cmd, timeout=900, check=True):
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 and not check:
        return None
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def load():
    return [round(x, 2) for x in os.getloadavg()]


def find_key(j, keys):
    """The first value under one of `keys`, searching nested objects breadth first."""
    todo = [j]
    while todo:
        x = todo.pop(0)
        if isinstance(x, dict):
            for k in keys:
                if k in x and isinstance(x[k], (int, float)):
                    return float(x[k])
            todo.extend(v for v in x.values() if isinstance(v, (dict, list)))
        elif isinstance(x, list):
            todo.extend(x)
    return None


STEP_KEYS = ["step_time_s", "step_seconds", "step_s", "predicted_step_s", "time_s"]


def grad_accum(layout):
    return GLOBAL_BATCH // sum(p["micro_batch"] for p in layout["pipelines"])


def uptime():
    r = subprocess.run(["uptime"], capture_output=True, text=True)
    return r.stdout.strip()


def cal_args(a, d):
    return [] if a.no_calibrated_terms else ["--calibration", d / "calibration.json"]


def predict(a, d, layout_file):
    r = run([a.ckpt, "plan", "--evaluate", layout_file, "--cluster", d / "cluster.json", "--model", d / "model.json",  # placement: the planner's
             "--global-batch", GLOBAL_BATCH, "--seq-len", SEQ, "--json", *cal_args(a, d)])
    j = json.loads(r.stdout)
    t = find_key(j, STEP_KEYS)
    if t is None:
        sys.exit(f"no step time ({STEP_KEYS}) in `ckpt plan --evaluate --json`: {r.stdout[:2000]}")
    return t, j


def layout_file(d, name, layout):
    lf = d / (name.replace(" ", "_").replace("=", "").replace("[", "").replace("]", "").replace(",", "-")
              .replace("'", "") + ".json")
    lf.write_text(json.dumps(layout))
    return lf


def cluster_for(d, lf, layout):
    """The cluster file in the layout's rank order (stage by stage, then pipeline, then tp rank) when
    every stage names its device type (the planner may put 'slow' first); else DIR/cluster.json."""
    stages = [st for p in layout["pipelines"] for st in p["stages"]]
    if not all(st.get("device") for st in stages):
        return d / "cluster.json"
    order = []
    for si in range(max(len(p["stages"]) for p in layout["pipelines"])):
        for p in layout["pipelines"]:
            if si < len(p["stages"]):
                order += [p["stages"][si]["device"]] * p["stages"][si]["tp"]
    c = json.loads((d / "cluster.json").read_text())
    c["ranks"] = [{"type": t, "count": 1} for t in order]
    f = d / f"cluster_{lf.stem}.json"
    f.write_text(json.dumps(c))
    return f


def measure(a, d, name, layout, repeats):
    """Per-step seconds after the warm-up of `repeats` runs (indices), and per-run medians and loads."""
    lf = layout_file(d, name, layout)
    secs, runs = [], []
    for k in repeats:
        out = d / f"run_{lf.stem}_{k}"
        shutil.rmtree(out, ignore_errors=True)
        before, up_before = load(), uptime()
        run(mpirun(2, a.ckpt, "train", "--config", d / "model.json", "--layout", lf, "--cluster", cluster_for(d, lf, layout),
                   "--emulate", "--out", out, "--steps", a.steps, "--seq-len", SEQ, "--grad-accum", grad_accum(layout),
                   "--threads", 1, "--warmup", 1, "--save-every", 0))
        recs = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
        steps = [r for r in recs if "step" in r][a.warmup:]
        steps = [r for r in steps if r.get("save_blocked_s", 0) == 0] or steps  # the saving last step
        assert all("emulated" in r for r in steps), "the run is not labelled as emulated"
        s = [r["seconds"] for r in steps]
        secs += s
        runs.append({"median_s": statistics.median(s), "load_before": before, "load_after": load(),
                     "uptime_before": up_before, "uptime_after": uptime(), "step_s": s,
                     "compute_s": statistics.median(r["compute_s"] for r in steps),
                     "comm_s": statistics.median(r["comm_s"] for r in steps),
                     "idle_s": statistics.median(r["idle_s"] for r in steps),
                     "rank_compute_s": [statistics.median(r["rank_compute_s"][i] for r in steps) for i in range(2)]})
        shutil.rmtree(out, ignore_errors=True)
    return secs, runs, lf


def ranks(v):
    order = sorted(range(len(v)), key=lambda i: v[i])
    r = [0.0] * len(v)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(x, y):
    rx, ry = ranks(x), ranks(y)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    num = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    den = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return num / den if den else 0.0


def calibrate(a, d):
    f = d / "calibration.json"
    if a.calibration:
        shutil.copy(a.calibration, f)
    else:
        run([a.ckpt, "plan", "--calibrate", "-o", f])
    return json.loads(f.read_text())


def write_inputs(a, d, cal):
    fast = dict(cal["device_type"], name="fast")
    slow = dict(fast, name="slow", peak_flops=fast["peak_flops"] / a.slow_factor)
    cluster = {"device_types": [fast, slow], "ranks": [{"type": "fast", "count": 1}, {"type": "slow", "count": 1}]}
    (d / "cluster.json").write_text(json.dumps(cluster, indent=1))
    (d / "model.json").write_text(json.dumps(MODEL, indent=1))


def planner_choice(a, d):
    """The planner's best layout (written to a file) and the hand-written one it compares with."""
    r = run([a.ckpt, "plan", "--cluster", d / "cluster.json", "--model", d / "model.json", "--global-batch",
             GLOBAL_BATCH, "--seq-len", SEQ, "--json", "-o", d / "planned.json", *cal_args(a, d)], check=False)
    if r is None or not (d / "planned.json").exists():
        return None, None, None  # a ckpt whose plan has no search (--evaluate only)
    j = json.loads(r.stdout)
    hand = None
    for k in ("hand_layout", "hand_written", "baseline", "hand"):
        if isinstance(j.get(k), dict):
            hand = j[k].get("layout", j[k])
    return json.loads((d / "planned.json").read_text()), hand, j


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--dir", default="/tmp/ckpt_plan_validate")
    ap.add_argument("--out", default=None, help="JSON results file (e.g. docs/plan_validation.json)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--slow-factor", type=float, default=2.0)
    ap.add_argument("--calibration", default=None, help="a `ckpt plan --calibrate` output to reuse")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--no-calibrated-terms", action="store_true",
                    help="predict without --calibration (the cluster file's device types and links alone)")
    ap.add_argument("--measure-only", action="store_true",
                    help="no `ckpt plan` (before the planner exists): calibrate with --calibration FILE or skip "
                         "the calibrated speeds (fast = 1e11 FLOP/s), measure the fixed layouts only")
    a = ap.parse_args()
    a.ckpt = str(pathlib.Path(a.ckpt).resolve())
    if a.smoke:
        a.steps, a.warmup, a.repeat = 3, 1, 1
    niceness = os.nice(0)
    d = pathlib.Path(a.dir)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    t0, load0, up0 = time.time(), load(), uptime()
    if a.measure_only and not a.calibration:
        cal = {"device_type": {"name": "fast", "vendor": "cpu", "memory": 24 << 30, "peak_flops": 1e11,
                               "link_bandwidth": 2000000000, "dtype": "fp32"}}
    else:
        cal = calibrate(a, d)
    write_inputs(a, d, cal)
    layouts = [(n, l) for n, l in LAYOUTS if not a.smoke or n in SMOKE]
    plan_json = None
    if not a.measure_only:
        planned, hand, plan_json = planner_choice(a, d)
        if planned is not None:
            layouts.append(("planner's choice", planned))
        if hand is not None:
            layouts.append(("hand-written", hand))
    # Round robin: repeat k runs every layout once, so that a load that drifts during the run (other
    # users of the machine) spreads over all layouts instead of favouring the last ones.
    secs = {n: [] for n, _ in layouts}
    runs = {n: [] for n, _ in layouts}
    files = {}
    for k in range(a.repeat):
        for name, layout in layouts:
            s_, r_, files[name] = measure(a, d, name, layout, [k])
            secs[name] += s_
            runs[name] += r_
            print(f"round {k}: {name:20s} measured {r_[-1]['median_s']:8.3f} s  load {r_[-1]['load_after']}", flush=True)
    rows = []
    for name, layout in layouts:
        pred = float("nan") if a.measure_only else predict(a, d, files[name])[0]
        meas = statistics.median(secs[name])
        rows.append({"layout": name, "file": files[name].name, "layout_json": layout, "predicted_s": pred,
                     "measured_s": meas, "runs": runs[name]})
        print(f"{name:20s} predicted {pred:8.3f} s  measured {meas:8.3f} s", flush=True)
    fixed = [r for r in rows if r["layout"] not in ("planner's choice", "hand-written")]
    rho = float("nan") if a.measure_only else spearman([r["predicted_s"] for r in fixed], [r["measured_s"] for r in fixed])
    res = {"spearman": rho, "rows": rows, "calibration": cal, "slow_factor": a.slow_factor, "steps": a.steps,
           "warmup": a.warmup, "repeat": a.repeat, "niceness": niceness, "load_start": load0, "load_end": load(),
           "uptime_start": up0, "uptime_end": uptime(), "calibrated_terms": not a.no_calibrated_terms,
           "spearman_all": None if a.measure_only else spearman([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]),
           "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
           "seconds": time.time() - t0, "plan": plan_json}
    by = {r["layout"]: r for r in rows}
    if "planner's choice" not in by and not a.measure_only:
        # Without the planner's search: its choice among the fixed layouts (lowest prediction), against
        # the hand-written layouts (even split [3,3], equal micro-batches [2,2]).
        best = min(fixed, key=lambda r: r["predicted_s"])
        res["choice_note"] = "no `ckpt plan` search: the planner's choice = the lowest prediction of the fixed layouts"
        by["planner's choice"] = best
        res["planner_choice_layout"] = best["layout"]
        for hand_name in ("pp=2 [3,3]", "dp=2 mb [2,2]"):
            if hand_name in by:
                h = by[hand_name]
                res.setdefault("gains", []).append(
                    {"hand": hand_name, "choice": best["layout"], "predicted_gain": h["predicted_s"] / best["predicted_s"],
                     "measured_gain": h["measured_s"] / best["measured_s"]})
                g = res["gains"][-1]
                g["ratio"] = g["predicted_gain"] / g["measured_gain"]
                print(f"choice {best['layout']} vs hand-written {hand_name}: predicted gain {g['predicted_gain']:.3f}x, "
                      f"measured {g['measured_gain']:.3f}x (ratio {g['ratio']:.3f})")
    if "hand-written" in by:
        p, h = by["planner's choice"], by["hand-written"]
        res["predicted_gain"] = h["predicted_s"] / p["predicted_s"]
        res["measured_gain"] = h["measured_s"] / p["measured_s"]
        res["gain_ratio"] = res["predicted_gain"] / res["measured_gain"]
    print("\n| layout | predicted s/step | measured s/step | load (1 min) after |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['predicted_s']:.3f} | {r['measured_s']:.3f} | {r['runs'][-1]['load_after'][0]} |")
    print(f"\nSpearman (fixed layouts, {len(fixed)}): {rho:.3f}; all {len(rows)} rows: {res['spearman_all']}")
    if "predicted_gain" in res:
        print(f"planner vs hand-written: predicted gain {res['predicted_gain']:.3f}x, measured "
              f"{res['measured_gain']:.3f}x (ratio {res['gain_ratio']:.3f})")
    print(f"load average start {load0}, end {res['load_end']}, niceness {niceness}")
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
