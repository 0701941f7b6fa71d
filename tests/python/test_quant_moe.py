"""Block-FP8 mixture-of-experts checkpoints (issue 39 on issue 37's MoE support): the tiny DeepSeek-V3 and
Qwen3-MoE of fixtures/moe (written by transformers' save_pretrained) quantized as DeepSeek-V3 and
Qwen3-FP8 ship: every linear `*_proj.weight` of the decoder layers (attention, dense MLP, shared
experts and each routed expert's `mlp.experts.{e}.{gate,up,down}_proj.weight`) F8_E4M3 with its own
`weight_scale_inv` per block; embeddings, lm_head, norms, the router `mlp.gate.weight` (and
DeepSeek's `e_score_correction_bias`) left unquantized in bf16; quantization_config fp8 with
weight_block_size [8, 8] (the tiny widths 16..64 are multiples of 8). Scales in F32 (DeepSeek) and
BF16 (Qwen3-FP8). The quantizer is quant_reference.quantize_block_fp8 (transformers' Fp8Quantize).

- `to-hf --dtype bf16` gives every tensor of the numpy-dequantized reference (DeepSeek's
  weight_dequant) bit for bit, and transformers the logits of that reference model.
- `from-hf --keep-quantized --ep 2` puts each rank's experts and their scales together; ep 2 -> 4 ->
  2 is byte-identical, `to-hf --keep-quantized` gives the source's bytes back under the per-expert
  names, and the ep store dequantizes to the reference; tp 2 cuts the dense MLP's 8-blocks (56 / 2):
  QuantSplitBlock.
- An expert without its scales, or with scales of another shape: QuantScaleMissing / QuantScaleShape
  naming that expert's tensors.
"""
import json
import pathlib

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import quant_reference as ref
from store_pieces import assert_same_file_bytes, assert_same_pieces, pieces

transformers = pytest.importorskip("transformers")

MOE = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "moe"
CLASSES = {"deepseek_v3": transformers.DeepseekV3ForCausalLM, "qwen3_moe": transformers.Qwen3MoeForCausalLM}
SCALE_DTYPES = {"deepseek_v3": np.float32, "qwen3_moe": ml_dtypes.bfloat16}
QCFG = {"quant_method": "fp8", "weight_block_size": [8, 8], "activation_scheme": "dynamic", "fmt": "e4m3"}


def _bf16(a):
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)


def _quantized(d, family):
    """Writes the FP8 checkpoint of `family` into `d`; returns the reference's dequantized bf16 state dict."""
    d.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((MOE / family / "legacy" / "config.json").read_text())
    cfg["quantization_config"], cfg["dtype"] = QCFG, "bfloat16"
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors, deq = {}, {}
    for k, v in load_file(MOE / family / "legacy" / "model.safetensors").items():
        if k.startswith("model.layers.") and k.endswith("_proj.weight"):
            q, inv = ref.quantize_block_fp8(v.numpy(), 8, 8)
            inv = inv.astype(SCALE_DTYPES[family])
            tensors[k] = torch.from_numpy(q).view(torch.float8_e4m3fn)
            tensors[k + "_scale_inv"] = torch.from_numpy(inv.view(np.int16)).view(torch.bfloat16) if inv.dtype != np.float32 \
                else torch.from_numpy(inv)
            deq[k] = _bf16(ref.dequant_block_fp8(q, inv.astype(np.float32), 8, 8))
        else:
            tensors[k] = deq[k] = v.to(torch.bfloat16)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return deq


@pytest.fixture(scope="module", params=sorted(CLASSES))
def fp8_moe(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param) / "fp8"
    return request.param, d, _quantized(d, request.param)


def _logits(model_dir, family):
    m = CLASSES[family].from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        return m(torch.tensor(np.load(MOE / family / "tokens.npy"))).logits


def _assert_reference(out, deq):
    got = {}
    for f in sorted(pathlib.Path(out).glob("*.safetensors")):
        got.update(load_file(f))
    assert sorted(got) == sorted(deq)
    for k, v in deq.items():
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k].view(torch.int16), v.view(torch.int16)), k


def test_dequantized_export_gives_the_reference_logits(run_ckpt, tmp_path, fp8_moe):
    family, src, deq = fp8_moe
    out = tmp_path / "bf16"
    r = json.loads(run_ckpt("to-hf", src, out, "--dtype", "bf16", "--no-fsync", "--json").stdout)
    n = sum(1 for k in deq if k.endswith("_proj.weight") and ".experts." not in k) + sum(
        1 for k in deq if k.endswith(".experts.0.gate_proj.weight")) * 3  # one stacked tensor per projection
    assert r["quantization"]["tensors"] == n and r["quantization"]["scheme"] == "fp8-block 8x8"
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    _assert_reference(out, deq)
    ref_dir = tmp_path / "reference"  # the reference model: the dequantized weights under save_pretrained's names
    ref_dir.mkdir()
    cfg = json.loads((MOE / family / "legacy" / "config.json").read_text())
    cfg["dtype"] = "bfloat16"
    (ref_dir / "config.json").write_text(json.dumps(cfg))
    save_file(deq, str(ref_dir / "model.safetensors"), metadata={"format": "pt"})
    assert torch.equal(_logits(out, family), _logits(ref_dir, family))


def test_expert_parallel_reshard_moves_experts_with_their_scales(run_ckpt, tmp_path, fp8_moe):
    family, src, deq = fp8_moe
    a, b, a2 = tmp_path / "ep2", tmp_path / "ep4", tmp_path / "ep2_again"
    run_ckpt("from-hf", src, a, "--keep-quantized", "--tp", "1", "--pp", "1", "--dp", "2", "--ep", "2", "--no-fsync")
    pa = pieces(a)
    w = "model.layers.1.mlp.experts.gate_proj.weight"  # [8, 24, 32]: 3 x 4 blocks per expert
    assert (w, (4, 0, 0), (4, 24, 32)) in pa and (w + "_scale_inv", (4, 0, 0), (4, 3, 4)) in pa
    d = "model.layers.1.mlp.experts.down_proj.weight"  # [8, 32, 24]
    assert (d + "_scale_inv", (0, 0, 0), (4, 4, 3)) in pa
    run_ckpt("reshard", a, b, "--tp", "1", "--pp", "1", "--dp", "4", "--ep", "4")
    assert (w + "_scale_inv", (6, 0, 0), (2, 3, 4)) in pieces(b)
    run_ckpt("reshard", b, a2, "--tp", "1", "--pp", "1", "--dp", "2", "--ep", "2")
    assert_same_pieces(pa, a2)
    out = tmp_path / "hf"
    run_ckpt("to-hf", a2, out, "--keep-quantized", "--no-fsync")
    assert_same_file_bytes(out / "model.safetensors", src / "model.safetensors")
    assert json.loads((out / "config.json").read_text())["quantization_config"] == QCFG
    run_ckpt("to-hf", b, tmp_path / "bf16", "--dtype", "bf16", "--no-fsync")  # gathered from 4 expert ranks
    _assert_reference(tmp_path / "bf16", deq)
    p = run_ckpt("from-hf", src, tmp_path / "tp2", "--keep-quantized", "--tp", "2", "--pp", "1", "--dp", "1", "--no-fsync", check=False)
    assert p.returncode != 0 and "[QuantSplitBlock]" in p.stderr, p.stderr


def _edited(tmp_path, src, edit):
    d = tmp_path / "bad"
    d.mkdir()
    (d / "config.json").write_text((src / "config.json").read_text())
    t = load_file(src / "model.safetensors")
    edit(t)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.mark.parametrize("case", ["missing", "shape"])
def test_expert_scales_missing_or_misshapen_are_named(run_ckpt, tmp_path, fp8_moe, case):
    _, src, _ = fp8_moe
    k = "model.layers.1.mlp.experts.5.up_proj.weight_scale_inv"

    def edit(t):
        if case == "missing":
            del t[k]
        else:
            t[k] = t[k][:2].contiguous()
    bad = _edited(tmp_path, src, edit)
    p = run_ckpt("to-hf", bad, tmp_path / "out", "--no-fsync", check=False)
    code = "[QuantScaleMissing]" if case == "missing" else "[QuantScaleShape]"  # the expert's own weight and scales named
    assert p.returncode != 0 and code in p.stderr and k in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_fused_fp8_experts_dequantize_to_the_same_model(run_ckpt, tmp_path):
    """transformers' in-memory (fused) naming quantized as its FP8Experts holds it: `mlp.experts.gate_up_proj`
    [E, 2F, h] + `gate_up_proj_scale_inv` per expert's blocks, `down_proj` + `down_proj_scale_inv`: dequantized,
    then seen as the stacked experts, the same tensors as the per-expert checkpoint's reference (F = 24 is
    a multiple of the 8-block, so the blocks are the same). Kept quantized, its blocks could straddle gate
    and up: refused by name."""
    deq = _quantized(tmp_path / "legacy_fp8", "qwen3_moe")
    d = tmp_path / "fused_fp8"
    d.mkdir()
    (d / "config.json").write_text((tmp_path / "legacy_fp8" / "config.json").read_text())
    tensors = {}
    for k, v in load_file(MOE / "qwen3_moe" / "fused" / "model.safetensors").items():
        if k.startswith("model.layers.") and (k.endswith("_proj.weight") or k.endswith(("experts.gate_up_proj", "experts.down_proj"))):
            qs = [ref.quantize_block_fp8(m.numpy(), 8, 8) for m in (v if v.dim() == 3 else [v])]
            q, inv = (np.stack([a for a, _ in qs]), np.stack([b for _, b in qs])) if v.dim() == 3 else qs[0]
            tensors[k] = torch.from_numpy(q).view(torch.float8_e4m3fn)
            tensors[k + "_scale_inv"] = torch.from_numpy(inv.astype(ml_dtypes.bfloat16).view(np.int16)).view(torch.bfloat16)
        else:
            tensors[k] = v.to(torch.bfloat16)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    run_ckpt("to-hf", d, tmp_path / "bf16", "--dtype", "bf16", "--no-fsync")
    _assert_reference(tmp_path / "bf16", deq)
    p = run_ckpt("from-hf", d, tmp_path / "kept", "--keep-quantized", "--no-fsync", check=False)
    assert p.returncode != 0 and "[QuantUnsupported]" in p.stderr and "gate_up_proj" in p.stderr, p.stderr
