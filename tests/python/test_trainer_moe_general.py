"""Expert parallelism of the trainer on general layouts (issue 38; docs/MOE.md "General layouts: ep
and etp per stage"), under mpirun: tests/tools/parallel_check runs 10 optimizer steps of
parallel_step on a layout file whose stages give their own tp, ep and etp, and on every rank the
one-process trainer (the independent oracle: the whole model, the same micro-batches one after the
other). Per case: the per-step losses within 1e-5 relative of the one-process ones (float64 twin:
1e-10), the step-0 gradients of every region a rank holds (after the replica sums) within 1e-5 of
the tensor's largest gradient, the global gradient norm, and every rank's held regions equal to the
planner's rank_view (the store's expert boxes of the stage views).
Layouts (a tiny Mixtral, 4 layers, all MoE; a tiny Qwen3-MoE, a dense layer between MoE ones; a tiny
Qwen2-MoE, shared expert):
- non-uniform pipelines with micro-batches 2 and 1: A [2 layers tp2 ep2 etp1 | 2 layers tp1],
  B [1 layer tp1 | 3 layers tp2 ep2 etp1]: each expert-parallel stage spreads all experts over its
  own tp ranks, the tp1 stages hold them whole (6 ranks);
- uniform pipelines with ZeRO-1, micro-batches 2 and 1: [2 tp2 ep2 | 2 tp1 ep2] x 2: a stage's
  experts over its ranks of both pipelines (ep2 x etp2 on stage 0, ep2 x etp1 on stage 1), the
  expert optimizer buffers over the expert data-parallel groups (6 ranks); the same with stage 1
  without ep (its experts whole, in the dense ZeRO-1 buffer), and with stage 0 ep2 x etp1 (edp 2).
A mutation such as an expert group taken over the wrong ranks (rows sent to a rank not holding
the expert) moves the losses by far more than the tolerance.
"""
import json
import subprocess

import pytest

from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd
from parallel_check_run import check_parallel_step, run_ids, with_f64_twins

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)


def _config(tmp_path, family):
    base = dict(rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64, hidden_act="silu",
                torch_dtype="float32", vocab_size=300, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, tie_word_embeddings=False, router_aux_loss_coef=0.05, num_hidden_layers=4)
    if family == "mixtral":
        c = dict(base, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=24,
                 num_local_experts=8, num_experts_per_tok=2)
    elif family == "qwen2_moe":  # shared expert and its sigmoid gate, q/k/v biases
        c = dict(base, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", intermediate_size=48,
                 moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                 decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=False)
    else:
        c = dict(base, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", intermediate_size=48,
                 moe_intermediate_size=24, mlp_only_layers=[1], decoder_sparse_step=1, num_experts=4,
                 num_experts_per_tok=2, norm_topk_prob=True)
    p = tmp_path / f"config_{family}.json"
    p.write_text(json.dumps(c))
    return p


def _stage(layers, tp, ep=1, etp=None):
    s = {"layers": layers, "tp": tp}
    if ep > 1:
        s["ep"] = ep
    if etp is not None:
        s["etp"] = etp
    return s


def _general(pipelines, zero=0):
    return {"pipelines": [{"micro_batch": mb, "stages": stages} for mb, stages in pipelines], "zero": zero,
            "num_layers": 4, "vocab_divisor": 128, "profile": "reference", "rank_order": "tp-dp-pp"}


NON_UNIFORM = _general([(2, [_stage(2, 2, 2, 1), _stage(2, 1)]), (1, [_stage(1, 1), _stage(3, 2, 2, 1)])])
UNIFORM_ZERO1 = _general([(2, [_stage(2, 2, 2), _stage(2, 1, 2)]), (1, [_stage(2, 2, 2), _stage(2, 1, 2)])], zero=1)
# a stage without ep under ZeRO-1 (its experts in the dense buffer); stage 0 ep2 x etp1 over 4 ranks (edp 2)
UNIFORM_STAGE1_DENSE = _general([(2, [_stage(2, 2, 2), _stage(2, 1)]), (1, [_stage(2, 2, 2), _stage(2, 1)])], zero=1)
UNIFORM_EDP2 = _general([(2, [_stage(2, 2, 2, 1), _stage(2, 1, 2)]), (1, [_stage(2, 2, 2, 1), _stage(2, 1, 2)])], zero=1)
# stage 1 of pipeline A at tp 2 without ep: its experts' width over TP (etp = tp), the same expert groups
NON_UNIFORM_TP_STAGE = _general([(2, [_stage(2, 2, 2, 1), _stage(2, 2)]), (1, [_stage(2, 1), _stage(2, 1)])])
# name, ranks, family, general layout
CASES = [
    ("nonuniform_a_tp2ep2_tp1_b_tp1_tp2ep2", 6, "mixtral", NON_UNIFORM),
    ("uniform_tp2ep2_tp1ep2_x2_zero1", 6, "mixtral", UNIFORM_ZERO1),
    ("uniform_tp2ep2_tp1_x2_zero1", 6, "mixtral", UNIFORM_STAGE1_DENSE),
    ("uniform_tp2ep2etp1_edp2_tp1ep2_x2_zero1", 6, "mixtral", UNIFORM_EDP2),
    ("nonuniform_a_tp2ep2_tp2_b_tp1_tp1", 6, "mixtral", NON_UNIFORM_TP_STAGE),
    ("qwen3_nonuniform", 6, "qwen3_moe", NON_UNIFORM),
    ("qwen3_uniform_zero1", 6, "qwen3_moe", UNIFORM_ZERO1),
    ("qwen2_nonuniform", 6, "qwen2_moe", NON_UNIFORM),
    ("qwen2_uniform_edp2_zero1", 6, "qwen2_moe", UNIFORM_EDP2),
]
F64 = {"nonuniform_a_tp2ep2_tp1_b_tp1_tp2ep2", "uniform_tp2ep2_tp1ep2_x2_zero1"}
RUNS = with_f64_twins(CASES, F64)


@pytest.mark.parametrize("case,f64", RUNS, ids=run_ids(RUNS))
def test_general_expert_parallel_layout_gives_the_one_process_step(case, f64, tmp_path):
    name, n, family, layout = case
    lay = tmp_path / f"layout_{name}.json"
    lay.write_text(json.dumps(layout))
    check_parallel_step(name, n, _config(tmp_path, family), ["--layout", lay], f64, min_drop=0.3, norm_tol32=5e-5)


# `ckpt train --cluster` on a general layout with per-stage ep: trainer/memory_estimate.h's estimate of
# every rank (its stage view's expert boxes and routed rows) within test_trainer_memory.py's 20% of the
# rank's measured peak RSS (getrusage: the kernel's accounting, not the code's arithmetic), on a Mixtral
# whose experts dominate the process constant (8 experts of 512 x 512, hidden 512, 4 layers, seq 64).
MEM_CONFIG = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 2048, "hidden_size": 512,
              "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
              "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128,
              "tie_word_embeddings": False, "hidden_act": "silu", "num_local_experts": 8, "num_experts_per_tok": 2}


def test_memory_estimate_of_per_stage_ep_within_20_percent_of_peak_rss(tmp_path):
    from trainer_runs import ckpt_path
    lay = {"pipelines": [{"micro_batch": 2, "stages": [_stage(2, 2, 2, 1), _stage(2, 1)]},
                         {"micro_batch": 1, "stages": [_stage(4, 1)]}], "zero": 0}
    files = {"config": MEM_CONFIG, "layout": lay,
             "cluster": {"device_types": [{"name": "A", "vendor": "test", "memory": "16GiB", "peak_flops": 1e12,
                                           "link_bandwidth": "10GB/s", "dtype": "fp32"}],
                         "ranks": [{"type": "A", "count": 4}]}}
    for k, v in files.items():
        (tmp_path / f"{k}.json").write_text(json.dumps(v))
    out = tmp_path / "run"
    cmd = mpirun_cmd(4, ckpt_path(), "train", "--config", tmp_path / "config.json", "--layout", tmp_path / "layout.json",
                     "--cluster", tmp_path / "cluster.json", "--out", out, "--seq-len", 64, "--threads", 1, "--seed", 3,
                     "--warmup", 1, "--sync-save", "--grad-accum", 2, "--steps", 1)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "memory check: every rank fits" in p.stdout, (p.stdout, p.stderr[-3000:])
    rows = json.loads((out / "memory.json").read_text())["ranks"]
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    table = [f"rank {r['rank']} pipeline {r['pipeline']} stage {r['stage']}: estimate {r['total'] / 2**20:.1f} MiB, "
             f"peak RSS {r['peak_rss'] / 2**20:.1f} MiB, ratio {r['total'] / r['peak_rss']:.3f}" for r in rows]
    print("\n".join(table))
    # The ep2 stage's ranks hold half the experts of its two layers: less than the tp1 stage of the same layers.
    assert rows[0]["weights"] < rows[3]["weights"], table
    for r in rows:
        assert r["process"] < 0.3 * r["total"], r
        assert abs(r["total"] / r["peak_rss"] - 1) <= 0.20, "\n".join(table)
