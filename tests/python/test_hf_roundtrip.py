"""HF LLaMA round trip: tiny LlamaForCausalLM models with random weights (no download), several
configs (GQA K < H, explicit head_dim != hidden/H, tied and untied embeddings, bf16 and fp32),
save_pretrained (single file and sharded) -> ckpt from-hf -> ckpt to-hf -> from_pretrained:
every tensor bit-identical and logits on a fixed batch identical; a --max-shard-size export with
several shards loads in transformers."""
import json
import os
import pathlib
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _ckpt_bin():
    b = os.environ.get("CKPT_BIN")
    if b:
        return b
    return str(pathlib.Path(os.environ.get("CKPT_BINARY_DIR", ROOT / "build-hf")) / "ckpt")


def run(*args, check=True):
    p = subprocess.run([_ckpt_bin(), *map(str, args)], capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"ckpt {args} exited {p.returncode}: {p.stderr}")
    return p


CONFIGS = {
    "gqa_untied_fp32": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
                            dtype=torch.float32),
    "headdim_tied_bf16": dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              tie_word_embeddings=True, dtype=torch.bfloat16),
    "mha_tied_fp32": dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                          dtype=torch.float32),
    "gqa_headdim_untied_bf16": dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                                    tie_word_embeddings=False, dtype=torch.bfloat16),
    "gqa_headdim_tied_fp32": dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                  tie_word_embeddings=True, dtype=torch.float32),
}


def _model(spec, seed=0):
    spec = dict(spec)
    dtype = spec.pop("dtype")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=101, intermediate_size=80, num_hidden_layers=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=50000.0, **spec)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    return m.to(dtype)


def _state(d: pathlib.Path):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _logits(model):
    ids = torch.tensor([[1, 5, 9, 33, 77, 100, 2, 64]])
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
def test_roundtrip(tmp_path, name, sharded):
    m = _model(CONFIGS[name])
    hf = tmp_path / "hf"
    m.save_pretrained(hf, max_shard_size="20KB" if sharded else "5GB")
    assert (hf / "model.safetensors.index.json").exists() == sharded
    run("from-hf", hf, tmp_path / "native", "--no-fsync")
    run("to-hf", tmp_path / "native", tmp_path / "back", "--no-fsync")
    a, b = _state(hf), _state(tmp_path / "back")
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k].view(torch.uint8), b[k].view(torch.uint8)), k
    if not sharded:
        # Same bytes as save_pretrained's file: ordering, alignment, padding, __metadata__.
        assert (tmp_path / "back" / "model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()
    cfg = json.loads((tmp_path / "back" / "config.json").read_text())
    assert cfg["tie_word_embeddings"] == CONFIGS[name]["tie_word_embeddings"]
    orig = json.loads((hf / "config.json").read_text())
    assert cfg == orig  # every key kept (rope_parameters, head_dim, GQA, dtype, ...)
    m2 = LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert m2.dtype == m.dtype
    assert torch.equal(_logits(m), _logits(m2))


def test_sharded_export_loads_and_casts(tmp_path):
    m = _model(CONFIGS["gqa_untied_fp32"], seed=1)
    hf = tmp_path / "hf"
    m.save_pretrained(hf)
    run("from-hf", hf, tmp_path / "native", "--no-fsync")
    run("to-hf", tmp_path / "native", tmp_path / "sh", "--max-shard-size", "30KB", "--no-fsync")
    idx = json.loads((tmp_path / "sh" / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) >= 3
    ref_state = _state(hf)
    assert idx["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in ref_state.values())
    for fn in set(idx["weight_map"].values()):  # each shard = the official writer's bytes for its tensors
        save_file({k: ref_state[k] for k, f in idx["weight_map"].items() if f == fn}, tmp_path / "ref.st",
                  metadata={"format": "pt"})
        assert (tmp_path / "sh" / fn).read_bytes() == (tmp_path / "ref.st").read_bytes(), fn
    m2 = LlamaForCausalLM.from_pretrained(tmp_path / "sh").eval()
    assert torch.equal(_logits(m), _logits(m2))
    # bf16 export: each tensor equals torch's own cast; config dtype follows.
    run("to-hf", tmp_path / "native", tmp_path / "bf", "--dtype", "bf16", "--no-fsync")
    ref = {k: v.to(torch.bfloat16) for k, v in _state(hf).items()}
    got = _state(tmp_path / "bf")
    for k in ref:
        assert torch.equal(ref[k].view(torch.uint8), got[k].view(torch.uint8)), k
    cfg = json.loads((tmp_path / "bf" / "config.json").read_text())
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
    m3 = LlamaForCausalLM.from_pretrained(tmp_path / "bf").eval()
    assert m3.dtype == torch.bfloat16


def test_import_refuses_inconsistent_dirs(tmp_path):
    m = _model(CONFIGS["mha_tied_fp32"], seed=2)
    hf = tmp_path / "hf"
    m.save_pretrained(hf)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["num_hidden_layers"] = 3
    (hf / "config.json").write_text(json.dumps(cfg))
    r = run("from-hf", hf, tmp_path / "n1", check=False)
    assert r.returncode != 0 and "MissingTensor" in r.stderr and "model.layers.2" in r.stderr, r.stderr
    cfg["num_hidden_layers"] = 2
    cfg["intermediate_size"] = 96
    (hf / "config.json").write_text(json.dumps(cfg))
    r = run("from-hf", hf, tmp_path / "n2", check=False)
    assert r.returncode == 3 and "ShapeMismatch" in r.stderr, r.stderr
    assert not (tmp_path / "n1").exists() and not (tmp_path / "n2").exists()
