"""Megatron-Core 0.19 distributed optimizer state beyond test_megatron_019.py (same fixtures,
fixtures/megatron_core_019): dp_reshardable read by an independent numpy restatement of the bucket
layout over torch's own DCP reader (second oracle); buckets of a form ckpt does not map named as not
imported; hostile bucket metadata (sizes that do not add up, numel_unpadded past the padded bucket,
a missing moment / master / bucket, a range not stored), a dp_zero_gather_scatter param_state item
outside its file and hostile legacy distrib_optim.pt files (Megatron-LM's legacy format): named
errors, nothing written.
"""
import dataclasses
import json
import pickle

import numpy as np
import pytest
import torch

from test_megatron_019 import (FIX, FFN, GROUPS, HD, HEADS, HIDDEN, LAYERS, TP_SAVED, VOCAB, _compare_oracle_state,
                               _copy, _mcore_local, _oracle, it_dir)


def _rename_state(old, new):
    def fn(md):
        for k in [k for k in md.state_dict_metadata if k.startswith("optimizer.distributed.") and k.endswith("." + old)]:
            nk = k[:-len(old)] + new
            md.state_dict_metadata[nk] = md.state_dict_metadata.pop(k)
            for s in [s for s in md.storage_data if s.fqn == k]:
                md.storage_data[dataclasses.replace(s, fqn=nk)] = md.storage_data.pop(s)
    return fn


def test_buckets_of_a_form_not_read_are_named_not_imported(run_ckpt, tmp_path):
    """Buckets holding a state ckpt does not map (here exp_avg_sq renamed 'momentum'): the weights
    import, every bucket is named as not imported with the reason, in inspect and the manifest."""
    d = _mutate_metadata(tmp_path, _rename_state("exp_avg_sq", "momentum"))
    info = json.loads(run_ckpt("inspect", "--json", d).stdout)
    note = info["not_imported"]["optimizer"]
    assert "dp_reshardable" in note and "states other than" in note and "bucket_idx_0.param" in note, note
    assert not any(t["name"].startswith("optimizer.") for t in info["tensors"])
    text = run_ckpt("inspect", d).stdout
    assert "not imported (optimizer)" in text, text
    run_ckpt("reshard", d, tmp_path / "n", "--tp", 1, "--pp", 1, "--dp", 1)
    man = json.loads(next((tmp_path / "n").rglob("manifest.json")).read_text())
    mg = man["metadata"]["megatron"] if "metadata" in man else man["megatron"]
    assert mg["optimizer_sharding_type"] == "dp_reshardable"
    assert any("bucket_idx_3.momentum" in k for k in mg["optimizer_not_imported_keys"])


# --- dp_reshardable: an independent reader of the bucket layout, hostile buckets ---

def _layout(numels, bucket_size, dp):
    """megatron-core's _compute_per_buffer_param_layout restated: reverse order, starts aligned to
    64, a bucket closes once it reaches bucket_size, ends padded to lcm(dp, 128)."""
    import math
    pad = math.lcm(dp, 128)
    out, buckets, start, bstart, end = {}, [], 0, 0, 0
    names = list(numels)[::-1]
    for i, n in enumerate(names):
        start = -(-start // 64) * 64
        end = start + numels[n]
        out[n] = (len(buckets), start - bstart)
        if end - bstart >= bucket_size or i == len(names) - 1:
            buckets.append(end - bstart)
            bstart = start = -(-end // pad) * pad
        else:
            start = end
    return out, buckets


def _registration_order(tp):
    """The local spec's parameters of one stage (tp ranks' shapes), in registration order."""
    q = (HEADS * HD + 2 * GROUPS * HD) // tp
    order = {"embedding.word_embeddings.weight": 256 // tp * HIDDEN}
    for i in range(LAYERS):
        p = f"decoder.layers.{i}."
        order.update({p + "input_layernorm.weight": HIDDEN, p + "self_attention.linear_proj.weight": HIDDEN * HEADS * HD // tp,
                      p + "self_attention.linear_qkv.weight": q * HIDDEN, p + "pre_mlp_layernorm.weight": HIDDEN,
                      p + "mlp.linear_fc1.weight": 2 * FFN // tp * HIDDEN, p + "mlp.linear_fc2.weight": HIDDEN * FFN // tp})
    order.update({"decoder.final_layernorm.weight": HIDDEN, "output_layer.weight": 256 // tp * HIDDEN})
    return order


def _dcp_buckets(d, g):
    """Every bucket tensor of dp_group_idx_g, read by torch's own DCP reader."""
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(str(d)).read_metadata()
    keys = [k for k in md.state_dict_metadata if k.startswith(f"optimizer.distributed.dp_group_idx_{g}.gbuf_idx_0.")]
    sd = {k: torch.empty(tuple(md.state_dict_metadata[k].size)) for k in keys}
    dcp.load(sd, storage_reader=dcp.FileSystemReader(str(d)), no_dist=True)
    return {(int(k.split(".bucket_idx_")[1].split(".")[0]), k.rsplit(".", 1)[1]): v.numpy() for k, v in sd.items()}


def test_dp_reshardable_numpy_reader_equals_oracle_and_ckpt(run_ckpt, tmp_path):
    """Second oracle: the buckets read by torch's DCP loader and sliced with the layout restated in
    numpy from the args (bucket size 2048, dp 2) equal megatron-core's state and ckpt's import."""
    from native_h5py import read_native
    name = "distopt_dp_reshardable"
    native = tmp_path / "native"
    run_ckpt("reshard", FIX / name, native, "--tp", 1, "--pp", 1, "--dp", 1)
    _, got, _ = read_native(native)
    for r in range(TP_SAVED):
        order = _registration_order(TP_SAVED)
        where, sizes = _layout(order, 2048, 2)
        bk = _dcp_buckets(it_dir(name), r)
        assert [bk[(b, "param")].shape[0] for b in range(len(sizes))] == sizes
        oracle, _ = _oracle(name, r)
        for pname, n in order.items():
            b, off = where[pname]
            for k, prefix in (("param", ""), ("exp_avg", "optimizer.exp_avg."), ("exp_avg_sq", "optimizer.exp_avg_sq.")):
                mine = bk[(b, k)][off:off + n].reshape(oracle[pname][k].shape)
                np.testing.assert_array_equal(mine, oracle[pname][k], err_msg=f"tp{r} {pname} {k}")
                want = _mcore_local(lambda x: got[prefix + x], pname, r, TP_SAVED)
                if pname in ("embedding.word_embeddings.weight", "output_layer.weight"):
                    keep = max(0, min(mine.shape[0], VOCAB - r * mine.shape[0]))
                    want, mine = want[:keep], mine[:keep]
                np.testing.assert_array_equal(want, mine, err_msg=f"tp{r} {pname} {k}")


def _mutate_metadata(tmp_path, fn, name="distopt_dp_reshardable"):
    d = _copy(name, tmp_path)
    md_file = d / "iter_0000010" / ".metadata"
    md = pickle.loads(md_file.read_bytes())
    fn(md)
    md_file.write_bytes(pickle.dumps(md))
    import hashlib  # integrity.json re-signed: the mutation alone is what the import must name
    ij = d / "iter_0000010" / "integrity.json"
    j = json.loads(ij.read_text())
    j["files"][".metadata"] = hashlib.sha256(md_file.read_bytes()).hexdigest()
    ij.write_text(json.dumps(j))
    return d


def _bucket_keys(md, bucket, states=("param", "exp_avg", "exp_avg_sq"), group=0):
    return [k for k in md.state_dict_metadata
            if k.startswith(f"optimizer.distributed.dp_group_idx_{group}.") and f".bucket_idx_{bucket}." in k
            and k.rsplit(".", 1)[1] in states]


def _resize(size):
    def fn(md):
        for k in _bucket_keys(md, 1):
            md.state_dict_metadata[k] = dataclasses.replace(md.state_dict_metadata[k], size=torch.Size([size]))
    return fn


def _drop(bucket, states):
    def fn(md):
        for k in _bucket_keys(md, bucket, states):
            md.state_dict_metadata.pop(k)
            for s in [s for s in md.storage_data if s.fqn == k]:
                md.storage_data.pop(s)
    return fn


def _drop_chunk(md):
    (k,) = _bucket_keys(md, 0, ("exp_avg",))
    m = md.state_dict_metadata[k]
    md.state_dict_metadata[k] = dataclasses.replace(m, chunks=m.chunks[:1])


@pytest.mark.parametrize("mutate,code", [
    (_resize(2150), "DistOptimBucketMismatch"),       # bucket sizes that do not add up
    (_resize(2300), "DistOptimPastBuffer"),           # numel_unpadded past the padded buffer (2176)
    (_drop(2, ("exp_avg_sq",)), "MissingDistOptimState"),  # one bucket without a moment
    (_drop(1, ("param",)), "MissingDistOptimState"),  # one bucket without masters
    (_drop(3, ("param", "exp_avg", "exp_avg_sq")), "DistOptimBucketCount"),
    (_drop_chunk, "DistOptimRangeNotCovered"),        # half of bucket 0 (output_layer) not stored
])
def test_dp_reshardable_hostile_buckets_are_named(mutate, code, run_ckpt, tmp_path):
    d = _mutate_metadata(tmp_path, mutate)
    for cmd in (["inspect", d], ["to-hf", d, tmp_path / "hf"]):
        p = run_ckpt(*cmd, check=False)
        assert p.returncode != 0 and code in p.stderr, (cmd, p.stderr)
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def test_dp_zero_param_state_outside_its_file_is_named(run_ckpt, tmp_path):
    """dp_zero_gather_scatter: a param_state item pointing past its .distcp file."""
    def fn(md):
        (k,) = [k for k in md.storage_data if k.fqn == "optimizer.distributed.dp_group_idx_1.param_state/shard_0_1"]
        md.storage_data[k] = dataclasses.replace(md.storage_data[k], offset=10**9)
    d = _mutate_metadata(tmp_path, fn, "distopt_dp_zero_gather_scatter")
    p = run_ckpt("to-hf", d, tmp_path / "hf", check=False)
    assert p.returncode != 0 and ("BadDistOptimState" in p.stderr or "DcpItemPastFile" in p.stderr), p.stderr
    assert "param_state" in p.stderr, p.stderr
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def test_legacy_distrib_optim_read_by_numpy_equals_oracle(run_ckpt):
    """Megatron-LM's legacy format with the distributed optimizer (mp_rank_TT/model_optim_rng.pt +
    distrib_optim.pt, written through megatron-core 0.19.2's save_parameter_state): the world buffers
    sliced with the numpy layout (bucket-local start + the earlier buckets unpadded) equal
    megatron-core's state (the second oracle of ckpt's import, test_distopt_state_equals_...)."""
    name = "distopt_legacy_torch"
    info = json.loads(run_ckpt("inspect", "--json", FIX / name).stdout)
    assert "not_imported" not in info, info["not_imported"]
    for r in range(TP_SAVED):
        world = torch.load(it_dir(name) / f"mp_rank_{r:02d}" / "distrib_optim.pt", weights_only=False)
        assert world["buckets_coalesced"] is True
        ((_, bufs),) = world[0].items()
        order = _registration_order(TP_SAVED)
        where, sizes = _layout(order, 2048, 2)
        assert bufs["numel_unpadded"] == sum(sizes) == bufs["param"].numel()
        oracle, _ = _oracle(name, r)
        for pname, n in order.items():
            b, off = where[pname]
            w0 = sum(sizes[:b]) + off
            for k in ("param", "exp_avg", "exp_avg_sq"):
                mine = bufs[k].numpy()[w0:w0 + n].reshape(oracle[pname][k].shape)
                np.testing.assert_array_equal(mine, oracle[pname][k], err_msg=f"tp{r} {pname} {k}")


def _legacy_edit(kind):
    def fn(o):
        ((_, bufs),) = o[0].items()
        if kind == "short":  # every buffer and numel_unpadded 64 elements short: the sizes do not add up
            bufs.update({k: v[:-64].clone() for k, v in bufs.items() if torch.is_tensor(v)}, numel_unpadded=9216)
        elif kind == "past":  # numel_unpadded past the buffers
            bufs["numel_unpadded"] = 99999
        elif kind == "no_moment":
            del bufs["exp_avg"]
        elif kind == "no_moment_sq":  # an Adam run's file without exp_avg_sq: not a one-moment state
            del bufs["exp_avg_sq"]
        elif kind == "not_coalesced":
            o["buckets_coalesced"] = False
    return fn


@pytest.mark.parametrize("kind,code", [("short", "DistOptimBucketMismatch"), ("past", "DistOptimBucketMismatch"),
                                       ("no_moment", "MissingDistOptimState"), ("no_moment_sq", "MissingDistOptimState"),
                                       ("not_coalesced", "UnsupportedDistOptim")])
def test_legacy_distrib_optim_hostile_is_named(kind, code, run_ckpt, tmp_path):
    d = _copy("distopt_legacy_torch", tmp_path)
    f = d / "iter_0000010" / "mp_rank_01" / "distrib_optim.pt"
    o = torch.load(f, weights_only=False)
    _legacy_edit(kind)(o)
    torch.save(o, f)
    p = run_ckpt("to-hf", d, tmp_path / "hf", check=False)
    assert p.returncode != 0 and code in p.stderr and "distrib_optim.pt" in p.stderr, p.stderr
    assert not (tmp_path / "hf" / "model.safetensors").exists()


# --- one moment: a DistributedOptimizer over Lion (fixtures/megatron_core_019/README.md) ---

LION = "distopt_lion_dp_reshardable"


@pytest.mark.parametrize("name", [LION, "distopt_lion_legacy_torch"])
def test_lion_state_equals_megatron_core_state(name, run_ckpt, tmp_path):
    """megatron-core 0.19.2's DistributedOptimizer over Lion keeps one moment (optimizer_state_keys
    ('exp_avg',)) and no step: the imported fp32 masters and exp_avg equal its
    get_parameter_state_dp_zero() element-wise (every parameter of both TP ranks), no exp_avg_sq is
    invented, no step either, and nothing is named as not imported; torch_dist dp_reshardable and
    Megatron-LM's legacy distrib_optim.pt alike."""
    from native_h5py import read_native
    native = tmp_path / "native"
    run_ckpt("reshard", FIX / name, native, "--tp", 1, "--pp", 1, "--dp", 1)
    _, got, _ = read_native(native)
    man = json.loads(next(native.rglob("manifest.json")).read_text())
    mg = (man["metadata"] if "metadata" in man else man).get("megatron", {})
    assert "optimizer_not_imported" not in mg and "optimizer_step" not in mg, mg
    assert not any(n.startswith("optimizer.exp_avg_sq.") for n in got)
    assert sum(n.startswith("optimizer.exp_avg.") for n in got) == 3 + 9 * LAYERS
    steps, compared = _compare_oracle_state(got, name, ("param", "exp_avg"))
    assert steps == [None] * TP_SAVED
    assert compared == 2 * 2 * (3 + 6 * LAYERS)


def test_lion_buckets_read_by_numpy_equal_oracle(run_ckpt):
    """Second oracle: Lion's buckets (param, exp_avg; no exp_avg_sq) read by torch's DCP loader and
    sliced with the numpy layout equal megatron-core's state."""
    for r in range(TP_SAVED):
        order = _registration_order(TP_SAVED)
        where, sizes = _layout(order, 2048, 2)
        bk = _dcp_buckets(it_dir(LION), r)
        assert {k for _, k in bk} == {"param", "exp_avg"}
        assert [bk[(b, "param")].shape[0] for b in range(len(sizes))] == sizes
        oracle, _ = _oracle(LION, r)
        for pname, n in order.items():
            b, off = where[pname]
            for k in ("param", "exp_avg"):
                np.testing.assert_array_equal(bk[(b, k)][off:off + n].reshape(oracle[pname][k].shape), oracle[pname][k],
                                              err_msg=f"tp{r} {pname} {k}")


def test_inspect_names_the_optimizer_and_its_moments(run_ckpt):
    """inspect says which optimizer and moments were found: Lion with exp_avg and no step, Adam with
    both moments and step 2."""
    info = json.loads(run_ckpt("inspect", "--json", FIX / LION).stdout)
    assert "not_imported" not in info, info["not_imported"]
    assert info["optimizer"] == {"optimizer": "lion", "moments": ["exp_avg"], "fp32_masters": False, "step": None,
                                 "sharding_type": "dp_reshardable"}, info["optimizer"]
    assert "optimizer:  lion, moments exp_avg, step none recorded, sharding dp_reshardable" in run_ckpt("inspect", FIX / LION).stdout
    adam = json.loads(run_ckpt("inspect", "--json", FIX / "distopt_dp_reshardable").stdout)["optimizer"]
    assert adam == {"optimizer": "adam", "moments": ["exp_avg", "exp_avg_sq"], "fp32_masters": False, "step": 2,
                    "sharding_type": "dp_reshardable"}, adam
    legacy = json.loads(run_ckpt("inspect", "--json", FIX / "distopt_lion_legacy_torch").stdout)
    assert "not_imported" not in legacy, legacy["not_imported"]
    assert legacy["optimizer"] == {"optimizer": "lion", "moments": ["exp_avg"], "fp32_masters": False, "step": None}, legacy
    plain = json.loads(run_ckpt("inspect", "--json", FIX / "tp2").stdout)
    assert "optimizer" not in plain


@pytest.mark.parametrize("fmt,extra", [("torch", [])])
def test_lion_export_is_refused_by_name(fmt, extra, run_ckpt, tmp_path):
    """A one-moment store is not written as Adam's per-parameter state (no exp_avg_sq invented): export-megatron
    without --dist-opt refuses it by name, naming the optimizer, and writes nothing; to-hf of its weights works.
    (With --dist-opt it is written as Lion's distributed optimizer: test_megatron_019_lion_export.py.)"""
    native = tmp_path / "native"
    run_ckpt("reshard", FIX / LION, native, "--tp", 1, "--pp", 1, "--dp", 1)
    out = tmp_path / "out"
    p = run_ckpt("export-megatron", native, out, "--format", fmt, "--tp", 2, "--local-norms", *extra, check=False)
    assert p.returncode == 5 and "MegatronOneMomentExport" in p.stderr and "'lion'" in p.stderr, p.stderr
    assert not out.exists() or not any(out.rglob("*.distcp")) and not any(out.rglob("*.pt"))
    run_ckpt("to-hf", native, tmp_path / "hf")


def _drop_everywhere(state):
    def fn(md):
        for k in [k for k in md.state_dict_metadata if k.startswith("optimizer.distributed.") and k.endswith("." + state)]:
            md.state_dict_metadata.pop(k)
            for s in [s for s in md.storage_data if s.fqn == k]:
                md.storage_data.pop(s)
    return fn


@pytest.mark.parametrize("name,mutate,code,what", [
    # an Adam checkpoint whose exp_avg_sq is in no bucket: named, not imported as a one-moment state
    ("distopt_dp_reshardable", _drop_everywhere("exp_avg_sq"), "MissingDistOptimState", "'exp_avg_sq'"),
    # Lion's only moment in no bucket
    (LION, _drop_everywhere("exp_avg"), "MissingDistOptimState", "'exp_avg'"),
    # Lion's moment missing from one bucket
    (LION, _drop(2, ("exp_avg",)), "MissingDistOptimState", "bucket 2"),
    (LION, _drop(1, ("param",)), "MissingDistOptimState", "'param'"),
])
def test_moment_hostile_variants_are_named(name, mutate, code, what, run_ckpt, tmp_path):
    d = _mutate_metadata(tmp_path, mutate, name)
    for cmd in (["inspect", d], ["to-hf", d, tmp_path / "hf"]):
        p = run_ckpt(*cmd, check=False)
        assert p.returncode != 0 and code in p.stderr and what in p.stderr, (cmd, p.stderr)
    assert not (tmp_path / "hf" / "model.safetensors").exists()
