"""gpt-oss (transformers GptOssForCausalLM) through ckpt, bf16 and MXFP4 (issues 37 and 39, docs/MOE.md
"gpt-oss"). A tiny model made by transformers 5.24 itself (2 layers: sliding then full attention,
4 experts top-2, attention sinks and biases, router bias, interleaved gate/up experts [E, D, 2F]),
saved by save_pretrained in bf16; its MXFP4 form as OpenAI ships gpt-oss: `mlp.experts.{gate_up,
down}_proj_blocks` [E, out, in / 32, 16] + `_scales` [E, out, in / 32] (the transposed, [out, in]
orientation), quantized by quant_reference.quantize_mxfp4 (triton_kernels' downcast_to_mxfp), the
rest bf16, quantization_config mxfp4 with gpt-oss's modules_to_not_convert.

- bf16: from-hf -> reshard (tp 2, then ep 2 with etp 2) -> to-hf gives save_pretrained's tensors bit
  for bit and transformers the same logits.
- MXFP4: `to-hf --dtype bf16` gives every expert tensor of the numpy reference (gpt-oss's unpacking,
  then its transpose) bit for bit, and transformers the logits of transformers' own MXFP4 load.
  transformers 5.24 on this CPU loads MXFP4 only dequantized (`Mxfp4Config(dequantize=True)`; a
  plain load wants accelerate and then triton kernels), so that is the reference model.
- `--keep-quantized` writes the blocks and scales back byte for byte; kept quantized they reshard
  with expert and expert-tensor parallelism on 32-value block boundaries (QuantSplitBlock inside).
- Hostile files: a missing tensor, MXFP4 scales of the wrong shape, experts of the wrong width: named.
"""
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import quant_reference as ref
from store_pieces import assert_same_file_bytes, assert_same_pieces, pieces

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[3, 17, 60, 5, 41, 9, 22, 50, 1, 33]])  # longer than the sliding window (4)
QCFG = {"quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}


def _model():
    cfg = transformers.GptOssConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                    max_position_embeddings=64, sliding_window=4, dtype="bfloat16")
    torch.manual_seed(3)
    m = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():  # biases, sinks and norms off their init too
            p.normal_(1.0 if "norm" in name else 0.0, 0.08)
    return m.to(torch.bfloat16)


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """(bf16 dir, MXFP4 dir, the reference's dequantized bf16 expert tensors of the MXFP4 dir)."""
    root = tmp_path_factory.mktemp("gpt_oss")
    _model().save_pretrained(root / "bf16")
    mx = root / "mxfp4"
    mx.mkdir()
    cfg = json.loads((root / "bf16" / "config.json").read_text())
    cfg["quantization_config"] = QCFG
    (mx / "config.json").write_text(json.dumps(cfg, indent=2))
    tensors, deq = {}, {}
    for k, v in load_file(root / "bf16" / "model.safetensors").items():
        if ".mlp.experts." in k and k.endswith("_proj"):
            blocks, scales = ref.quantize_mxfp4(v.float().transpose(1, 2).numpy())  # [E, out, in]: gpt-oss's files
            tensors[k + "_blocks"] = torch.from_numpy(np.ascontiguousarray(blocks))
            tensors[k + "_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
            d = ref.dequant_mxfp4(blocks, scales)  # [E, out, in] bf16, then the model's [E, in, out]
            deq[k] = torch.from_numpy(np.ascontiguousarray(np.swapaxes(d, 1, 2)).view(np.int16)).view(torch.bfloat16)
        else:
            tensors[k] = v
    save_file(tensors, str(mx / "model.safetensors"), metadata={"format": "pt"})
    return root / "bf16", mx, deq


def _logits(d, **kw):
    m = transformers.GptOssForCausalLM.from_pretrained(d, dtype=torch.bfloat16, **kw).eval()
    with torch.no_grad():
        return m(TOKENS).logits


def _tensors(d):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_bf16_through_layouts_gives_transformers_back(run_ckpt, tmp_path, gpt_oss):
    src, _, _ = gpt_oss
    run_ckpt("from-hf", src, tmp_path / "s0", "--no-fsync")
    run_ckpt("reshard", tmp_path / "s0", tmp_path / "s1", "--tp", "2", "--pp", "2", "--dp", "1", "--pp-layers", "1,1")
    run_ckpt("reshard", tmp_path / "s1", tmp_path / "s2", "--tp", "2", "--pp", "1", "--dp", "2", "--ep", "2", "--etp", "2")
    run_ckpt("to-hf", tmp_path / "s2", tmp_path / "hf", "--no-fsync")
    got, want = _tensors(tmp_path / "hf"), _tensors(src)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    assert torch.equal(_logits(tmp_path / "hf"), _logits(src))


def test_mxfp4_dequantized_export_gives_transformers_own_dequantization(run_ckpt, tmp_path, gpt_oss):
    _, mx, deq = gpt_oss
    out = tmp_path / "bf16"
    r = json.loads(run_ckpt("to-hf", mx, out, "--dtype", "bf16", "--no-fsync", "--json").stdout)
    assert r["quantization"]["scheme"] == "mxfp4 1x32" and r["quantization"]["tensors"] == 4
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    got = _tensors(out)
    for k, v in deq.items():
        assert got[k].shape == v.shape and torch.equal(got[k].view(torch.int16), v.view(torch.int16)), k
    want = _logits(mx, quantization_config=transformers.Mxfp4Config(dequantize=True))
    assert torch.equal(_logits(out), want)


def test_mxfp4_keep_quantized_writes_blocks_back(run_ckpt, tmp_path, gpt_oss):
    _, mx, _ = gpt_oss
    out = tmp_path / "kept"
    run_ckpt("to-hf", mx, out, "--keep-quantized", "--no-fsync")
    assert_same_file_bytes(out / "model.safetensors", mx / "model.safetensors")
    assert json.loads((out / "config.json").read_text())["quantization_config"] == QCFG


def test_mxfp4_kept_quantized_reshards_on_block_boundaries(run_ckpt, tmp_path, gpt_oss):
    """from-hf --keep-quantized with ep 2 x etp 2: each rank holds the blocks and scales of its experts'
    box of the model's tensor (gate_up_proj [E, h, 2F] split along 2F = the stored rows; down_proj
    [E, F, h] along F = the stored packed dim, 32 | F / 2); -> ep 4 -> back: byte-identical, the
    source's bytes exported, the ep 4 store dequantizes to the reference; tp 4 (experts split F over tp: 16) cuts 32-blocks."""
    _, mx, deq = gpt_oss
    a, b, a2 = tmp_path / "ep2", tmp_path / "ep4", tmp_path / "ep2_again"
    lay2 = ("--tp", "2", "--pp", "1", "--dp", "2", "--ep", "2", "--etp", "2")
    run_ckpt("from-hf", mx, a, "--keep-quantized", *lay2, "--no-fsync")
    pa = pieces(a)
    g, d = "model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj"  # E 4, h 64, F 64
    assert (g + "_blocks", (2, 64, 0, 0), (2, 64, 2, 16)) in pa and (g + "_scales", (2, 64, 0), (2, 64, 2)) in pa
    assert (d + "_blocks", (0, 0, 1, 0), (2, 64, 1, 16)) in pa and (d + "_scales", (0, 0, 1), (2, 64, 1)) in pa
    run_ckpt("reshard", a, b, "--tp", "1", "--pp", "1", "--dp", "4", "--ep", "4")
    run_ckpt("reshard", b, a2, *lay2)
    assert_same_pieces(pa, a2)
    run_ckpt("to-hf", a2, tmp_path / "kept", "--keep-quantized", "--no-fsync")
    assert_same_file_bytes(tmp_path / "kept" / "model.safetensors", mx / "model.safetensors")
    run_ckpt("to-hf", b, tmp_path / "bf16", "--dtype", "bf16", "--no-fsync")
    got = _tensors(tmp_path / "bf16")
    for k, v in deq.items():
        assert torch.equal(got[k].view(torch.int16), v.view(torch.int16)), k
    p = run_ckpt("reshard", a, tmp_path / "tp4", "--tp", "4", "--pp", "1", "--dp", "1", check=False)  # F / 4 = 16
    assert p.returncode != 0 and "[QuantSplitBlock]" in p.stderr and "down_proj" in p.stderr, p.stderr


@pytest.mark.parametrize("case", ["sinks_missing", "scales_shape", "experts_width"])
def test_hostile_gpt_oss_is_named(run_ckpt, tmp_path, gpt_oss, case):
    """A missing sinks tensor (from-hf of the bf16 model): MissingTensor; MXFP4 scales of another shape
    than their blocks: QuantScaleShape; MXFP4 experts whose width is not the config's: ShapeMismatch."""
    src, mx, _ = gpt_oss
    base = src if case == "sinks_missing" else mx
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((base / "config.json").read_text())
    t = _tensors(base)
    g = "model.layers.1.mlp.experts.gate_up_proj"
    if case == "sinks_missing":
        del t["model.layers.1.self_attn.sinks"]
    elif case == "scales_shape":
        t[g + "_scales"] = t[g + "_scales"][:, :, :1].contiguous()
    else:  # 2F = 128 rows -> 96
        t[g + "_blocks"], t[g + "_scales"] = t[g + "_blocks"][:, :96].contiguous(), t[g + "_scales"][:, :96].contiguous()
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    cmd = ("from-hf", bad, tmp_path / "out") if case == "sinks_missing" else ("to-hf", bad, tmp_path / "out", "--dtype", "bf16")
    p = run_ckpt(*cmd, "--no-fsync", check=False)
    code = {"sinks_missing": "[MissingTensor]", "scales_shape": "[QuantScaleShape]", "experts_width": "[ShapeMismatch]"}[case]
    assert p.returncode != 0 and code in p.stderr, p.stderr
    assert ("sinks" if case == "sinks_missing" else "gate_up_proj") in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
