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


def _config(tmp_path, kv_heads=4, tied=False, heads=8, inter=96):
    c = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=64, attention_bias=False, mlp_bias=False, hidden_act="silu",
             torch_dtype="float32", vocab_size=300, hidden_size=64, intermediate_size=inter, num_hidden_layers=2,
             num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=8, tie_word_embeddings=tied)
    p = tmp_path / f"config_{kv_heads}_{heads}_{inter}_{int(tied)}.json"
    p.write_text(json.dumps(c))
    return p


def _run(tp, cfg, *args):
    return subprocess.run(mpirun_cmd(tp, _tool(), cfg, "--tp", tp, *args), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.parametrize("tp,divisor,tied,f64", [
    (2, 100, False, True), (2, 100, False, False), (2, 100, True, True), (2, 100, True, False),
    (4, 64, False, True), (4, 64, False, False)])
def test_tp_shard_gradients_match_one_process(tmp_path, tp, divisor, tied, f64):
    r = _run(tp, _config(tmp_path, tied=tied), "--vocab-divisor", divisor, "--f64", int(f64))
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    ranks = out["ranks"]
    assert [x["rank"] for x in ranks] == list(range(tp))
    worst = max(ranks, key=lambda x: x["worst_rel"])
    print(f"tp={tp} tied={tied} f64={f64}: worst gradient error {worst['worst_rel']:.3g} "
          f"({worst['worst_tensor']}, rank {worst['rank']})")
    assert worst["worst_rel"] <= (1e-10 if f64 else 1e-5), worst
    # The loss is the one-process loss, and the same on every TP rank.
    ref = ranks[0]["loss_ref"]
    for x in ranks:
        assert abs(x["loss"] - ref) <= (1e-12 if f64 else 1e-6) * abs(ref), x
        assert abs(x["loss"] - ranks[0]["loss"]) <= 1e-14 * abs(ref), (x, ranks[0])
    # Vocabulary rows: contiguous, in rank order, covering [0, 300); padded rows never held.
    bounds = [tuple(x["vocab"]) for x in ranks]
    assert bounds[0][0] == 0 and bounds[-1][1] == 300, bounds
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])), bounds
    if tp == 4:
        assert bounds == [(0, 128), (128, 256), (256, 300), (300, 300)]
    else:
        assert bounds == [(0, 200), (200, 300)]
    # Every rank holds only its shard: the shards plus one copy of the replicated norms are the model.
    rep = ranks[0]["replicated_numel"]
    assert rep == (2 * 2 + 1) * 64
    assert sum(x["numel"] - x["replicated_numel"] for x in ranks) + rep == ranks[0]["full_numel"]


@pytest.mark.parametrize("tp,kv,heads,inter,named", [
    (4, 2, 8, 96, "num_key_value_heads=2"), (2, 4, 8, 97, "intermediate_size=97"),
    (3, 4, 8, 96, "num_attention_heads=8")])
def test_tp_not_dividing_the_model_is_refused(tmp_path, tp, kv, heads, inter, named):
    r = _run(tp, _config(tmp_path, kv_heads=kv, heads=heads, inter=inter))
    assert r.returncode != 0
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert not out["ok"] and out["code"] == "LayoutRefused", out
    assert f"tp={tp}" in out["message"] and named in out["message"], out
