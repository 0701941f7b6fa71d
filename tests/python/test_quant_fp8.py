"""Quantized checkpoints exported by `ckpt to-hf` (issue 39, docs/QUANTIZATION.md): block-scaled
FP8 (DeepSeek-V3 / Qwen3-FP8 layout), per-tensor and per-row scaled FP8, MXFP4 (gpt-oss layout).
References: tests/python/quant_reference.py (numpy, written from DeepSeek's weight_dequant,
transformers' Fp8Quantize and gpt-oss's MXFP4 unpacking) and transformers' own CPU dequantizers.
Inputs are written by safetensors 0.8.0 from numpy/torch arrays."""
import json

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import quant_reference as ref

RNG = np.random.default_rng(39)
BF16 = ml_dtypes.bfloat16


def fp8_bytes(*shape):
    x = (RNG.standard_normal(shape) * 100).clip(-448, 448).astype(np.float32)
    return x.astype(ref.FP8).view(np.uint8)


def scales(*shape):
    return (RNG.random(shape) * 1e-3 + 1e-5).astype(np.float32)


def t8(a):  # fp8 bytes -> torch float8_e4m3fn
    return torch.from_numpy(np.ascontiguousarray(a)).view(torch.float8_e4m3fn)


def write(path, tensors):
    save_file({k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(v))) for k, v in tensors.items()}, str(path))
    return path


def read_out(out_dir):
    with safe_open(str(out_dir / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def bits(t):
    return t.contiguous().view(torch.uint16 if t.element_size() == 2 else torch.uint32).numpy()


@pytest.fixture()
def block_fp8(tmp_path):
    """Ragged shapes on 128-blocks: [300, 200] and experts [2, 260, 130]; scales in F32, BF16, E8M0."""
    w, e, v = fp8_bytes(300, 200), fp8_bytes(2, 260, 130), fp8_bytes(256, 128)
    s, se = scales(3, 2), scales(2, 3, 2)
    sv = np.ldexp(np.ones((2, 1), np.float32), RNG.integers(-12, -4, size=(2, 1)))  # powers of two: E8M0
    ts = {"a.weight": t8(w), "a.weight_scale_inv": torch.from_numpy(s), "e.weight": t8(e),
          "e.weight_scale_inv": torch.from_numpy(se).to(torch.bfloat16), "v.weight": t8(v),
          "v.weight_scale_inv": torch.from_numpy(sv).to(torch.float8_e8m0fnu), "norm.weight": torch.ones(7, dtype=torch.bfloat16)}
    src = write(tmp_path / "w.safetensors", ts)
    refs = {"a.weight": (w, s), "e.weight": (e, torch.from_numpy(se).to(torch.bfloat16).float().numpy()), "v.weight": (v, sv)}
    return src, ts, refs


@pytest.mark.parametrize("dtype,np_out", [("bf16", BF16), ("fp32", np.float32)])
def test_block_fp8_dequantizes_as_weight_dequant(run_ckpt, tmp_path, block_fp8, dtype, np_out):
    src, ts, refs = block_fp8
    out = tmp_path / "out"
    r = json.loads(run_ckpt("to-hf", src, out, "--dtype", dtype, "--no-fsync", "--json").stdout)
    assert r["quantization"]["scheme"] == "fp8-block 128x128" and r["quantization"]["dequantized"] is True
    got = read_out(out)
    assert sorted(got) == ["a.weight", "e.weight", "norm.weight", "v.weight"]  # scales are part of their weights
    steps = {e["tensor"]: e for e in r["quantization"]["exactness"]["steps"]}
    for name, (w, s) in refs.items():
        want = ref.dequant_block_fp8(w, s, out=np_out)
        assert got[name].shape == tuple(w.shape), name
        assert np.array_equal(bits(got[name]), want.view(np.uint16 if np_out is BF16 else np.uint32)), name
        # The exactness report: the elements whose f32 product the output dtype rounded.
        exact = ref.dequant_block_fp8(w, s, out=np.float32)
        e = steps[name]
        assert e["step"] == f"dequantize fp8-block 128x128 -> {'BF16' if np_out is BF16 else 'F32'}" and e["elements"] == w.size
        assert e["changed"] == int(np.count_nonzero(want.astype(np.float32) != exact)), (name, e)


def test_block_fp8_equals_transformers_dequantizer(run_ckpt, tmp_path):
    """transformers' Fp8Dequantize._dequantize_one (CPU; divisible shapes only, it refuses ragged)."""
    fg = pytest.importorskip("transformers.integrations.finegrained_fp8")
    w, s = fp8_bytes(256, 384), scales(2, 3)
    src = write(tmp_path / "w.safetensors", {"x.weight": t8(w), "x.weight_scale_inv": torch.from_numpy(s)})
    run_ckpt("to-hf", src, tmp_path / "out", "--dtype", "bf16", "--no-fsync")
    want = fg.Fp8Dequantize.__new__(fg.Fp8Dequantize)._dequantize_one(t8(w), torch.from_numpy(s), torch.bfloat16)
    assert torch.equal(read_out(tmp_path / "out")["x.weight"].view(torch.int16), want.view(torch.int16))


def test_keep_quantized_writes_weights_and_scales_as_stored(run_ckpt, tmp_path, block_fp8):
    src, ts, _ = block_fp8
    out = tmp_path / "out"
    r = json.loads(run_ckpt("to-hf", src, out, "--keep-quantized", "--dtype", "fp32", "--no-fsync", "--json").stdout)
    assert r["quantization"]["dequantized"] is False
    got = read_out(out)
    assert sorted(got) == sorted(ts)
    for k, v in ts.items():
        if k == "norm.weight":
            assert got[k].dtype == torch.float32  # --dtype casts what is not quantized
            continue
        assert got[k].dtype == v.dtype and torch.equal(got[k].view(torch.uint8), v.view(torch.uint8)), k


def test_per_tensor_and_per_row_fp8(run_ckpt, tmp_path):
    w1, w2 = fp8_bytes(64, 48), fp8_bytes(40, 24)
    s1, s2 = np.array(0.0123, np.float32), scales(40, 1)
    src = write(tmp_path / "w.safetensors", {"p.weight": t8(w1), "p.weight_scale": torch.from_numpy(s1), "p.input_scale": torch.tensor(0.5),
                                             "r.weight": t8(w2), "r.weight_scale": torch.from_numpy(s2)})
    r = json.loads(run_ckpt("to-hf", src, tmp_path / "out", "--no-fsync", "--json").stdout)
    assert r["quantization"]["scheme"] == "fp8-tensor per-row + fp8-tensor per-tensor"
    got = read_out(tmp_path / "out")
    assert sorted(got) == ["p.weight", "r.weight"]  # input_scale belongs to the quantized weight
    assert np.array_equal(bits(got["p.weight"]), ref.dequant_scaled_fp8(w1, s1).view(np.uint16))
    assert np.array_equal(bits(got["r.weight"]), ref.dequant_scaled_fp8(w2, s2).view(np.uint16))


def test_mxfp4_dequantizes_as_gpt_oss(run_ckpt, tmp_path):
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    blocks = RNG.integers(0, 256, size=(2, 6, 3, 16), dtype=np.uint8)
    sc = RNG.integers(118, 134, size=(2, 6, 3), dtype=np.uint8)
    src = write(tmp_path / "w.safetensors", {"mlp.experts.gate_up_proj_blocks": blocks, "mlp.experts.gate_up_proj_scales": sc})
    run_ckpt("to-hf", src, tmp_path / "out", "--no-fsync", "--max-memory", "64MiB")
    got = read_out(tmp_path / "out")["mlp.experts.gate_up_proj"]
    assert got.shape == (2, 6, 96)
    assert np.array_equal(bits(got), ref.dequant_mxfp4(blocks, sc).view(np.uint16))
    want = mx.convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(sc), dtype=torch.bfloat16)
    assert torch.equal(got.view(torch.int16), want.transpose(1, 2).contiguous().view(torch.int16))  # gpt-oss's layout transposes


@pytest.mark.parametrize("case,code", [
    ("scale_shape", "QuantScaleShape"), ("scale_missing", "QuantScaleMissing"), ("payload_missing", "QuantPayloadMissing"),
    ("scale_nan", "QuantScaleNotFinite"), ("scale_inf", "QuantScaleNotFinite"), ("scale_dtype", "QuantScaleDType"),
])
def test_hostile_quantized_inputs_are_refused_by_name(run_ckpt, tmp_path, case, code):
    w, s = fp8_bytes(300, 200), scales(3, 2)
    ts = {"a.weight": t8(w), "a.weight_scale_inv": torch.from_numpy(s)}
    if case == "scale_shape":
        ts["a.weight_scale_inv"] = torch.from_numpy(scales(2, 2))  # [300, 200] on 128-blocks needs [3, 2]
    elif case == "scale_missing":
        ts["b.weight"] = t8(fp8_bytes(8, 8))
    elif case == "payload_missing":
        ts["c.weight_scale_inv"] = torch.ones(1, 1)
    elif case in ("scale_nan", "scale_inf"):
        s[2, 1] = np.nan if case == "scale_nan" else np.inf
        ts["a.weight_scale_inv"] = torch.from_numpy(s)
    elif case == "scale_dtype":
        ts["a.weight_scale_inv"] = torch.ones(3, 2, dtype=torch.int32)
    src = write(tmp_path / "w.safetensors", ts)
    p = run_ckpt("to-hf", src, tmp_path / "out", "--no-fsync", check=False)
    assert p.returncode != 0 and f"[{code}]" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_scale_like_names_of_an_unquantized_checkpoint_are_ordinary_tensors(run_ckpt, tmp_path):
    """No quantization_config and no FP8 weight: `X.weight_scale` beside an F32 `X.weight` (a layer
    scale, say) is an ordinary tensor, exported as it is."""
    ts = {"ls.weight": torch.ones(4, 4), "ls.weight_scale": torch.full((4,), 0.5), "o.weight_scale_inv": torch.ones(2)}
    src = write(tmp_path / "w.safetensors", ts)
    r = json.loads(run_ckpt("to-hf", src, tmp_path / "out", "--no-fsync", "--json").stdout)
    assert r["quantization"] is None
    got = read_out(tmp_path / "out")
    assert sorted(got) == sorted(ts) and all(torch.equal(got[k], v) for k, v in ts.items())
