"""The older Megatron-LM naming (before megatron-core): renames of a real mcore state dict as the
legacy models saved it, for the older-names fixtures of mcore_fixtures.py."""
import pathlib
import shutil

# mcore name fragment -> Megatron-LM legacy (pre-mcore) name fragment, as Megatron-LM's
# tools/checkpoint/loader_legacy.py reads legacy checkpoints (model.language_model.embedding,
# .encoder.layers[i].input_norm / self_attention.query_key_value / self_attention.dense /
# post_attention_norm / mlp.dense_h_to_4h / mlp.dense_4h_to_h, .encoder.final_norm,
# .output_layer) and megatron/legacy/model/transformer.py names its modules.
LEGACY_RENAMES = [
    ("embedding.word_embeddings.weight", "language_model.embedding.word_embeddings.weight"),
    ("decoder.final_layernorm.weight", "language_model.encoder.final_norm.weight"),  # older: final_layernorm
    ("output_layer.weight", "language_model.output_layer.weight"),
    ("decoder.layers.", "language_model.encoder.layers."),
    (".input_layernorm.weight", ".input_norm.weight"),
    (".self_attention.linear_qkv.weight", ".self_attention.query_key_value.weight"),
    (".self_attention.linear_proj.weight", ".self_attention.dense.weight"),
    (".pre_mlp_layernorm.weight", ".post_attention_norm.weight"),
    (".mlp.linear_fc1.weight", ".mlp.dense_h_to_4h.weight"),
    (".mlp.linear_fc2.weight", ".mlp.dense_4h_to_h.weight"),
]


# The other norm naming of the older models (megatron/legacy/model/transformer.py before the
# input_norm / post_attention_norm / final_norm rename).
LAYERNORM_NAMES = [(".input_norm.", ".input_layernorm."), (".post_attention_norm.", ".post_attention_layernorm."),
                   (".final_norm.", ".final_layernorm.")]


def legacy_name(name, layernorm_names=False):
    for a, b in LEGACY_RENAMES + (LAYERNORM_NAMES if layernorm_names else []):
        name = name.replace(a, b)
    return name


def legacy_nested(model, layernorm_names=False):
    """The mcore state dict in the older Megatron-LM form: renamed (LEGACY_RENAMES) and nested as
    legacy TransformerLanguageModel.state_dict_for_save_checkpoint nests it, which the converters
    in use read with get_element_from_dict_by_path(sd, "model.language_model.encoder")
    (transformers' megatron_gpt2/checkpoint_reshaping_and_interoperability.py):
    {'language_model': {'embedding': {'word_embeddings': {'weight': T}},
                        'encoder': {'layers.0.input_norm.weight': T, ..., 'final_norm.weight': T},
                        'output_layer': {'weight': T}}}. Non-tensor entries (_extra_state) dropped."""
    import torch
    lm = {}
    for k, v in model.items():
        if not torch.is_tensor(v):
            continue
        name = legacy_name(k, layernorm_names)
        assert name.startswith("language_model."), name
        rest = name[len("language_model."):]
        if rest.startswith("encoder."):
            lm.setdefault("encoder", {})[rest[len("encoder."):]] = v
        elif rest.startswith("embedding."):
            lm.setdefault("embedding", {}).setdefault("word_embeddings", {})["weight"] = v
        else:
            lm.setdefault("output_layer", {})["weight"] = v
    return {"language_model": lm}


def rename_to_legacy(src, dst, layernorm_names=False):
    """The older-names fixture: each rank file of `src` with its model in the older naming."""
    import torch
    for f in sorted(pathlib.Path(src).glob("iter_*/mp_rank_*/model_optim_rng.pt")):
        ck = torch.load(f, weights_only=False)
        ck["model"] = legacy_nested(ck["model"], layernorm_names)
        g = pathlib.Path(dst) / f.relative_to(src)
        g.parent.mkdir(parents=True, exist_ok=True)
        torch.save(ck, g)
    for n in ("latest_checkpointed_iteration.txt", "tokens.npy", "logits.npy"):
        shutil.copy(pathlib.Path(src) / n, pathlib.Path(dst) / n)
