"""Real Megatron-LM legacy per-rank checkpoints, written by megatron-core 0.16.1 on CPU.

A small LLaMA-like GPTModel (RMSNorm, SwiGLU, GQA 8 heads / 2 query groups, rotary, untied
embeddings, no bias, vocab 300 padded as Megatron pads it) is built with
get_gpt_layer_local_spec() and use_cpu_initialization=True in each layout (tp=1, tp=2, pp=2 with
the uneven split 2 + 4 layers through TransformerConfig.num_layers_in_first_pipeline_stage) and
saved in the LEGACY layout as Megatron-LM's megatron/training/checkpointing.py writes it:

    <dir>/latest_checkpointed_iteration.txt                      "10"
    <dir>/iter_0000010/mp_rank_TT[_PPP]/model_optim_rng.pt       torch.save of
        {'args': argparse.Namespace(...), 'checkpoint_version': 3.0, 'iteration': 10,
         'model': model.state_dict_for_save_checkpoint(), 'optimizer': {...},
         'opt_param_scheduler': {...}, 'rng_state': [{...}]}

Beside it: tokens.npy and logits.npy (megatron-core's own forward on CPU over the padded vocab,
[batch, seq, padded_vocab]), computed after the optimizer steps. The 'optimizer' entry: real
torch.optim.Adam steps in the structure of megatron-core's local optimizers (see _optimizer_state).

The second naming generation (older Megatron-LM: language_model.encoder.layers.N.self_attention.
query_key_value.weight, ..., nested dicts) is made from the real mcore state dict by renaming it
with the inverse of the mapping Megatron-LM's tools/checkpoint/loader_legacy.py reads
(LEGACY_RENAMES) and nesting it as the legacy model saved it (legacy_nested). It is a rename of a
real model, not a model built by us.

CLI (what the tests run once per fixture, cached under $CKPT_BINARY_DIR/fixtures/mcore/<name>
with a file lock):  torchrun --nproc-per-node N mcore_fixtures.py --out DIR --tp T --pp P [--bf16]
"""
import argparse
import contextlib
import fcntl
import os
import pathlib
import random
import shutil
import subprocess
import sys

VOCAB = 300
DIVISOR = 128
LAYERS = 6
HIDDEN = 64
HEADS = 8
GROUPS = 2
FFN = 160
SEQ = 16
BATCH = 2
ITERATION = 10
FIRST_STAGE_LAYERS = 2  # pp=2: 2 + 4 layers (uneven)

# name -> (tp, pp, bf16)
LAYOUTS = {
    "tp1": (1, 1, False),
    "tp2": (2, 1, False),
    "pp2": (1, 2, False),
    "tp1_bf16": (1, 1, True),
}

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


def padded_vocab(tp):
    """Megatron-LM's _vocab_size_with_padding: a multiple of make_vocab_size_divisible_by * tp."""
    m = DIVISOR * tp
    return ((VOCAB + m - 1) // m) * m


# The other norm naming of the older models (megatron/legacy/model/transformer.py before the
# input_norm / post_attention_norm / final_norm rename).
LAYERNORM_NAMES = [(".input_norm.", ".input_layernorm."), (".post_attention_norm.", ".post_attention_layernorm."),
                   (".final_norm.", ".final_layernorm.")]


def legacy_name(name, layernorm_names=False):
    for a, b in LEGACY_RENAMES + (LAYERNORM_NAMES if layernorm_names else []):
        name = name.replace(a, b)
    return name


def megatron_args(tp, pp, bf16):
    """The args Namespace as Megatron-LM's arguments.py names its fields."""
    import torch
    return argparse.Namespace(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, num_layers=LAYERS,
        decoder_first_pipeline_num_layers=FIRST_STAGE_LAYERS if pp > 1 else None,
        decoder_last_pipeline_num_layers=None, hidden_size=HIDDEN, ffn_hidden_size=FFN,
        num_attention_heads=HEADS, num_query_groups=GROUPS, group_query_attention=True,
        kv_channels=HIDDEN // HEADS, vocab_size=VOCAB, padded_vocab_size=padded_vocab(tp),
        make_vocab_size_divisible_by=DIVISOR, swiglu=True, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, add_qkv_bias=False, rotary_base=10000, rotary_percent=1.0,
        norm_epsilon=1e-5, normalization="RMSNorm", position_embedding_type="rope",
        max_position_embeddings=SEQ * 4, seq_length=SEQ, params_dtype=torch.bfloat16 if bf16 else torch.float32,
        fp16=False, bf16=bf16, use_distributed_optimizer=False, transformer_impl="local",
        iteration=ITERATION, consumed_train_samples=ITERATION * BATCH, lr=1e-3, world_size=tp * pp,
        data_parallel_size=1, micro_batch_size=BATCH, global_batch_size=BATCH, seed=1234)


def _cpu_shims():
    """megatron-core on CPU: no CUDA RNG tracker forks, no CUDA device queries."""
    import torch
    from megatron.core import tensor_parallel
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"  # used as a device: .to(device=current_device())
    tracker = tensor_parallel.random.get_cuda_rng_tracker()
    tracker.fork = lambda *a, **k: contextlib.nullcontext()


def _build(tp, pp, bf16):
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.manual_seed(1234 + parallel_state.get_tensor_model_parallel_rank())
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=FFN, kv_channels=HIDDEN // HEADS, normalization="RMSNorm", layernorm_epsilon=1e-5,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, init_method_std=0.05,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
        num_layers_in_first_pipeline_stage=FIRST_STAGE_LAYERS if pp > 1 else None,
        params_dtype=torch.bfloat16 if bf16 else torch.float32, bf16=bf16, apply_rope_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=padded_vocab(tp), max_sequence_length=SEQ * 4,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(), parallel_output=False,
                     share_embeddings_and_output_weights=False, position_embedding_type="rope",
                     rotary_base=10000)
    # Non-trivial norm weights (initialised to ones) so a swapped norm shows in the logits; the
    # same on every TP rank (norms are replicated over TP), different per stage and layer.
    gen = torch.Generator().manual_seed(99 + 1000 * parallel_state.get_pipeline_model_parallel_rank())
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "layernorm" in n or "norm" in n.split(".")[-2]:
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype))
    return model


def _forward(model, tokens, pp):
    """Logits [b, s, padded_vocab] of megatron-core's forward (hidden states passed between stages)."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    b, s = tokens.shape
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(1, 1, s, s)  # True = masked
    with torch.no_grad():
        if pp > 1:
            first, last = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
            if not first:
                buf = torch.empty(s, b, HIDDEN, dtype=next(model.parameters()).dtype)
                dist.recv(buf, src=parallel_state.get_pipeline_model_parallel_prev_rank())
                model.set_input_tensor(buf)
            out = model(tokens, pos, mask)
            if not last:
                dist.send(out.contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
                return None
            return out
        return model(tokens, pos, mask)


def _optimizer_state(model, bf16):
    """The 'optimizer' entry after 3 real torch.optim.Adam steps, in the structure megatron-core's
    local optimizers return from state_dict(): FP32Optimizer -> the Adam state dict itself;
    Float16OptimizerWithFloat16Params -> {'optimizer': Adam over fp32 master copies,
    'grad_scaler': None, 'fp32_from_fp16_params': [[master per param of each group]]}, the model
    params then being the master's rounding (megatron copies main params to model params after
    each step). megatron-core's own wrappers cannot run here: FP32Optimizer.__init__ makes
    torch.tensor([1.0], device='cuda') (optimizer.py) and they expect DDP's param.main_grad."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().float().clone().requires_grad_(True) for p in params] if bf16 else params
    adam = torch.optim.Adam(masters, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    gen = torch.Generator().manual_seed(7)
    for _ in range(3):
        for m in masters:
            m.grad = 0.01 * torch.randn(m.shape, generator=gen, dtype=torch.float32)
        adam.step()
    with torch.no_grad():
        for p, m in zip(params, masters):
            if p is not m:
                p.copy_(m)
    if not bf16:
        return adam.state_dict()
    return {"optimizer": adam.state_dict(), "grad_scaler": None,
            "fp32_from_fp16_params": [[m.detach() for m in masters]]}


def _rank_file(out, tp_rank, pp_rank, pp):
    d = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "")
    return out / f"iter_{ITERATION:07d}" / d / "model_optim_rng.pt"


def generate(out, tp, pp, bf16):
    """Runs inside torchrun (or alone for tp=pp=1): writes the rank files, tokens and logits."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("gloo")
    _cpu_shims()
    model = _build(tp, pp, bf16)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))
    opt_state = _optimizer_state(model, bf16)
    logits = _forward(model, tokens, pp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    ckpt = {
        "args": megatron_args(tp, pp, bf16), "checkpoint_version": 3.0, "iteration": ITERATION,
        "model": model.state_dict_for_save_checkpoint(),
        "optimizer": opt_state,
        "opt_param_scheduler": {"max_lr": 1e-3, "lr_warmup_steps": 0, "num_steps": ITERATION * BATCH,
                                "lr_decay_style": "constant", "lr_decay_steps": 100, "min_lr": 0.0,
                                "start_wd": 0.0, "end_wd": 0.0, "wd_incr_style": "constant"},
        "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                       "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": None,
                       "rng_tracker_states": {}}],
        "num_floating_point_operations_so_far": 0,
    }
    f = _rank_file(out, tp_rank, pp_rank, pp)
    f.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, f)
    if logits is not None and tp_rank == 0:
        np.save(out / "logits.npy", logits.float().numpy())
        np.save(out / "tokens.npy", tokens.numpy())
    dist.barrier()
    if dist.get_rank() == 0:
        (out / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    dist.destroy_process_group()


def load_and_forward(run_dir, out, tp, pp, local_vocab_check=True):
    """Runs inside torchrun: builds the GPTModel of layout (tp, pp), load_state_dict(strict=True) of
    this rank's model_optim_rng.pt of `run_dir` (torch.load(weights_only=True), argparse.Namespace
    allowed as Megatron-LM registers it), checks every tensor equal to the file's, and writes the
    forward logits on tokens.npy of `out` to out/logits_loaded.npy."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    dist.init_process_group("gloo")
    _cpu_shims()
    model = _build(tp, pp, False)
    it = (pathlib.Path(run_dir) / "latest_checkpointed_iteration.txt").read_text().strip()
    d = f"mp_rank_{parallel_state.get_tensor_model_parallel_rank():02d}" + (
        f"_{parallel_state.get_pipeline_model_parallel_rank():03d}" if pp > 1 else "")
    torch.serialization.add_safe_globals([argparse.Namespace])
    ck = torch.load(pathlib.Path(run_dir) / f"iter_{int(it):07d}" / d / "model_optim_rng.pt", weights_only=True)
    model.load_state_dict(ck["model"], strict=True)
    for k, v in model.state_dict().items():
        if torch.is_tensor(v):
            assert torch.equal(v, ck["model"][k]), k
    tokens = torch.from_numpy(np.load(pathlib.Path(out) / "tokens.npy"))
    logits = _forward(model, tokens, pp)
    if logits is not None and parallel_state.get_tensor_model_parallel_rank() == 0:
        np.save(pathlib.Path(out) / "logits_loaded.npy", logits.float().numpy())
    dist.barrier()
    dist.destroy_process_group()


def run_load(run_dir, out, tp, pp):
    """load_and_forward under torchrun with tp * pp processes; returns the logits."""
    import numpy as np
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(tp * pp), "--master-port",
           str(29500 + random.randint(1, 2000)), __file__, "--out", str(out), "--tp", str(tp), "--pp", str(pp),
           "--load", str(run_dir)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"megatron-core load failed ({' '.join(cmd)}):\n{p.stderr[-6000:]}")
    return np.load(pathlib.Path(out) / "logits_loaded.npy")


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


def fixture(name, binary_dir=None):
    """The fixture directory `name` (a LAYOUTS key, or '<key>_legacy_names' / '<key>_legacy_layernorm_names'
    for the older naming with either norm naming), generated once under
    $CKPT_BINARY_DIR/fixtures/mcore with a file lock."""
    base = pathlib.Path(binary_dir or os.environ.get("CKPT_BINARY_DIR", "build")) / "fixtures" / "mcore"
    base.mkdir(parents=True, exist_ok=True)
    out = base / name
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "DONE").exists():
            return out
        tmp = base / (name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        if name.endswith("_legacy_names") or name.endswith("_legacy_layernorm_names"):
            layernorm = name.endswith("_legacy_layernorm_names")
            rename_to_legacy(fixture_unlocked(base, name.split("_legacy")[0]), tmp, layernorm)
        else:
            _run_generator(tmp, *LAYOUTS[name])
        (tmp / "DONE").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def fixture_unlocked(base, name):
    out = base / name
    if not (out / "DONE").exists():
        tmp = base / (name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _run_generator(tmp, *LAYOUTS[name])
        (tmp / "DONE").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def _run_generator(out, tp, pp, bf16):
    out.mkdir(parents=True)
    n = tp * pp
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-port",
           str(29500 + random.randint(1, 2000)), __file__, "--out", str(out), "--tp", str(tp), "--pp", str(pp)]
    if bf16:
        cmd.append("--bf16")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"megatron-core fixture generation failed ({' '.join(cmd)}):\n{p.stderr[-6000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--load", help="load this run dir into megatron-core instead (see load_and_forward)")
    a = ap.parse_args()
    if a.load:
        return load_and_forward(a.load, a.out, a.tp, a.pp)
    generate(pathlib.Path(a.out), a.tp, a.pp, a.bf16)


if __name__ == "__main__":
    main()
