"""The trainer's gradient sum over replicas (trainer/optim/replica_sum.h) under mpirun, through
tests/tools/replica_sum_check: every rank fills its boxes with values of (rank, tensor, element),
sums, and rank 0 compares every element with a naive reference (the sum over the (pipeline,
stage) holding it of their lowest TP rank's value; elements of one (pipeline, stage) unchanged),
in float64 and float32 (values are multiples of 1/8: both exact). counted() must tile every tensor
once (lowest holder counts). Negative controls in the same runs: the reference that also sums TP
replicas, the one that ignores the pipeline scope, and one perturbed value must each give
mismatches where the layout makes them differ; sum() must refuse box lists that differ from the
plan; and one run where a rank corrupts a summed value must fail. Expert tensors of an
expert-parallel layout (a Mixtral): every holder's value is summed, TP ranks of a stage included.
A 6-layer model (hidden 32, 4 heads, 2 KV heads: tp 4 replicates each KV head on 2 ranks;
vocabulary 100 with divisor 16: tp 2 splits it 64 + 36, tp 4 32 + 32 + 32 + 4).
"""
import json
import os
import pathlib
import subprocess

import pytest

from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)


def _tool():
    p = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", pathlib.Path(__file__).parents[2] / "build")) / "replica_sum_check"
    if not p.exists():
        pytest.fail(f"replica_sum_check not found at {p}: build it first")
    return str(p)


def _config(tmp_path, tied):
    c = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=64, attention_bias=False, mlp_bias=False, hidden_act="silu",
             torch_dtype="float32", vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=6,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=tied)
    p = tmp_path / f"config_{int(tied)}.json"
    p.write_text(json.dumps(c))
    return p


def _general(pipelines):
    """pipelines: [[(layers, tp), ...], ...] -> the general layout JSON."""
    return dict(pipelines=[dict(micro_batch=1, stages=[dict(layers=n, tp=t, device="") for n, t in p])
                           for p in pipelines], zero=0, num_layers=6, vocab_divisor=16, profile="reference",
                rank_order="tp-dp-pp")


def _run(tmp_path, name, layout, tied, *args, config=None):
    lp = tmp_path / f"{name}.json"
    lp.write_text(json.dumps(layout))
    n = _ranks(layout)
    r = subprocess.run(mpirun_cmd(n, _tool(), config or _config(tmp_path, tied), lp, *args), capture_output=True,
                       text=True, timeout=120)
    lines = [x for x in r.stdout.splitlines() if x.startswith("{")]
    assert lines, f"no report (exit {r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r.returncode, json.loads(lines[-1])


def _ranks(layout):
    if "pipelines" in layout:
        return sum(s["tp"] for p in layout["pipelines"] for s in p["stages"])
    return layout["tp"] * layout["pp"] * layout.get("dp", 1)


def _checks(rc, out, scopes):
    """The run passed; returns {(scope, dtype): check}."""
    assert rc == 0 and out["ok"], json.dumps(out)[:2000]
    got = {(c["scope"], c["dtype"]): c for c in out["checks"]}
    assert sorted(got) == sorted((s, d) for s in scopes for d in ("f64", "f32"))
    for c in got.values():
        assert c["mismatches"] == 0 and c["max_err"] == 0, c
        assert c["elements"] > 0 and c["perturbed"] == 1, c  # the checker sees one changed value
    assert out["counted"]["bad"] == 0 and out["counted"]["elements"] > 0, out["counted"]
    assert out["validation"]["bad"] == [], out["validation"]
    ex = out["validation"]["example"]  # rank 0's changed box: the message names tensor and both boxes
    assert "tensor 'model." in ex and "given, the layout gives this rank [" in ex, ex
    return got


def test_symmetric_dp2_equals_plain_dp_sum(tmp_path):
    # tp 1, pp 3, dp 2, tied: equal to the trainer's tied-embedding + DP all-reduces.
    layout = dict(tp=1, pp=3, dp=2, zero=0, layers_per_stage=[2, 2, 2], vocab_divisor=16)
    rc, out = _run(tmp_path, "sym", layout, True, "--scopes", "world,pipeline", "--fill", "stage")
    got = _checks(rc, out, ["world", "pipeline"])
    for c in got.values():
        if c["dtype"] == "f64":
            assert c["legacy_max_err"] == 0, c
    w, p = got["world", "f64"], got["pipeline", "f64"]
    assert w["summed"] == w["elements"]  # dp 2: every element has a DP peer
    assert 0 < p["summed"] < p["elements"] and p["ignore_scope"] > 0  # the tied embedding only
    assert w["elements_per_sum"][0] > p["elements_per_sum"][0] > 0


def test_flashflex_pipelines(tmp_path):
    # pipeline 0 = [2 layers tp 2 | 4 layers tp 1], pipeline 1 = [3 tp 1 | 3 tp 1]; untied.
    layout = _general([[(2, 2), (4, 1)], [(3, 1), (3, 1)]])
    rc, out = _run(tmp_path, "flashflex", layout, False, "--scopes", "world,pipeline")
    got = _checks(rc, out, ["world", "pipeline"])
    w, p = got["world", "f64"], got["pipeline", "f64"]
    assert w["summed"] == w["elements"] and w["tp_replicas"] > 0, w  # norms replicated on the tp 2 stage
    assert p["summed"] == 0 and p["ignore_scope"] > 0 and p["elements_per_sum"] == [0] * 5, p


def test_flagscale_meshes_tied(tmp_path):
    # 2 pipelines, stage 0 (3 layers) tp 2, stage 1 (3 layers) tp 1, tied embedding: within a
    # pipeline the embedding is vocab-split 64 + 36 on stage 0 and whole on stage 1.
    layout = _general([[(3, 2), (3, 1)], [(3, 2), (3, 1)]])
    rc, out = _run(tmp_path, "flagscale", layout, True, "--scopes", "world,pipeline")
    got = _checks(rc, out, ["world", "pipeline"])
    w, p = got["world", "f64"], got["pipeline", "f64"]
    assert w["summed"] == w["elements"] and w["tp_replicas"] > 0
    assert 0 < p["summed"] < p["elements"] and p["ignore_scope"] > 0
    emb = 100 * 32
    assert p["summed"] == 2 * 2 * emb  # per pipeline: both stages' copies of every embedding row


def test_tp4_replicated_kv_and_tied_mix(tmp_path):
    # pipeline 0 = [3 tp 4 (KV heads on 2 ranks each) | 3 tp 1], pipeline 1 = [6 tp 1], tied.
    layout = _general([[(3, 4), (3, 1)], [(6, 1)]])
    rc, out = _run(tmp_path, "tp4", layout, True, "--scopes", "world,pipeline")
    got = _checks(rc, out, ["world", "pipeline"])
    w = got["world", "f64"]
    assert w["summed"] == w["elements"] and w["tp_replicas"] > 0
    assert got["pipeline", "f64"]["ignore_scope"] > 0


def test_corrupted_value_fails(tmp_path):
    layout = dict(tp=1, pp=1, dp=2, zero=0, layers_per_stage=[6], vocab_divisor=16)
    rc, out = _run(tmp_path, "corrupt", layout, False, "--corrupt", "1")
    assert rc == 1 and not out["ok"], out
    bad = [c for c in out["checks"] if c["mismatches"]]
    assert [(c["scope"], c["dtype"], c["mismatches"]) for c in bad] == [("world", "f64", 1)], out
    assert bad[0]["first"].startswith("rank 1 ") and "expected" in bad[0]["first"], bad[0]


@pytest.mark.parametrize("tp,dp,ep,etp", [(2, 1, 1, 1), (2, 2, 2, 1), (1, 4, 2, 1)])
def test_expert_tensors_sum_every_holder(tmp_path, tp, dp, ep, etp):
    """Expert parallelism (docs/MOE.md "Expert parallelism in the trainer"): the ranks holding the same
    expert element computed it on other routed rows, so the reference sums every holder's value, TP
    ranks of one stage included (tp2 with etp 1: both TP ranks hold every expert whole)."""
    c = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=64, hidden_act="silu", vocab_size=100, hidden_size=32, intermediate_size=48,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             tie_word_embeddings=False, num_local_experts=4, num_experts_per_tok=2)
    cfg = tmp_path / "mixtral.json"
    cfg.write_text(json.dumps(c))
    layout = dict(tp=tp, pp=1, dp=dp, zero=0, layers_per_stage=[2], vocab_divisor=16, ep=ep, etp=etp)
    rc, out = _run(tmp_path, f"ep_{tp}_{dp}_{ep}_{etp}", layout, False, "--scopes", "world", config=cfg)
    got = _checks(rc, out, ["world"])
    assert all(c["summed"] > 0 for c in got.values()), got
