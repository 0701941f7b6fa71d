"""One layout-equivalence run of tests/tools/parallel_check under mpirun, checked against the
one-process trainer it runs beside on every rank (the independent oracle; the model is tiny): 10
optimizer steps, the per-step losses within 1e-5 relative (float64 twin: 1e-10), every rank's
step-0 gradients after the replica sums within 1e-5 of the tensor's largest gradient, its loss and
global gradient norm, its held regions equal to the planner's rank_view, and (float64) the weights
after 10 steps. Shared by test_trainer_parallel_equiv.py and the MoE layout tests."""
import json
import os
import pathlib
import subprocess

import pytest

from mpi_ranks import mpirun_cmd


def parallel_check_tool():
    p = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", pathlib.Path(__file__).parents[2] / "build")) / "parallel_check"
    if not p.exists():
        pytest.fail(f"parallel_check not found at {p}: build it first")
    return str(p)


def with_f64_twins(cases, f64_names):
    """(case, f64) runs: every case in float32, the named ones also as float64 twins (not under the
    sanitizers, where they would only repeat the float32 run's code paths slower)."""
    runs = [(c, False) for c in cases]
    if os.environ.get("CKPT_SANITIZE") != "ON":
        runs += [(c, True) for c in cases if c[0] in f64_names]
    return runs


def run_ids(runs):
    return [c[0] + ("-f64" if f else "-f32") for c, f in runs]


def check_parallel_step(name, n, config, args, f64, min_drop=0.5, norm_tol32=1e-5):
    """Runs parallel_check on n ranks with `args` (layout flags or --layout FILE) and asserts the
    equivalence; min_drop: how much the loss must fall over the 10 steps (the run learns);
    norm_tol32: the float32 bound of the norm (later steps carry Adam's rounding)."""
    cmd = mpirun_cmd(n, parallel_check_tool(), config, *args, "--steps", 10, "--grad-accum", 2, "--seq", 8,
                     "--f64", int(f64))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ok"], out
    ranks = out["ranks"]
    assert [x["rank"] for x in ranks] == list(range(n))
    tol = 1e-10 if f64 else 1e-5
    losses, ref = out["losses"], out["ref_losses"]
    assert len(losses) == 10 and losses[-1] < losses[0] - min_drop, losses
    for a, b in zip(losses, ref):
        assert abs(a - b) <= tol * abs(b), (losses, ref)
    worst = max(ranks, key=lambda x: x["grad_rel"])
    print(f"{name} {'f64' if f64 else 'f32'}: worst step-0 gradient error {worst['grad_rel']:.3g} "
          f"({worst['grad_tensor']}, rank {worst['rank']}), worst loss error {max(x['loss_rel'] for x in ranks):.3g}")
    for x in ranks:
        assert x["held_ok"], x
        assert x["grad_numel"] > 0, x
        assert x["grad_rel"] <= tol, x
        assert x["loss_rel"] <= tol, x
        assert x["norm_rel"] <= (1e-10 if f64 else norm_tol32), x
        if f64:
            assert x["weights_rel"] <= 1e-10, x
    return out
