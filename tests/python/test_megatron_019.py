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
# One moment: a DistributedOptimizer over Lion (exp_avg only, no step; test_megatron_019_distopt.py).
LION = ["distopt_lion_dp_reshardable", "distopt_lion_legacy_torch"]
SAVED = {"tp2": (2, 1), "pp2": (1, 2), "vpp2_pp2": (1, 2), **{k: (2, 1) for k in DISTOPT + LION + ["distopt_legacy_torch"]}}


def it_dir(name):
    return FIX / name / "iter_0000010"


@pytest.mark.parametrize("name", PLAIN + DISTOPT + LION + ["distopt_legacy_torch"])
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


def _oracle(name, tp_rank):
    """megatron-core's get_parameter_state_dp_zero() of TP rank `tp_rank`, per parameter:
    {mcore name: {param, exp_avg, exp_avg_sq}} (local TP shards; the moments megatron-core's
    optimizer_state_keys names: Lion's exp_avg only), and the step (None: Lion keeps none)."""
    from safetensors.numpy import load_file
    lay = json.loads((FIX / name / f"optimizer_oracle_tp{tp_rank}.json").read_text())
    world = load_file(str(FIX / name / f"optimizer_oracle_tp{tp_rank}.safetensors"))
    padded = lay["buckets"]["0"]
    (unpadded,) = lay["per_bucket_numel_unpadded"]["0"].values()
    keys = ("param",) + tuple(lay.get("optimizer_state_keys", ("exp_avg", "exp_avg_sq")))
    out = {}
    for key, p in lay["params"].items():
        b = p["bucket"]
        # param_index_map indexes the padded buffer; the dp_zero world buffers hold the buckets unpadded
        w0 = p["start"] - sum(padded[:b]) + sum(unpadded[:b])
        n = p["end"] - p["start"]
        assert w0 + n <= sum(unpadded[: b + 1]), key
        out[key.split("/", 1)[1]] = {k: next(v for kk, v in world.items() if kk.endswith("." + k))[w0:w0 + n].reshape(p["shape"])
                                     for k in keys}
    return out, int(world["step"][0]) if "step" in world else None


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


@pytest.mark.parametrize("name", DISTOPT + ["distopt_legacy_torch"])
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
    steps, compared = _compare_oracle_state(got, name, ("param", "exp_avg", "exp_avg_sq"))
    assert mg["optimizer_step"] == 2 and steps == [2] * TP_SAVED
    assert compared == 2 * 3 * (3 + 6 * LAYERS)


def _compare_oracle_state(got, name, states):
    """Every parameter's imported `states` (canonical tensors in `got`: the masters as the weights,
    optimizer.<moment>.<name>) equal megatron-core's oracle of each TP rank element-wise, the
    vocabulary padding rows left out. Returns the oracle's steps and the count compared."""
    prefixes = {"param": "", "exp_avg": "optimizer.exp_avg.", "exp_avg_sq": "optimizer.exp_avg_sq."}
    steps, compared = [], 0
    for r in range(TP_SAVED):
        oracle, step = _oracle(name, r)
        steps.append(step)
        for pname, st in oracle.items():
            assert set(st) == set(states), (pname, sorted(st))
            for k in states:
                want = _mcore_local(lambda n: got[prefixes[k] + n], pname, r, TP_SAVED)
                have = st[k]
                if pname in ("embedding.word_embeddings.weight", "output_layer.weight"):
                    keep = max(0, min(have.shape[0], VOCAB - r * have.shape[0]))
                    want, have = want[:keep], have[:keep]
                np.testing.assert_array_equal(want, have, err_msg=f"tp{r} {pname} {k}")
                compared += 1
    return steps, compared


def _diff_equal(run_ckpt, a, b):
    p = run_ckpt("diff", a, b, "--json", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    assert rep.get("identical", rep.get("equal")) is True, rep


@pytest.mark.parametrize("name", PLAIN + DISTOPT + LION + ["distopt_legacy_torch"])
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
