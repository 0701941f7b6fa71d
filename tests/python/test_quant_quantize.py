"""`ckpt to-hf --quantize fp8-block[:RxC]` (issue 39): the linear weights of a tiny bf16 LLaMA written
as block-scaled FP8 with the rounding of transformers' FineGrainedFP8 (Fp8Quantize._quantize_one,
run here on CPU as the reference, and quant_reference.quantize_block_fp8 in numpy), the
quantization_config transformers reads, and quantize -> dequantize equal to the references'."""
import json
import types

import numpy as np
import pytest
import torch
from safetensors import safe_open

import quant_reference as ref

transformers = pytest.importorskip("transformers")
fg = pytest.importorskip("transformers.integrations.finegrained_fp8")


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16_llama")
    torch.manual_seed(7)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=384, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    m = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
        m.model.layers[0].mlp.up_proj.weight[3, 5:9] = 0  # a partly zero block
        m.model.layers[0].self_attn.k_proj.weight[:, :128] = 0  # all-zero blocks: scale 1
    m.save_pretrained(d)
    return d, {k: v.clone() for k, v in m.state_dict().items()}


def _fp8_quantize(block):
    q = types.SimpleNamespace(quantization_config=types.SimpleNamespace(weight_block_size=block, scale_fmt=None))
    return fg.Fp8Quantize(q)


def read_all(d):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as g:
            out.update({k: g.get_tensor(k) for k in g.keys()})
    return out


@pytest.mark.parametrize("flag,block", [("fp8-block", (128, 128)), ("fp8-block:64x128", (64, 128))])
def test_quantize_as_transformers_fineGrainedFP8(run_ckpt, tmp_path, bf16_llama, flag, block):
    src, sd = bf16_llama
    out = tmp_path / "fp8"
    r = json.loads(run_ckpt("to-hf", src, out, "--quantize", flag, "--no-fsync", "--json").stdout)
    assert r["quantization"]["tensors"] == 7
    steps = {e["tensor"]: e for e in r["quantization"]["exactness"]["steps"]}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "fp8" and cfg["quantization_config"]["weight_block_size"] == list(block)
    got = read_all(out)
    quant = _fp8_quantize(block)
    for k, v in sd.items():
        if not k.endswith("_proj.weight"):
            assert torch.equal(got[k], v), k  # embeddings, norms, lm_head: as they were
            continue
        want = quant._quantize_one(k, v)
        qk, sk = k, k.replace(".weight", ".weight_scale_inv")
        assert got[qk].dtype == torch.float8_e4m3fn and torch.equal(got[qk].view(torch.uint8), want[qk].view(torch.uint8)), k
        assert got[sk].dtype == torch.float32 and torch.equal(got[sk], want[sk]), sk
        nq, ninv = ref.quantize_block_fp8(v.float().numpy(), *block)
        assert np.array_equal(nq, got[qk].view(torch.uint8).numpy()) and np.array_equal(ninv.view(np.uint32), got[sk].numpy().view(np.uint32))
        back = ref.dequant_block_fp8(nq, ninv, *block, out=np.float32)  # what quantizing changed
        assert steps[k]["changed"] == int(np.count_nonzero(back != v.float().numpy())) and steps[k]["elements"] == v.numel(), steps[k]


def test_quantize_then_dequantize_equals_the_reference(run_ckpt, tmp_path, bf16_llama):
    src, sd = bf16_llama
    run_ckpt("to-hf", src, tmp_path / "fp8", "--quantize", "fp8-block", "--no-fsync")
    run_ckpt("to-hf", tmp_path / "fp8", tmp_path / "back", "--dtype", "bf16", "--no-fsync")
    got = read_all(tmp_path / "back")
    assert "quantization_config" not in json.loads((tmp_path / "back" / "config.json").read_text())
    for k, v in sd.items():
        if k.endswith("_proj.weight"):
            q, inv = ref.quantize_block_fp8(v.float().numpy())
            want = ref.dequant_block_fp8(q, inv)
            assert np.array_equal(got[k].view(torch.int16).numpy(), want.view(np.int16)), k
        else:
            assert torch.equal(got[k], v), k


def test_bad_quantize_flags_and_requantizing(run_ckpt, tmp_path, bf16_llama):
    src, _ = bf16_llama
    for bad in ("fp4", "fp8-block:128", "fp8-block:0x128", "fp8-block:12ax128"):
        p = run_ckpt("to-hf", src, tmp_path / "x", "--quantize", bad, check=False)
        assert p.returncode != 0 and "--quantize" in p.stderr, (bad, p.stderr)
    # A quantized SRC is dequantized first: 128-blocks re-quantized into 64-blocks.
    run_ckpt("to-hf", src, tmp_path / "fp8", "--quantize", "fp8-block", "--no-fsync")
    run_ckpt("to-hf", tmp_path / "fp8", tmp_path / "fp8_64", "--quantize", "fp8-block:64x64", "--no-fsync")
    got = read_all(tmp_path / "fp8_64")
    assert got["model.layers.0.self_attn.q_proj.weight_scale_inv"].shape == (4, 4)


def test_quantize_mxfp4_as_gpt_oss(run_ckpt, tmp_path, bf16_llama):
    """--quantize mxfp4: every *_proj.weight as gpt-oss's X_blocks / X_scales with triton_kernels'
    downcast_to_mxfp rounding (quant_reference.quantize_mxfp4, a numpy transcription: the kernel is
    GPU-only); dequantized back, the values of gpt-oss's unpacking (quant_reference.dequant_mxfp4)."""
    src, sd = bf16_llama
    r = json.loads(run_ckpt("to-hf", src, tmp_path / "mx", "--quantize", "mxfp4", "--no-fsync", "--json").stdout)
    assert r["quantization"]["scheme"] == "mxfp4 1x32" and r["quantization"]["tensors"] == 7
    assert json.loads((tmp_path / "mx" / "config.json").read_text())["quantization_config"] == {"quant_method": "mxfp4"}
    got = read_all(tmp_path / "mx")
    steps = {e["tensor"]: e for e in r["quantization"]["exactness"]["steps"]}
    for k, v in sd.items():
        if not k.endswith("_proj.weight"):
            assert torch.equal(got[k], v), k
            continue
        blocks, scales = ref.quantize_mxfp4(v.float().numpy())
        assert np.array_equal(got[k + "_blocks"].numpy(), blocks), k
        assert np.array_equal(got[k + "_scales"].numpy(), scales), k
        back = ref.dequant_mxfp4(blocks, scales, out=np.float32)
        assert steps[k]["elements"] == v.numel() and steps[k]["changed"] == int(np.count_nonzero(back != v.float().numpy())), steps[k]
    run_ckpt("to-hf", tmp_path / "mx", tmp_path / "kept", "--keep-quantized", "--no-fsync")  # as stored, config kept
    kept = read_all(tmp_path / "kept")
    assert sorted(kept) == sorted(got) and all(torch.equal(kept[k], got[k]) for k in got)
    run_ckpt("to-hf", tmp_path / "mx", tmp_path / "back", "--dtype", "bf16", "--no-fsync")
    back = read_all(tmp_path / "back")
    for k, v in sd.items():
        if k.endswith("_proj.weight"):
            blocks, scales = ref.quantize_mxfp4(v.float().numpy())
            assert np.array_equal(back[k].view(torch.int16).numpy(), ref.dequant_mxfp4(blocks, scales).view(np.int16)), k


def test_mxfp4_e2m1_recipe_on_ties_and_edges(run_ckpt, tmp_path):
    """The recipe's ties go up (0.25 -> 0.5, 2.5 -> 3: not nearest-even), saturation at 6, zero blocks."""
    from safetensors.torch import save_file
    x = np.zeros((3, 32), np.float32)
    x[0, :8] = [0.25, 2.5, 5.0, 0.75, -1.25, 6.0, 0.1, -6.0]
    x[1, :] = np.linspace(-3, 3, 32)
    save_file({"a.q_proj.weight": torch.from_numpy(x)}, str(tmp_path / "w.safetensors"))
    run_ckpt("to-hf", tmp_path / "w.safetensors", tmp_path / "mx", "--quantize", "mxfp4", "--no-fsync")
    got = read_all(tmp_path / "mx")
    blocks, scales = ref.quantize_mxfp4(x)
    assert np.array_equal(got["a.q_proj.weight_blocks"].numpy(), blocks) and np.array_equal(got["a.q_proj.weight_scales"].numpy(), scales)
    assert scales[0, 0] == 127 and (blocks[0, 0, 0] & 0xF) == 1 and (blocks[0, 0, 0] >> 4) == 5  # 0.25 -> 0.5, 2.5 -> 3 (scale 2^0)
