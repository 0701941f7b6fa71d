"""The transposed (`in-out`) weights of a profile conversion against numpy's transpose:
odd shapes (hidden 72, ffn 200, vocab 5003, GQA 4 heads of 18 / 2 KV heads), a --max-memory so
small that the executor's chunks (about 455 KiB) cut lm_head within its stored rows and the
transpose tiles divide nothing, bf16 / fp16 / fp32 (PaddleNLP's profile with its dtypes set to
the source's, so no cast), tp=2 pp=1 -> tp=1 pp=2 [1,1] and back, 1 and 2 threads:
- every stored [in, out] tensor equals numpy's `.T` of the HF tensor, bit for bit (h5py reads);
- converting back to the HF orientation (reference profile, same dtype) at the source's layout
  gives the source's bytes.
"""
import json

import numpy as np
import pytest
import torch
from native_h5py import read_native  # scripts/: h5py + hashlib only, no ckpt code
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from conftest import ROOT

DTYPES = {"bf16": ("BF16", torch.bfloat16), "fp16": ("F16", torch.float16), "fp32": ("F32", torch.float32)}
TRANSPOSED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _profile(d, base, dt):
    p = json.loads((ROOT / "profiles" / f"{base}.json").read_text())
    p["name"] = f"{base}-{dt.lower()}"
    p["dtypes"] = {k: (dt if k != "optimizer" else v) for k, v in p["dtypes"].items()}
    f = d / f"{p['name']}.json"
    f.write_text(json.dumps(p))
    return f


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


@pytest.mark.parametrize("dt", list(DTYPES))
def test_transposed_weights_equal_numpy_both_ways(run_ckpt, tmp_path, dt):
    name, tdt = DTYPES[dt]
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=5003, hidden_size=72, intermediate_size=200, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=18, max_position_embeddings=32, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).to(tdt)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    m.save_pretrained(tmp_path / "hf")
    ints = {2: torch.int16, 4: torch.int32}
    hf = {k: v.view(ints[v.element_size()]).numpy() for k, v in load_file(str(tmp_path / "hf" / "model.safetensors")).items()}
    run_ckpt("from-hf", tmp_path / "hf", tmp_path / "src", "--tp", "2", "--pp", "1", "--dp", "1", "--no-fsync")
    paddle, ref = _profile(tmp_path, "paddlenlp", name), _profile(tmp_path, "reference", name)
    _, src, _ = read_native(tmp_path / "src")
    for threads in ("1", "2"):
        t, back = tmp_path / f"paddle{threads}", tmp_path / f"back{threads}"
        run_ckpt("convert", tmp_path / "src", t, "--profile-file", paddle, "--tp", "1", "--pp", "2", "--pp-layers", "1,1",
                 "--dp", "1", "--max-memory", "1M", "--threads", threads)
        _, got, _ = read_native(t)
        for k, v in hf.items():
            if k.endswith(".weight") and (k.split(".")[-2] in TRANSPOSED or k == "lm_head.weight"):
                pk = k.replace("model.", "llama.", 1)
                assert got[pk].shape == v.T.shape and np.array_equal(_bits(got[pk]), _bits(np.ascontiguousarray(v.T))), (dt, k)
        run_ckpt("convert", t, back, "--profile-file", ref, "--tp", "2", "--pp", "1", "--dp", "1", "--max-memory", "1M",
                 "--threads", threads)
        _, again, _ = read_native(back)
        assert src.keys() == again.keys()
        for k in src:
            assert src[k].dtype == again[k].dtype and np.array_equal(_bits(src[k]), _bits(again[k])), (dt, k)
