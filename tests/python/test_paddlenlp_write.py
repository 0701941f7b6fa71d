"""ckpt writes what PaddleNLP loads (issue 36): `to-hf SRC OUT --profile paddlenlp|paddlenlp-fused`.
Default suite: the written directory against what PaddleNLP 2.8.1 itself wrote (the committed
fixtures: names, shapes, dtypes, bytes, shard metadata {"format": "np"}, config.json) for the same
weights, across packings (unfused -> fused gives PaddleNLP's own fuse), and HF -> PaddleNLP against
numpy's transposes and packing of transformers' tensors. Opt-in (runs where /work/venv-paddle
exists): PaddleNLP's from_pretrained loads the written directory without flags and gives the HF
model's logits (1e-5)."""
import json
import pathlib
import subprocess

import numpy as np
import pytest

from paddle_helpers import ROOT, bf16_round, case_dir, read_safetensors

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

PADDLE_PY = pathlib.Path("/work/venv-paddle/bin/python")
PAIRS = [(d, f, k) for d in ("fp32", "bf16") for f in ("unfused", "fused") for k in ("pdparams", "safetensors")]


def _raw(path):
    """{name: (dtype, shape, bytes)} and the metadata of a .safetensors file from its header (json)."""
    b = pathlib.Path(path).read_bytes()
    n = int.from_bytes(b[:8], "little")
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}, meta


@pytest.mark.parametrize("dt,fused,kind", PAIRS)
@pytest.mark.parametrize("to", ["paddlenlp", "paddlenlp-fused"])
def test_paddle_to_paddle_equals_paddles_own_files(dt, fused, kind, to, run_ckpt, tmp_path):
    """Any PaddleNLP save written in either packing equals PaddleNLP's own save of that packing,
    byte for byte, with its shard metadata and its config.json."""
    out = tmp_path / "pd"
    p = run_ckpt("to-hf", case_dir(f"{dt}_{fused}_{kind}") / "model", out, "--profile", to, "--json", "--no-fsync")
    assert json.loads(p.stdout)["profile"] == to
    want_case = f"{dt}_{'fused' if to == 'paddlenlp-fused' else 'unfused'}_safetensors"
    want, want_meta = _raw(case_dir(want_case) / "model" / "model.safetensors")
    got, got_meta = _raw(out / "model.safetensors")
    assert got_meta == want_meta == {"format": "np"}
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k][:2] == want[k][:2], k  # dtype (U16 for bf16) and shape ([in, out])
        assert got[k][2] == want[k][2], k
    cfg = json.loads((out / "config.json").read_text())
    want_cfg = json.loads((case_dir(want_case) / "model" / "config.json").read_text())
    assert cfg == want_cfg
    assert (out / "generation_config.json").exists()


def _hf_model(tmp_path, dtype):
    import torch
    import transformers

    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                                   tie_word_embeddings=False)
    m = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for prm in m.parameters():
            prm.normal_(0, 0.2)
    m = m.to(getattr(torch, dtype))
    d = tmp_path / f"hf_{dtype}"
    m.save_pretrained(d)
    return d, {k: v.float().numpy() for k, v in m.state_dict().items() if "rotary" not in k}


def _paddle_reference(hf, fused, heads=4, kv=2, head_dim=8):
    """numpy: HF tensors in PaddleNLP's names and layout (README of fixtures/paddlenlp): [in, out]
    linears, qkv_proj's output columns per KV group [q heads of g, k_g, v_g], gate_up = [gate | up]."""
    out = {}
    for k, v in hf.items():
        name = "llama." + k[len("model."):] if k.startswith("model.") else k
        out[name] = v.T if v.ndim == 2 and "embed_tokens" not in k else v
    if not fused:
        return out
    for i in range(2):
        pre = f"llama.layers.{i}."
        q, k_, v_ = (out.pop(pre + f"self_attn.{x}_proj.weight") for x in "qkv")
        g = heads // kv
        cols = []
        for j in range(kv):
            cols += [q[:, (j * g) * head_dim:(j + 1) * g * head_dim], k_[:, j * head_dim:(j + 1) * head_dim], v_[:, j * head_dim:(j + 1) * head_dim]]
        out[pre + "self_attn.qkv_proj.weight"] = np.concatenate(cols, axis=1)
        gate, up = out.pop(pre + "mlp.gate_proj.weight"), out.pop(pre + "mlp.up_proj.weight")
        out[pre + "mlp.gate_up_fused_proj.weight"] = np.concatenate([gate, up], axis=1)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("to", ["paddlenlp", "paddlenlp-fused"])
def test_hf_to_paddle_against_numpy(dtype, to, run_ckpt, tmp_path):
    src, hf = _hf_model(tmp_path, dtype)
    out = tmp_path / "pd"
    run_ckpt("to-hf", src, out, "--profile", to, "--no-fsync")
    raw, meta = _raw(out / "model.safetensors")
    assert meta == {"format": "np"}
    want = _paddle_reference(hf, to == "paddlenlp-fused")
    assert sorted(raw) == sorted(want)
    for k, v in want.items():
        dt, shape, data = raw[k]
        assert shape == list(v.shape), k
        if dtype == "bfloat16":
            assert dt == "U16", k
            got = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
        else:
            assert dt == "F32", k
            got = np.frombuffer(data, np.float32).reshape(shape)
        np.testing.assert_array_equal(got, v, err_msg=k)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["fuse_attention_qkv"] == cfg["fuse_attention_ffn"] == (to == "paddlenlp-fused")
    assert "torch_dtype" not in cfg and cfg.get("dtype") == ("bfloat16" if dtype == "bfloat16" else None)
    paddle_keys = set(json.loads((case_dir("fp32_unfused_safetensors") / "model" / "config.json").read_text()))
    missing = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "rms_norm_eps", "rope_theta", "tie_word_embeddings", "seq_length", "tensor_parallel_output"} - set(cfg)
    assert not missing and {"fuse_attention_qkv", "fuse_attention_ffn"} <= paddle_keys
    assert bf16_round  # (the bf16 reference is exact here: the HF model is bf16 already)


def test_mixed_dtypes_and_other_profiles_refused(run_ckpt, tmp_path):
    p = run_ckpt("to-hf", case_dir("fp32_unfused_safetensors") / "model", tmp_path / "x", "--profile", "megatron-mcore", check=False)
    assert p.returncode == 2  # not one of hf, paddlenlp, paddlenlp-fused


@pytest.mark.skipif(not PADDLE_PY.exists(), reason="opt-in: PaddleNLP's own load needs /work/venv-paddle (fixtures/paddlenlp/README.md)")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("to", ["paddlenlp", "paddlenlp-fused"])
def test_paddlenlp_from_pretrained_loads_what_ckpt_wrote(dtype, to, run_ckpt, tmp_path):
    """HF -> ckpt store -> PaddleNLP files: PaddleNLP 2.8.1's from_pretrained loads them without
    flags (bf16 parameters for a bf16 save) and gives transformers' logits of the HF model (1e-5)."""
    from paddle_helpers import hf_logits

    src, _ = _hf_model(tmp_path, dtype)
    run_ckpt("from-hf", src, tmp_path / "store", "--no-fsync")
    out = tmp_path / "pd"
    run_ckpt("to-hf", tmp_path / "store", out, "--profile", to, "--no-fsync")
    tokens = np.load(case_dir("fp32_unfused_safetensors") / "tokens.npy")
    np.save(tmp_path / "tokens.npy", tokens)
    res = tmp_path / "paddle.npz"
    subprocess.run([str(PADDLE_PY), str(ROOT / "tests" / "python" / "paddle_load.py"), str(out), str(tmp_path / "tokens.npy"), str(res)],
                   check=True, capture_output=True, timeout=600)
    r = np.load(res)
    assert list(r["dtypes"]) == (["paddle.bfloat16"] if dtype == "bfloat16" else ["paddle.float32"])
    np.testing.assert_allclose(r["logits"], hf_logits(src, tokens), rtol=1e-5, atol=1e-5)
