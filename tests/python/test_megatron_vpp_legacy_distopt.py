"""A virtual pipeline's distributed optimizer in Megatron-LM's LEGACY format, against megatron-core 0.19.2
(fixtures/megatron_core_019/distopt_legacy_vpp2_pp2: the interleaved run of distopt_vpp2_pp2, pp 2 x vpp 2 x
dp 2, saved as Megatron-LM's save_checkpoint does with --ckpt-format torch --use-distributed-optimizer:
mp_rank_00_00P/model_optim_rng.pt holding model0, model1 and DistributedOptimizer.state_dict(), and
megatron-core's own save_parameter_state's distrib_optim.pt beside it: {buckets_coalesced, 0: {dtype:
{param, exp_avg, exp_avg_sq, numel_unpadded}}, 1: {...}}, one grad buffer per model chunk).
  * import: the fp32 masters and both moments equal megatron-core's get_parameter_state_dp_zero() of every
    chunk element-wise (the oracles beside the fixture, as test_megatron_vpp._vpp_oracle reads them), the
    step is 2, nothing is named not imported; the import equals the torch_dist import of the same run
    (distopt_vpp2_pp2) tensor for tensor; HF logits equal megatron-core's; reshard to tp 2 and back is
    byte-identical.
  * dp_zero_gather_scatter of the same run (distopt_zero_vpp2_pp2: param_state with grad buffers 0, 1):
    equal to megatron-core's state and to the dp_reshardable import.
  * hostile distrib_optim.pt: a grad buffer missing, a third one, numel_unpadded that does not add up, a
    moment missing in chunk 1's buffer -> named errors, nothing written.
"""
import json
import shutil

import numpy as np
import pytest
import torch

from test_megatron_vpp import FIX, LAYERS, VOCAB, _diff_equal, _hf_logits, _import_equals_vpp_oracle, _rel

NAME = "distopt_legacy_vpp2_pp2"


def test_legacy_vpp_distopt_state_equals_megatron_core(run_ckpt, tmp_path):
    native, got, mg = _import_equals_vpp_oracle(run_ckpt, NAME, tmp_path)
    assert mg["optimizer_step"] == 2
    # the same run saved as torch_dist (dp_reshardable buckets per chunk) imports to the same tensors
    other = tmp_path / "td"
    run_ckpt("reshard", FIX / "distopt_vpp2_pp2", other, "--tp", 1, "--pp", 1, "--dp", 1)
    rep = json.loads(run_ckpt("diff", native, other, "--json").stdout)
    assert rep["equal"] is True and rep["counts"]["identical"] == 117 == len(got), rep["counts"]
    run_ckpt("to-hf", FIX / NAME, tmp_path / "hf")
    logits = _hf_logits(tmp_path / "hf", np.load(FIX / NAME / "tokens.npy"))
    assert _rel(logits, np.load(FIX / NAME / "logits.npy")[..., :VOCAB]) <= 1e-5
    run_ckpt("reshard", FIX / NAME, tmp_path / "a", "--tp", 2, "--pp", 1, "--dp", 1)
    run_ckpt("reshard", tmp_path / "a", tmp_path / "b", "--tp", 1, "--pp", 1, "--dp", 1)
    _diff_equal(run_ckpt, native, tmp_path / "b")


def _edit_distrib(tmp_path, pp_rank, edit):
    d = tmp_path / "src"
    shutil.copytree(FIX / NAME, d)
    f = d / "iter_0000010" / f"mp_rank_00_{pp_rank:03d}" / "distrib_optim.pt"
    st = torch.load(f, weights_only=False)
    edit(st)
    torch.save(st, f)
    return d


@pytest.mark.parametrize("case,code", [
    ("drop_gbuf1", "UnsupportedDistOptim"),
    ("third_gbuf", "UnsupportedDistOptim"),
    ("numel", "DistOptimBucketMismatch"),
    ("no_moment_sq", "MissingDistOptimState"),
])
def test_legacy_vpp_distrib_optim_hostile(case, code, run_ckpt, tmp_path):
    def edit(st):
        if case == "drop_gbuf1":
            del st[1]
            return
        if case == "third_gbuf":
            st[2] = st[1]
        (dkey,) = st[1]
        buf = st[1][dkey]
        if case == "numel":  # every buffer cut by 64 and numel_unpadded with it: the layout gives more
            for k in ("param", "exp_avg", "exp_avg_sq"):
                buf[k] = buf[k][:-64].clone()
            buf["numel_unpadded"] -= 64
        if case == "no_moment_sq":
            del buf["exp_avg_sq"]
    d = _edit_distrib(tmp_path, 1, edit)
    p = run_ckpt("reshard", d, tmp_path / "out", "--tp", 1, "--pp", 1, "--dp", 1, check=False)
    assert p.returncode != 0 and code in p.stderr and "internal error" not in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
    if case != "third_gbuf":
        assert "grad buffer 1" in p.stderr or case == "drop_gbuf1", p.stderr


def test_legacy_vpp_dist_opt_export_equals_megatron_core_files(run_ckpt, tmp_path):
    """The import exported as the legacy format with --pp 2 --vpp 2 --dist-opt --dp 2 --ddp-bucket-size
    2048 (the run's settings): per pipeline rank, distrib_optim.pt holds grad buffers 0 and 1 of
    megatron-core's sizes and every parameter's slice equal to megatron-core's own file bit for bit
    (placed by megatron-core's param_index_map in the oracle JSON; not compared: the alignment gaps,
    torch.empty in megatron-core, and the vocabulary padding rows, which must be zeros here); the
    rank file's optimizer entry (DistributedOptimizer.state_dict(): param groups, step) equals
    megatron-core's; the export imports back equal to the store."""
    store = tmp_path / "store"
    run_ckpt("reshard", FIX / NAME, store, "--tp", 1, "--pp", 1, "--dp", 1)
    out = tmp_path / "lg"
    run_ckpt("export-megatron", store, out, "--format", "torch", "--pp", 2, "--vpp", 2, "--dist-opt", "--dp", 2,
             "--ddp-bucket-size", 2048, "--local-norms", "--iteration", 10)
    compared = 0
    for p in (0, 1):
        rank, ref_rank = (d / "iter_0000010" / f"mp_rank_00_{p:03d}" for d in (out, FIX / NAME))
        mine, ref = (torch.load(d / "distrib_optim.pt", weights_only=False) for d in (rank, ref_rank))
        assert list(mine) == list(ref) == ["buckets_coalesced", 0, 1]
        lay = json.loads((FIX / NAME / f"optimizer_oracle_tp0_pp{p}.json").read_text())
        for key, q in lay["params"].items():
            g, b = q["gbuf"], q["bucket"]
            ((dk, m),), ((rk, r),) = mine[g].items(), ref[g].items()
            assert dk == rk and m["numel_unpadded"] == r["numel_unpadded"] and list(m) == list(r)
            (unpadded,) = lay["per_bucket_numel_unpadded"][str(g)].values()
            lo = q["start"] - sum(lay["buckets"][str(g)][:b]) + sum(unpadded[:b])
            n = q["end"] - q["start"]
            pad = None
            if key.endswith(("embedding.word_embeddings.weight", "output_layer.weight")):
                n, pad = VOCAB * q["shape"][1], q["end"] - q["start"]
            for st in ("param", "exp_avg", "exp_avg_sq"):
                np.testing.assert_array_equal(m[st][lo:lo + n].numpy(), r[st][lo:lo + n].numpy(), err_msg=f"pp{p} {key} {st}")
                if pad is not None:
                    assert not m[st][lo + n:lo + pad].any(), f"pp{p} {key} {st}: vocabulary padding not zero"
                compared += 1
        mo, ro = (torch.load(d / "model_optim_rng.pt", weights_only=False) for d in (rank, ref_rank))
        assert mo["optimizer"] == ro["optimizer"]
        assert mo["args"].virtual_pipeline_model_parallel_size == 2 and mo["args"].use_distributed_optimizer
    assert compared == 3 * (3 + 6 * LAYERS)
    back = tmp_path / "back"
    run_ckpt("reshard", out, back, "--tp", 1, "--pp", 1, "--dp", 1)
    _diff_equal(run_ckpt, store, back)


def test_dp_zero_gather_scatter_vpp_equals_megatron_core_state(run_ckpt, tmp_path):
    """distopt_zero_vpp2_pp2 (megatron-core 0.19.2: the same interleaved run saved with the deprecated
    dp_zero_gather_scatter: per pipeline rank the ShardedObject param_state = get_parameter_state_dp_zero(),
    grad buffers 0 and 1): masters and moments equal megatron-core's state of every chunk, nothing named not
    imported, and the import equals the dp_reshardable one of the same run tensor for tensor."""
    native, _, mg = _import_equals_vpp_oracle(run_ckpt, "distopt_zero_vpp2_pp2", tmp_path)
    assert mg["optimizer_sharding_type"] == "dp_zero_gather_scatter" and mg["optimizer_step"] == 2, mg
    other = tmp_path / "td"
    run_ckpt("reshard", FIX / "distopt_vpp2_pp2", other, "--tp", 1, "--pp", 1, "--dp", 1)
    rep = json.loads(run_ckpt("diff", native, other, "--json").stdout)
    assert rep["equal"] is True and rep["counts"]["identical"] == 117, rep["counts"]
