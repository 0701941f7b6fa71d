"""Real Megatron-Core `torch_dist` checkpoints, written by megatron-core 0.16.1 on CPU.

A small LLaMA-like GPTModel (RMSNorm, SwiGLU, GQA 8 heads / 2 query groups, rotary, untied
embeddings, no bias, vocab 300 padded as Megatron pads it, fp32) is built with
get_gpt_layer_local_spec() and use_cpu_initialization=True in each layout (tp=1, tp=2, pp=2 with
the uneven split 2 + 4 layers through TransformerConfig.num_layers_in_first_pipeline_stage) and
saved as Megatron-LM's megatron/training/checkpointing.py saves the torch_dist format:

    <dir>/latest_checkpointed_iteration.txt   "10"
    <dir>/iter_0000010/                       megatron.core.dist_checkpointing.save(state, ...) of
        {'args': argparse.Namespace(...), 'checkpoint_version': 3.0, 'iteration': 10,
         'model': model.sharded_state_dict(),
         'optimizer': FP32Optimizer.sharded_state_dict(model_sd),   (megatron-core's own code)
         'opt_param_scheduler': {...}, 'rng_state': ShardedObject, ...}

megatron-core writes the sharded tensors as a DCP directory (__R_K.distcp, .metadata), the rest
(args, iteration, optimizer common_step, param_groups...) to common.pt, and metadata.json.

Optimizer: torch.optim.Adam steps (3, on seeded gradients) over the model parameters, then
megatron-core's FP32Optimizer.sharded_state_dict (the unbound method on an instance holding only
that Adam: FP32Optimizer.__init__ itself makes a CUDA tensor, torch.tensor([1.0], device='cuda'),
so it cannot be constructed on CPU). It yields optimizer.state.exp_avg.<key> and
optimizer.state.exp_avg_sq.<key> sharded like the parameters, and the step as common_step.
(fp32_param keys appear only with mixed-precision optimizers, which need CUDA grads buffers.)

Beside it: tokens.npy, logits.npy (megatron-core's own forward on CPU, [batch, seq, padded_vocab],
after the optimizer steps), and for the export test the ShardedTensor keys/shapes of each rank.

CLI (what the tests run once per fixture, cached under $CKPT_BINARY_DIR/fixtures/mcore_dist/<name>
with a file lock):  torchrun --nproc-per-node N mcore_dist_fixtures.py --out DIR --tp T --pp P
Load check (used on ckpt's export): ... --load DIR:OUTDIR:TP:PP (repeatable):
dist_checkpointing.load into a fresh GPTModel of that layout, every rank's model.state_dict()
written to OUTDIR/<mp_rank_..>.npz.
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
import zlib

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

LAYOUTS = {"tp1": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}
FIXTURE_VERSION = 2  # part of the cache directory name: bump when the generator changes


def padded_vocab(tp):
    """Megatron-LM's _vocab_size_with_padding: a multiple of make_vocab_size_divisible_by * tp."""
    m = DIVISOR * tp
    return ((VOCAB + m - 1) // m) * m


def megatron_args(tp, pp):
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
        max_position_embeddings=SEQ * 4, seq_length=SEQ, params_dtype=torch.float32,
        fp16=False, bf16=False, use_distributed_optimizer=False, transformer_impl="local",
        ckpt_format="torch_dist", iteration=ITERATION, consumed_train_samples=ITERATION * BATCH,
        lr=1e-3, world_size=tp * pp, data_parallel_size=1, micro_batch_size=BATCH,
        global_batch_size=BATCH, seed=1234)


def _cpu_shims():
    """megatron-core on CPU: no CUDA RNG tracker forks, no CUDA device queries or syncs."""
    import torch
    from megatron.core import tensor_parallel
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.current_device = lambda: "cpu"
    tracker = tensor_parallel.random.get_cuda_rng_tracker()
    tracker.fork = lambda *a, **k: contextlib.nullcontext()


def _build(tp, pp, seed=1234):
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    torch.manual_seed(seed + parallel_state.get_tensor_model_parallel_rank())
    cfg = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=FFN, kv_channels=HIDDEN // HEADS, normalization="RMSNorm", layernorm_epsilon=1e-5,
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True, init_method_std=0.05,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
        num_layers_in_first_pipeline_stage=FIRST_STAGE_LAYERS if pp > 1 else None,
        params_dtype=torch.float32, apply_rope_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=padded_vocab(tp), max_sequence_length=SEQ * 4,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(), parallel_output=False,
                     share_embeddings_and_output_weights=False, position_embedding_type="rope",
                     rotary_base=10000)
    # Non-trivial norm weights (initialised to ones) so a swapped norm shows in the logits; seeded
    # by name so that the TP replicas of a norm stay equal (megatron-core saves replica 0 only).
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n:
                g = torch.Generator().manual_seed(zlib.crc32(n.encode()))
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
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
                buf = torch.empty(s, b, HIDDEN, dtype=torch.float32)
                dist.recv(buf, src=parallel_state.get_pipeline_model_parallel_prev_rank())
                model.set_input_tensor(buf)
            out = model(tokens, pos, mask)
            if not last:
                dist.send(out.contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
                return None
            return out
        return model(tokens, pos, mask)


def _adam_steps(model):
    """3 torch.optim.Adam steps on seeded gradients; returns the Adam."""
    import torch
    params = [p for p in model.parameters() if p.requires_grad]
    adam = torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    names = {id(p): n for n, p in model.named_parameters()}
    for step in range(3):
        for p in params:  # seeded by name and step: TP replicas (norms) get equal gradients
            gen = torch.Generator().manual_seed(zlib.crc32(f"{names[id(p)]}/{step}".encode()))
            p.grad = 0.01 * torch.randn(p.shape, generator=gen, dtype=torch.float32)
        adam.step()
    return adam


def _optimizer_sharded(adam, model_sd):
    """megatron-core's FP32Optimizer.sharded_state_dict over `adam` (see the module doc)."""
    from megatron.core.optimizer.optimizer import FP32Optimizer
    opt = FP32Optimizer.__new__(FP32Optimizer)
    opt.optimizer = adam
    return FP32Optimizer.sharded_state_dict(opt, model_sd)


def _init_dist():
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    dist.init_process_group("gloo")
    _cpu_shims()


def generate(out, tp, pp):
    """Runs inside torchrun (or alone for tp=pp=1): dist_checkpointing.save, tokens and logits."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    _init_dist()
    model = _build(tp, pp)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(3))
    adam = _adam_steps(model)
    logits = _forward(model, tokens, pp)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    model_sd = model.sharded_state_dict()
    rng = ShardedObject("rng_state", {"random_rng_state": random.getstate(), "torch_rng_state": torch.get_rng_state()},
                        (pp, tp), (pp_rank, tp_rank), replica_id=0)
    state = {
        "args": megatron_args(tp, pp), "checkpoint_version": 3.0, "iteration": ITERATION,
        "model": model_sd, "optimizer": _optimizer_sharded(adam, model_sd),
        "opt_param_scheduler": {"max_lr": 1e-3, "lr_warmup_steps": 0, "num_steps": ITERATION * BATCH,
                                "lr_decay_style": "constant", "lr_decay_steps": 100, "min_lr": 0.0},
        "rng_state": [rng], "num_floating_point_operations_so_far": 0,
    }
    it_dir = out / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        it_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(state, str(it_dir))
    if logits is not None and tp_rank == 0:
        np.save(out / "logits.npy", logits.float().numpy())
        np.save(out / "tokens.npy", tokens.numpy())
    dist.barrier()
    if dist.get_rank() == 0:
        (out / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))
    dist.destroy_process_group()


def load_and_dump(jobs):
    """For each (ckpt_dir, dump, tp, pp) of `jobs` (one process group, world size tp * pp each):
    dist_checkpointing.load of ckpt_dir into a fresh GPTModel (another seed) of that layout (pp > 1:
    the uneven 2 + 4 split), then model.load_state_dict; every rank's model.state_dict() tensors
    (no _extra_state) to <dump>/<mp_rank_TT[_PPP]>.npz."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state
    _init_dist()
    for ckpt_dir, dump, tp, pp in jobs:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
        model = _build(tp, pp, seed=999)
        loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, str(ckpt_dir))  # as Megatron-LM
        model.load_state_dict(loaded["model"])
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        name = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "")
        arrays = {k: v.detach().float().numpy() for k, v in model.state_dict().items()
                  if isinstance(v, torch.Tensor) and "_extra_state" not in k}
        pathlib.Path(dump).mkdir(parents=True, exist_ok=True)
        np.savez(pathlib.Path(dump) / f"{name}.npz", **arrays)
        dist.barrier()
    dist.destroy_process_group()


def fixture(name, binary_dir=None):
    """The fixture directory `name` (a LAYOUTS key), generated once under
    $CKPT_BINARY_DIR/fixtures/mcore_dist with a file lock."""
    base = pathlib.Path(binary_dir or os.environ.get("CKPT_BINARY_DIR", "build")) / "fixtures" / "mcore_dist"
    base.mkdir(parents=True, exist_ok=True)
    out = base / f"{name}_v{FIXTURE_VERSION}"
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "DONE").exists():
            return out
        tmp = base / (out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tp, pp = LAYOUTS[name]
        run_torchrun(tp * pp, ["--out", str(tmp), "--tp", str(tp), "--pp", str(pp)])
        (tmp / "DONE").write_text("")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def run_torchrun(nproc, args):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
           str(29500 + random.randint(1, 2000)), __file__, *args]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"megatron-core run failed ({' '.join(cmd)}):\n{p.stderr[-6000:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--load", action="append", default=[],
                    help="DIR:DUMP:TP:PP (repeatable; every layout of world size nproc)")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    a = ap.parse_args()
    if a.load:
        jobs = []
        for spec in a.load:
            d, dump, tp, pp = spec.rsplit(":", 3)
            jobs.append((pathlib.Path(d), dump, int(tp), int(pp)))
        load_and_dump(jobs)
    else:
        generate(pathlib.Path(a.out), a.tp, a.pp)


if __name__ == "__main__":
    main()
