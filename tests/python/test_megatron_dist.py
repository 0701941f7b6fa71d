"""Megatron-Core `torch_dist` checkpoints against megatron-core 0.16.1 itself.

Fixtures (tests/python/mcore_fixtures.py, kind "dist", cached under $CKPT_BINARY_DIR/fixtures):
a small LLaMA-like GPTModel (local spec, RMSNorm, SwiGLU, GQA 8/2, rotary, untied, vocab 300
padded, fp32) saved by megatron.core.dist_checkpointing.save for tp=1, tp=2 and pp=2 (uneven
2 + 4 layers), with megatron-core's forward logits on fixed tokens and its FP32Optimizer's
sharded Adam state.
  * import: `ckpt to-hf` of each fixture -> transformers LlamaForCausalLM logits equal
    megatron-core's (1e-5 relative, fp32); `ckpt inspect --json` shows the config; the Adam
    moments equal those torch's DCP reader finds in the fixture.
  * export: round trip native -> `ckpt export-megatron --format torch_dist` -> import ->
    `ckpt diff` identical. The load of the export into megatron-core (dist_checkpointing.load
    into a GPTModel of tp=2 / pp=2 uneven, every rank's state dict equal to an independent
    repacking) is in test_megatron_torch.py::test_exports_load_in_megatron_core, which shares one
    torchrun between both formats.
"""
import json
import pathlib
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import mcore_fixtures as mf  # noqa: E402
import megatron_reference as ref  # noqa: E402

pytest.importorskip("megatron.core")

HF_CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": mf.VOCAB,
    "hidden_size": mf.HIDDEN, "intermediate_size": mf.FFN, "num_hidden_layers": mf.LAYERS,
    "num_attention_heads": mf.HEADS, "num_key_value_heads": mf.GROUPS, "head_dim": mf.HIDDEN // mf.HEADS,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": mf.SEQ * 4,
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "torch_dtype": "float32",
}
LAYOUT_ARGS = {"tp2": ["--tp", "2"], "pp2": ["--pp", "2", "--pp-layers", f"{mf.FIRST_STAGE_LAYERS},{mf.LAYERS - mf.FIRST_STAGE_LAYERS}"]}


@pytest.fixture(scope="module", params=["tp1", "tp2", "pp2"])
def mcore_fixture(request):
    return mf.fixture(request.param, "dist")


def test_to_hf_logits_equal_megatron_core(mcore_fixture, run_ckpt, tmp_path):
    from transformers import LlamaForCausalLM
    out = tmp_path / "hf"
    run_ckpt("to-hf", mcore_fixture, out)
    model = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    tokens = torch.from_numpy(np.load(mcore_fixture / "tokens.npy"))
    with torch.no_grad():
        got = model(tokens).logits.numpy()
    want = np.load(mcore_fixture / "logits.npy")[..., : mf.VOCAB]
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-5, rel


def test_inspect_json_shows_config_and_layout(run_ckpt):
    fx = mf.fixture("pp2", "dist")
    info = json.loads(run_ckpt("inspect", "--json", fx).stdout)
    assert "model_config" in info["metadata_keys"]
    lay = info["layout"]
    assert (lay["tp"], lay["pp"], lay["layers_per_stage"]) == (1, 2, [mf.FIRST_STAGE_LAYERS, mf.LAYERS - mf.FIRST_STAGE_LAYERS])
    shapes = {t["name"]: t["shape"] for t in info["tensors"]}
    hd = mf.HIDDEN // mf.HEADS
    assert shapes["model.embed_tokens.weight"] == [mf.VOCAB, mf.HIDDEN]  # padding rows cut
    assert shapes["model.layers.5.self_attn.k_proj.weight"] == [mf.GROUPS * hd, mf.HIDDEN]
    assert shapes["model.layers.5.mlp.up_proj.weight"] == [mf.FFN, mf.HIDDEN]
    assert shapes["optimizer.exp_avg.model.layers.3.mlp.up_proj.weight"] == [mf.FFN, mf.HIDDEN]
    assert len(shapes) == 3 * (3 + 9 * mf.LAYERS)  # weights + 2 moments of each


def _random_hf(tmp_path):
    from safetensors.numpy import save_file
    hf = ref.make_hf_model(HF_CFG, np.random.default_rng(5))
    d = tmp_path / "hf_src"
    d.mkdir()
    save_file(hf, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(HF_CFG))
    return d, hf


def test_roundtrip_native_export_import_diff(run_ckpt, tmp_path):
    src, _ = _random_hf(tmp_path)
    native = tmp_path / "native"
    run_ckpt("from-hf", src, native)
    out = tmp_path / "dist"
    run_ckpt("export-megatron", native, out, "--format", "torch_dist", *LAYOUT_ARGS["pp2"], "--tp", "2")
    p = run_ckpt("diff", native, out, check=False)
    assert p.returncode == 0, p.stdout + p.stderr


def _fixture_global(fx):
    """Every tensor of a fixture, global, as torch's own DCP reader assembles it."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = fx.parent / (fx.name + ".global.pt")
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        dcp_to_torch_save(str(fx / f"iter_{mf.ITERATION:07d}"), str(tmp))
        tmp.rename(out)
    return torch.load(out, weights_only=False)


def test_optimizer_moments_equal_torch_dcp(run_ckpt, tmp_path):
    """The Adam moments ckpt imports (reshard into the native store, read with h5py) equal those
    of the fixture as torch's DCP reader assembles them, unpacked by megatron_reference's rules."""
    from native_h5py import read_native
    fx = mf.fixture("tp2", "dist")
    native = tmp_path / "native"
    run_ckpt("reshard", fx, native, "--tp", "1", "--pp", "1", "--dp", "1")
    _, got, _ = read_native(native)
    g = _fixture_global(fx)
    H, K, hd = mf.HEADS, mf.GROUPS, mf.HIDDEN // mf.HEADS
    for kind in ("exp_avg", "exp_avg_sq"):
        st = f"optimizer.state.{kind}."
        o = f"optimizer.{kind}.model."
        for i in (0, mf.LAYERS - 1):
            p = f"{o}layers.{i}."
            qkv = ref._pack_qkv(got[p + "self_attn.q_proj.weight"], got[p + "self_attn.k_proj.weight"],
                                got[p + "self_attn.v_proj.weight"], H, K, hd)
            np.testing.assert_array_equal(qkv, g[st + "decoder.layers.self_attention.linear_qkv.weight"][i].numpy())
            fc1 = np.concatenate([got[p + "mlp.gate_proj.weight"], got[p + "mlp.up_proj.weight"]])
            np.testing.assert_array_equal(fc1, g[st + "decoder.layers.mlp.linear_fc1.weight"][i].numpy())
        np.testing.assert_array_equal(got[o + "embed_tokens.weight"],
                                      g[st + "embedding.word_embeddings.weight"][: mf.VOCAB].numpy())
    np.testing.assert_array_equal(got["model.norm.weight"], g["decoder.final_layernorm.weight"].numpy())


def _copy_fixture(tmp_path, name="tp1"):
    import shutil
    d = tmp_path / "copy"
    shutil.copytree(mf.fixture(name, "dist") / f"iter_{mf.ITERATION:07d}", d)
    return d


def test_refuses_other_sharded_backend(run_ckpt, tmp_path):
    d = _copy_fixture(tmp_path)
    md = json.loads((d / "metadata.json").read_text())
    md["sharded_backend"] = "zarr"
    (d / "metadata.json").write_text(json.dumps(md))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0 and "sharded_backend" in p.stderr and "zarr" in p.stderr, p.stderr


def test_refuses_args_that_do_not_match_tensors(run_ckpt, tmp_path):
    d = _copy_fixture(tmp_path)
    common = torch.load(d / "common.pt", weights_only=False)
    common["args"].num_layers = mf.LAYERS + 1
    torch.save(common, d / "common.pt")
    p = run_ckpt("to-hf", d, tmp_path / "hf", check=False)
    assert p.returncode != 0 and "num_layers" in p.stderr and "ShapeMismatch" in p.stderr, p.stderr
    assert not (tmp_path / "hf" / "model.safetensors").exists()
