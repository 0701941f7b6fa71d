"""`ckpt train --ep/--etp`: the layouts the expert-parallel trainer refuses, each by name, before any
step (docs/MOE.md "Expert parallelism in the trainer"), and the step line / train_log.jsonl of an
expert-parallel run (the a2a share, the router load of the step's tokens on all ranks).
"""
import json
import subprocess

import pytest

from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd
from trainer_runs import ckpt_path

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)

BASE = dict(vocab_size=264, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64, tie_word_embeddings=False,
            hidden_act="silu")
MIXTRAL = dict(BASE, architectures=["MixtralForCausalLM"], model_type="mixtral", intermediate_size=48,
               num_local_experts=4, num_experts_per_tok=2)

def _train(tmp_path, cfg, n, *args):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    cmd = mpirun_cmd(n, ckpt_path(), "train", "--config", p, "--steps", 2, "--seq-len", 8, "--threads", 1, *args)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)


# name, config, ranks, flags, error code, words of the message
REFUSED = [
    ("ep3_of_4_experts", MIXTRAL, 3, ["--dp", 3, "--ep", 3], "LayoutRefused", "does not divide the 4 experts"),
    ("etp_x_ep_over_ranks", MIXTRAL, 2, ["--dp", 2, "--ep", 2, "--etp", 2], "BadLayout", "does not divide the 2 ranks"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_by_name(tmp_path, case):
    _, cfg, n, flags, code, words = case
    p = _train(tmp_path, cfg, n, *flags)
    assert p.returncode != 0, p.stdout[-2000:]
    assert code in p.stderr and words in p.stderr, p.stderr[-3000:]
    assert "step      1" not in p.stdout


def test_general_layout_with_ep_is_unsupported(tmp_path):
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps({"pipelines": [{"micro_batch": 1, "stages": [{"layers": 2, "tp": 1}]}] * 2, "zero": 0,
                               "ep": 2}))
    p = _train(tmp_path, MIXTRAL, 2, "--layout", lay)
    assert p.returncode != 0 and "LayoutUnsupported" in p.stderr, p.stderr[-3000:]
    assert "step      1" not in p.stdout


def test_step_line_and_log_of_an_expert_parallel_run(tmp_path):
    """From a layout file with "ep" / "etp" (ZeRO-1): the step line, train_log.jsonl, the checkpoint's layout."""
    out, lay = tmp_path / "run", tmp_path / "layout.json"
    lay.write_text(json.dumps({"tp": 1, "pp": 1, "dp": 2, "zero": 1, "ep": 2, "etp": 1, "micro_batch": [2, 2],
                               "layers_per_stage": [2]}))
    p = _train(tmp_path, MIXTRAL, 2, "--layout", lay, "--out", out)
    assert p.returncode == 0, p.stderr[-3000:]
    j = json.loads(subprocess.run([ckpt_path(), "inspect", "--json", out / "step-00000002"], capture_output=True,
                                  text=True, check=True).stdout)
    assert {k: j["layout"][k] for k in ("dp", "ep", "etp", "zero")} == {"dp": 2, "ep": 2, "etp": 1, "zero": 1}, j["layout"]
    lines = [l for l in p.stdout.splitlines() if l.startswith("step ")]
    assert len(lines) == 2 and all(" | a2a " in l and "router max/mean" in l for l in lines), p.stdout
    recs = [json.loads(l) for l in (out / "train_log.jsonl").read_text().splitlines()]
    for r in recs:
        assert 0 < r["a2a_s"] < r["seconds"], r
        assert 1 <= r["router_load"] <= 4, r  # max / mean over 4 experts
