"""Layout equivalence of expert parallelism in the trainer (issue 38; docs/MOE.md "Expert
parallelism in the trainer"), under mpirun: tests/tools/parallel_check runs 10 optimizer steps of
parallel_step with the MoE layers' tokens dispatched to the ranks holding their experts
(all-to-all over ep, gather / reduce-scatter over etp, each TP rank routing its block of the
tokens), and on every rank the one-process trainer (the independent oracle: the whole model, the
same micro-batches one after the other, since the load-balancing loss is per micro-batch).
Per case: the per-step losses within 1e-5 relative of the one-process ones (float64 twin:
1e-10), the step-0 gradients of every region a rank holds (after the replica sums, before
clipping) within 1e-5 of the tensor's largest gradient, the global gradient norm, and every
rank's held regions equal to the planner's rank_view (the store's expert boxes).
Models: a tiny Mixtral (8 experts, top-2; 2 layers, one per stage at pp 2), a tiny Qwen3-MoE (q/k
norms, a dense layer between MoE ones, norm_topk_prob) and a tiny Qwen2-MoE (shared expert and its
sigmoid gate, q/k/v biases).
A mutation such as a missing TP all-gather of the MoE output or a row sent to the wrong ep rank
moves the losses by far more than the tolerance.
"""
import json

import pytest

from mpi_ranks import MPIRUN, SKIP_REASON
from parallel_check_run import check_parallel_step, run_ids, with_f64_twins

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)


def _config(tmp_path, family):
    base = dict(rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64, hidden_act="silu",
                torch_dtype="float32", vocab_size=300, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, tie_word_embeddings=False, router_aux_loss_coef=0.05)
    if family == "mixtral":
        c = dict(base, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=24,
                 num_hidden_layers=2, num_local_experts=8, num_experts_per_tok=2)
    elif family == "qwen2_moe":  # shared expert and its gate, q/k/v biases
        c = dict(base, architectures=["Qwen2MoeForCausalLM"], model_type="qwen2_moe", intermediate_size=48,
                 moe_intermediate_size=16, shared_expert_intermediate_size=32, num_hidden_layers=2, num_experts=4,
                 num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=False)
    else:
        c = dict(base, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", intermediate_size=48,
                 moe_intermediate_size=24, num_hidden_layers=3, mlp_only_layers=[1], decoder_sparse_step=1,
                 num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    p = tmp_path / f"config_{family}.json"
    p.write_text(json.dumps(c))
    return p


# name, ranks, family, layout args (the micro-batch of every DP rank: 2 sequences)
CASES = [
    ("ep2", 2, "mixtral", ["--dp", 2, "--ep", 2, "--micro-batches", "2,2"]),
    ("ep4", 4, "mixtral", ["--dp", 4, "--ep", 4, "--micro-batches", "2,2,2,2"]),
    ("ep2_tp2_etp1", 2, "mixtral", ["--tp", 2, "--ep", 2, "--etp", 1, "--micro-batches", "2"]),
    ("ep2_tp2_etp2_dp2", 4, "mixtral", ["--tp", 2, "--dp", 2, "--ep", 2, "--etp", 2, "--micro-batches", "2,2"]),
    ("ep2_tp2_etp1_dp2", 4, "mixtral", ["--tp", 2, "--dp", 2, "--ep", 2, "--etp", 1, "--micro-batches", "2,2"]),
    ("tp2_etp1_ep1", 2, "mixtral", ["--tp", 2, "--ep", 1, "--etp", 1, "--micro-batches", "2"]),
    # 7 tokens per micro-batch: TP blocks of 3 and 4 rows
    ("ep2_tp2_etp1_odd_rows", 2, "mixtral", ["--tp", 2, "--ep", 2, "--etp", 1, "--micro-batches", "1", "--seq", 7]),
    ("dp2_ep2_zero1", 2, "mixtral", ["--dp", 2, "--ep", 2, "--zero", 1, "--micro-batches", "2,2"]),
    ("ep2_tp2_etp1_dp2_zero1", 4, "mixtral", ["--tp", 2, "--dp", 2, "--ep", 2, "--etp", 1, "--zero", 1,
                                              "--micro-batches", "2,2"]),
    ("dp4_ep2_zero1", 4, "mixtral", ["--dp", 4, "--ep", 2, "--zero", 1, "--micro-batches", "2,2,2,2"]),
    ("ep2_tp2_etp2_dp2_zero1", 4, "mixtral", ["--tp", 2, "--dp", 2, "--ep", 2, "--etp", 2, "--zero", 1,
                                              "--micro-batches", "2,2"]),
    ("qwen3_ep2_zero1", 2, "qwen3_moe", ["--dp", 2, "--ep", 2, "--zero", 1, "--micro-batches", "2,2"]),
    # pipeline stages: each stage's tp x dp ranks regrouped for its experts; the router totals of the
    # stages before are not summed over TP again
    ("pp2_dp2_ep2", 4, "mixtral", ["--pp", 2, "--dp", 2, "--ep", 2, "--micro-batches", "2,2"]),
    ("pp2_tp2_ep2_etp1", 4, "mixtral", ["--pp", 2, "--tp", 2, "--ep", 2, "--etp", 1, "--micro-batches", "2"]),
    ("pp2_dp2_ep2_zero1", 4, "mixtral", ["--pp", 2, "--dp", 2, "--ep", 2, "--zero", 1, "--micro-batches", "2,2"]),
    ("qwen3_pp2_dp2_ep2", 4, "qwen3_moe", ["--pp", 2, "--dp", 2, "--ep", 2, "--micro-batches", "2,2"]),
    # uneven stages: 1 + 2 layers (layer 1 dense), the MoE layers on both
    ("qwen3_pp2_uneven_1_2_dp2_ep2", 4, "qwen3_moe", ["--pp", 2, "--pp-layers", "1,2", "--dp", 2, "--ep", 2,
                                                      "--micro-batches", "2,2"]),
    ("qwen3_ep2", 2, "qwen3_moe", ["--dp", 2, "--ep", 2, "--micro-batches", "2,2"]),
    ("qwen3_ep4", 4, "qwen3_moe", ["--dp", 4, "--ep", 4, "--micro-batches", "2,2,2,2"]),
    ("qwen3_tp2_ep2_etp1", 2, "qwen3_moe", ["--tp", 2, "--ep", 2, "--etp", 1, "--micro-batches", "2"]),
    # the shared expert: on the own tokens at tp 1, on every token with its F slice at tp 2
    ("qwen2_dp2_ep2", 2, "qwen2_moe", ["--dp", 2, "--ep", 2, "--micro-batches", "2,2"]),
    ("qwen2_tp2_ep2_etp1", 2, "qwen2_moe", ["--tp", 2, "--ep", 2, "--etp", 1, "--micro-batches", "2"]),
    # no --ep: the experts' width split over TP as the store places them at ep 1 (etp = tp)
    ("tp2_ep1", 2, "mixtral", ["--tp", 2, "--micro-batches", "2"]),
    ("qwen3_tp2_pp2_ep1", 4, "qwen3_moe", ["--tp", 2, "--pp", 2, "--micro-batches", "2"]),
    ("qwen2_tp2_dp2_ep1_zero1", 4, "qwen2_moe", ["--tp", 2, "--dp", 2, "--zero", 1, "--micro-batches", "2,2"]),
    ("qwen2_tp2_dp2_ep2_etp2_zero1", 4, "qwen2_moe", ["--tp", 2, "--dp", 2, "--ep", 2, "--etp", 2, "--zero", 1,
                                                      "--micro-batches", "2,2"]),
]
F64 = {"tp2_ep1", "qwen3_pp2_uneven_1_2_dp2_ep2", "ep2_tp2_etp2_dp2", "ep2_tp2_etp1_dp2_zero1", "pp2_tp2_ep2_etp1", "qwen3_ep2", "qwen2_tp2_ep2_etp1"}
RUNS = with_f64_twins(CASES, F64)


@pytest.mark.parametrize("case,f64", RUNS, ids=run_ids(RUNS))
def test_expert_parallel_layout_gives_the_one_process_step(case, f64, tmp_path):
    name, n, family, args = case
    check_parallel_step(name, n, _config(tmp_path, family), args, f64, min_drop=0.3, norm_tol32=5e-5)
