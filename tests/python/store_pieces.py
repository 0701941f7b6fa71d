"""What the quantized-reshard tests compare (test_quant_llama, test_quant_moe, test_gpt_oss): a native store's
pieces from its manifest, two stores holding the same pieces byte for byte (digests), and two safetensors files
holding the same tensors byte for byte (read by the official safetensors library)."""
import json

import torch
from safetensors import safe_open


def pieces(store):
    """{(tensor, offset, extent): manifest piece} of the store at `store`."""
    man = json.loads((store / "manifest.json").read_text())
    return {(p["tensor"], tuple(p["region"]["offset"]), tuple(p["region"]["extent"])): p for p in man["pieces"]}


def assert_same_pieces(a, b):
    """Stores (or pieces() of them) `a` and `b`: the same boxes of the same tensors, equal digests and dtypes."""
    pa = a if isinstance(a, dict) else pieces(a)
    pb = b if isinstance(b, dict) else pieces(b)
    assert pa.keys() == pb.keys()
    for k in pa:
        assert pa[k]["digest"] == pb[k]["digest"] and pa[k]["dtype"] == pb[k]["dtype"], k


def assert_same_file_bytes(got, want):
    """Safetensors files `got` and `want`: the same tensor names, dtypes and bytes."""
    with safe_open(str(got), "pt") as f, safe_open(str(want), "pt") as g:
        assert sorted(f.keys()) == sorted(g.keys())
        for k in g.keys():
            x, y = f.get_tensor(k), g.get_tensor(k)
            assert x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8)), k
