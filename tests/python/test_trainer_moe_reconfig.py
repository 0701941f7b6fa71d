"""Resume across reconfigurations of an MoE model with expert parallelism (issue 38; docs/MOE.md
"Expert parallelism in the trainer"), the dense test_trainer_reconfig.py's pattern: 20 steps
uninterrupted on layout A with a checkpoint at step 10, then a new launch on layout B resuming A's
step-10 checkpoint to step 20. Oracle: the uninterrupted run on A (itself checked against one
process by test_trainer_moe_equiv.py). Steps 11-20 within 1e-5 relative, `ckpt diff --rtol 1e-5
--atol 5e-6` of the two step-20 checkpoints equal (trainer_runs.py's float32 noise), and B's
checkpoint shows B's expert layout in `ckpt inspect --json`.

Model: a tiny Mixtral (4 experts, top-2, 2 layers, a vocabulary above the byte tokenizer's).
Every layout runs the same micro-batches (3 sequences of 8 tokens, 12 per step): the
load-balancing loss is per micro-batch, so the layouts agree only on one partition.
Transitions: ep4 -> ep2 x tp2 (etp 1) -> pp2 x ep2 -> one process; one process -> ep4 ZeRO-1 -> ep2; a general
layout with per-stage ep (two pipelines [tp2 ep2 etp1 | tp1] and [tp1 | tp2 ep2 etp1]) -> ep2 x tp2, and ep4 ZeRO-1
-> that general layout; and an HF import (transformers
saves a seeded Mixtral, test_trainer_moe_cli's; `ckpt from-hf`, then `ckpt train --init`): one
process vs ep2 from the same import to step 10, then ep2's step-10 checkpoint resumed on ep2 x tp2.
"""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON  # noqa: E402
from trainer_runs import (MID, STEPS, Gen, Runs, Sym, assert_losses_close, assert_same_checkpoint, ckpt,  # noqa: E402
                          log, step_dir)

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
CONFIG = dict(architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=264, hidden_size=32,
              intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
              num_local_experts=4, num_experts_per_tok=2, rms_norm_eps=1e-5, rope_theta=10000.0,
              max_position_embeddings=64, tie_word_embeddings=False, hidden_act="silu", router_aux_loss_coef=0.02)

LAYOUTS = {
    "one": Sym(1, ["--micro-batch", 3, "--grad-accum", 4]),
    "ep2": Sym(2, ["--dp", 2, "--ep", 2, "--micro-batch", 3, "--grad-accum", 2]),
    "ep4": Sym(4, ["--dp", 4, "--ep", 4, "--micro-batch", 3]),
    "ep2_tp2": Sym(2, ["--tp", 2, "--ep", 2, "--etp", 1, "--micro-batch", 3, "--grad-accum", 4]),
    "ep4_zero1": Sym(4, ["--dp", 4, "--ep", 4, "--zero", 1, "--micro-batch", 3]),
    "pp2_ep2": Sym(4, ["--pp", 2, "--dp", 2, "--ep", 2, "--micro-batch", 3, "--grad-accum", 2]),
    # a general layout with per-stage ep (docs/MOE.md "General layouts"): pipelines A [tp2 ep2 etp1 | tp1],
    # B [tp1 | tp2 ep2 etp1] (non-uniform: each expert-parallel stage's experts over its own tp ranks)
    "gen_ep": Gen([{"micro_batch": 3, "stages": [{"layers": 1, "tp": 2, "ep": 2, "etp": 1}, {"layers": 1, "tp": 1}]},
                   {"micro_batch": 3, "stages": [{"layers": 1, "tp": 1}, {"layers": 1, "tp": 2, "ep": 2, "etp": 1}]}],
                  grad_accum=2),
}
PAIRS = [("ep4", "ep2_tp2", "fewer expert ranks, experts over TP ranks"),
         ("one", "ep4_zero1", "one process -> ep4 with ZeRO-1 expert buffers"),
         ("ep4_zero1", "ep2", "ZeRO-1 expert buffers -> replicated state, fewer ranks"),
         ("ep2_tp2", "pp2_ep2", "experts over TP ranks -> two pipeline stages, experts over DP ranks"),
         ("pp2_ep2", "one", "ep2 x pp2 -> one process"),
         ("gen_ep", "ep2_tp2", "general layout with per-stage ep -> symmetric ep2 x tp2"),
         ("ep4_zero1", "gen_ep", "ZeRO-1 expert buffers -> general layout with per-stage ep")]
EXPECTED = {"ep2": (1, 2, 2, 1, 0), "ep4": (1, 4, 4, 1, 0), "ep2_tp2": (2, 1, 2, 1, 0), "ep4_zero1": (1, 4, 4, 1, 1),
            "pp2_ep2": (1, 2, 2, 1, 0)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    r = Runs(tmp_path_factory.mktemp("moe_reconfig_runs"), LAYOUTS)
    r.cfg.write_text(json.dumps(CONFIG))
    return r


def assert_inspect_shows(ckpt_dir, name):
    j = json.loads(ckpt("inspect", "--json", ckpt_dir).stdout)
    assert j["step"] == STEPS
    lay = j["layout"]
    if name in EXPECTED:
        tp, dp, ep, etp, zero = EXPECTED[name]
        assert (lay.get("tp"), lay.get("dp"), lay.get("ep"), lay.get("etp"), lay.get("zero")) == (tp, dp, ep, etp, zero), lay
    assert j["totals"]["files"] == LAYOUTS[name].n, f"every rank writes its own shard file: {j['totals']}"


@pytest.mark.parametrize("a,b,what", PAIRS, ids=[f"{a}-to-{b}" for a, b, _ in PAIRS])
def test_moe_resume_on_another_layout(runs, a, b, what):
    res, worst, max_abs = runs.check_resume(a, b)
    assert_inspect_shows(res / step_dir(STEPS), b)
    lb = log(res)
    if LAYOUTS[b].n > 1:
        assert all(r["a2a_s"] > 0 and r["router_load"] >= 1 for r in lb), lb[-1]
    print(f"{a} -> {b} ({what}): worst relative loss difference {worst:.3g}, max |w_a - w_b| {max_abs:.3g}")


def test_hf_import_trains_the_same_on_ep2(runs):
    pytest.importorskip("transformers")
    from test_trainer_moe_cli import _make_hf
    _make_hf(runs.root, "mixtral")  # runs.root / "hf"
    store = runs.root / "hf_store"
    ckpt("from-hf", runs.root / "hf", store)
    one, ep2 = runs.root / "hf_one", runs.root / "hf_ep2"
    res = runs.root / "hf_ep2_resumed"  # and on to step 20 from its own step-10 checkpoint, on ep2_tp2
    runs.cfg.write_text((runs.root / "hf" / "config.json").read_text())
    try:
        runs.train("one", one, "--steps", STEPS, "--save-every", MID, "--init", store)
        runs.train("ep2", ep2, "--steps", MID, "--save-every", MID, "--init", store)
        runs.train("ep2_tp2", res, "--steps", STEPS, "--resume", ep2 / step_dir(MID))
    finally:
        runs.cfg.write_text(json.dumps(CONFIG))
    lo = log(one)
    worst = assert_losses_close(lo, log(ep2), range(1, MID + 1))
    worst = max(worst, assert_losses_close(lo, log(res), range(MID + 1, STEPS + 1)))
    max_abs = assert_same_checkpoint(one / step_dir(STEPS), res / step_dir(STEPS))
    assert_inspect_shows(res / step_dir(STEPS), "ep2_tp2")
    print(f"HF import: one process vs ep2 (then ep2 x tp2): worst relative loss difference {worst:.3g}, "
          f"max |w_a - w_b| {max_abs:.3g}")
    # ep2's step-10 checkpoint exported back to HF: the one-process model's tensors, and it loads.
    worst_t, worst_l = _to_hf_matches(runs.root, ep2 / step_dir(MID), one / step_dir(MID))
    print(f"to-hf of ep2 step {MID} vs one process: max |a - b| {worst_t:.3g}, logits {worst_l:.3g}")


def _to_hf_matches(root, ckpt_a, ckpt_b):
    """`ckpt to-hf` of both; every tensor of A within float32 noise of B's (safetensors), and A loads in
    transformers with logits within 1e-4 of B's."""
    import numpy as np
    import torch
    import transformers
    from safetensors.numpy import load_file
    outs = []
    for i, c in enumerate((ckpt_a, ckpt_b)):
        out = root / f"to_hf_{i}"
        ckpt("to-hf", c, out)
        outs.append(out)
    ta = {k: v for f in sorted(outs[0].glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    tb = {k: v for f in sorted(outs[1].glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    assert ta.keys() == tb.keys() and any(".experts." in k for k in ta), sorted(ta)[:8]
    worst = max(float(np.abs(ta[k] - tb[k]).max()) for k in ta)
    assert worst < 5e-6, worst
    tokens = torch.arange(2, 34).view(2, 16) % 256
    logits = []
    for out in outs:
        m = transformers.MixtralForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            logits.append(m(tokens).logits)
    worst_l = float((logits[0] - logits[1]).abs().max())
    assert worst_l < 1e-4, worst_l
    return worst, worst_l
