#!/usr/bin/env python3
"""MoE training benchmark (issue 38; docs/BENCHMARKS.md "MoE training", docs/PLAN.md "Mixture of experts"):
tokens/s and the all-to-all share of `ckpt train` on a small MoE model at ep 1, 2, 4 (and with tp),
and `ckpt plan --evaluate`'s predictions for the same layouts on the same cluster description.

    python benchmarks/train_moe_bench.py [--ckpt build/ckpt] [--train-ckpt BIN] [--np 4] [--steps 6] [--warmup 2]
        [--repeat 1] [--calibration FILE] [--out results.json] [--quick]

1. Model (DIR/model.json): Mixtral-shaped, 8 experts of width 512, top-2, hidden 256, 4 layers,
   8 heads / 4 KV heads, vocab 264; seq 128; global batch 8 sequences (micro-batches of 1 per
   data-parallel rank, grad-accum = 8 / dp).
2. Cluster (DIR/cluster.json): --np ranks of this machine's device type (`ckpt plan --calibrate`, or
   --calibration FILE; its cost terms, the all-to-all's included, go to every `ckpt plan` call).
3. Layouts (symmetric layout files): at --np 4 dp4 at ep 1, 2, 4 (etp 1), tp2 x dp2 at ep 1 and
   ep 2 x etp 1, ep 2 x etp 2; at --np 2 dp2 at ep 1 and 2, tp2 at ep 1 x etp 1 and ep 2 x etp 1.
   Each runs `mpirun -np N --oversubscribe ckpt train --layout L` (--allow-run-as-root as root) for
   --steps steps, --repeat times round robin over the layouts (as benchmarks/plan_validate.py: a
   drifting load reaches every layout alike; the load after each round is recorded) (also recorded:
   the step's compute_s, comm_s, idle_s, router_load); measured: the median over the runs' steps
   after --warmup of `tokens_per_s` and of `a2a_s` / `seconds` (train_log.jsonl; `a2a_s` is the trainer's all-to-all seconds per
   step, absent before expert parallelism: the share is then reported as 0 at ep 1). A layout the
   trainer refuses (expert parallelism before it exists, MoE under tp) is printed as a "refused"
   row with the trainer's error; it takes no part in the Spearman.
4. Predictions: `ckpt plan --evaluate L --json` (tokens_per_s, a2a_share) under balanced routing and,
   when the run's router_load (max / mean tokens per expert) is above 1, again with `--router-load`
   set to it (predicted_at_load, its own Spearman); and the plan's own choice
   (`ckpt plan --json`) for the record. Spearman rank correlation of predicted vs measured tokens/s
   over the measured layouts (as benchmarks/plan_validate.py does for dense models).
5. The machine's state: load average and free memory (/proc/meminfo) before and after.
--quick: a tiny model (2 layers, hidden 64, 4 experts, seq 32), ep 1 in one process, 2 steps,
no calibration (a fixed device type): checks that the commands work together; its figures mean
nothing. --train-ckpt: another build's binary for `ckpt train` (e.g. a branch with expert
parallelism in the trainer; default --ckpt). stdlib only.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from plan_validate import spearman as plan_spearman  # noqa: E402  one rank correlation for both benchmarks

MODEL = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 264, "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
    "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "max_position_embeddings": 512, "tie_word_embeddings": False, "hidden_act": "silu",
    "bos_token_id": 256, "eos_token_id": 257,
}
QUICK_MODEL = dict(MODEL, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, num_local_experts=4)
SEQ, QUICK_SEQ = 128, 32
GLOBAL_BATCH = 8
# name -> (tp, dp, ep, etp); world = tp * dp.
LAYOUTS = [("dp4 ep1", 1, 4, 1, 1), ("dp4 ep2", 1, 4, 2, 1), ("dp4 ep4", 1, 4, 4, 1),
           ("tp2 dp2 ep1", 2, 2, 1, 2), ("tp2 dp2 ep2 etp1", 2, 2, 2, 1), ("tp2 dp2 ep2 etp2", 2, 2, 2, 2),
           ("dp2 ep1", 1, 2, 1, 1), ("dp2 ep2", 1, 2, 2, 1), ("tp2 ep1 etp1", 2, 1, 1, 1), ("tp2 ep2 etp1", 2, 1, 2, 1)]
QUICK_LAYOUTS = [("ep1", 1, 1, 1, 1)]


def run(cmd, check=True, timeout=1800):
    r = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 and check:
        sys.exit(f"failed ({r.returncode}): {' '.join(map(str, cmd))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def mpirun(n, *args):
    cmd = [shutil.which("mpirun") or "mpirun"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["--oversubscribe", "--mca", "btl", "self,vader", "--mca", "pml", "ob1", "-np", str(n), *map(str, args)]


def machine_state():
    free = None
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"load": [round(x, 2) for x in os.getloadavg()], "mem_available_bytes": free}


def layout_json(num_layers, tp, dp, ep, etp):
    j = {"tp": tp, "pp": 1, "dp": dp, "zero": 0, "layers_per_stage": [num_layers]}
    if ep > 1 or etp != tp:
        j.update(ep=ep, etp=etp)
    return j


def error_line(r):
    """The trainer's named error (the first line with a '[', else the last non-empty line)."""
    lines = [x.strip() for x in (r.stderr + "\n" + r.stdout).splitlines() if x.strip()]
    named = [x for x in lines if "[" in x and "]" in x]
    return (named or lines or ["(no output)"])[0][:300]


def run_once(a, d, lf, world, seq):
    """One run's steps after the warm-up (train_log.jsonl records), or the trainer's refusal (a string)."""
    out = d / f"run_{lf.stem}"
    shutil.rmtree(out, ignore_errors=True)
    grad_accum = GLOBAL_BATCH // (world // json.loads(lf.read_text())["tp"])
    args = [a.train_ckpt, "train", "--config", d / "model.json", "--layout", lf, "--out", out, "--steps", a.steps, "--seq-len", seq,
            "--grad-accum", grad_accum, "--micro-batch", 1, "--threads", 1, "--warmup", 1, "--save-every", 0]
    r = run(mpirun(world, *args) if world > 1 else args, check=False)
    if r.returncode != 0:
        return error_line(r)
    recs = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines() if x.strip()]
    shutil.rmtree(out, ignore_errors=True)
    return [x for x in recs if "step" in x and "tokens_per_s" in x][a.warmup:] or [x for x in recs if "tokens_per_s" in x]


def summarize(name, runs):
    """Median tokens/s and all-to-all share over the steps of every run (pooled), per-run medians kept."""
    refused = [r for r in runs if isinstance(r, str)]
    if refused:
        return {"layout": name, "refused": refused[0]}
    steps = [x for r in runs for x in r]
    tps = statistics.median(x["tokens_per_s"] for x in steps)
    share = statistics.median(x.get("a2a_s", 0.0) / x["seconds"] if x.get("seconds") else 0.0 for x in steps)
    med = {k: statistics.median(x.get(k, 0.0) for x in steps) for k in ("compute_s", "comm_s", "idle_s", "a2a_s", "router_load")}
    return {"layout": name, "tokens_per_s": tps, "a2a_share": share, "steps": len(steps),
            "step_s": statistics.median(x["seconds"] for x in steps), **med,
            "runs_tokens_per_s": [statistics.median(x["tokens_per_s"] for x in r) for r in runs]}


def predict(a, d, lf, seq, router_load=1.0):
    r = run([a.ckpt, "plan", "--evaluate", lf, "--cluster", d / "cluster.json", "--model", d / "model.json", "--global-batch",
             GLOBAL_BATCH, "--seq-len", seq, "--json", "--router-load", router_load, *a.cal_args], check=False)
    if r.returncode != 0:
        return {"refused": error_line(r)}
    j = json.loads(r.stdout)
    return {"tokens_per_s": j["tokens_per_s"], "a2a_share": j.get("a2a_share", 0.0), "feasible": j["feasible"],
            "step_s": j["step_time_s"]}


def spearman(x, y):
    """plan_validate's rank correlation over the layouts; nan with fewer than two or a constant side."""
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return float("nan")
    return plan_spearman(x, y)


def write_inputs(a, d, model, world):
    if a.quick:
        dev = {"name": "cpu", "vendor": "cpu", "memory": 8 << 30, "peak_flops": 1e10, "link_bandwidth": 2000000000, "dtype": "fp32"}
        a.cal_args = []
    else:
        f = d / "calibration.json"
        if a.calibration:
            shutil.copy(a.calibration, f)
        else:
            run([a.ckpt, "plan", "--calibrate", "-o", f])
        dev = dict(json.loads(f.read_text())["device_type"], name="cpu")
        a.cal_args = ["--calibration", f]
    (d / "cluster.json").write_text(json.dumps({"device_types": [dev], "ranks": [{"type": "cpu", "count": world}]}, indent=1))
    (d / "model.json").write_text(json.dumps(model, indent=1))


def plan_choice(a, d, seq):
    r = run([a.ckpt, "plan", "--cluster", d / "cluster.json", "--model", d / "model.json", "--global-batch", GLOBAL_BATCH,
             "--seq-len", seq, "--json", *a.cal_args], check=False)
    if r.returncode != 0:
        return {"refused": error_line(r)}
    best = json.loads(r.stdout)["best"]
    return {"layout_text": best.get("layout_text"), "tokens_per_s": best["tokens_per_s"], "ep": best.get("ep", 1),
            "etp": best.get("etp"), "a2a_share": best.get("a2a_share", 0.0)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--train-ckpt", default=None, help="the binary that runs `ckpt train` (default: --ckpt)")
    ap.add_argument("--np", type=int, default=4, help="ranks of the cluster and of every run")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs per layout, round robin over the layouts")
    ap.add_argument("--calibration", default=None, help="a `ckpt plan --calibrate` output to reuse")
    ap.add_argument("--out", default=None, help="JSON results file")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    a.ckpt = str(pathlib.Path(a.ckpt).resolve())
    a.train_ckpt = str(pathlib.Path(a.train_ckpt).resolve()) if a.train_ckpt else a.ckpt
    if a.quick:
        a.steps, a.warmup, a.np, a.repeat = 2, 1, 1, 1
    model, seq = (QUICK_MODEL, QUICK_SEQ) if a.quick else (MODEL, SEQ)
    layouts = QUICK_LAYOUTS if a.quick else [x for x in LAYOUTS if x[1] * x[2] == a.np]
    with tempfile.TemporaryDirectory() as tmp:
        d = pathlib.Path(a.dir or tmp)
        d.mkdir(parents=True, exist_ok=True)
        before = machine_state()
        write_inputs(a, d, model, a.np)
        files = []
        for name, tp, dp, ep, etp in layouts:
            lf = d / f"{name.replace(' ', '_')}.json"
            lf.write_text(json.dumps(layout_json(model["num_hidden_layers"], tp, dp, ep, etp)))
            files.append((name, lf, tp * dp))
        # Round robin (as benchmarks/plan_validate.py): round k runs every layout once, so that a load
        # that drifts during the benchmark (other jobs on the machine) reaches every layout alike.
        runs = {name: [] for name, _, _ in files}
        loads = []
        for k in range(a.repeat):
            for name, lf, world in files:
                if not any(isinstance(r, str) for r in runs[name]):
                    runs[name].append(run_once(a, d, lf, world, seq))
            loads.append(machine_state()["load"])
        rows = []
        for name, lf, world in files:
            row = summarize(name, runs[name])
            row["predicted"] = predict(a, d, lf, seq)
            if row.get("router_load", 0) > 1:  # the run's own routing imbalance (max / mean tokens per expert)
                row["predicted_at_load"] = predict(a, d, lf, seq, min(row["router_load"], model["num_local_experts"]))
            rows.append(row)
            print(f"{name:18s} " + (f"refused: {row['refused']}" if "refused" in row else
                                    f"measured {row['tokens_per_s']:9.1f} tokens/s a2a {100 * row['a2a_share']:5.1f}%") +
                  ("" if "refused" in row["predicted"] else
                   f"  predicted {row['predicted']['tokens_per_s']:9.1f} tokens/s a2a {100 * row['predicted']['a2a_share']:5.1f}%"),
                  flush=True)
        ok = [r for r in rows if "refused" not in r and "refused" not in r["predicted"]]
        rho = spearman([r["predicted"]["tokens_per_s"] for r in ok], [r["tokens_per_s"] for r in ok])
        at = [r for r in ok if "tokens_per_s" in r.get("predicted_at_load", {})]
        rho_load = spearman([r["predicted_at_load"]["tokens_per_s"] for r in at], [r["tokens_per_s"] for r in at])
        res = {"model": model, "seq_len": seq, "global_batch": GLOBAL_BATCH, "np": a.np, "rows": rows, "spearman": rho, "spearman_at_load": rho_load,
               "measured_layouts": len(ok), "plan": plan_choice(a, d, seq), "machine_before": before, "machine_after": machine_state(),
               "repeat": a.repeat, "load_after_each_round": loads}
    print("\n| layout | measured tokens/s | measured a2a | predicted tokens/s | predicted a2a |\n|---|---|---|---|---|")
    for r in rows:
        m = ("refused", "-") if "refused" in r else (f"{r['tokens_per_s']:.1f}", f"{100 * r['a2a_share']:.1f}%")
        p = r["predicted"]
        q = ("refused", "-") if "refused" in p else (f"{p['tokens_per_s']:.1f}", f"{100 * p['a2a_share']:.1f}%")
        print(f"| {r['layout']} | {m[0]} | {m[1]} | {q[0]} | {q[1]} |")
    print(f"\nSpearman over {len(ok)} measured layouts: {rho:.3f} (balanced routing), {rho_load:.3f} over {len(at)} with each run's "
          f"router load (--router-load); plan's choice: {res['plan']}")
    print(f"machine before: {res['machine_before']}, after: {res['machine_after']}")
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
