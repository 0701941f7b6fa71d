"""megatron-core 0.19.2's side of benchmarks/mcore_dist_optim_bench.py (runs in /work/venv-mcore019, Python 3.12;
nothing here runs in CI). Two commands, each started under `torchrun --nproc-per-node TP` (gloo, CPU, the
shims of fixtures/megatron_core_019/cpu_shims.py):

  make DIR       builds the TinyLlama-shaped GPTModel (hidden 2048, FFN 5632, 32 heads / 4 query groups, SwiGLU,
                 RMSNorm, rotary, untied, vocab 32003 padded by Megatron to 32256, fp32 parameters (--bf16: bf16), --layers
                 layers; get_gpt_layer_local_spec) at tp = TP, wraps it in megatron-core's DDP (grad_reduce_in_fp32,
                 Megatron-LM's defaults: no overlap_grad_reduce, so one bucket) and its DistributedOptimizer
                 (Adam; with --bf16 fp32 masters), takes ONE step on seeded gradients and saves model + optimizer as
                 Megatron-LM's save_checkpoint does with --ckpt-format torch_dist (dp_reshardable, the default):
                 DIR/iter_0000001, latest_checkpointed_iteration.txt.
  load-save SRC DST --sharding S
                 megatron-core's own load + save: builds the same model, DDP and DistributedOptimizer (no
                 initialisation: the load overwrites everything), `dist_checkpointing.load` of the model's and the
                 optimizer's sharded state dict (is_loading=True, dp_reshardable), model.load_state_dict,
                 optimizer.load_state_dict, then `dist_checkpointing.save` of model + optimizer with sharding type
                 S (fully_reshardable: the form megatron-core re-slices to another tp / pp on load) to DST.
                 Rank 0 prints one JSON line of its phases (import, build, load, save seconds).

    CUDA_VISIBLE_DEVICES= /work/venv-mcore019/bin/python benchmarks/mcore_dist_optim_worker.py make DIR --tp 2 --layers 2
"""
import argparse
import json
import os
import pathlib
import random
import subprocess
import sys
import time

T0 = time.perf_counter()
ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "fixtures" / "megatron_core_019"))

HIDDEN, FFN, HEADS, GROUPS, VOCAB, SEQ = 2048, 5632, 32, 4, 32003, 2048
ITERATION = 1
LR, WD = 3e-4, 0.1


def padded_vocab(tp):
    m = 128 * tp
    return (VOCAB + m - 1) // m * m


def dtype(a):
    import torch
    return torch.bfloat16 if a.bf16 else torch.float32


def megatron_args(a, sharding):
    import torch
    return argparse.Namespace(
        tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        num_layers=a.layers, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        group_query_attention=True, kv_channels=HIDDEN // HEADS, vocab_size=VOCAB, padded_vocab_size=padded_vocab(a.tp),
        make_vocab_size_divisible_by=128, swiglu=True, untie_embeddings_and_output_weights=True, add_bias_linear=False,
        add_qkv_bias=False, rotary_base=10000, rotary_percent=1.0, norm_epsilon=1e-5, normalization="RMSNorm",
        position_embedding_type="rope", max_position_embeddings=SEQ, seq_length=SEQ, params_dtype=dtype(a),
        fp16=False, bf16=a.bf16, transformer_impl="local", ckpt_format="torch_dist", use_distributed_optimizer=True,
        ddp_bucket_size=None, overlap_grad_reduce=False, overlap_param_gather=False, grad_reduce_in_fp32=True,
        dist_ckpt_optim_fully_reshardable=sharding == "fully_reshardable", optimizer="adam", adam_beta1=0.9,
        adam_beta2=0.95, adam_eps=1e-8, weight_decay=WD, lr=LR, min_lr=LR, iteration=ITERATION, world_size=a.tp,
        data_parallel_size=1, micro_batch_size=1, global_batch_size=1, consumed_train_samples=ITERATION, seed=1234)


def build(a, init):
    """(DDP-wrapped model, DistributedOptimizer) of this rank, as Megatron-LM's get_model + get_megatron_optimizer."""
    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import DistributedDataParallel as DDP, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig
    ps.initialize_model_parallel(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=1)
    torch.manual_seed(1234 + ps.get_tensor_model_parallel_rank())
    cfg = TransformerConfig(
        num_layers=a.layers, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS, ffn_hidden_size=FFN,
        kv_channels=HIDDEN // HEADS, normalization="RMSNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=False, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, perform_initialization=init, init_method_std=0.02, tensor_model_parallel_size=a.tp,
        pipeline_model_parallel_size=1, pipeline_dtype=dtype(a), params_dtype=dtype(a), bf16=a.bf16,
        apply_rope_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False)
    model = GPTModel(config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
                     vocab_size=padded_vocab(a.tp), max_sequence_length=SEQ, parallel_output=True,
                     share_embeddings_and_output_weights=False, position_embedding_type="rope", rotary_base=10000)
    ddp = DDP(config=cfg, ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True),
              module=model)
    ocfg = OptimizerConfig(optimizer="adam", lr=LR, min_lr=LR, weight_decay=WD, adam_beta1=0.9, adam_beta2=0.95,
                           adam_eps=1e-8, use_distributed_optimizer=True, bf16=a.bf16, fp16=False, params_dtype=dtype(a),
                           clip_grad=0.0)
    return ddp, get_megatron_optimizer(ocfg, [ddp])


def content_metadata(sharding):
    return {"distrib_optim_sharding_type": sharding, "singleton_local_shards": False, "chained_optim_avoid_prefix": True}


def save(ddp, opt, a, out, sharding):
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    it_dir = pathlib.Path(out) / f"iter_{ITERATION:07d}"
    if dist.get_rank() == 0:
        it_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    model_sd = ddp.module.sharded_state_dict()
    meta = content_metadata(sharding)
    state = {"args": megatron_args(a, sharding), "checkpoint_version": 3.0, "iteration": ITERATION,
             "model": model_sd, "optimizer": opt.sharded_state_dict(model_sd, is_loading=False, metadata=meta),
             "opt_param_scheduler": {"max_lr": LR, "min_lr": LR, "num_steps": ITERATION, "lr_decay_style": "constant"}}
    dist_checkpointing.save(state, str(it_dir), content_metadata=meta)
    dist.barrier()
    if dist.get_rank() == 0:
        (pathlib.Path(out) / "latest_checkpointed_iteration.txt").write_text(str(ITERATION))


def make(a):
    import torch
    import zlib
    ddp, opt = build(a, init=True)
    ddp.zero_grad_buffer()
    opt.zero_grad()
    for n, p in ddp.module.named_parameters():
        g = torch.Generator().manual_seed(zlib.crc32(n.encode()))
        p.main_grad.copy_(0.01 * torch.randn(p.shape, generator=g))
    ok, _, _ = opt.step()
    assert ok
    save(ddp, opt, a, a.dir, "dp_reshardable")


def load_save(a):
    import torch
    from megatron.core import dist_checkpointing
    import check_resume as cr  # the CPU shims for loading on torch AdamW (fixtures/megatron_core_019/README.md)
    phases = {"import": time.perf_counter() - T0}
    t = time.perf_counter()
    ddp, opt = build(a, init=False)
    cr._allocate_adam_state(opt)
    phases["build"] = time.perf_counter() - t
    t = time.perf_counter()
    it = int((pathlib.Path(a.dir) / "latest_checkpointed_iteration.txt").read_text())
    model_sd = ddp.module.sharded_state_dict()
    sd = {"model": model_sd,
          "optimizer": opt.sharded_state_dict(model_sd, is_loading=True, metadata=content_metadata("dp_reshardable"))}
    state = dist_checkpointing.load(sd, str(pathlib.Path(a.dir) / f"iter_{it:07d}"))
    with torch.no_grad():
        ddp.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    del state, sd, model_sd
    cr._step_from_param_groups(opt)
    phases["load"] = time.perf_counter() - t
    t = time.perf_counter()
    save(ddp, opt, a, a.out, a.sharding)
    phases["save"] = time.perf_counter() - t
    return phases


def worker(a):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo")
    from cpu_shims import install
    install()
    phases = make(a) if a.cmd == "make" else load_save(a)
    dist.barrier()
    if dist.get_rank() == 0 and phases:
        print(json.dumps({"phases": phases}), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=["make", "load-save"])
    ap.add_argument("dir")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sharding", default="fully_reshardable")
    ap.add_argument("--bf16", action="store_true", help="bf16 parameters, WITHOUT Megatron-LM's Float16Module: the local "
                    "spec's RMSNorm weights stay fp32, a second grad buffer per model chunk (ckpt reads one: "
                    "UnsupportedDistOptim); Megatron-LM's get_model casts them to bf16 (one buffer)")
    a = ap.parse_args()
    if os.environ.get("MCORE_BENCH_WORKER") == "1":
        return worker(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(a.tp), "--master-port",
           str(29500 + random.randint(1, 2000)), __file__, *sys.argv[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", MCORE_BENCH_WORKER="1", PYTHONWARNINGS="ignore")
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
