"""tests/python/profile_refs.py (the numpy reference of the PaddleNLP and LiBai conventions) checked
against the frameworks' FORWARD code, re-enacted in numpy, and transformers' own projections:

- PaddleNLP paddlenlp/transformers/llama/modeling.py: nn.Linear is y = x @ W with W [in, out];
  LlamaAttention.forward (fuse_attention_qkv) reshapes qkv_proj(x) to
  [b, s, num_key_value_heads, (num_key_value_groups + 2) * head_dim] and splits it into
  [groups * head_dim, head_dim, head_dim]; LlamaMLP.forward (fuse_attention_ffn) chunks
  gate_up_fused_proj(x) in 2 on the last axis; on TP rank r a ColumnParallelLinear holds the rank's
  columns (qkv_proj: a contiguous block, normal_fuse_split_tp; gate_up: naive_fuse_split_tp);
  LlamaLMHead: logits = x @ W (parallel_matmul, transpose_y=False).
- LiBai projects/Llama/llama.py: Linear is y = x @ W^T (matmul(x, weight, transpose_b=True));
  MultiheadAttention.forward views query_key_value(x) as [b, s, num_heads, 3 * head_size] and chunks
  it in 3 on the last axis; TP rank r holds rows r * 3H*hd/tp.. (sbp split(0)).
So a wrong packing in profile_refs (which `ckpt convert` is compared against) fails here.
"""
import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import profile_refs


def _model(heads, kv, head_dim=4, hidden=16, inter=12):
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=23, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                      num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
                      max_position_embeddings=32, tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.1)
    return m


def _torch_proj(m, layer, x):
    """transformers' q/k/v/gate/up projections of x [b, s, hidden], as numpy (float64 math)."""
    att, mlp = m.model.layers[layer].self_attn, m.model.layers[layer].mlp
    t = torch.from_numpy(x)
    with torch.no_grad():
        return {n: f(t).double().numpy() for n, f in
                (("q", att.q_proj), ("k", att.k_proj), ("v", att.v_proj), ("gate", mlp.gate_proj), ("up", mlp.up_proj))}


def _x(hidden):
    return np.random.default_rng(2).standard_normal((2, 3, hidden)).astype(np.float32)


@pytest.mark.parametrize("tp", [1, 2])
def test_paddlenlp_fused_forward_matches_transformers(tp):
    heads, kv, hd, inter = 4, 2, 4, 12
    m = _model(heads, kv, hd, inter=inter)
    cfg = m.config.to_dict()
    pd = profile_refs.to_paddlenlp(profile_refs.hf_numpy_state_dict(m), cfg, fused=True, tp=tp)
    x = _x(cfg["hidden_size"])
    want = _torch_proj(m, 1, x)
    w_qkv = pd["llama.layers.1.self_attn.qkv_proj.weight"].astype(np.float64)
    w_gu = pd["llama.layers.1.mlp.gate_up_fused_proj.weight"].astype(np.float64)
    groups = heads // kv
    for r in range(tp):  # each TP rank's ColumnParallelLinear and forward
        qkv_r = np.split(w_qkv, tp, axis=-1)[r]  # normal_fuse_split_tp: a contiguous column block
        mix = (x @ qkv_r).reshape(2, 3, kv // tp, (groups + 2) * hd)
        q, k, v = np.split(mix, [groups * hd, (groups + 1) * hd], axis=-1)
        q_heads = slice(r * heads // tp * hd, (r + 1) * heads // tp * hd)
        kv_heads = slice(r * kv // tp * hd, (r + 1) * kv // tp * hd)
        np.testing.assert_allclose(q.reshape(2, 3, -1), want["q"][..., q_heads], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(k.reshape(2, 3, -1), want["k"][..., kv_heads], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(v.reshape(2, 3, -1), want["v"][..., kv_heads], rtol=1e-5, atol=1e-6)
        gu_r = np.split(w_gu, tp, axis=-1)[r]  # ckpt's global view: the rank tensors side by side
        gate, up = np.split(x @ gu_r, 2, axis=-1)  # LlamaMLP.forward: paddle.chunk(.., 2, axis=-1)
        cols = slice(r * inter // tp, (r + 1) * inter // tp)
        np.testing.assert_allclose(gate, want["gate"][..., cols], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(up, want["up"][..., cols], rtol=1e-5, atol=1e-6)
    # And the rank tensors are exactly what PaddleNLP's naive_fuse_split_tp gives from the merged weight.
    merged = profile_refs.paddle_naive_fuse_merge_tp(np.split(w_gu, tp, axis=-1))
    for r, t in enumerate(profile_refs.paddle_naive_fuse_split_tp(merged, tp)):
        np.testing.assert_array_equal(t, np.split(w_gu, tp, axis=-1)[r])


def test_paddlenlp_unfused_linear_and_lm_head_are_in_out():
    m = _model(4, 2)
    cfg = m.config.to_dict()
    pd = profile_refs.to_paddlenlp(profile_refs.hf_numpy_state_dict(m), cfg, fused=False)
    x = _x(cfg["hidden_size"])
    want = _torch_proj(m, 0, x)
    for n in ("q", "k", "v"):
        got = x.astype(np.float64) @ pd[f"llama.layers.0.self_attn.{n}_proj.weight"].astype(np.float64)
        np.testing.assert_allclose(got, want[n], rtol=1e-5, atol=1e-6)
    with torch.no_grad():
        logits = m.lm_head(torch.from_numpy(x)).double().numpy()
    np.testing.assert_allclose(x.astype(np.float64) @ pd["lm_head.weight"].astype(np.float64), logits, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_array_equal(pd["llama.embed_tokens.weight"], m.model.embed_tokens.weight.detach().numpy())
    assert "llama.norm.weight" in pd and "model.norm.weight" not in pd


@pytest.mark.parametrize("tp", [1, 2])
def test_libai_forward_matches_transformers(tp):
    heads, hd = 4, 4
    m = _model(heads, heads, hd)
    cfg = m.config.to_dict()
    lb = profile_refs.to_libai(profile_refs.hf_numpy_state_dict(m), cfg)
    x = _x(cfg["hidden_size"])
    want = _torch_proj(m, 0, x)
    w = lb["model.layers.0.self_attn.query_key_value.weight"].astype(np.float64)
    for r in range(tp):
        w_r = np.split(w, tp, axis=0)[r]  # column-parallel: sbp split(0) of [out, in]
        mix = (x @ w_r.T).reshape(2, 3, heads // tp, 3 * hd)  # view(bsz, -1, num_heads, 3 * head_size)
        q, k, v = np.split(mix, 3, axis=-1)  # flow.chunk(.., chunks=3, dim=-1)
        cols = slice(r * heads // tp * hd, (r + 1) * heads // tp * hd)
        for got, n in ((q, "q"), (k, "k"), (v, "v")):
            np.testing.assert_allclose(got.reshape(2, 3, -1), want[n][..., cols], rtol=1e-5, atol=1e-6)
    assert "model.layers.0.self_attn.q_proj.weight" not in lb
    with pytest.raises(ValueError):
        profile_refs.to_libai(profile_refs.hf_numpy_state_dict(_model(4, 2)), _model(4, 2).config.to_dict())


def test_round_trips():
    m = _model(4, 2)
    cfg = m.config.to_dict()
    hf = profile_refs.hf_numpy_state_dict(m)
    for fused in (False, True):
        for tp in (1, 2):
            back = profile_refs.from_paddlenlp(profile_refs.to_paddlenlp(hf, cfg, fused, tp), cfg, fused, tp)
            assert back.keys() == hf.keys()
            for k in hf:
                np.testing.assert_array_equal(back[k], hf[k])
    m = _model(4, 4)
    cfg, hf = m.config.to_dict(), profile_refs.hf_numpy_state_dict(m)
    back = profile_refs.from_libai(profile_refs.to_libai(hf, cfg), cfg)
    assert back.keys() == hf.keys()
    for k in hf:
        np.testing.assert_array_equal(back[k], hf[k])
