"""Shared by the PaddleNLP tests (issue 36): the committed fixtures written by PaddleNLP 2.8.1
(fixtures/paddlenlp/README.md), transformers' logits of an HF directory, and the numpy reference
of the HF tensors a PaddleNLP case holds (its unfused.npz: Paddle names, [in, out] linears)."""
import json
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "paddlenlp"
CASES = [f"{d}_{f}_{k}" for d in ("fp32", "bf16") for f in ("unfused", "fused") for k in ("pdparams", "safetensors")]


def case_dir(case):
    return FIXTURES / case


def hf_reference(case):
    """{HF name: fp32 array} from the case's unfused.npz: llama. -> model., 2-D linears and lm_head
    transposed back to [out, in] (the embedding is [vocab, hidden] in both)."""
    z = np.load(case_dir(case) / "unfused.npz")
    out = {}
    for k in z.files:
        v = z[k]
        name = "model." + k[len("llama."):] if k.startswith("llama.") else k
        if v.ndim == 2 and not name.endswith("embed_tokens.weight"):
            v = v.T
        out[name] = np.ascontiguousarray(v, dtype=np.float32)
    return out


def bf16_round(x):
    """fp32 -> bf16 -> fp32, round to nearest even (numpy only)."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return (b.astype(np.uint32) << 16).view(np.float32)


def hf_logits(hf_dir, tokens):
    """transformers' LlamaForCausalLM from `hf_dir` in fp32 on `tokens` -> numpy logits."""
    import torch
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(tokens, dtype=np.int64))).logits.float().numpy()


def read_safetensors(path):
    """({name: numpy array}, header metadata, {name: safetensors dtype}) of a .safetensors file by the
    safetensors library (its own header parse); BF16 tensors come back as float32 (exact)."""
    import struct

    from safetensors import safe_open

    raw = pathlib.Path(path).read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    dtypes = {k: v["dtype"] for k, v in header.items() if k != "__metadata__"}
    out = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        for k in f.keys():
            t = f.get_tensor(k)
            if dtypes[k] == "BF16":
                t = t.float()
            out[k] = t.numpy()
    return out, meta, dtypes


def load_case_json(case):
    return json.loads((case_dir(case) / "case.json").read_text())
