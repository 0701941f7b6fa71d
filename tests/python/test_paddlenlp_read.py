"""PaddleNLP checkpoints read by ckpt (issue 36): the eight fixtures PaddleNLP 2.8.1 wrote (fp32 /
bf16, fused / unfused, model_state.pdparams / model.safetensors with format np) go through
`to-hf` (and `from-hf` + `to-hf`) and transformers' logits must equal the logits Paddle computed
(1e-5); every exported tensor equals numpy's reading of the case's unfused.npz (bf16: its rounding).
The directory is detected (the --json says what it was read as); --source-profile names it where
detection cannot; U16 weights where a float is expected are refused by name."""
import json
import shutil

import numpy as np
import pytest

from paddle_helpers import CASES, bf16_round, case_dir, hf_logits, hf_reference, read_safetensors

pytest.importorskip("transformers")
pytest.importorskip("safetensors")


def _expected_profile(case):
    return "paddlenlp-fused" if "_fused_" in case else "paddlenlp"


def _check_hf_dir(case, hf_dir):
    tensors, dtypes = {}, {}
    for f in sorted(hf_dir.glob("*.safetensors")):
        t, _, d = read_safetensors(f)
        tensors.update(t)
        dtypes.update(d)
    ref = hf_reference(case)
    assert sorted(tensors) == sorted(ref)
    bf16 = case.startswith("bf16")
    for name, want in ref.items():
        assert dtypes[name] == ("BF16" if bf16 else "F32"), name
        np.testing.assert_array_equal(tensors[name], bf16_round(want) if bf16 else want, err_msg=name)
    cfg = json.loads((hf_dir / "config.json").read_text())
    assert cfg["torch_dtype"] == ("bfloat16" if bf16 else "float32")
    assert "fuse_attention_qkv" not in cfg and "dtype" not in cfg
    tokens = np.load(case_dir(case) / "tokens.npy")
    want = np.load(case_dir(case) / "logits.npy")
    np.testing.assert_allclose(hf_logits(hf_dir, tokens), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_to_hf_gives_paddles_logits(case, run_ckpt, tmp_path):
    out = tmp_path / "hf"
    p = run_ckpt("to-hf", case_dir(case) / "model", out, "--json", "--no-fsync")
    src = json.loads(p.stdout)["source"]
    assert src["kind"] == "paddlenlp" and src["profile"] == _expected_profile(case)
    assert ("U16" in src["dtype"]) == case.startswith("bf16")
    _check_hf_dir(case, out)


@pytest.mark.parametrize("case", ["fp32_fused_pdparams", "bf16_unfused_safetensors"])
def test_from_hf_then_to_hf(case, run_ckpt, tmp_path):
    """PaddleNLP -> ckpt's store -> to-hf: Paddle's logits, the store in the source's dtype."""
    store, out = tmp_path / "store", tmp_path / "hf"
    p = run_ckpt("from-hf", case_dir(case) / "model", store, "--json", "--no-fsync")
    assert json.loads(p.stdout)["source"]["profile"] == _expected_profile(case)
    manifest = json.loads((store / "manifest.json").read_text())
    dts = {t["dtype"] for t in manifest["tensors"]}
    assert dts == ({"BF16"} if case.startswith("bf16") else {"F32"})
    run_ckpt("to-hf", store, out, "--no-fsync")
    _check_hf_dir(case, out)


def test_reshard_and_inspect_read_paddle(run_ckpt, tmp_path):
    case = "bf16_fused_safetensors"
    p = run_ckpt("reshard", case_dir(case) / "model", tmp_path / "tp2", "--tp", "2", "--pp", "1", "--dp", "1", "--json")
    assert json.loads(p.stdout)["source"]["profile"] == "paddlenlp-fused"
    run_ckpt("to-hf", tmp_path / "tp2", tmp_path / "hf", "--no-fsync")
    _check_hf_dir(case, tmp_path / "hf")
    ins = json.loads(run_ckpt("inspect", case_dir(case) / "model", "--json").stdout)
    assert "model.layers.0.self_attn.q_proj.weight" in json.dumps(ins)
    assert "paddlenlp-fused" in ins["detected"] and "U16" in ins["detected"], ins.get("detected")
    v = run_ckpt("verify", case_dir(case) / "model", "--json")
    assert json.loads(v.stdout)["ok"]


def test_diff_pdparams_against_safetensors(run_ckpt):
    """The two file kinds of one save hold the same tensors."""
    a = case_dir("bf16_fused_pdparams") / "model"
    b = case_dir("bf16_fused_safetensors") / "model"
    run_ckpt("diff", a, b)
    c = case_dir("fp32_unfused_safetensors") / "model"
    assert run_ckpt("diff", a, c, check=False).returncode == 1


def _plain_config_dir(case, dst):
    """The case's weights beside a config.json without PaddleNLP's keys: not detected."""
    shutil.copytree(case_dir(case) / "model", dst)
    cfg = json.loads((dst / "config.json").read_text())
    for k in ("fuse_attention_qkv", "fuse_attention_ffn", "tensor_parallel_output", "paddlenlp_version"):
        cfg.pop(k, None)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_source_profile_names_what_detection_cannot(run_ckpt, tmp_path):
    case = "bf16_fused_safetensors"
    src = _plain_config_dir(case, tmp_path / "plain")
    p = run_ckpt("to-hf", src, tmp_path / "no", check=False)
    assert p.returncode != 0 and "MissingTensor" in p.stderr
    p = run_ckpt("to-hf", src, tmp_path / "hf", "--source-profile", "paddlenlp-fused", "--json", "--no-fsync")
    assert json.loads(p.stdout)["source"]["why"] == "--source-profile paddlenlp-fused"
    _check_hf_dir(case, tmp_path / "hf")
    # The wrong profile is refused naming a tensor it does not hold.
    p = run_ckpt("to-hf", src, tmp_path / "wrong", "--source-profile", "paddlenlp", check=False)
    assert p.returncode != 0 and "ProfileTensorMismatch" in p.stderr and "fused_proj" in p.stderr, p.stderr
    # Kinds that record their own conventions refuse it.
    run_ckpt("from-hf", src, tmp_path / "store", "--source-profile", "paddlenlp-fused", "--no-fsync")
    p = run_ckpt("to-hf", tmp_path / "store", tmp_path / "x", "--source-profile", "paddlenlp", check=False)
    assert p.returncode != 0 and "SourceProfileUnsupported" in p.stderr, p.stderr
    p = run_ckpt("to-hf", src, tmp_path / "y", "--source-profile", "no-such", check=False)
    assert p.returncode != 0 and "ProfileUnknown" in p.stderr, p.stderr


def _u16_as_hf_names(case, dst):
    """A bf16 PaddleNLP save renamed to HF names and orientation, still U16 (issue 36's trap)."""
    from safetensors.numpy import save_file

    dst.mkdir()
    t, _, _ = read_safetensors(case_dir(case) / "model" / "model.safetensors")
    out = {}
    for k, v in t.items():
        name = "model." + k[len("llama."):] if k.startswith("llama.") else k
        out[name] = np.ascontiguousarray(v.T if v.ndim == 2 and "embed" not in name else v)
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((case_dir(case) / "model" / "config.json").read_text())
    for k in ("fuse_attention_qkv", "fuse_attention_ffn", "tensor_parallel_output", "paddlenlp_version"):
        cfg.pop(k, None)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@pytest.mark.parametrize("cmd", ["to-hf", "from-hf"])
def test_u16_weights_refused_by_name(cmd, run_ckpt, tmp_path):
    src = _u16_as_hf_names("bf16_unfused_safetensors", tmp_path / "u16")
    p = run_ckpt(cmd, src, tmp_path / "out", check=False)
    assert p.returncode != 0
    assert "NonFloatWeight" in p.stderr and "model.embed_tokens.weight" in p.stderr, p.stderr
    assert "--source-profile paddlenlp" in p.stderr
    assert not (tmp_path / "out").exists()
    # Named as HF with the config's bfloat16: read as bf16, Paddle's logits.
    run_ckpt(cmd, src, tmp_path / "ok", "--source-profile", "hf", "--no-fsync")
    if cmd == "from-hf":
        run_ckpt("to-hf", tmp_path / "ok", tmp_path / "ok_hf", "--no-fsync")
    _check_hf_dir("bf16_unfused_safetensors", tmp_path / ("ok" if cmd == "to-hf" else "ok_hf"))


def test_paddlenlp_profile_keeps_the_dtype_unless_asked(run_ckpt, tmp_path):
    """An fp32 PaddleNLP save stored in the paddlenlp profile stays F32 (the built-in forced BF16
    before issue 36); --dtype bf16 asks for bf16: numpy's rounding of the same numbers."""
    from native_h5py import read_native

    src = case_dir("fp32_unfused_safetensors") / "model"
    ref = {("llama." + k[len("model."):] if k.startswith("model.") else k): (v.T if v.ndim == 2 and "embed" not in k else v)
           for k, v in hf_reference("fp32_unfused_safetensors").items()}
    for extra, cast in (((), lambda x: x), (("--dtype", "bf16"), bf16_round)):
        out = tmp_path / ("keep" if not extra else "bf16")
        run_ckpt("from-hf", src, out, "--profile", "paddlenlp", *extra, "--no-fsync")
        _, got, _ = read_native(out)
        assert sorted(got) == sorted(ref)
        for k, v in ref.items():
            g = got[k] if not extra else (got[k].astype(np.uint32) << 16).view(np.float32)
            assert got[k].dtype == (np.float32 if not extra else np.uint16), k
            np.testing.assert_array_equal(g, cast(v), err_msg=k)
