"""`ckpt plan --memory-model embedded` against `ckpt train --cluster` (issue 38): one memory model for
planner and trainer. On a cluster whose devices hold little more than the trainer's process
constant, the megatron memory model (the formula: no process constant, dtype weights) plans a layout
that `ckpt train --layout L --cluster C` refuses (RankOutOfMemory); the embedded model plans one the
trainer accepts, and the plan's memory of every rank is the trainer's own estimate byte for byte
(<run>/memory.json, written by the run itself). A 6 MiB device: the embedded plan says no layout
fits and why."""
import json
import pathlib
import subprocess

import pytest

from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd
from trainer_runs import ckpt, ckpt_path

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "tiny_llama.json"
G, SEQ = 8, 32


def cluster_file(tmp_path, memory, name="cluster.json"):
    f = tmp_path / name
    f.write_text(json.dumps({"device_types": [{"name": "x", "memory": memory, "peak_flops": 4e10, "link_bandwidth": "2GB/s",
                                               "dtype": "fp32"}],
                             "ranks": [{"type": "x", "count": 2}]}))
    return f


def plan(cl, *extra, check=True):
    return ckpt("plan", "--cluster", cl, "--model", CONFIG, "--global-batch", G, "--seq-len", SEQ, *extra, check=check)


def train(tmp_path, cl, layout_file, run):
    layout = json.loads(layout_file.read_text())
    world = sum(st["tp"] for pl in layout["pipelines"] for st in pl["stages"]) if "pipelines" in layout else \
        layout["tp"] * layout["pp"] * layout["dp"]
    mbs = [pl["micro_batch"] for pl in layout["pipelines"]] if "pipelines" in layout else layout.get("micro_batch", [1])
    cmd = [ckpt_path(), "train", "--config", CONFIG, "--layout", layout_file, "--grad-accum", G // sum(mbs), "--seq-len", SEQ,
           "--steps", 1, "--out", tmp_path / run, "--cluster", cl]
    cmd = mpirun_cmd(world, *cmd) if world > 1 else [str(c) for c in cmd]
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=240)


@pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
def test_embedded_plan_trains_where_the_megatron_plan_is_refused(tmp_path):
    # Capacity: the trainer's estimate of the two-stage pipeline [2 | 2], micro-batches of 1, + 1 MiB.
    pp = tmp_path / "pp.json"
    pp.write_text(json.dumps({"pipelines": [{"micro_batch": 1, "stages": [{"layers": 2, "tp": 1}, {"layers": 2, "tp": 1}]}],
                              "zero": 0}))
    e = json.loads(plan(cluster_file(tmp_path, "1GiB", "big.json"), "--evaluate", pp, "--json", "--memory-model", "embedded").stdout)
    assert e["memory_model"] == "embedded"
    cl = cluster_file(tmp_path, max(r["memory_bytes"] for r in e["ranks"]) + (1 << 20))

    megatron = json.loads(plan(cl, "--json", "-o", tmp_path / "megatron.json").stdout)
    assert megatron["memory_model"] == "megatron" and megatron["best"]["feasible"]
    r = train(tmp_path, cl, tmp_path / "megatron.json", "run_megatron")
    assert r.returncode != 0 and "RankOutOfMemory" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]

    text = plan(cl, "--memory-model", "embedded").stdout
    assert "memory model: embedded" in text, text
    best = json.loads(plan(cl, "--json", "--memory-model", "embedded", "-o", tmp_path / "embedded.json").stdout)
    assert best["memory_model"] == "embedded" and best["best"]["memory_model"] == "embedded"
    r = train(tmp_path, cl, tmp_path / "embedded.json", "run")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    measured = json.loads((tmp_path / "run" / "memory.json").read_text())["ranks"]
    assert [m["total"] for m in measured] == [x["memory_bytes"] for x in best["best"]["ranks"]]
    assert all(x["memory_bytes"] <= x["capacity_bytes"] for x in best["best"]["ranks"])


def test_a_device_below_the_process_constant_fits_nothing(tmp_path):
    cl = cluster_file(tmp_path, "6MiB")
    assert json.loads(plan(cl, "--json").stdout)["best"]["feasible"]  # the formula alone fits it
    p = plan(cl, "--memory-model", "embedded", check=False)
    assert p.returncode == 2 and "PlanInfeasible" in p.stderr and "process constant" in p.stderr, p.stderr
    p = plan(cl, "--memory-model", "deepspeed", check=False)
    assert p.returncode == 2 and "BadPlan" in p.stderr and "'embedded'" in p.stderr, p.stderr
