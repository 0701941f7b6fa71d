"""Megatron-Core 0.19 `torch_dist` checkpoints written by megatron-core 0.19.2 itself.

Fixtures: fixtures/megatron_core_019 (committed; made once by its make_fixtures.py in a Python 3.12
venv, see its README.md): a small LLaMA-like GPTModel (local spec, RMSNorm, SwiGLU, GQA 4/2, rotary,
untied, vocab 200 padded to 256, fp32, 4 layers) saved by dist_checkpointing.save with
verify_integrity=True for tp2, pp2 uneven (1 + 3), vpp2 x pp2, and tp2 x dp2 with the
DistributedOptimizer (dp_reshardable, fully_reshardable, dp_zero_gather_scatter); megatron-core's
logits on fixed tokens and its get_parameter_state_dp_zero() beside each. 0.19 writes no common.pt:
the common state is the DCP item common_state/shard_0_1.
  * import: `ckpt to-hf` of each -> transformers LlamaForCausalLM logits equal megatron-core's
    (1e-5 relative, fp32); inspect --json shows the layout, the integrity scheme (integrity.json)
    and the optimizer state ckpt does not import, by key, sharding type and reason (a bucket state
    it does not map); fully_reshardable's, dp_reshardable's and dp_zero_gather_scatter's (4 buckets
    per TP rank, layout derived from the args)
    moments and fp32 masters are imported and equal megatron-core's own get_parameter_state_dp_zero()
    element-wise, the step is the param_groups'; dp_reshardable also against an independent numpy
    restatement of the bucket layout over the buckets read by torch's DCP loader.
  * reshard to another tp/pp and back: byte-identical (ckpt diff), and the same as the direct import.
  * verify: integrity.json's SHA-256 are checked (a flipped byte -> MegatronIntegrityMismatch); the
    source check of to-hf refuses the tampered checkpoint too.
  * hostile: common_state pointing outside its file; dp_reshardable bucket sizes that do not add up,
    numel_unpadded past the padded bucket, a missing moment or master, a missing bucket, a
    parameter range not stored, a dp_zero param_state item outside its file -> named errors,
    nothing written.
"""
import dataclasses
import json
import pathlib
import pickle
import shutil
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import megatron_reference as ref  # noqa: E402

FIX = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "megatron_core_019"
VOCAB, HIDDEN, HEADS, GROUPS, FFN, LAYERS, TP_SAVED = 200, 16, 4, 2, 32, 4, 2
HD = HIDDEN // HEADS
PLAIN = ["tp2", "pp2", "vpp2_pp2"]
DISTOPT = ["distopt_dp_reshardable", "distopt_fully_reshardable", "distopt_dp_zero_gather_scatter"]
SAVED = {"tp2": (2, 1), "pp2": (1, 2), "vpp2_pp2": (1, 2), **{k: (2, 1) for k in DISTOPT}}


def it_dir(name):
    return FIX / name / "iter_0000010"


@pytest.mark.parametrize("name", PLAIN + DISTOPT + ["distopt_legacy_torch"])
def test_to_hf_logits_equal_megatron_core(name, run_ckpt, tmp_path):
    from transformers import LlamaForCausalLM
    out = tmp_path / "hf"
    run_ckpt("to-hf", FIX / name, out)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (LAYERS, GROUPS, VOCAB)
    assert cfg["tie_word_embeddings"] is False
    model = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    tokens = torch.from_numpy(np.load(FIX / name / "tokens.npy"))
    with torch.no_grad():
        got = model(tokens).logits.numpy()
    want = np.load(FIX / name / "logits.npy")[..., :VOCAB]
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-5, rel


def _inspect(run_ckpt, name):
    return json.loads(run_ckpt("inspect", "--json", FIX / name).stdout)


@pytest.mark.parametrize("name", PLAIN)
def test_inspect_plain(name, run_ckpt):
    info = _inspect(run_ckpt, name)
    tp, pp = SAVED[name]
    if name == "vpp2_pp2":
        assert info["layout"] is None  # interleaved stages: no stage split to claim
    else:
        assert (info["layout"]["tp"], info["layout"]["pp"]) == (tp, pp)
    if name == "pp2":
        assert info["layout"]["layers_per_stage"] == [1, 3]
    assert "SHA-256" in info["integrity"]["scheme"] and "integrity.json" in info["integrity"]["scheme"]
    assert "not_imported" not in info
    names = {t["name"] for t in info["tensors"]}
    assert len(names) == 3 + 9 * LAYERS and not any(n.startswith("optimizer.") for n in names)


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


def _oracle(name, tp_rank):
    """megatron-core's get_parameter_state_dp_zero() of TP rank `tp_rank`, per parameter:
    {mcore name: {param, exp_avg, exp_avg_sq}} (local TP shards), and the step."""
    from safetensors.numpy import load_file
    lay = json.loads((FIX / name / f"optimizer_oracle_tp{tp_rank}.json").read_text())
    world = load_file(str(FIX / name / f"optimizer_oracle_tp{tp_rank}.safetensors"))
    padded = lay["buckets"]["0"]
    (unpadded,) = lay["per_bucket_numel_unpadded"]["0"].values()
    out = {}
    for key, p in lay["params"].items():
        b = p["bucket"]
        # param_index_map indexes the padded buffer; the dp_zero world buffers hold the buckets unpadded
        w0 = p["start"] - sum(padded[:b]) + sum(unpadded[:b])
        n = p["end"] - p["start"]
        assert w0 + n <= sum(unpadded[: b + 1]), key
        out[key.split("/", 1)[1]] = {k: next(v for kk, v in world.items() if kk.endswith("." + k))[w0:w0 + n].reshape(p["shape"])
                                     for k in ("param", "exp_avg", "exp_avg_sq")}
    return out, int(world["step"][0])


def _mcore_local(get, name, r, tp):
    """TP rank r's shard of mcore parameter `name` from the canonical HF tensors `get(hf_name)`."""
    def rows(a):
        n = a.shape[0] // tp
        return a[r * n:(r + 1) * n]

    def cols(a):
        n = a.shape[1] // tp
        return a[:, r * n:(r + 1) * n]

    if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
        a = get("model.embed_tokens.weight" if name.startswith("embedding") else "lm_head.weight")
        pad = np.zeros((256 - VOCAB, HIDDEN), a.dtype)
        return rows(np.concatenate([a, pad]))  # the padding rows are compared below VOCAB only
    if name == "decoder.final_layernorm.weight":
        return get("model.norm.weight")
    i, rest = name[len("decoder.layers."):].split(".", 1)
    p = f"model.layers.{i}."
    if rest == "self_attention.linear_qkv.weight":
        return rows(ref._pack_qkv(get(p + "self_attn.q_proj.weight"), get(p + "self_attn.k_proj.weight"),
                                  get(p + "self_attn.v_proj.weight"), HEADS, GROUPS, HD))
    if rest == "self_attention.linear_proj.weight":
        return cols(get(p + "self_attn.o_proj.weight"))
    if rest == "mlp.linear_fc1.weight":
        return np.concatenate([rows(get(p + "mlp.gate_proj.weight")), rows(get(p + "mlp.up_proj.weight"))])
    if rest == "mlp.linear_fc2.weight":
        return cols(get(p + "mlp.down_proj.weight"))
    return get(p + {"input_layernorm.weight": "input_layernorm.weight",
                    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight"}[rest])


@pytest.mark.parametrize("name", DISTOPT)
def test_distopt_state_equals_megatron_core_state(name, run_ckpt, tmp_path):
    """fully_reshardable and dp_reshardable (bucket layout derived from the args: 4 buckets per TP
    rank, one padded): the imported fp32 masters and Adam moments equal megatron-core's
    get_parameter_state_dp_zero() element-wise (every parameter of both TP ranks), and the step is
    the param_groups' step."""
    from native_h5py import read_native
    native = tmp_path / "native"
    run_ckpt("reshard", FIX / name, native, "--tp", 1, "--pp", 1, "--dp", 1)
    _, got, _ = read_native(native)
    man = json.loads(next(native.rglob("manifest.json")).read_text())
    mg = man["metadata"]["megatron"] if "metadata" in man else man["megatron"]
    assert "optimizer_not_imported" not in mg
    compared = 0
    for r in range(TP_SAVED):
        oracle, step = _oracle(name, r)
        assert mg["optimizer_step"] == step == 2
        for pname, st in oracle.items():
            for k, prefix in (("param", ""), ("exp_avg", "optimizer.exp_avg."), ("exp_avg_sq", "optimizer.exp_avg_sq.")):
                want = _mcore_local(lambda n: got[prefix + n], pname, r, TP_SAVED)
                have = st[k]
                if pname in ("embedding.word_embeddings.weight", "output_layer.weight"):
                    keep = max(0, min(have.shape[0], VOCAB - r * have.shape[0]))
                    want, have = want[:keep], have[:keep]
                np.testing.assert_array_equal(want, have, err_msg=f"tp{r} {pname} {k}")
                compared += 1
    assert compared == 2 * 3 * (3 + 6 * LAYERS)


def _diff_equal(run_ckpt, a, b):
    p = run_ckpt("diff", a, b, "--json", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    assert rep.get("identical", rep.get("equal")) is True, rep


@pytest.mark.parametrize("name", PLAIN + DISTOPT)
def test_reshard_other_layout_and_back_identical(name, run_ckpt, tmp_path):
    tp, pp = SAVED[name]
    other = ["--tp", 1, "--pp", 2, "--pp-layers", "3,1"] if tp == 2 else ["--tp", 2, "--pp", 1]
    saved = ["--tp", tp, "--pp", pp] + (["--pp-layers", "1,3"] if name == "pp2" else [])
    run_ckpt("reshard", FIX / name, tmp_path / "a", *other, "--dp", 1)
    run_ckpt("reshard", tmp_path / "a", tmp_path / "b", *saved, "--dp", 1)
    run_ckpt("reshard", FIX / name, tmp_path / "direct", *saved, "--dp", 1)
    _diff_equal(run_ckpt, tmp_path / "b", tmp_path / "direct")
    _diff_equal(run_ckpt, tmp_path / "a", FIX / name)


def _copy(name, tmp_path):
    d = tmp_path / name
    shutil.copytree(FIX / name, d)
    return d


def test_verify_checks_integrity_json(run_ckpt, tmp_path):
    p = run_ckpt("verify", "--json", FIX / "tp2")
    rep = json.loads(p.stdout)
    assert rep["ok"] and rep["checksums"] and "sha256" in rep["digests"], rep
    d = _copy("tp2", tmp_path)
    f = d / "iter_0000010" / "__3_0.distcp"  # a DP replica's file: only the rng state lives there
    b = bytearray(f.read_bytes())
    b[len(b) // 2] ^= 0x40
    f.write_bytes(bytes(b))
    p = run_ckpt("verify", "--json", d, check=False)
    assert p.returncode != 0
    rep = json.loads(p.stdout)
    codes = {x["code"] for x in rep["failures"]}
    assert "MegatronIntegrityMismatch" in codes and any("__3_0.distcp" in x["file"] for x in rep["failures"]), rep
    p = run_ckpt("to-hf", d, tmp_path / "hf", check=False)
    assert p.returncode != 0 and "MegatronIntegrityMismatch" in p.stderr, p.stderr
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def test_common_state_outside_its_file_is_named(run_ckpt, tmp_path):
    """A .metadata whose common_state item points past the end of its .distcp file."""
    d = _copy("pp2", tmp_path)
    md_file = d / "iter_0000010" / ".metadata"
    md = pickle.loads(md_file.read_bytes())
    (idx,) = [k for k in md.storage_data if k.fqn == "common_state/shard_0_1"]
    info = md.storage_data[idx]
    size = (d / "iter_0000010" / info.relative_path).stat().st_size
    md.storage_data[idx] = dataclasses.replace(info, offset=size - 16)
    md_file.write_bytes(pickle.dumps(md))
    for cmd in (["inspect", d], ["to-hf", d, tmp_path / "hf"]):
        p = run_ckpt(*cmd, check=False)
        assert p.returncode != 0, p.stdout
        assert "common_state/shard_0_1" in p.stderr, p.stderr
        assert "DcpItemPastFile" in p.stderr or "BadMegatronCommonState" in p.stderr, p.stderr
    assert not (tmp_path / "hf" / "model.safetensors").exists()


def test_missing_common_state_is_named(run_ckpt, tmp_path):
    d = _copy("tp2", tmp_path)
    md_file = d / "iter_0000010" / ".metadata"
    md = pickle.loads(md_file.read_bytes())
    md.state_dict_metadata.pop("common_state/shard_0_1")
    for k in [k for k in md.storage_data if k.fqn == "common_state/shard_0_1"]:
        md.storage_data.pop(k)
    md_file.write_bytes(pickle.dumps(md))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0 and "MissingMegatronCommonState" in p.stderr, p.stderr


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


def test_legacy_distrib_optim_read_by_numpy_equals_oracle_and_is_named(run_ckpt):
    """Megatron-LM's legacy format with the distributed optimizer (mp_rank_TT/model_optim_rng.pt +
    distrib_optim.pt, written through megatron-core 0.19.2's save_parameter_state): the world buffers
    sliced with the numpy layout (bucket-local start + the earlier buckets unpadded) equal
    megatron-core's state; ckpt imports the weights and names distrib_optim.pt as not imported
    (importing it is the next step of issue 35)."""
    name = "distopt_legacy_torch"
    info = json.loads(run_ckpt("inspect", "--json", FIX / name).stdout)
    assert "distrib_optim.pt" in info["not_imported"]["optimizer"], info.get("not_imported")
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
