"""A tiny LLaMA with block-FP8 weights (issue 39): every *_proj weight quantized to F8_E4M3 with
128 x 128 block scales by the reference quantizer (quant_reference.quantize_block_fp8, written from
transformers' Fp8Quantize), quantization_config as transformers' FineGrainedFP8 writes it.

- `to-hf --dtype bf16` gives transformers the logits of the reference model holding the
  reference's dequantized weights (DeepSeek's weight_dequant in numpy), bit for bit.
- `from-hf --keep-quantized --tp 2` splits every weight on block boundaries with its scales;
  reshard tp 2 -> 1 -> 2 is byte-identical (every piece of every rank), and the store exports the
  source's bytes again; `--tp 4` would cut blocks: QuantSplitBlock.
"""
import json

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import quant_reference as ref
from store_pieces import assert_same_file_bytes, assert_same_pieces, pieces

transformers = pytest.importorskip("transformers")

QCFG = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic", "fmt": "e4m3"}


def _model():
    torch.manual_seed(39)
    cfg = transformers.LlamaConfig(vocab_size=320, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                   tie_word_embeddings=False)
    m = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    return m.to(torch.bfloat16)


@pytest.fixture(scope="module")
def fp8_llama(tmp_path_factory):
    """(HF dir with block-FP8 weights, the reference bf16 state dict of the dequantized model)."""
    d = tmp_path_factory.mktemp("fp8_llama")
    m = _model()
    m.config.save_pretrained(d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = QCFG
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors, deq = {}, {}
    for k, v in m.state_dict().items():
        if k.endswith("_proj.weight"):
            q, inv = ref.quantize_block_fp8(v.float().numpy())
            tensors[k] = torch.from_numpy(q).view(torch.float8_e4m3fn)
            tensors[k.replace(".weight", ".weight_scale_inv")] = torch.from_numpy(inv)
            deq[k] = torch.from_numpy(ref.dequant_block_fp8(q, inv).view(np.uint16).astype(np.int16)).view(torch.bfloat16)
        else:
            tensors[k] = v.contiguous()
            deq[k] = v
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d, deq


def _logits(m):
    ids = torch.tensor([[1, 5, 77, 300, 12, 9, 250, 3]])
    with torch.no_grad():
        return m(ids).logits


def test_dequantized_export_gives_the_reference_logits(run_ckpt, tmp_path, fp8_llama):
    src, deq = fp8_llama
    out = tmp_path / "bf16"
    r = json.loads(run_ckpt("to-hf", src, out, "--dtype", "bf16", "--no-fsync", "--json").stdout)
    assert r["config"] and r["quantization"]["tensors"] == 14
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg
    got = transformers.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.bfloat16).eval()
    ref_model = _model()  # the reference model holding the reference's dequantized weights, loaded as transformers loads any
    ref_model.load_state_dict(deq)
    ref_model.save_pretrained(tmp_path / "reference")
    want = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "reference", torch_dtype=torch.bfloat16).eval()
    for k, v in got.state_dict().items():
        assert torch.equal(v.view(torch.int16), deq[k].view(torch.int16)), k
    assert torch.equal(_logits(got), _logits(want))


def test_inspect_shows_scheme_block_and_bytes_saved(run_ckpt, fp8_llama):
    src, _ = fp8_llama
    j = json.loads(run_ckpt("inspect", src, "--json").stdout)["quantization"]
    assert j["scheme"] == "fp8-block 128x128" and j["block_sizes"] == ["128x128"] and j["quant_method"] == "fp8"
    n = sum(np.prod(v.shape) for k, v in _model().state_dict().items() if k.endswith("_proj.weight"))
    assert j["bf16_bytes"] == 2 * n and j["stored_bytes"] == n + 4 * n // (128 * 128)
    assert "fp8-block 128x128" in run_ckpt("inspect", src).stdout


def test_reshard_moves_weights_with_their_scales(run_ckpt, tmp_path, fp8_llama):
    src, deq = fp8_llama
    a, b, a2 = tmp_path / "tp2", tmp_path / "tp1", tmp_path / "tp2_again"
    run_ckpt("from-hf", src, a, "--keep-quantized", "--tp", "2", "--pp", "1", "--dp", "1", "--no-fsync")
    pa = pieces(a)
    q = "model.layers.0.self_attn.q_proj"
    assert (q + ".weight", (0, 0), (128, 256)) in pa and (q + ".weight_scale_inv", (0, 0), (1, 2)) in pa
    assert (q + ".weight_scale_inv", (1, 0), (1, 2)) in pa  # rank 1's blocks' scales
    o = "model.layers.0.self_attn.o_proj"  # row-parallel: split along columns
    assert (o + ".weight_scale_inv", (0, 1), (2, 1)) in pa
    run_ckpt("reshard", a, b, "--tp", "1", "--pp", "1", "--dp", "1")
    run_ckpt("reshard", b, a2, "--tp", "2", "--pp", "1", "--dp", "1")
    assert_same_pieces(pa, a2)
    out = tmp_path / "hf"
    run_ckpt("to-hf", a2, out, "--keep-quantized", "--no-fsync")
    assert_same_file_bytes(out / "model.safetensors", src / "model.safetensors")
    assert json.loads((out / "config.json").read_text())["quantization_config"] == QCFG
    # The tp 2 store dequantized (weights and scales gathered from both ranks' pieces).
    run_ckpt("to-hf", a, tmp_path / "bf16", "--dtype", "bf16", "--no-fsync")
    with safe_open(str(tmp_path / "bf16" / "model.safetensors"), "pt") as f:
        for k, v in deq.items():
            assert torch.equal(f.get_tensor(k).view(torch.int16), v.view(torch.int16)), k


def test_split_inside_a_block_is_refused_by_name(run_ckpt, tmp_path, fp8_llama):
    src, _ = fp8_llama
    p = run_ckpt("from-hf", src, tmp_path / "tp4", "--keep-quantized", "--tp", "4", "--pp", "1", "--dp", "1", "--no-fsync", check=False)
    assert p.returncode != 0 and "[QuantSplitBlock]" in p.stderr, p.stderr
    assert not (tmp_path / "tp4").exists()


def test_requantize_reblocks_and_reports_changed_elements(run_ckpt, tmp_path, fp8_llama):
    """--requantize: tp 4 cuts the 128-blocks at 64 (q/k/v/gate/up rows, o/down columns): every weight
    re-quantized with 64 x 64 blocks from its f32 dequantized values (the references: DeepSeek's
    weight_dequant in f32, then transformers' Fp8Quantize), and the exactness report counts the
    elements whose value changed, as numpy counts them."""
    src, _ = fp8_llama
    a, b = tmp_path / "tp2", tmp_path / "tp4"
    run_ckpt("from-hf", src, a, "--keep-quantized", "--tp", "2", "--pp", "1", "--dp", "1", "--no-fsync")
    p = run_ckpt("reshard", a, b, "--tp", "4", "--pp", "1", "--dp", "1", check=False)
    assert p.returncode != 0 and "[QuantSplitBlock]" in p.stderr, p.stderr
    r = json.loads(run_ckpt("reshard", a, b, "--tp", "4", "--pp", "1", "--dp", "1", "--requantize", "--json").stdout)
    assert r["exactness"]["exact"] is False
    report = {e["tensor"]: e for e in r["exactness"]["steps"]}
    out = tmp_path / "hf"
    run_ckpt("to-hf", b, out, "--keep-quantized", "--no-fsync")
    assert json.loads((out / "config.json").read_text())["quantization_config"]["weight_block_size"] == [64, 64]
    with safe_open(str(out / "model.safetensors"), "pt") as f, safe_open(str(src / "model.safetensors"), "pt") as g:
        for k in g.keys():
            if not k.endswith("_proj.weight"):
                continue
            old = ref.dequant_block_fp8(g.get_tensor(k).view(torch.uint8).numpy(), g.get_tensor(k + "_scale_inv").numpy(), out=np.float32)
            q, inv = ref.quantize_block_fp8(old, 64, 64)
            assert np.array_equal(f.get_tensor(k).view(torch.uint8).numpy(), q), k
            assert np.array_equal(f.get_tensor(k + "_scale_inv").numpy().view(np.uint32), inv.view(np.uint32)), k
            new = ref.dequant_block_fp8(q, inv, 64, 64, out=np.float32)
            e = report[k]
            assert e["step"] == "requantize fp8-block 128x128 -> 64x64" and e["elements"] == old.size, e
            assert e["changed"] == int(np.count_nonzero(new != old)), (k, e)
