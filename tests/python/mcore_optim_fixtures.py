"""Megatron-LM legacy per-rank checkpoints WITH optimizer state, written by megatron-core 0.16.1 on CPU.

The model is mcore_fixtures.py's (a small LLaMA-like GPTModel, local spec, built by megatron-core
under torchrun/gloo with the same CPU shims). The optimizer is built as megatron-core's
get_megatron_optimizer builds it with use_distributed_optimizer=False and neither
TransformerEngine nor Apex installed (megatron/core/optimizer/__init__.py,
_get_megatron_optimizer_based_on_param_groups):

  - param groups: megatron.core.optimizer._get_param_groups([model], OptimizerConfig(...), None)
    itself (the real function: weight-decay group first, then the wd_mult=0 group of 1-dim and
    bias parameters, each in named_parameters order, with its max_lr / min_lr / wd_mult /
    lr_mult / is_expert_parallel / default_config fields);
  - torch.optim.AdamW over those groups (USING_PYTORCH_OPTIMIZER and decoupled_weight_decay=True);
  - bf16: the groups' bf16 params replaced by fp32 master copies as Float16OptimizerWithFloat16Params
    .__init__ does (fp32 params, here the norms, stay in the group as they are), and the model
    params set from the masters after each step.

The wrappers themselves (FP32Optimizer, Float16OptimizerWithFloat16Params, ChainedOptimizer)
cannot be constructed on CPU (FP32Optimizer.__init__ makes torch.tensor([1.0], device='cuda'),
both expect DDP's param.main_grad), so their state_dict() is reproduced exactly
(megatron/core/optimizer/optimizer.py): ChainedOptimizer of one optimizer -> that optimizer's
state_dict(); FP32Optimizer -> the AdamW state_dict; Float16OptimizerWithFloat16Params ->
{'optimizer': AdamW state_dict, 'fp32_from_fp16_params': [[fp32 master per bf16 param] per group]}
('grad_scaler' only when a scaler exists: fp16, not bf16). save_checkpoint (Megatron-LM
megatron/training/checkpointing.py, generate_state_dict, ckpt_format 'torch') stores it as
state_dict['optimizer'] = optimizer.state_dict().

Beside each rank file: param_groups.json, the mcore names of each group's parameters in order as
megatron-core's _get_param_groups returned them (the reference for which id is which parameter).

Two AdamW steps with per-parameter seeded gradients (equal over TP ranks for the replicated
norms, as an all-reduced gradient is) make the moments non-trivial.

CLI: torchrun --nproc-per-node N mcore_optim_fixtures.py --out DIR --tp T --pp P [--bf16]
     torchrun --nproc-per-node N mcore_optim_fixtures.py --job DIR:TP:PP:BF16 ... (layouts of one world size)
"""
import argparse
import fcntl
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import zlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import mcore_fixtures as mf  # noqa: E402

STEPS = 2
LR = 1e-3
WEIGHT_DECAY = 0.1

LAYOUTS = {  # name -> (tp, pp, bf16)
    "optim_tp2": (2, 1, False),
    "optim_pp2_bf16": (1, 2, True),
}


def _grad(name, p, tp_rank, pp_rank):
    import torch
    tp_split = getattr(p, "tensor_model_parallel", False)
    seed = zlib.crc32(name.encode()) + 1000 * pp_rank + (100 * tp_rank if tp_split else 0)
    return 0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def optimizer_state(model, bf16, tp_rank, pp_rank):
    """The optimizer.state_dict() megatron-core's wrappers return, after STEPS AdamW steps."""
    import torch
    from megatron.core.optimizer import OptimizerConfig, _get_param_groups
    config = OptimizerConfig(optimizer="adam", lr=LR, min_lr=0.0, weight_decay=WEIGHT_DECAY, adam_beta1=0.9,
                             adam_beta2=0.95, adam_eps=1e-8, bf16=bf16, use_distributed_optimizer=False)
    groups = _get_param_groups([model], config, None)
    names = {id(p): n for n, p in model.named_parameters()}
    model_params = [list(g["params"]) for g in groups]
    fp32_from_fp16 = []
    if bf16:  # Float16OptimizerWithFloat16Params.__init__: bf16 params -> fp32 masters in the group
        for g in groups:  # (fp32 params, the norms here, stay themselves and have no master listed)
            g["params"] = [p.detach().clone().float() if p.dtype != torch.float32 else p for p in g["params"]]
            fp32_from_fp16.append([m for m, p in zip(g["params"], model_params[len(fp32_from_fp16)]) if m is not p])
    adam = torch.optim.AdamW(groups, lr=LR, weight_decay=WEIGHT_DECAY, betas=(0.9, 0.95), eps=1e-8)
    for _ in range(STEPS):
        for g, mp in zip(groups, model_params):
            for p, m in zip(g["params"], mp):
                p.grad = _grad(names[id(m)], m, tp_rank, pp_rank)
        adam.step()
        with torch.no_grad():
            for g, mp in zip(groups, model_params):
                for p, m in zip(g["params"], mp):
                    if p is not m:
                        m.copy_(p)
    group_names = [[names[id(m)] for m in mp] for mp in model_params]
    if not bf16:
        return adam.state_dict(), group_names
    return ({"optimizer": adam.state_dict(), "fp32_from_fp16_params": [[m.detach() for m in g] for g in fp32_from_fp16]},
            group_names)


def generate_all(jobs):
    """Inside torchrun: generate() of each (out, tp, pp, bf16) of `jobs` (all of one world size tp * pp)
    in this one process group: importing torch and megatron-core is most of a fixture's cost."""
    import torch.distributed as dist
    dist.init_process_group("gloo")
    mf._cpu_shims()
    for out, tp, pp, bf16 in jobs:
        generate(out, tp, pp, bf16)
    dist.destroy_process_group()


def generate(out, tp, pp, bf16):
    """Inside torchrun (process group initialised): each rank's model_optim_rng.pt with its optimizer
    state. mf._build seeds torch anew for each layout, so a layout's files do not depend on the
    layouts generated before it in the same process."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state
    model = mf._build(tp, pp, bf16)
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    opt, group_names = optimizer_state(model, bf16, tp_rank, pp_rank)
    args = mf.megatron_args(tp, pp, bf16)
    args.weight_decay, args.adam_beta1, args.adam_beta2, args.adam_eps = WEIGHT_DECAY, 0.9, 0.95, 1e-8
    ckpt = {
        "args": args, "checkpoint_version": 3.0, "iteration": mf.ITERATION,
        "model": model.state_dict_for_save_checkpoint(), "optimizer": opt,
        "opt_param_scheduler": {"max_lr": LR, "lr_warmup_steps": 0, "num_steps": mf.ITERATION * mf.BATCH,
                                "lr_decay_style": "constant", "lr_decay_steps": 100, "min_lr": 0.0},
        "rng_state": [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                       "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": None, "rng_tracker_states": {}}],
        "num_floating_point_operations_so_far": 0,
    }
    f = mf._rank_file(out, tp_rank, pp_rank, pp)
    f.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, f)
    # megatron-core's own answer to "which parameter is which id": the names of each group's
    # parameters in order (torch numbers them 0.. across the groups).
    (f.parent / "param_groups.json").write_text(json.dumps(group_names))
    dist.barrier()
    if dist.get_rank() == 0:
        (out / "latest_checkpointed_iteration.txt").write_text(str(mf.ITERATION))
    dist.barrier()


def fixture(name, binary_dir=None):
    """The fixture directory `name` (a LAYOUTS key), generated under $CKPT_BINARY_DIR/fixtures/mcore_optim
    with a file lock, together with every other missing layout of its world size (one torchrun)."""
    base = pathlib.Path(binary_dir or os.environ.get("CKPT_BINARY_DIR", "build")) / "fixtures" / "mcore_optim"
    base.mkdir(parents=True, exist_ok=True)
    out = base / name
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "DONE").exists():
            return out
        nproc = LAYOUTS[name][0] * LAYOUTS[name][1]
        names = [n for n, (tp, pp, _) in LAYOUTS.items() if tp * pp == nproc and not (base / n / "DONE").exists()]
        specs = []
        for n in names:
            tmp = base / (n + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            tp, pp, bf16 = LAYOUTS[n]
            specs.append(f"{tmp}:{tp}:{pp}:{int(bf16)}")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
               str(29500 + random.randint(1, 2000)), __file__, *[a for sp in specs for a in ("--job", sp)]]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"optimizer fixture generation failed ({' '.join(cmd)}):\n{p.stderr[-6000:]}")
        for n in names:
            tmp = base / (n + ".tmp")
            (tmp / "DONE").write_text("")
            shutil.rmtree(base / n, ignore_errors=True)
            tmp.rename(base / n)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--job", action="append", default=[], help="OUT:TP:PP:BF16 (0/1), repeated: several fixtures")
    a = ap.parse_args()
    jobs = [(pathlib.Path(a.out), a.tp, a.pp, a.bf16)] if a.out else []
    for spec in a.job:
        d, tp, pp, bf16 = spec.rsplit(":", 3)
        jobs.append((pathlib.Path(d), int(tp), int(pp), bf16 == "1"))
    if not jobs:
        ap.error("--out or --job is required")
    generate_all(jobs)


if __name__ == "__main__":
    main()
