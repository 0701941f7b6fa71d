"""Tensor parallelism of the trainer's model (Megatron-LM column/row-parallel linears,
vocab-parallel embedding and cross-entropy), under mpirun: tests/tools/tp_check runs one
micro-batch forward + backward of each rank's shard and of the one-process model (the oracle,
built by every rank on the same weights and data) and reports, per rank, its loss and the worst
gradient error over its own boxes (relative to the tensor's largest gradient). Float64 gives
the tight bound (1e-10), float32 1e-5. The vocabulary of 300 rows is split unevenly (tp=2,
divisor 100: 200 + 100 rows) and with an empty last rank (tp=4, divisor 64: 128, 128, 44, 0).
"""
import json
import os
import pathlib
import subprocess

import pytest

from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)


def _tool():
    p = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", pathlib.Path(__file__).parents[2] / "build")) / "tp_check"
    if not p.exists():
        pytest.fail(f"tp_check not found at {p}: build it first")
    return str(p)


def _config(tmp_path, kv_heads=4, tied=False, heads=8, inter=96, layers=2):
    c = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=64, attention_bias=False, mlp_bias=False, hidden_act="silu",
             torch_dtype="float32", vocab_size=300, hidden_size=64, intermediate_size=inter, num_hidden_layers=layers,
             num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=8, tie_word_embeddings=tied)
    p = tmp_path / f"config_{kv_heads}_{heads}_{inter}_{layers}_{int(tied)}.json"
    p.write_text(json.dumps(c))
    return p


def _run(tp, cfg, *args, pp=1):
    return subprocess.run(mpirun_cmd(tp * pp, _tool(), cfg, "--tp", tp, "--pp", pp, *args), capture_output=True,
                          text=True, timeout=300)


def _check(ranks, tp, pp, f64, tied, label):
    assert [x["rank"] for x in ranks] == list(range(tp * pp))
    worst = max(ranks, key=lambda x: x["worst_rel"])
    print(f"{label}: worst gradient error {worst['worst_rel']:.3g} ({worst['worst_tensor']}, rank {worst['rank']})")
    assert worst["worst_rel"] <= (1e-10 if f64 else 1e-5), worst
    # The loss (last stage) is the one-process loss, and the same on every TP rank.
    ref = ranks[0]["loss_ref"]
    last = [x for x in ranks if x["pp_rank"] == pp - 1]
    assert all(x["loss"] is None for x in ranks if x["pp_rank"] < pp - 1)
    for x in last:
        assert abs(x["loss"] - ref) <= (1e-12 if f64 else 1e-6) * abs(ref), x
        assert abs(x["loss"] - last[0]["loss"]) <= 1e-14 * abs(ref), (x, last[0])
    shared = 0  # one copy of every replicated tensor
    for stage in range(pp):
        group = [x for x in ranks if x["pp_rank"] == stage]
        shared += group[0]["replicated_numel"]
        # Vocabulary rows of the embedding / head: contiguous, in rank order, covering [0, 300);
        # padded rows never held.
        bounds = [tuple(x["vocab"]) for x in group]
        assert bounds == ([(0, 128), (128, 256), (256, 300), (300, 300)] if tp == 4 else
                          [(0, 200), (200, 300)] if tp == 2 else [(0, 300)]), bounds
    # Every rank holds only its shard: the shards plus one copy of the replicated norms are the
    # model (the tied embedding twice with pp > 1: on the first and the last stage).
    twice = 300 * 64 if tied and pp > 1 else 0
    assert sum(x["numel"] - x["replicated_numel"] for x in ranks) + shared == ranks[0]["full_numel"] + twice


@pytest.mark.parametrize("tp,divisor,tied,f64", [
    (2, 100, False, True), (2, 100, False, False), (2, 100, True, True), (2, 100, True, False),
    (4, 64, False, True), (4, 64, False, False)])
def test_tp_shard_gradients_match_one_process(tmp_path, tp, divisor, tied, f64):
    r = _run(tp, _config(tmp_path, tied=tied), "--vocab-divisor", divisor, "--f64", int(f64))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    _check(out["ranks"], tp, 1, f64, tied, f"tp={tp} tied={tied} f64={f64}")
    assert out["ranks"][0]["replicated_numel"] == (2 * 2 + 1) * 64  # the norms


@pytest.mark.parametrize("tp,pp,tied,f64", [(2, 2, True, True), (2, 2, True, False), (2, 2, False, True),
                                            (1, 3, True, True)])
def test_tp_and_pipeline_stages_match_one_process(tmp_path, tp, pp, tied, f64):
    """Stages chained by send/recv over 3 micro-batches in flight, tied embedding gradients summed
    over the first and last stage: the same gradients as the one-process model."""
    r = _run(tp, _config(tmp_path, tied=tied, layers=3), "--vocab-divisor", 100, "--f64", int(f64),
             "--micro-batches", 3, pp=pp)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    _check(out["ranks"], tp, pp, f64, tied, f"tp={tp} pp={pp} tied={tied} f64={f64}")


@pytest.mark.parametrize("tp,kv,heads,inter,named", [
    (4, 2, 8, 96, "num_key_value_heads=2"), (2, 4, 8, 97, "intermediate_size=97"),
    (3, 4, 8, 96, "num_attention_heads=8")])
def test_tp_not_dividing_the_model_is_refused(tmp_path, tp, kv, heads, inter, named):
    r = _run(tp, _config(tmp_path, kv_heads=kv, heads=heads, inter=inter))
    assert r.returncode != 0
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert not out["ok"] and out["code"] == "LayoutRefused", out
    assert f"tp={tp}" in out["message"] and named in out["message"], out
