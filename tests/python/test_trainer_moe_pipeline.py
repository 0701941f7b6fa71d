"""MoE models in the parallel trainer with pipeline stages, data parallelism and TP of the dense
parts, ep = 1 (issue 38; docs/MOE.md "Training on several ranks").

Layout equivalence (tests/tools/parallel_check under mpirun, as test_trainer_parallel_equiv.py):
10 optimizer steps of parallel_step against the one-process trainer that every rank also runs on
the SAME micro-batches (the load-balancing loss is one per micro-batch: pipeline p's micro-batch j
is one forward of the oracle). Per case: the losses within 1e-5 relative (float64 twin: 1e-10),
the step-0 gradients of every region a rank holds within 1e-5 of the tensor's largest gradient,
the gradient norm, the held regions equal to the planner's. Cases: a 4-layer Mixtral on stages of
1 + 3 layers; pp2 x dp2 ZeRO-1 with micro-batches 2 and 1 (two pipelines, each its own aux losses);
a Qwen3-MoE on 3 stages whose middle one holds only dense layers (mlp_only_layers: the router
statistics pass through it); TP 2 of the attention of Qwen3-MoE (per-head q/k norms, replicated,
their gradient summed over the ranks' heads) and Qwen2-MoE (q/k/v biases split with their rows)
on configs whose layers are dense; a general layout whose first stage (dense layers) has tp 2 and
whose second (MoE layers) tp 1; two pipelines with different stage splits and micro-batch
sizes. The router statistics crossing the boundaries are what make the pipeline cases pass: with
the aux loss's coefficient at 0.1 the aux term (0.1 x ~2) is a few percent of the loss, far above
the tolerance (without stage 0's totals every pipeline case fails; tests/trainer/pipeline_stage_test.cc
also drops aux_dp on its way back and sees the difference).

`ckpt train` (a 4-layer Mixtral, 12 sequences of 8 tokens per step split into micro-batches of 3
on every layout, so that the aux losses are the same): pp2 (1 + 3 layers) trains like one process
(20 steps, losses within 1e-5); resume across reconfigurations, the oracle being the uninterrupted
run (trainer_runs.py): pp2's step-10 checkpoint resumed on one process, one process's on pp2 x dp2
ZeRO-1, steps 11-20 within 1e-5 and `ckpt diff` of the step-20 checkpoints within the documented
float32 noise; a Qwen3-MoE on a general layout (its dense layers on a tp2 stage, the MoE layers on
tp1) trains like one process and resumes on one. Faults: a rank SIGKILLed while writing its shard of the step-10 MoE checkpoint at
pp2 ends the job, `latest` stays on step 5, and a new launch resumes from it to the uninterrupted
run's losses and checkpoint. tp2 x pp2 without --ep (the experts' width split over TP as the store
places them at ep 1) trains like one process.
"""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON  # noqa: E402
from parallel_check_run import check_parallel_step, run_ids, with_f64_twins  # noqa: E402
from trainer_runs import (MID, STEPS, Gen, Runs, Sym, assert_losses_close, assert_same_checkpoint, ckpt, log,  # noqa: E402
                          step_dir)

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)

BASE = dict(rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64, hidden_act="silu", torch_dtype="float32",
            vocab_size=300, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            tie_word_embeddings=False, num_experts_per_tok=2, router_aux_loss_coef=0.1)
MIXTRAL = dict(BASE, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=40,
               num_hidden_layers=4, num_local_experts=4)


def qwen(family, layers, mlp_only, **kw):
    arch = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM"}[family]
    c = dict(BASE, architectures=[arch], model_type=family, intermediate_size=48, moe_intermediate_size=24,
             num_hidden_layers=layers, num_experts=4, mlp_only_layers=mlp_only, decoder_sparse_step=1,
             norm_topk_prob=family == "qwen3_moe", **kw)
    if family == "qwen2_moe":
        c["shared_expert_intermediate_size"] = 40
    return c


def _general(pipelines, layers, zero=0):
    return {"pipelines": [{"micro_batch": mb, "stages": [{"layers": l, "tp": t} for l, t in stages]}
                          for mb, stages in pipelines], "zero": zero, "num_layers": layers, "vocab_divisor": 128}


# name, ranks, config, layout args (a dict: a general layout file)
CASES = [
    ("mixtral_pp2_1_3", 2, MIXTRAL, ["--pp", 2, "--pp-layers", "1,3"]),
    ("mixtral_pp2_dp2_zero1_mb_2_1", 4, MIXTRAL, ["--pp", 2, "--dp", 2, "--zero", 1, "--micro-batches", "2,1"]),
    ("qwen3_pp3_dense_middle", 3, qwen("qwen3_moe", 4, [1, 2]), ["--pp", 3, "--pp-layers", "1,2,1"]),
    ("qwen3_tp2_dense_layers", 2, qwen("qwen3_moe", 2, [0, 1]), ["--tp", 2]),
    ("qwen2_tp2_dense_layers", 2, qwen("qwen2_moe", 2, [0, 1]), ["--tp", 2]),
    ("qwen3_tp2_dense_stage_then_moe", 3, qwen("qwen3_moe", 4, [0, 1]), _general([(2, [(2, 2), (2, 1)])], 4)),
    # Two pipelines splitting the layers differently (FlashFlex-style), micro-batches 2 and 1.
    ("mixtral_pipelines_1_3_and_2_2", 4, MIXTRAL, _general([(2, [(1, 1), (3, 1)]), (1, [(2, 1), (2, 1)])], 4)),
]
F64 = {"mixtral_pp2_dp2_zero1_mb_2_1", "qwen3_tp2_dense_layers", "qwen2_tp2_dense_layers", "qwen3_tp2_dense_stage_then_moe"}
RUNS = with_f64_twins(CASES, F64)


@pytest.mark.parametrize("case,f64", RUNS, ids=run_ids(RUNS))
def test_moe_layout_gives_the_one_process_step(case, f64, tmp_path):
    name, n, cfg, args = case
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    if isinstance(args, dict):
        (tmp_path / "layout.json").write_text(json.dumps(args))
        args = ["--layout", tmp_path / "layout.json"]
    check_parallel_step(name, n, tmp_path / "config.json", args, f64)


# `ckpt train`: every layout runs 12 sequences per step in micro-batches of 3.
LAYOUTS = {
    "one": Sym(1, ["--micro-batch", 3, "--grad-accum", 4]),
    "pp2": Sym(2, ["--pp", 2, "--pp-layers", "1,3", "--micro-batch", 3, "--grad-accum", 4]),
    "pp2dp2z1": Sym(4, ["--pp", 2, "--dp", 2, "--zero", 1, "--micro-batch", 3, "--grad-accum", 2]),
    "tp2pp2": Sym(4, ["--tp", 2, "--pp", 2, "--pp-layers", "1,3", "--micro-batch", 3, "--grad-accum", 4]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("moe_pipeline_runs"), LAYOUTS, config=dict(MIXTRAL, vocab_size=264))


def test_pp2_trains_like_one_process(runs):
    worst = assert_losses_close(log(runs.full("one")), log(runs.full("pp2")), range(1, STEPS + 1))
    assert all(r["router_load"] >= 1 for r in log(runs.full("pp2")) if "loss" in r)
    d = assert_same_checkpoint(runs.full("one") / step_dir(STEPS), runs.full("pp2") / step_dir(STEPS))
    print(f"pp2 vs one process: worst loss error {worst:.3g}, step-20 |a-b| {d:.3g}")


@pytest.mark.parametrize("a,b", [("pp2", "one"), ("one", "pp2dp2z1")])
def test_moe_resume_on_another_layout(runs, a, b):
    res = runs.resumed(a, b)
    worst = assert_losses_close(log(runs.full(a)), log(res), range(MID + 1, STEPS + 1))
    d = assert_same_checkpoint(runs.full(a) / step_dir(STEPS), res / step_dir(STEPS))
    lay = json.loads(ckpt("inspect", "--json", res / step_dir(STEPS)).stdout)["layout"]
    assert lay["pp"] == (2 if b != "one" else 1), lay
    print(f"{a} -> {b}: worst loss error {worst:.3g}, step-20 |a-b| {d:.3g}")


# A Qwen3-MoE whose layers 0-1 are dense: a general layout with those on a tp2 stage, the MoE layers on tp1.
QWEN_LAYOUTS = {
    "one": Sym(1, ["--micro-batch", 3, "--grad-accum", 4]),
    "tp2_then_tp1": Gen([{"micro_batch": 3, "stages": [{"layers": 2, "tp": 2}, {"layers": 2, "tp": 1}]}], 0, 4),
}


def test_general_layout_with_a_tp_stage_trains_and_resumes_like_one_process(tmp_path_factory):
    q = Runs(tmp_path_factory.mktemp("moe_general_runs"), QWEN_LAYOUTS,
             config=qwen("qwen3_moe", 4, [0, 1], vocab_size=264))
    worst = assert_losses_close(log(q.full("one")), log(q.full("tp2_then_tp1")), range(1, STEPS + 1))
    res = q.resumed("tp2_then_tp1", "one")
    assert_losses_close(log(q.full("tp2_then_tp1")), log(res), range(MID + 1, STEPS + 1))
    d = assert_same_checkpoint(q.full("tp2_then_tp1") / step_dir(STEPS), res / step_dir(STEPS))
    print(f"qwen3-moe tp2 dense stage + tp1 MoE stage vs one process: worst loss error {worst:.3g}; resumed on one "
          f"process, step-20 |a-b| {d:.3g}")


def test_rank_killed_in_moe_save(runs, tmp_path):
    """The last stage's rank SIGKILLs itself while writing its shard of step 10 (checkpoints every 5)."""
    out = tmp_path / "killed"
    p = runs.train("pp2", out, "--steps", STEPS, "--save-every", 5, env={"CKPT_TEST_KILL_IN_SAVE": "1:10"}, check=False)
    assert p.returncode != 0, f"the job survived a killed rank:\n{p.stdout[-2000:]}"
    assert (out / "latest").read_text().strip() == step_dir(5)
    assert not (out / step_dir(10) / "manifest.json").exists()
    ckpt("verify", out / step_dir(5))
    again = tmp_path / "again"
    runs.train("pp2", again, "--steps", MID, "--resume", out)  # a run dir: follows `latest`
    assert_losses_close(log(runs.full("pp2")), log(again), range(6, MID + 1))
    assert_same_checkpoint(runs.full("pp2") / step_dir(MID), again / step_dir(MID))


def test_moe_layers_on_tp_stages_train_like_one_process(runs):
    """No --ep: every MoE layer's experts split over TP by width (etp = tp) through the expert groups."""
    worst = assert_losses_close(log(runs.full("one")), log(runs.full("tp2pp2")), range(1, STEPS + 1))
    d = assert_same_checkpoint(runs.full("one") / step_dir(STEPS), runs.full("tp2pp2") / step_dir(STEPS))
    print(f"tp2 x pp2 (ep 1) vs one process: worst loss error {worst:.3g}, step-20 |a-b| {d:.3g}")
