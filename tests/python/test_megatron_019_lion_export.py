"""export-megatron --dist-opt of a one-moment optimizer's state (Lion) against megatron-core 0.19.2's own
files of the same run (fixtures/megatron_core_019/distopt_lion_dp_reshardable and distopt_lion_legacy_torch:
a DistributedOptimizer over emerging_optimizers' Lion, tp 2 x dp 2, bucket size 2048).

The store imported from the dp_reshardable fixture (masters, exp_avg, no step, args.optimizer 'lion') is
exported as the distributed optimizer at the fixture's layout; every bucket tensor (torch_dist, read by
torch's DCP loader) and world buffer (legacy distrib_optim.pt, torch.load) equals megatron-core's own file
element for element except the vocabulary padding rows (megatron-core keeps what it initialised there; the
store holds the 200 real rows and ckpt writes zeros); there is no exp_avg_sq; the param groups equal
megatron-core's (Lion's keys, no step, no eps); args record optimizer 'lion' and lion_beta1/2; the reimport
equals the store. That megatron-core itself loads the export into a DistributedOptimizer over Lion and its
next step equals the fixture's is check_resume.py --optimizer lion (Python 3.12, by hand: README.md there).
"""
import json

import numpy as np
import pytest
import torch

from test_megatron_019 import FIX, HIDDEN, TP_SAVED, VOCAB, _diff_equal
from test_megatron_019_distopt import _dcp_buckets, _layout, _registration_order
from test_megatron_019_distopt_export import _bytes_item

SRC = "distopt_lion_dp_reshardable"
LEGACY = "distopt_lion_legacy_torch"
DIST_OPT = ["--tp", 2, "--dist-opt", "--dp", 2, "--ddp-bucket-size", 2048, "--local-norms"]


@pytest.fixture(scope="module")
def store(tmp_path_factory, ckpt_bin):
    import subprocess
    d = tmp_path_factory.mktemp("lion") / "native"
    subprocess.run([ckpt_bin, "reshard", str(FIX / SRC), str(d), "--tp", "1", "--pp", "1", "--dp", "1"],
                   check=True, capture_output=True)
    return d


def _padding_mask(sizes, r):
    """Per bucket, True where no real element sits: the 64-element alignment gaps (megatron-core leaves
    them uninitialised) and the vocabulary padding rows (ids >= 200) of TP rank r's embedding and output layer."""
    order = _registration_order(TP_SAVED)
    where, _ = _layout(order, 2048, 2)
    masks = [np.ones(n, bool) for n in sizes]
    for pname, n in order.items():
        b, off = where[pname]
        masks[b][off:off + n] = False
    for pname in ("embedding.word_embeddings.weight", "output_layer.weight"):
        b, off = where[pname]
        rows = order[pname] // HIDDEN
        keep = max(0, min(rows, VOCAB - r * rows))
        masks[b][off + keep * HIDDEN:off + order[pname]] = True
    return masks


def _equal_but_padding(mine, theirs, mask, what):
    assert mine.shape == theirs.shape, what
    assert not mine[mask].any(), f"{what}: alignment gaps / vocabulary padding not zero"
    np.testing.assert_array_equal(mine[~mask], theirs[~mask], err_msg=what)


def test_torch_dist_lion_buckets_equal_megatron_core_files(run_ckpt, store, tmp_path):
    d = tmp_path / "td"
    run_ckpt("export-megatron", store, d, "--format", "torch_dist", *DIST_OPT)
    theirs_dir = FIX / SRC / "iter_0000010"
    for r in range(TP_SAVED):
        mine, theirs = _dcp_buckets(d, r), _dcp_buckets(theirs_dir, r)
        assert sorted(mine) == sorted(theirs)
        assert {k for _, k in mine} == {"param", "exp_avg"}  # one moment: no exp_avg_sq
        sizes = [mine[(b, "param")].shape[0] for b in range(len({b for b, _ in mine}))]
        masks = _padding_mask(sizes, r)
        for (b, k), v in mine.items():
            _equal_but_padding(v, theirs[(b, k)], masks[b], f"tp{r} bucket {b} {k}")
        for obj in ("optimizer", "per_bucket_numel", "per_bucket_numel_unpadded"):
            fqn = f"optimizer.distributed.dp_group_idx_{r}.{obj}/shard_0_1"
            assert _bytes_item(d, fqn) == _bytes_item(theirs_dir, fqn), fqn  # Lion's groups: no step, no eps
    (common,) = _bytes_item(d, "common_state/shard_0_1")
    (want,) = _bytes_item(theirs_dir, "common_state/shard_0_1")
    assert common["content_metadata"] == want["content_metadata"] and common["optimizer"] == want["optimizer"]
    a, w = common["args"], want["args"]
    for f in ("optimizer", "lion_beta1", "lion_beta2", "lr", "weight_decay", "use_distributed_optimizer",
              "data_parallel_size", "ddp_bucket_size", "overlap_grad_reduce"):
        assert getattr(a, f) == getattr(w, f), f


def test_legacy_lion_distrib_optim_equals_megatron_core_files(run_ckpt, store, tmp_path):
    d = tmp_path / "lg"
    run_ckpt("export-megatron", store, d, "--format", "torch", *DIST_OPT, "--iteration", 10)
    for r in range(TP_SAVED):
        rank, their_rank = (x / "iter_0000010" / f"mp_rank_{r:02d}" for x in (d, FIX / LEGACY))
        mine, theirs = (torch.load(x / "distrib_optim.pt", weights_only=False) for x in (rank, their_rank))
        assert list(mine) == list(theirs) == ["buckets_coalesced", 0]
        ((key, bufs),) = mine[0].items()
        ((their_key, their_bufs),) = theirs[0].items()
        assert key == their_key == (torch.float32, torch.float32)
        assert list(bufs) == list(their_bufs) == ["param", "exp_avg", "numel_unpadded"]
        assert bufs["numel_unpadded"] == their_bufs["numel_unpadded"]
        _, sizes = _layout(_registration_order(TP_SAVED), 2048, 2)
        mask = np.concatenate(_padding_mask(sizes, r))
        for k in ("param", "exp_avg"):
            _equal_but_padding(bufs[k].numpy(), their_bufs[k].numpy(), mask, f"tp{r} {k}")
        m, t = (torch.load(x / "model_optim_rng.pt", weights_only=False) for x in (rank, their_rank))
        assert m["optimizer"] == t["optimizer"]  # DistributedOptimizer.state_dict(): Lion's param groups, no step
        assert (m["args"].optimizer, m["args"].lion_beta1, m["args"].lion_beta2) == ("lion", 0.95, 0.98)


@pytest.mark.parametrize("fmt", ["torch", "torch_dist"])
def test_lion_export_reimports_equal_to_the_store(fmt, run_ckpt, store, tmp_path):
    d = tmp_path / "out"
    run_ckpt("export-megatron", store, d, "--format", fmt, *DIST_OPT, *(["--iteration", 10] if fmt == "torch" else []))
    back = tmp_path / "back"
    run_ckpt("reshard", d, back, "--tp", 1, "--pp", 1, "--dp", 1)
    _diff_equal(run_ckpt, store, back)
    info = json.loads(run_ckpt("inspect", d, "--json").stdout)
    assert info["optimizer"]["optimizer"] == "lion" and info["optimizer"]["moments"] == ["exp_avg"], info["optimizer"]


@pytest.mark.parametrize("case,code", [
    ("no_dist_opt", "MegatronOneMomentExport"),  # FP32Optimizer's per-parameter Lion state: not written
    ("not_lion", "MegatronOneMomentExport"),  # exp_avg only, no args.optimizer 'lion' recorded: which optimizer?
])
def test_lion_export_refusals_are_named(case, code, run_ckpt, store, tmp_path):
    src = store
    args = ["--format", "torch_dist", *DIST_OPT]
    if case == "no_dist_opt":
        args = ["--format", "torch", "--tp", 2, "--local-norms"]
    if case == "not_lion":  # the same tensors as HF safetensors + config.json: no megatron_args recorded
        from native_h5py import read_native
        from safetensors.numpy import save_file
        man, got, _ = read_native(store)
        src = tmp_path / "hf"
        src.mkdir()
        save_file({k: np.ascontiguousarray(v) for k, v in got.items()}, str(src / "model.safetensors"))
        (src / "config.json").write_text(json.dumps((man["metadata"] if "metadata" in man else man)["model_config"]))
    p = run_ckpt("export-megatron", src, tmp_path / "out", *args, check=False)
    assert p.returncode != 0 and code in p.stderr and "internal error" not in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def _local_shard(g, name, r, tp=2):
    """TP rank r's shard of mcore parameter `name` (decoder.layers.<i>. ... or not) from the global
    fully_reshardable tensor `g` of its stacked key (layer index first for decoder.layers.*)."""
    if name.startswith("decoder.layers."):
        i, rest = name[len("decoder.layers."):].split(".", 1)
        t = g[int(i)]
    else:
        rest, t = name, g
    def rows(a):
        n = a.shape[0] // tp
        return a[r * n:(r + 1) * n]
    if rest.endswith(("linear_qkv.weight",)) or name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return rows(t)
    if rest.endswith("linear_fc1.weight"):  # [gate; up], each split by rows
        half = t.shape[0] // 2
        return np.concatenate([rows(t[:half]), rows(t[half:])])
    if rest.endswith(("linear_proj.weight", "linear_fc2.weight")):
        n = t.shape[1] // tp
        return t[:, r * n:(r + 1) * n]
    return t  # norms: replicated


def test_lion_fully_reshardable_equals_megatron_core_buckets(run_ckpt, store, tmp_path):
    """--dist-opt-sharding fully_reshardable of the Lion store: optimizer.state.{param,exp_avg}.<key> (no
    exp_avg_sq), each parameter's TP shard equal to its slice of megatron-core's own dp_reshardable buckets
    (distopt_lion_dp_reshardable, placed by the numpy layout); Lion's param groups (no step) in the common
    state. megatron-core 0.19.2 loads it and resumes bit for bit (check_resume.py --form fully_reshardable
    --optimizer lion against the uninterrupted run: README.md there)."""
    from test_megatron_019_distopt_export import _dcp_tensors
    d = tmp_path / "fr"
    run_ckpt("export-megatron", store, d, "--format", "torch_dist", "--tp", 2, "--dist-opt", "--dp", 2,
             "--dist-opt-sharding", "fully_reshardable", "--local-norms")
    got = _dcp_tensors(d, "optimizer.state.")
    assert {k.split(".")[2] for k in got} == {"param", "exp_avg"} and len(got) == 2 * 9
    order = _registration_order(TP_SAVED)
    where, _ = _layout(order, 2048, 2)
    compared = 0
    for r in range(TP_SAVED):
        theirs = _dcp_buckets(FIX / SRC / "iter_0000010", r)
        for name, n in order.items():
            key = name if not name.startswith("decoder.layers.") else "decoder.layers." + name.split(".", 3)[3]
            # the sharded keys name the norms as Transformer Engine does, local spec or not
            key = key.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight")
            key = key.replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")
            b, off = where[name]
            for st in ("param", "exp_avg"):
                mine = _local_shard(got[f"optimizer.state.{st}.{key}"], name, r).reshape(-1)
                want = theirs[(b, st)][off:off + n]
                assert mine.shape == want.shape, (name, st)
                keep = n if name not in ("embedding.word_embeddings.weight", "output_layer.weight") else \
                    max(0, min(n // HIDDEN, VOCAB - r * (n // HIDDEN))) * HIDDEN
                np.testing.assert_array_equal(mine[:keep], want[:keep], err_msg=f"tp{r} {name} {st}")
                compared += 1
    assert compared == 2 * 2 * len(order)
    (common,) = _bytes_item(d, "common_state/shard_0_1")
    (theirs_groups,) = _bytes_item(FIX / SRC / "iter_0000010", "optimizer.distributed.dp_group_idx_0.optimizer/shard_0_1")
    assert common["optimizer"]["optimizer"] == theirs_groups and common["optimizer"]["param_state_sharding_type"] == "fully_reshardable"
