"""Layout equivalence of the parallel trainer step (docs/TRAINER.md), under
mpirun: tests/tools/parallel_check runs 10 optimizer steps of parallel_step (1F1B pipeline, TP,
heterogeneous DP, ZeRO-1, tied embeddings) on each rank, and on every rank the one-process trainer
(optimizer_step on the whole model, the independent oracle; the model is tiny). Per case: the
per-step losses within 1e-5 relative of the one-process ones (float64 twin: 1e-10), the step-0
gradients of every region a rank holds (after the DP reduction, before clipping) within 1e-5 of
the tensor's largest gradient (float64: 1e-10; the worst is printed), the global gradient norm
(clipping at 0.5 is active: the tiny model's norms are larger), and every rank's held regions
equal to the planner's rank_view. Weights after 10 steps are compared in float64 only: in float32
Adam amplifies rounding differences of near-zero gradients (m / sqrt(v) ~ sign(g)), so only the
float64 twin can show that the updates are the same.

General layouts get the same check (pipelines of stages, each with its own tp and device
type; reshard/layout/layout.h): worked examples on a 6-layer model, given as layout files:
stages of [1, 2, 3] layers on three device types, three data-parallel replicas with micro-batches
[3, 2, 1], FlagScale-style meshes (tp 2 then tp 1, ZeRO-1), FlashFlex-style pipelines (different
stage splits and per-stage tp), and a tied embedding whose first and last stage have different tp.
"""
import json

import pytest

from mpi_ranks import MPIRUN, SKIP_REASON
from parallel_check_run import check_parallel_step, run_ids, with_f64_twins

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)


def _stage(layers, tp, device):
    return {"layers": layers, "tp": tp, "device": device}


def _general(pipelines, zero=0):
    return {"pipelines": [{"micro_batch": mb, "stages": [_stage(*st) for st in stages]} for mb, stages in pipelines],
            "zero": zero, "num_layers": 6, "vocab_divisor": 128, "profile": "reference", "rank_order": "tp-dp-pp"}


def _layout_args(tmp_path, name, args):
    """args, with a general layout (a dict) written to a file and passed as --layout FILE."""
    if not isinstance(args, dict):
        return args
    p = tmp_path / f"layout_{name}.json"
    p.write_text(json.dumps(args))
    return ["--layout", p]


def _config(tmp_path, kv=2, layers=4, tied=False):
    c = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5, rope_theta=10000.0,
             max_position_embeddings=64, attention_bias=False, mlp_bias=False, hidden_act="silu",
             torch_dtype="float32", vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=layers,
             num_attention_heads=4, num_key_value_heads=kv, head_dim=8, tie_word_embeddings=tied)
    p = tmp_path / f"config_{kv}_{layers}_{int(tied)}.json"
    p.write_text(json.dumps(c))
    return p


# name, ranks, config kwargs, layout args
CASES = [
    ("tp2", 2, {}, ["--tp", 2]),
    ("tp4_kv4", 4, {"kv": 4}, ["--tp", 4]),
    ("pp2_1_3", 2, {}, ["--pp", 2, "--pp-layers", "1,3"]),
    ("pp3_1_2_3", 3, {"layers": 6}, ["--pp", 3, "--pp-layers", "1,2,3"]),
    ("dp3_mb_3_2_1", 3, {}, ["--dp", 3, "--micro-batches", "3,2,1"]),
    ("dp2_zero1", 2, {}, ["--dp", 2, "--zero", 1, "--micro-batches", "2,2"]),
    ("tp2_pp2", 4, {}, ["--tp", 2, "--pp", 2]),
    ("tp2_pp2_dp2_zero1_uneven", 8, {}, ["--tp", 2, "--pp", 2, "--pp-layers", "1,3", "--dp", 2, "--zero", 1,
                                         "--micro-batches", "2,1"]),
    ("tied_pp2", 2, {"tied": True}, ["--pp", 2]),
    ("tied_tp2_pp2_dp2_zero1", 8, {"tied": True}, ["--tp", 2, "--pp", 2, "--dp", 2, "--zero", 1]),
]
# The worked examples of general layouts (6 layers): name, ranks, config kwargs, general layout.
GENERAL = [
    ("hetero_pp_1_2_3", 4, {"layers": 6}, _general([(2, [(1, 1, "A"), (2, 2, "B"), (3, 1, "C")])])),
    ("hetero_dp_mb_3_2_1", 3, {"layers": 6}, _general([(3, [(6, 1, "A")]), (2, [(6, 1, "B")]), (1, [(6, 1, "C")])])),
    ("flagscale_tp2_tp1_zero1", 6, {"layers": 6},
     _general([(2, [(2, 2, "A"), (4, 1, "B")]), (1, [(2, 2, "A"), (4, 1, "B")])], zero=1)),
    ("flashflex_2tp2_4_vs_3_3", 5, {"layers": 6},
     _general([(2, [(2, 2, "A"), (4, 1, "B")]), (1, [(3, 1, "B"), (3, 1, "C")])])),
    ("tied_first_tp1_last_tp2_zero1", 6, {"layers": 6, "tied": True},
     _general([(1, [(3, 1, "A"), (3, 2, "B")]), (2, [(3, 1, "A"), (3, 2, "B")])], zero=1)),
]
CASES += GENERAL
F64 = {"pp3_1_2_3", "dp3_mb_3_2_1", "tp2_pp2_dp2_zero1_uneven", "tied_tp2_pp2_dp2_zero1", "flagscale_tp2_tp1_zero1",
       "flashflex_2tp2_4_vs_3_3"}


# Every case in float32; the float64 twin for the pipeline, heterogeneous DP and 8-rank cases
# (not under the sanitizers: the same code paths, and the sanitized run is the slowest of CI).
RUNS = with_f64_twins(CASES, F64)


@pytest.mark.parametrize("case,f64", RUNS, ids=run_ids(RUNS))
def test_layout_gives_the_one_process_step(case, f64, tmp_path):
    name, n, cfg_kw, args = case
    check_parallel_step(name, n, _config(tmp_path, **cfg_kw), _layout_args(tmp_path, name, args), f64)
