"""The HuggingFace LLaMA tensors of a config, by name and shape: what the interop tests write with
safetensors / numpy as a model ckpt must import (one home for the list the tests build models from)."""


def hf_llama_shapes(hidden, ffn, vocab, layers, q_dim=None, kv_dim=None):
    """{name: shape} of a LLaMA with untied embeddings; q_dim (heads x head_dim) defaults to hidden,
    kv_dim (kv heads x head_dim) to q_dim."""
    h, q = hidden, q_dim or hidden
    kv = kv_dim or q
    out = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,), "lm_head.weight": (vocab, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                    p + "mlp.gate_proj.weight": (ffn, h), p + "mlp.up_proj.weight": (ffn, h),
                    p + "mlp.down_proj.weight": (h, ffn)})
    return out


def write_hf_llama(hf_dir, cfg, rng):
    """A HuggingFace directory at `hf_dir` (created): config.json = cfg, and model.safetensors with
    every tensor of cfg's LLaMA drawn from `rng` (numpy Generator) as float32 standard normals, in
    hf_llama_shapes order (written by the safetensors library)."""
    import json
    import numpy as np
    from safetensors.numpy import save_file
    h = cfg["hidden_size"]
    kv = h * cfg["num_key_value_heads"] // cfg["num_attention_heads"]
    t = hf_llama_shapes(h, cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"], kv_dim=kv)
    hf_dir.mkdir()
    save_file({k: rng.standard_normal(s, dtype=np.float32) for k, s in t.items()}, str(hf_dir / "model.safetensors"))
    (hf_dir / "config.json").write_text(json.dumps(cfg))
