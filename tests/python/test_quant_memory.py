"""Peak memory of `ckpt to-hf --quantize fp8-block|mxfp4` (issue 39, docs/QUANTIZATION.md "Memory")
with `--max-memory 64M` on a bf16 LLaMA whose MLP weights are [8192, 2048] (32 MiB each, 130 MB in
all): the quantizing view reads one band at a time (fp8-block: a block row, 128 x 2048 in f32;
mxfp4: 64 Ki values) and counts it in the budget. Before, a scale tensor's read quantized every
block of its weight at once (64 MiB of f32 + 16 MiB of FP8 for a 256 B scale chunk) and an MXFP4
read its chunk's values in f32 (17 bytes per output byte): 130 and 136 MiB peaks. The peak resident
set (wait4's ru_maxrss, as tests/python/test_memory.py measures it) stays within the budget, and
the output is the reference quantizer's bit for bit (transformers' Fp8Quantize, triton_kernels'
downcast_to_mxfp, both in numpy).
"""
import json
import os

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

import quant_reference as ref
from test_memory import _peak_mib

pytestmark = pytest.mark.memory
BUDGET_MIB = 64


def _bf16_llama(d):
    d.mkdir()
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "vocab_size": 256,
           "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 1, "num_attention_heads": 16,
           "num_key_value_heads": 16, "max_position_embeddings": 64, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (d / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(39)
    h, f = 2048, 8192
    shapes = {"model.embed_tokens.weight": (256, h), "lm_head.weight": (256, h), "model.norm.weight": (h,),
              "model.layers.0.input_layernorm.weight": (h,), "model.layers.0.post_attention_layernorm.weight": (h,)}
    for p in ("q", "k", "v", "o"):
        shapes[f"model.layers.0.self_attn.{p}_proj.weight"] = (h, h)
    shapes.update({"model.layers.0.mlp.gate_proj.weight": (f, h), "model.layers.0.mlp.up_proj.weight": (f, h),
                   "model.layers.0.mlp.down_proj.weight": (h, f)})
    tensors = {k: (rng.standard_normal(s, dtype=np.float32) * 0.05).astype(ml_dtypes.bfloat16) for k, s in shapes.items()}
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return tensors


@pytest.fixture(scope="module")
def bf16_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("quant_memory") / "bf16"
    return d, _bf16_llama(d)


@pytest.mark.parametrize("scheme", ["fp8-block", "mxfp4"])
def test_quantize_peak_within_budget(ckpt_bin, tmp_path, bf16_model, scheme):
    if os.environ.get("CKPT_SANITIZE") == "ON":
        pytest.skip("ASan's shadow memory and quarantine are not ckpt's")
    src, tensors = bf16_model
    peak = _peak_mib(ckpt_bin, "to-hf", src, tmp_path / "q", "--quantize", scheme, "--max-memory", "64M", "--no-fsync")
    print(f"to-hf --quantize {scheme} --max-memory 64M: peak RSS {peak:.1f} MiB")
    assert peak <= BUDGET_MIB, f"peak RSS {peak:.1f} MiB > {BUDGET_MIB} MiB"
    k = "model.layers.0.mlp.down_proj.weight"
    w = tensors[k].astype(np.float32)
    with safe_open(str(tmp_path / "q" / "model.safetensors"), "pt") as f:
        if scheme == "mxfp4":
            blocks, scales = ref.quantize_mxfp4(w)
            assert np.array_equal(f.get_tensor(k + "_blocks").numpy(), blocks)
            assert np.array_equal(f.get_tensor(k + "_scales").numpy(), scales)
            return
        q, inv = ref.quantize_block_fp8(w)
        assert np.array_equal(f.get_tensor(k + "_scale_inv").numpy().view(np.uint32), inv.view(np.uint32))
        assert np.array_equal(f.get_tensor(k).view(torch.uint8).numpy(), q)
