"""`ckpt train --cluster FILE`: the memory check before training and the estimate against the
measured peak RSS.

- Refused before training: a cluster file whose smaller device cannot hold its stage stops the run
  (exit 2, RankOutOfMemory) naming the rank, its place, its device type, the estimate and the
  capacity, before anything is allocated or written (no run dir, no checkpoint); a cluster file
  with another rank count stops it too (ClusterMismatch).
- The estimate (trainer/memory_estimate.h, computed from the config and the layout alone) is
  within 20% of each rank's peak RSS (getrusage, gathered to rank 0 into <run>/memory.json), on a
  model whose parameters, gradients and Adam moments dominate the process constant: hidden 512,
  4 layers, vocab 2048, seq 64; one step and a checkpoint. The oracle is the
  kernel's accounting of each process, not the code's own arithmetic.
"""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd  # noqa: E402

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 2048,
    "hidden_size": 512, "intermediate_size": 2048, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 128, "tie_word_embeddings": False,
    "hidden_act": "silu",
}
COMMON = ["--seq-len", 64, "--threads", 1, "--seed", 3, "--warmup", 1, "--sync-save"]
TOLERANCE = 0.20
TIMEOUT = 300


def ckpt_path():
    p = os.environ.get("CKPT_BIN") or str(pathlib.Path(os.environ.get("CKPT_BINARY_DIR", "../../build")) / "ckpt")
    return str(pathlib.Path(p).resolve())


def write_json(path, obj):
    path.write_text(json.dumps(obj))
    return path


def cluster(types, ranks):
    return {"device_types": [{"name": n, "vendor": "test", "memory": m, "peak_flops": 1e12,
                              "link_bandwidth": "10GB/s", "dtype": "fp32"} for n, m in types],
            "ranks": [{"type": t, "count": c} for t, c in ranks]}


def train(tmp_path, n, out, cluster_file, *args):
    cfg = write_json(tmp_path / "config.json", CONFIG)
    cmd = mpirun_cmd(n, ckpt_path(), "train", "--config", cfg, "--out", out, "--cluster", cluster_file,
                     *COMMON, *args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)


def test_cluster_whose_small_device_cannot_hold_its_stage_is_refused_before_training(tmp_path):
    # Two stages of 1 and 3 layers: stage 1 (rank 1) holds 3 layers and the head, ~460 MiB.
    big_small = write_json(tmp_path / "cluster.json", cluster([("big", "64GiB"), ("small", "48MiB")],
                                                              [("big", 1), ("small", 1)]))
    out = tmp_path / "run"
    p = train(tmp_path, 2, out, big_small, "--pp", 2, "--pp-layers", "1,3", "--steps", 1)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    msg = p.stderr
    assert "RankOutOfMemory" in msg, msg
    assert "rank 1 (pipeline 0, stage 1, tp rank 0) on device type 'small'" in msg, msg
    m = re.search(r"needs an estimated ([\d.]+) MiB \(weights .*\) but the device has 48\.00 MiB", msg)
    assert m and float(m.group(1)) > 48, msg
    assert "cluster.json" in msg, msg
    assert not out.exists(), "the run dir was created before the check"
    assert "step " not in p.stdout, p.stdout
    # The same layout on two big devices runs; a cluster of another rank count does not.
    three = write_json(tmp_path / "three.json", cluster([("big", "64GiB")], [("big", 3)]))
    p = train(tmp_path, 2, out, three, "--pp", 2, "--steps", 1)
    assert p.returncode == 2 and "ClusterMismatch" in p.stderr and "has 3 ranks" in p.stderr, p.stderr
    assert not out.exists()


# 4 ranks each: tensor and pipeline parallel; pipelines of other micro-batch sizes with ZeRO-1.
LAYOUTS = {
    "tp2pp2": ["--tp", 2, "--pp", 2, "--pp-layers", "2,2", "--micro-batch", 2, "--grad-accum", 2],
    "pp2dp2z1": ["--pp", 2, "--pp-layers", "1,3", "--dp", 2, "--zero", 1, "--micro-batches", "2,1",
                 "--grad-accum", 2],
    # General form (FlashFlex style): pipelines with their own stage splits and per-stage tp.
    "flashflex": ["--layout", "{tmp}/flashflex.json", "--grad-accum", 2],
}
FLASHFLEX = {"pipelines": [{"micro_batch": 2, "stages": [{"layers": 2, "tp": 2}, {"layers": 2, "tp": 1}]},
                           {"micro_batch": 1, "stages": [{"layers": 4, "tp": 1}]}], "zero": 0}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_estimate_within_20_percent_of_peak_rss_per_rank(tmp_path, name):
    n = 4
    roomy = write_json(tmp_path / "cluster.json", cluster([("A", "16GiB"), ("B", "8GiB")], [("A", 2), ("B", 2)]))
    out = tmp_path / "run"
    write_json(tmp_path / "flashflex.json", FLASHFLEX)
    args = [str(a).replace("{tmp}", str(tmp_path)) for a in LAYOUTS[name]]
    p = train(tmp_path, n, out, roomy, *args, "--steps", 1)
    assert p.returncode == 0, (p.stdout, p.stderr)
    assert "memory check: every rank fits" in p.stdout, p.stdout
    assert "peak RSS" in p.stdout, p.stdout  # the table printed with --cluster
    report = json.loads((out / "memory.json").read_text())
    rows = report["ranks"]
    assert [r["rank"] for r in rows] == list(range(n))
    table = []
    for r in rows:
        parts = sum(r[k] for k in ("weights", "grads", "optimizer", "activations", "workspace", "buffers",
                                   "checkpoint", "process"))
        assert parts == r["total"], r
        ratio = r["total"] / r["peak_rss"]
        table.append(f"{name} rank {r['rank']} pipeline {r['pipeline']} stage {r['stage']} tp {r['tp_rank']}: estimate {r['total'] / 2**20:.1f} MiB, "
                     f"peak RSS {r['peak_rss'] / 2**20:.1f} MiB, ratio {ratio:.3f}")
        # The model dominates: the process constant is a small part of the estimate.
        assert r["process"] < 0.3 * r["total"], r
    print("\n".join(table))
    for r, line in zip(rows, table):
        assert abs(r["total"] / r["peak_rss"] - 1) <= TOLERANCE, "\n".join(table)
