"""Smoke test of benchmarks/train_moe_bench.py (docs/BENCHMARKS.md "MoE training"): one --quick run
(a tiny Mixtral, ep 1 in one process, 2 steps) measures tokens/s and predicts them with `ckpt plan
--evaluate`; the figures it writes must follow from the run's own numbers, recomputed here: tokens/s
= global batch x seq / step seconds on both sides, no all-to-all at ep 1; the plan's choice is an
MoE plan that names its ep. The script's Spearman against hand-ranked examples (ties averaged)."""
import importlib.util
import json
import math
import pathlib
import subprocess
import sys

from trainer_runs import ckpt_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "train_moe_bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("train_moe_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_measures_and_predicts(tmp_path):
    out = tmp_path / "res.json"
    r = subprocess.run([sys.executable, BENCH, "--ckpt", ckpt_path(), "--quick", "--dir", tmp_path / "work", "--out", out],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["np"] == 1 and res["global_batch"] == 8 and res["seq_len"] == 32
    (row,) = res["rows"]
    assert "refused" not in row, row
    tokens = res["global_batch"] * res["seq_len"]
    assert abs(row["tokens_per_s"] - tokens / row["step_s"]) <= 1e-6 * row["tokens_per_s"], row
    assert row["a2a_share"] == 0.0
    p = row["predicted"]
    assert p["feasible"] and p["a2a_share"] == 0.0
    assert abs(p["tokens_per_s"] - tokens / p["step_s"]) <= 1e-9 * p["tokens_per_s"], p
    assert res["plan"].get("ep", 0) >= 1 and "refused" not in res["plan"], res["plan"]
    assert res["machine_before"]["load"] and res["machine_after"]["mem_available_bytes"] > 0
    assert "| ep1 |" in r.stdout and "Spearman" in r.stdout


def test_spearman_against_hand_ranks():
    b = load_bench()
    assert b.spearman([1, 2, 3], [10, 20, 30]) == 1.0
    assert b.spearman([1, 2, 3], [30, 20, 10]) == -1.0
    assert sys.modules["plan_validate"].ranks([5, 1, 5, 3]) == [3.5, 1.0, 3.5, 2.0]  # the shared ranks, ties averaged
    assert math.isnan(b.spearman([1, 1, 1], [1, 2, 3])) and math.isnan(b.spearman([1], [2]))
    # Ranks [1, 2, 3, 4] vs [1, 3, 2, 4]: 1 - 6 * 2 / (4 * 15) = 0.8.
    assert abs(b.spearman([1, 2, 3, 4], [1, 3, 2, 4]) - 0.8) < 1e-12
