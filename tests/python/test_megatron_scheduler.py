"""Megatron-LM's `opt_param_scheduler` (OptimizerParamScheduler.state_dict()) carried through ckpt: imported
from a legacy rank file or a torch_dist common state into the store's metadata (megatron.opt_param_scheduler)
and written back by export-megatron beside the optimizer state, as Megatron-LM's save_checkpoint saves it and
its load_checkpoint reads it (a training-loop resume loads the scheduler whenever it loads the optimizer).

References: megatron-core 0.19.2's fixtures (their scheduler dicts, written by make_fixtures.py beside the
optimizer), and megatron-core 0.16.1's own OptimizerParamScheduler (this venv): a real scheduler's
state_dict() put into a copy of the legacy fixture comes back equal, and a fresh scheduler's load_state_dict
of the exported dict gives the original's learning rate and weight decay.
"""
import pathlib
import shutil

import pytest
import torch

from test_megatron_019 import FIX
from test_megatron_019_distopt_export import _bytes_item

DIST_OPT = ["--tp", 2, "--dist-opt", "--dp", 2, "--ddp-bucket-size", 2048, "--local-norms"]


def _rank(d, r=0):
    return d / "iter_0000010" / f"mp_rank_{r:02d}" / "model_optim_rng.pt"


def test_torch_dist_scheduler_written_back(run_ckpt, tmp_path):
    run_ckpt("reshard", FIX / "distopt_dp_reshardable", tmp_path / "s", "--tp", 1, "--pp", 1, "--dp", 1)
    run_ckpt("export-megatron", tmp_path / "s", tmp_path / "td", "--format", "torch_dist", *DIST_OPT)
    (mine,) = _bytes_item(tmp_path / "td", "common_state/shard_0_1")
    (theirs,) = _bytes_item(FIX / "distopt_dp_reshardable" / "iter_0000010", "common_state/shard_0_1")
    assert mine["opt_param_scheduler"] == theirs["opt_param_scheduler"] and theirs["opt_param_scheduler"]
    # none without optimizer state (Megatron-LM's --no-save-optim saves no scheduler either)
    run_ckpt("export-megatron", FIX / "tp2", tmp_path / "plain", "--format", "torch_dist", "--tp", 2)
    (plain,) = _bytes_item(tmp_path / "plain", "common_state/shard_0_1")
    assert "opt_param_scheduler" not in plain


def _scheduler(lr_steps=8):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [p], "max_lr": 1e-3, "min_lr": 1e-4}], lr=0.0)
    s = OptimizerParamScheduler(opt, init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=4, lr_decay_steps=100,
                                lr_decay_style="cosine", start_wd=0.1, end_wd=0.2, wd_incr_steps=100,
                                wd_incr_style="linear")
    if lr_steps:
        s.step(increment=lr_steps)
    return s, opt


@pytest.mark.parametrize("fmt", ["torch", "torch_dist"])
def test_real_scheduler_round_trips_and_loads_in_megatron_core(fmt, run_ckpt, tmp_path):
    pytest.importorskip("megatron.core.optimizer_param_scheduler")
    sched, opt = _scheduler(8 * 7)  # 7 iterations of global batch 8 (num_steps counts samples)
    src = tmp_path / "legacy"
    shutil.copytree(FIX / "distopt_legacy_torch", src)
    for r in (0, 1):
        st = torch.load(_rank(src, r), weights_only=False)
        st["opt_param_scheduler"] = sched.state_dict()
        torch.save(st, _rank(src, r))
    run_ckpt("reshard", src, tmp_path / "s", "--tp", 1, "--pp", 1, "--dp", 1)
    out = tmp_path / "out"
    run_ckpt("export-megatron", tmp_path / "s", out, "--format", fmt, *DIST_OPT, *(["--iteration", 10] if fmt == "torch" else []))
    if fmt == "torch":
        got = torch.load(_rank(out), weights_only=False)["opt_param_scheduler"]
    else:
        (common,) = _bytes_item(out, "common_state/shard_0_1")
        got = common["opt_param_scheduler"]
    assert got == sched.state_dict()
    fresh, fresh_opt = _scheduler(0)
    fresh.load_state_dict(got)  # Megatron-LM's load_checkpoint: opt_param_scheduler.load_state_dict(...)
    assert fresh.num_steps == 56 and fresh.get_lr(fresh_opt.param_groups[0]) == sched.get_lr(opt.param_groups[0])
    assert fresh_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"] > 0
    assert fresh_opt.param_groups[0]["weight_decay"] == opt.param_groups[0]["weight_decay"]
