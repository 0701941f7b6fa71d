"""ckpt plan end to end: the layout `ckpt plan -o` writes is taken as is by `ckpt train --layout`
(one step under mpirun, oversubscribed), `--evaluate` of that layout predicts what the search
reported for it, and the FLOPs per step match a count from the model's matmul shapes made here
(from transformers' LlamaConfig)."""
import json
import pathlib
import subprocess

import pytest

from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd
from trainer_runs import ckpt, ckpt_path

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONFIG = ROOT / "fixtures" / "tiny_llama.json"

CLUSTER = {
    "device_types": [
        {"name": "fast", "memory": "1GiB", "peak_flops": 4e10, "link_bandwidth": "2GB/s", "dtype": "fp32"},
        {"name": "slow", "memory": "1GiB", "peak_flops": 1e10, "link_bandwidth": "2GB/s", "dtype": "fp32"},
    ],
    "nodes": [{"name": "n0", "devices": [{"type": "fast", "count": 1}, {"type": "slow", "count": 2}]}],
}
G, SEQ = 8, 32


def naive_step_flops(cfg, sequences, s):
    from transformers import LlamaConfig
    c = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures",)})
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    n = sequences * s
    d, f, h, k, v = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size
    layer = 2 * n * d * h * hd + 2 * 2 * n * d * k * hd + 2 * n * h * hd * d + 2 * 2 * sequences * h * s * s * hd + 3 * 2 * n * d * f
    return 3 * (c.num_hidden_layers * layer + 2 * n * d * v)


@pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
def test_plan_layout_trains_and_evaluates(tmp_path):
    cl = tmp_path / "cluster.json"
    cl.write_text(json.dumps(CLUSTER))
    out = tmp_path / "layout.json"
    p = ckpt("plan", "--cluster", cl, "--model", CONFIG, "--global-batch", G, "--seq-len", SEQ, "-o", out, "--json", "--top", "2")
    plan = json.loads(p.stdout)
    layout = json.loads(out.read_text())
    assert layout == plan["best"]["layout"]
    assert plan["best"]["feasible"] and plan["best"]["step_time_s"] > 0
    cfg = json.loads(CONFIG.read_text())
    assert plan["best"]["flops_per_step"] == pytest.approx(naive_step_flops(cfg, G, SEQ), rel=1e-12)
    # --evaluate of the written layout gives the search's prediction (same placement rule).
    e = json.loads(ckpt("plan", "--cluster", cl, "--model", CONFIG, "--global-batch", G, "--seq-len", SEQ,
                        "--evaluate", out, "--json", "--trainer-memory").stdout)
    assert all(r["trainer_memory_bytes"] > 0 for r in e["ranks"])
    assert e["feasible"]
    assert e["step_time_s"] == pytest.approx(plan["best"]["step_time_s"], rel=1e-12)
    assert [r["cluster_rank"] for r in e["ranks"]] == plan["best"]["placement"]
    assert set(e) >= {"step_time_s", "tokens_per_s", "stages", "pipelines", "ranks", "problems"}
    # The trainer takes the layout as is and runs a step.
    world = sum(st["tp"] for pl in layout["pipelines"] for st in pl["stages"]) if "pipelines" in layout else \
        layout["tp"] * layout["pp"] * layout["dp"]
    mbs = [pl["micro_batch"] for pl in layout["pipelines"]] if "pipelines" in layout else layout.get("micro_batch", [1])
    grad_accum = G // sum(mbs)
    cmd = [ckpt_path(), "train", "--config", CONFIG, "--layout", out, "--grad-accum", grad_accum, "--seq-len", SEQ,
           "--steps", 1, "--out", tmp_path / "run"]
    cmd = mpirun_cmd(world, *cmd) if world > 1 else [str(c) for c in cmd]
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert (tmp_path / "run" / "latest").exists()


def naive_params(cfg):
    d, f, h, k, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], \
        cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    layer = d * h * hd * 2 + 2 * d * k * hd + 3 * d * f + 2 * d
    return cfg["num_hidden_layers"] * layer + cfg["vocab_size"] * d * (1 if cfg.get("tie_word_embeddings") else 2) + d


def test_plan_calibration_terms_in_the_prediction(tmp_path):
    """--calibration: 2 replicas on one node compute at concurrency[1] of their speed and pay the
    per-micro-batch cost; the step time against a computation made here (FLOPs from transformers'
    config, the gradient all-reduce of every parameter over the 2 GB/s link, 5 us per ring step)."""
    cl = tmp_path / "cluster.json"
    cl.write_text(json.dumps({"device_types": [{"name": "x", "memory": "1GiB", "peak_flops": 4e10, "efficiency": 0.5,
                                                "link_bandwidth": "2GB/s", "dtype": "fp32"}],
                              "ranks": [{"type": "x", "count": 2}]}))
    layout = tmp_path / "dp2.json"
    layout.write_text(json.dumps({"pipelines": [{"micro_batch": 2, "stages": [{"layers": 4, "tp": 1}]}] * 2, "zero": 0}))
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"cost_terms": {"concurrency": [1, 0.6], "micro_batch_overhead_s": 0.004,
                                              "allreduce_latency_s": 1e-4, "allreduce_bytes_per_s": 1e9}}))
    cfg = json.loads(CONFIG.read_text())
    assert cfg["num_hidden_layers"] == 4
    base = ["plan", "--cluster", cl, "--model", CONFIG, "--global-batch", G, "--seq-len", SEQ, "--evaluate", layout, "--json"]
    with_cal = json.loads(ckpt(*base, "--calibration", cal).stdout)
    plain = json.loads(ckpt(*base).stdout)
    m = G // 4
    sync = naive_params(cfg) * 4 / 2e9 + 2 * 5e-6
    want = m * (naive_step_flops(cfg, 2, SEQ) / (4e10 * 0.5 * 0.6) + 0.004) + sync
    assert with_cal["step_time_s"] == pytest.approx(want, rel=1e-9)
    assert plain["step_time_s"] == pytest.approx(m * naive_step_flops(cfg, 2, SEQ) / (4e10 * 0.5) + sync, rel=1e-9)
    # The search takes the same terms: its best is evaluated with them.
    p = json.loads(ckpt("plan", "--cluster", cl, "--model", CONFIG, "--global-batch", G, "--seq-len", SEQ, "--json",
                        "--calibration", cal).stdout)
    assert all(st["time_s"] >= 0.004 for st in p["best"]["stages"])
    bad = tmp_path / "bad_cal.json"
    bad.write_text(json.dumps({"cost_terms": {"concurrency": [1, 2.0]}}))
    r = ckpt(*base, "--calibration", bad, check=False)
    assert r.returncode == 2 and "BadCalibration" in r.stderr and "bad_cal.json" in r.stderr and "(0, 1]" in r.stderr


def test_plan_bad_clusters_say_what(tmp_path):
    bad = tmp_path / "empty_node.json"
    bad.write_text(json.dumps({"device_types": [{"name": "x", "memory": "1GiB", "peak_flops": 1e12}],
                               "nodes": [{"name": "n0", "devices": []}]}))
    p = ckpt("plan", "--cluster", bad, "--model", CONFIG, "--global-batch", 4, check=False)
    assert p.returncode == 2 and "cluster node 'n0' is empty" in p.stderr
    small = tmp_path / "small.json"
    small.write_text(json.dumps({"device_types": [{"name": "x", "memory": 4096, "peak_flops": 1e12}],
                                 "ranks": [{"type": "x", "count": 2}]}))
    p = ckpt("plan", "--cluster", small, "--model", CONFIG, "--global-batch", 4, "--seq-len", 16, check=False)
    assert p.returncode == 2, p.stderr
    assert "PlanInfeasible" in p.stderr and "short by" in p.stderr and "over by" in p.stderr


def test_replan_from_checkpoint_reshards_to_the_new_cluster(tmp_path):
    run_dir = tmp_path / "run"
    ckpt("train", "--config", CONFIG, "--steps", 1, "--micro-batch", 2, "--grad-accum", 2, "--seq-len", SEQ, "--out", run_dir)
    cl = tmp_path / "cluster.json"
    cl.write_text(json.dumps(CLUSTER))
    dst = tmp_path / "dst"
    p = ckpt("plan", "--from", run_dir, "--cluster", cl, "-o", tmp_path / "planned.json")
    assert "ckpt reshard" in p.stdout and "global batch 4 x 32 tokens" in p.stdout, p.stdout
    ckpt("plan", "--from", run_dir, "--cluster", cl, "--reshard", dst)
    planned = json.loads((tmp_path / "dst.layout.json").read_text())
    manifest = json.loads((dst / "manifest.json").read_text())
    assert {k: manifest["layout"][k] for k in planned} == planned
    # The plan is for the new cluster's 3 devices and the checkpoint's batch (4 sequences).
    if "pipelines" in planned:
        assert sum(st["tp"] for pl in planned["pipelines"] for st in pl["stages"]) == 3
    ckpt("verify", dst)
    # The source checkpoint is untouched: it still verifies.
    ckpt("verify", run_dir)


MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 264, "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_local_experts": 4, "num_experts_per_tok": 2, "max_position_embeddings": 64}


def test_plan_moe_flops_ep_and_refusals(tmp_path):
    """An MoE config: the FLOPs per step against a count made here (attention, router 2nDE, top-k experts
    6nDkF, head), ep / etp / a2a share in `--evaluate --json`, `-o` carries "ep" / "etp"; DeepSeek-V3
    (MLA) is refused by name."""
    model, cl = tmp_path / "mixtral.json", tmp_path / "cluster.json"
    model.write_text(json.dumps(MIXTRAL))
    cl.write_text(json.dumps({"device_types": [CLUSTER["device_types"][0]], "ranks": [{"type": "fast", "count": 4}]}))
    lay = tmp_path / "ep2.json"
    lay.write_text(json.dumps({"tp": 1, "pp": 1, "dp": 4, "zero": 0, "layers_per_stage": [2], "ep": 2, "etp": 1}))
    j = json.loads(ckpt("plan", "--evaluate", lay, "--cluster", cl, "--model", model, "--global-batch", G, "--seq-len", SEQ,
                        "--json").stdout)
    c = MIXTRAL
    n, d, hd = G * SEQ, c["hidden_size"], c["hidden_size"] // c["num_attention_heads"]
    h, k, e, top, f = c["num_attention_heads"], c["num_key_value_heads"], c["num_local_experts"], c["num_experts_per_tok"], c["intermediate_size"]
    attn = 2 * n * d * h * hd + 2 * 2 * n * d * k * hd + 2 * n * h * hd * d + 2 * 2 * G * h * SEQ * SEQ * hd
    layer = attn + 2 * n * d * e + top * 3 * 2 * n * d * f
    assert j["flops_per_step"] == pytest.approx(3 * (c["num_hidden_layers"] * layer + 2 * n * d * c["vocab_size"]), rel=1e-12)
    assert j["ep"] == 2 and j["etp"] == 1 and 0 < j["a2a_share"] < 1 and j["a2a_s_per_step"] > 0, j
    out = tmp_path / "planned.json"
    best = json.loads(ckpt("plan", "--cluster", cl, "--model", model, "--global-batch", G, "--seq-len", SEQ, "--json", "-o",
                           out).stdout)["best"]
    written = json.loads(out.read_text())
    assert written.get("ep", 1) == best["ep"] and written.get("etp", best["etp"]) == best["etp"], (written, best)
    for bad in ("0.5", "5"):  # the routing imbalance is a max / mean of 4 experts: [1, 4]
        p = ckpt("plan", "--evaluate", lay, "--cluster", cl, "--model", model, "--global-batch", G, "--seq-len", SEQ,
                 "--router-load", bad, check=False)
        assert p.returncode != 0 and "[BadPlan]" in p.stderr and "--router-load" in p.stderr, p.stderr
    ds = json.loads((ROOT / "fixtures" / "moe" / "deepseek_v3" / "legacy" / "config.json").read_text())
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    p = ckpt("plan", "--cluster", cl, "--model", tmp_path / "ds.json", "--global-batch", G, "--seq-len", SEQ, check=False)
    assert p.returncode != 0 and "[UnsupportedModel]" in p.stderr and "MLA" in p.stderr, p.stderr
