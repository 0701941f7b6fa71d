"""Independent numpy reference of Megatron-LM (mcore GPT, LLaMA settings) per-rank tensors.

Written from /work/shared/FORMATS.md section 3, not from ckpt's C++:
  * linear_qkv packs rows per query group: reshape q to (ng, H/K*hd, in), k and v to (ng, hd, in),
    concatenate on axis 1, reshape to (-1, in); TP splits the packed tensor on dim 0.
  * linear_fc1 = [gate; up]; in legacy per-rank files TP rank r holds [gate_r; up_r].
  * column-parallel (dim 0): linear_qkv, linear_fc1 (+ biases); row-parallel (dim 1): linear_proj,
    linear_fc2 (biases replicated); vocab-parallel (dim 0): word_embeddings, output_layer;
    replicated: norms.
  * vocab padded with zero rows to ceil(V / (d*tp)) * d*tp, d = make-vocab-size-divisible-by.
  * legacy per-rank naming: layer index restarts at 0 in each pipeline stage; the first stage has
    the embedding, the last the final norm and output layer; tied embeddings with PP > 1: the last
    stage keeps a copy of the embedding as its output layer (mcore `output_layer.weight`); tied with
    PP == 1: no output_layer.
  * norm names: Transformer Engine spec (`self_attention.linear_qkv.layer_norm_weight`,
    `mlp.linear_fc1.layer_norm_weight`) or local spec (`input_layernorm.weight`,
    `pre_mlp_layernorm.weight`).
  * directories: mp_rank_{tp:02d} when PP == 1, else mp_rank_{tp:02d}_{pp:03d}.
"""
import numpy as np


def padded_vocab(vocab, tp, divisor):
    m = divisor * tp
    return -(-vocab // m) * m


def layers_per_stage(num_layers, pp, given=None):
    if given:
        assert len(given) == pp and sum(given) == num_layers
        return list(given)
    base, extra = divmod(num_layers, pp)
    return [base + (1 if s < extra else 0) for s in range(pp)]


def rank_dir(tp_rank, pp_rank, pp):
    return f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def _vocab_split(w, tp, divisor):
    v, h = w.shape
    p = padded_vocab(v, tp, divisor)
    full = np.zeros((p, h), dtype=w.dtype)
    full[:v] = w
    return np.split(full, tp, axis=0)


def _pack_qkv(q, k, v, H, K, hd):
    """HF q [H*hd, ...], k/v [K*hd, ...] -> Megatron linear_qkv [(H + 2K)*hd, ...] (per group)."""
    ng = K
    tail = q.shape[1:]
    qg = q.reshape((ng, H // K * hd) + tail)
    kg = k.reshape((ng, hd) + tail)
    vg = v.reshape((ng, hd) + tail)
    return np.concatenate([qg, kg, vg], axis=1).reshape((-1,) + tail)


def megatron_shards(cfg, hf, tp, pp, pp_layers=None, divisor=128, te_norms=True):
    """cfg: HF config dict; hf: name -> numpy array (HF names). Returns {rank_dir: {name: array}}."""
    H = cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", cfg["hidden_size"] // H)
    L = cfg["num_hidden_layers"]
    tied = cfg.get("tie_word_embeddings", False)
    assert K % tp == 0, "Megatron needs tp | num_query_groups"
    per_stage = layers_per_stage(L, pp, pp_layers)
    emb = _vocab_split(hf["model.embed_tokens.weight"], tp, divisor)
    head = None
    if not tied:
        head = _vocab_split(hf["lm_head.weight"], tp, divisor)
    elif pp > 1:
        head = emb

    out = {}
    first = 0
    for s in range(pp):
        layers = range(first, first + per_stage[s])
        first += per_stage[s]
        for r in range(tp):
            d = {}
            if s == 0:
                d["embedding.word_embeddings.weight"] = emb[r]
            for local, i in enumerate(layers):
                p = f"model.layers.{i}."
                m = f"decoder.layers.{local}."
                ln1 = "self_attention.linear_qkv.layer_norm_weight" if te_norms else "input_layernorm.weight"
                ln2 = "mlp.linear_fc1.layer_norm_weight" if te_norms else "pre_mlp_layernorm.weight"
                d[m + ln1] = hf[p + "input_layernorm.weight"]
                d[m + ln2] = hf[p + "post_attention_layernorm.weight"]
                for kind in ("weight", "bias"):
                    a = p + "self_attn.q_proj." + kind
                    if a in hf:
                        qkv = _pack_qkv(hf[a], hf[p + "self_attn.k_proj." + kind], hf[p + "self_attn.v_proj." + kind],
                                        H, K, hd)
                        d[m + "self_attention.linear_qkv." + kind] = np.split(qkv, tp, axis=0)[r]
                    g = p + "mlp.gate_proj." + kind
                    if g in hf:
                        gs = np.split(hf[g], tp, axis=0)
                        us = np.split(hf[p + "mlp.up_proj." + kind], tp, axis=0)
                        d[m + "mlp.linear_fc1." + kind] = np.concatenate([gs[r], us[r]], axis=0)
                d[m + "self_attention.linear_proj.weight"] = np.split(hf[p + "self_attn.o_proj.weight"], tp, axis=1)[r]
                d[m + "mlp.linear_fc2.weight"] = np.split(hf[p + "mlp.down_proj.weight"], tp, axis=1)[r]
                if p + "self_attn.o_proj.bias" in hf:
                    d[m + "self_attention.linear_proj.bias"] = hf[p + "self_attn.o_proj.bias"]
                if p + "mlp.down_proj.bias" in hf:
                    d[m + "mlp.linear_fc2.bias"] = hf[p + "mlp.down_proj.bias"]
            if s == pp - 1:
                d["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
                if head is not None:
                    d["output_layer.weight"] = head[r]
            out[rank_dir(r, s, pp)] = {k: np.ascontiguousarray(v) for k, v in d.items()}
    return out


def make_hf_model(cfg, rng, dtype=np.float32):
    """Random HF-named LLaMA tensors for config dict `cfg`."""
    H = cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", cfg["hidden_size"] // H)
    h, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    ab, mb = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)

    def r(*shape):
        return rng.standard_normal(shape).astype(dtype)

    t = {"model.embed_tokens.weight": r(V, h), "model.norm.weight": r(h)}
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = r(V, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = r(h)
        t[p + "post_attention_layernorm.weight"] = r(h)
        t[p + "self_attn.q_proj.weight"] = r(H * hd, h)
        t[p + "self_attn.k_proj.weight"] = r(K * hd, h)
        t[p + "self_attn.v_proj.weight"] = r(K * hd, h)
        t[p + "self_attn.o_proj.weight"] = r(h, H * hd)
        t[p + "mlp.gate_proj.weight"] = r(f, h)
        t[p + "mlp.up_proj.weight"] = r(f, h)
        t[p + "mlp.down_proj.weight"] = r(h, f)
        if ab:
            t[p + "self_attn.q_proj.bias"] = r(H * hd)
            t[p + "self_attn.k_proj.bias"] = r(K * hd)
            t[p + "self_attn.v_proj.bias"] = r(K * hd)
            t[p + "self_attn.o_proj.bias"] = r(h)
        if mb:
            t[p + "mlp.gate_proj.bias"] = r(f)
            t[p + "mlp.up_proj.bias"] = r(f)
            t[p + "mlp.down_proj.bias"] = r(h)
    return t
