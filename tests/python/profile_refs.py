"""Independent numpy reference for the PaddleNLP and LiBai LLaMA conventions (docs/PROFILES.md).

Written from the frameworks' own conversion code, NOT from ckpt's profiles, so that tests can
compare `ckpt convert --profile paddlenlp|paddlenlp-fused|libai` against it:

PaddleNLP (PaddlePaddle/PaddleNLP):
  paddlenlp/transformers/llama/modeling.py @5dd0f5d5e580038911ea168305c433f0bf79d547 and develop:
    LlamaPretrainedModel._get_name_mappings: torch "model.X" -> paddle "llama.X"; every linear
      weight (q/k/v/o/gate/up/down) and "lm_head.weight" with action "transpose" (Paddle's Linear
      stores [in, out]); embed_tokens and the norms as they are.
    _get_fuse_or_split_param_mappings: q/k/v -> self_attn.qkv_proj.weight and gate/up ->
      mlp.gate_up_fused_proj.weight through conversion_utils.fuse_param_func.
    _get_tensor_parallel_mappings: qkv_proj column split (normal_fuse_split_tp: contiguous blocks
      of the last axis), gate_up_fused_proj with is_naive_2fuse=True (naive_fuse_split_tp),
      o_proj/down_proj row split (axis 0 of [in, out]).
  paddlenlp/transformers/conversion_utils.py @def28155c405d73681cabcf23a399a4f5de989ea and develop:
    fuse_param_func (is_qkv): split q into num_heads, k and v into num_key_value_heads blocks on
      the last axis; for each KV head i: q blocks of group i, then k_i, then v_i; concatenate on the
      last axis. (ffn): concatenate [gate, up] on the last axis.
    naive_fuse_split_tp: split the fused weight into fuse_parts * tp blocks on the last axis; rank r
      takes blocks r, r + tp, ... (so rank r holds [gate_r | up_r]).
LiBai (Oneflow-Inc/libai @9dcbe3b281c98ba9a3bd192495bef42570095336):
  projects/Llama/utils/llama_loader.py LlamaLoaderHuggerFace._convert_state_dict:
    qkv = cat([q, k, v], dim=0); qkv = _fix_qkv_ordering(qkv, head_size, num_heads, hidden_size);
    stored as "model.layers.{i}.self_attn.query_key_value.weight"; q/k/v dropped, everything else
    (names, [out, in] orientation) kept.
  libai/models/utils/model_loader/base_loader.py ModelLoaderHuggerFace._fix_qkv_ordering:
    weight: view([num_of_qkv=3, num_heads, head_size, hidden]).permute(1, 0, 2, 3) -> per head
    [q_h; k_h; v_h]; bias: view(3, num_heads, head_size).permute(1, 0, 2).

Functions take and return {name: np.ndarray}. `hf_numpy_state_dict(model)` turns a transformers
LlamaForCausalLM into that form (float32). Everything is pure numpy; nothing imports ckpt.
"""

import re

import numpy as np

_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def hf_numpy_state_dict(model):
    """A transformers model's state_dict as float32 numpy arrays (rotary buffers dropped)."""
    out = {}
    for k, v in model.state_dict().items():
        if "rotary_emb" in k:
            continue
        out[k] = v.detach().float().cpu().numpy()
    return out


def _heads(cfg):
    h = cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or h
    hd = cfg.get("head_dim") or cfg["hidden_size"] // h
    return h, kv, hd


def _is_linear_weight(name):
    return name.endswith(".weight") and any(f".{p}." in name for p in _LINEAR)


# ---------------------------------------------------------------- PaddleNLP
def paddle_fuse_qkv(q, k, v, num_heads, num_kv_heads):
    """conversion_utils.fuse_param_func(is_qkv=True) on [in, out] weights (or 1-D biases)."""
    q_list = np.split(q, num_heads, axis=-1)
    k_list = np.split(k, num_kv_heads, axis=-1)
    v_list = np.split(v, num_kv_heads, axis=-1)
    groups = num_heads // num_kv_heads
    pairs = []
    for i in range(num_kv_heads):
        pairs += q_list[i * groups:(i + 1) * groups]
        pairs.append(k_list[i])
        pairs.append(v_list[i])
    return np.concatenate(pairs, axis=-1)


def paddle_split_qkv(fused, num_heads, num_kv_heads):
    """conversion_utils.split_param_func(is_qkv=True): the inverse of paddle_fuse_qkv."""
    groups = num_heads // num_kv_heads
    heads = np.split(fused, num_heads + 2 * num_kv_heads, axis=-1)
    q, k, v = [], [], []
    for i in range(num_kv_heads):
        q += heads[i * (groups + 2):(i + 1) * (groups + 2) - 2]
        k.append(heads[(i + 1) * (groups + 2) - 2])
        v.append(heads[(i + 1) * (groups + 2) - 1])
    return np.concatenate(q, axis=-1), np.concatenate(k, axis=-1), np.concatenate(v, axis=-1)


def paddle_naive_fuse_split_tp(weight, tp, fuse_parts=2):
    """conversion_utils.naive_fuse_split_tp (is_column=True): the TP rank tensors of a fused weight."""
    blocks = np.split(weight, fuse_parts * tp, axis=-1)
    return [np.concatenate(blocks[r::tp], axis=-1) for r in range(tp)]


def paddle_naive_fuse_merge_tp(rank_tensors, fuse_parts=2):
    """conversion_utils.naive_fuse_merge_tp (is_column=True): rank tensors -> the merged weight."""
    reorder = []
    for t in rank_tensors:
        reorder.extend(np.split(t, fuse_parts, axis=-1))
    index = np.arange(len(reorder)).reshape(len(rank_tensors), fuse_parts).T.reshape(-1)
    return np.concatenate([reorder[i] for i in index], axis=-1)


def _paddle_name(hf_name):
    if hf_name.startswith("model."):
        return "llama." + hf_name[len("model."):]
    return hf_name  # lm_head.weight


def to_paddlenlp(hf, cfg, fused=False, tp=1):
    """HF tensors -> PaddleNLP tensors. fused: fuse_attention_qkv and fuse_attention_ffn.

    With fused=True and tp > 1, gate_up_fused_proj is given as ckpt's global view of PaddleNLP's
    tensor-parallel files: the TP rank tensors of naive_fuse_split_tp concatenated along the out
    axis (at tp=1 that is PaddleNLP's merged [gate | up]). qkv_proj is split by plain contiguous
    column blocks (normal_fuse_split_tp), so its global view does not depend on tp.
    """
    h, kv, _ = _heads(cfg)
    out = {}
    for name, w in hf.items():
        if _is_linear_weight(name) or name == "lm_head.weight":
            w = w.T  # action "transpose": Paddle's Linear is [in, out]
        out[_paddle_name(name)] = np.ascontiguousarray(w)
    if not fused:
        return out
    layers = sorted({int(m.group(1)) for n in out for m in [re.match(r"llama\.layers\.(\d+)\.", n)] if m})
    for i in layers:
        p = f"llama.layers.{i}."
        for kind in ("weight", "bias"):
            qn, kn, vn = (f"{p}self_attn.{x}_proj.{kind}" for x in "qkv")
            if qn in out:
                out[f"{p}self_attn.qkv_proj.{kind}"] = paddle_fuse_qkv(out.pop(qn), out.pop(kn), out.pop(vn), h, kv)
            gn, un = f"{p}mlp.gate_proj.{kind}", f"{p}mlp.up_proj.{kind}"
            if gn in out:
                merged = np.concatenate([out.pop(gn), out.pop(un)], axis=-1)  # fuse_param_func (ffn)
                ranks = paddle_naive_fuse_split_tp(merged, tp)
                out[f"{p}mlp.gate_up_fused_proj.{kind}"] = np.concatenate(ranks, axis=-1)
    return out


def from_paddlenlp(pd, cfg, fused=False, tp=1):
    """PaddleNLP tensors (as to_paddlenlp gives them) -> HF tensors."""
    h, kv, _ = _heads(cfg)
    pd = dict(pd)
    if fused:
        for name in [n for n in pd if ".self_attn.qkv_proj." in n]:
            q, k, v = paddle_split_qkv(pd.pop(name), h, kv)
            for x, t in zip("qkv", (q, k, v)):
                pd[name.replace("qkv_proj", f"{x}_proj")] = t
        for name in [n for n in pd if ".mlp.gate_up_fused_proj." in n]:
            ranks = np.split(pd.pop(name), tp, axis=-1)
            merged = paddle_naive_fuse_merge_tp(ranks)
            gate, up = np.split(merged, 2, axis=-1)
            pd[name.replace("gate_up_fused_proj", "gate_proj")] = gate
            pd[name.replace("gate_up_fused_proj", "up_proj")] = up
    out = {}
    for name, w in pd.items():
        hf_name = "model." + name[len("llama."):] if name.startswith("llama.") else name
        if _is_linear_weight(hf_name) or hf_name == "lm_head.weight":
            w = w.T
        out[hf_name] = np.ascontiguousarray(w)
    return out


# ---------------------------------------------------------------- LiBai
def libai_fix_qkv_ordering(qkv, head_size, num_heads, hidden_size):
    """base_loader.ModelLoaderHuggerFace._fix_qkv_ordering (checkpoint_version 0)."""
    num_of_qkv = qkv.shape[0] // (head_size * num_heads)
    if qkv.ndim > 1:
        qkv = qkv.reshape(num_of_qkv, num_heads, head_size, hidden_size)
        return np.ascontiguousarray(qkv.transpose(1, 0, 2, 3)).reshape(num_of_qkv * head_size * num_heads, hidden_size)
    qkv = qkv.reshape(num_of_qkv, num_heads, head_size)
    return np.ascontiguousarray(qkv.transpose(1, 0, 2)).reshape(-1)


def libai_unfix_qkv_ordering(qkv, head_size, num_heads):
    """The inverse permutation: per head [q_h; k_h; v_h] -> [q; k; v]."""
    if qkv.ndim > 1:
        hidden = qkv.shape[1]
        t = qkv.reshape(num_heads, 3, head_size, hidden).transpose(1, 0, 2, 3)
        return np.ascontiguousarray(t).reshape(3 * num_heads * head_size, hidden)
    return np.ascontiguousarray(qkv.reshape(num_heads, 3, head_size).transpose(1, 0, 2)).reshape(-1)


def to_libai(hf, cfg):
    """HF tensors -> LiBai tensors (LlamaLoaderHuggerFace._convert_state_dict). Needs K == H."""
    h, kv, _ = _heads(cfg)
    if kv != h:
        raise ValueError("LiBai's LLaMA has no grouped-query attention (num_key_value_heads != num_attention_heads)")
    hidden = cfg["hidden_size"]
    head_size = hidden // h  # as LiBai computes it
    out = dict(hf)
    for i in range(cfg["num_hidden_layers"]):
        for kind in ("weight", "bias"):
            names = [f"model.layers.{i}.self_attn.{x}_proj.{kind}" for x in "qkv"]
            if names[0] not in out:
                continue
            qkv = np.concatenate([out.pop(n) for n in names], axis=0)
            out[f"model.layers.{i}.self_attn.query_key_value.{kind}"] = libai_fix_qkv_ordering(qkv, head_size, h, hidden)
    return out


def from_libai(lb, cfg):
    """LiBai tensors -> HF tensors."""
    h = cfg["num_attention_heads"]
    head_size = cfg["hidden_size"] // h
    out = dict(lb)
    for name in [n for n in out if ".self_attn.query_key_value." in n]:
        q, k, v = np.split(libai_unfix_qkv_ordering(out.pop(name), head_size, h), 3, axis=0)
        for x, t in zip("qkv", (q, k, v)):
            out[name.replace("query_key_value", f"{x}_proj")] = t
    return out


def _self_test():
    rng = np.random.default_rng(0)
    cfg = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 8, "num_hidden_layers": 2,
           "intermediate_size": 6, "vocab_size": 11}
    hd = 2
    hf = {"model.embed_tokens.weight": rng.standard_normal((11, 8)), "model.norm.weight": rng.standard_normal(8),
          "lm_head.weight": rng.standard_normal((11, 8))}
    for i in range(2):
        p = f"model.layers.{i}."
        hf[p + "self_attn.q_proj.weight"] = rng.standard_normal((4 * hd, 8))
        hf[p + "self_attn.k_proj.weight"] = rng.standard_normal((2 * hd, 8))
        hf[p + "self_attn.v_proj.weight"] = rng.standard_normal((2 * hd, 8))
        hf[p + "self_attn.o_proj.weight"] = rng.standard_normal((8, 4 * hd))
        hf[p + "mlp.gate_proj.weight"] = rng.standard_normal((6, 8))
        hf[p + "mlp.up_proj.weight"] = rng.standard_normal((6, 8))
        hf[p + "mlp.down_proj.weight"] = rng.standard_normal((8, 6))
        hf[p + "input_layernorm.weight"] = rng.standard_normal(8)
        hf[p + "post_attention_layernorm.weight"] = rng.standard_normal(8)
    for fused in (False, True):
        for tp in (1, 2, 3):
            back = from_paddlenlp(to_paddlenlp(hf, cfg, fused, tp), cfg, fused, tp)
            assert back.keys() == hf.keys() and all(np.array_equal(back[k], hf[k]) for k in hf)
    pd = to_paddlenlp(hf, cfg, True, 2)
    q = hf["model.layers.0.self_attn.q_proj.weight"].T
    k = hf["model.layers.0.self_attn.k_proj.weight"].T
    assert np.array_equal(pd["llama.layers.0.self_attn.qkv_proj.weight"][:, :2 * hd], q[:, :2 * hd])
    assert np.array_equal(pd["llama.layers.0.self_attn.qkv_proj.weight"][:, 2 * hd:3 * hd], k[:, :hd])
    g = hf["model.layers.0.mlp.gate_proj.weight"].T
    assert np.array_equal(pd["llama.layers.0.mlp.gate_up_fused_proj.weight"][:, :3], g[:, :3])
    cfg_mha = dict(cfg, num_key_value_heads=4)
    hf_mha = dict(hf)
    for i in range(2):
        for x in "kv":
            hf_mha[f"model.layers.{i}.self_attn.{x}_proj.weight"] = rng.standard_normal((4 * hd, 8))
    lb = to_libai(hf_mha, cfg_mha)
    back = from_libai(lb, cfg_mha)
    assert back.keys() == hf_mha.keys() and all(np.array_equal(back[k], hf_mha[k]) for k in hf_mha)
    qkv = lb["model.layers.1.self_attn.query_key_value.weight"]
    assert np.array_equal(qkv[hd:2 * hd], hf_mha["model.layers.1.self_attn.k_proj.weight"][:hd])
    print("profile_refs self test: ok")


if __name__ == "__main__":
    _self_test()
