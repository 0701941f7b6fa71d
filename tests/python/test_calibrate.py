"""Calibration of this machine as a device type (issue 16, trainer/plan/calibrate.h), through
tests/tools/calibrate_tool (calibrate_device; `ckpt plan --calibrate` prints the same JSON).

Independent references, measured here in the same machine state:
- sgemm FLOP/s: numpy (its own OpenBLAS, 1 thread) at the same shapes (rows 512, hidden 256, ffn
  704: the four GEMMs of an MLP projection pair, forward and backward); the two agree within 4x
  (the machine is shared and noisy: this catches unit errors, e.g. FLOPs counted once instead of
  twice per multiply-add, or seconds taken as milliseconds);
- memory: psutil's physical memory, exactly;
- trainer efficiency (trainer FLOP/s / sgemm FLOP/s) in (0.05, 1.5);
- MPI (mpirun -np 2, ckpt's hidden calibrate-mpi-probe): bandwidth 50 MB/s .. 1 TB/s, latency
  100 ns .. 20 ms; and without MPI the link bandwidth is the memcpy bandwidth.
- cost terms (docs/PLAN.md "Calibrated terms"): the concurrency factor (sgemm FLOP/s per process
  with 2 processes at once / alone) against the same ratio measured here with numpy in 1 and 2
  concurrent processes (within 0.45: noisy shared machine; catches an inverted or unscaled ratio);
  the all-reduce fit passes through its two measured points (a negative intercept: zero latency); per-micro-batch and per-message costs
  are the measured slopes (0 .. 50 ms) and the file's cost_terms are what `ckpt plan --calibration`
  reads.
"""
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON  # noqa: E402

BIN = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", "../../build")).resolve()


def ckpt_path():
    return str(pathlib.Path(os.environ.get("CKPT_BIN") or BIN / "ckpt").resolve())


def calibrate(*extra):
    r = subprocess.run([str(BIN / "calibrate_tool"), ckpt_path(), "0.3", "1", *extra], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def numpy_sgemm_flops(seconds=0.3, procs=1):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    code = r"""
import numpy as np, time, statistics
n, D, F = 512, 256, 704
x = np.full((n, D), .5, np.float32); W = np.full((F, D), .01, np.float32)
h = np.full((n, F), .5, np.float32); W2 = np.full((D, F), .01, np.float32)
dy = np.full((n, F), .25, np.float32); dy2 = np.full((n, D), .25, np.float32)
def rep():
    y = x @ W.T; y2 = h @ W2.T
    dh = dy2 @ W2; dW2 = dy2.T @ h
    dx = dy @ W; dW = dy.T @ x
rep(); r = []; end = time.time() + %f
while len(r) < 5 or time.time() < end:
    t = time.perf_counter(); rep(); r.append(12.0 * n * D * F / (time.perf_counter() - t))
print(statistics.median(r))
""" % seconds
    ps = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
          for _ in range(procs)]
    rates = []
    for p in ps:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        rates.append(float(out))
    return statistics.mean(rates)


@pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
def test_calibration_against_numpy_psutil_and_bounds():
    import psutil
    c = calibrate()
    ref = numpy_sgemm_flops()
    dev, m = c["device_type"], c["measured"]
    assert 0.25 <= dev["peak_flops"] / ref <= 4.0, (dev["peak_flops"], ref)
    assert dev["memory"] == psutil.virtual_memory().total
    assert dev["dtype"] == "fp32" and dev["name"] == "this-machine"
    assert 0.05 < c["efficiency"] < 1.5, c
    assert abs(m["trainer_flops"] - c["efficiency"] * dev["peak_flops"]) <= 1e-6 * m["trainer_flops"]
    assert 5e7 <= dev["link_bandwidth"] <= 1e12, c
    assert 1e-7 <= m["mpi_latency_s"] <= 2e-2, c
    assert 1e8 <= m["memcpy_bytes_per_s"] <= 1e12, c
    # Cost terms: concurrency against numpy's 2-process / 1-process ratio measured now.
    t, pr = c["cost_terms"], c["cost_terms"]["measured"]
    numpy_ratio = numpy_sgemm_flops(procs=2) / numpy_sgemm_flops()
    assert t["concurrency"][0] == 1 and 0 < t["concurrency"][1] <= 1, t
    assert t["concurrency"][1] == pytest.approx(min(1.0, pr["sgemm_concurrent"] / pr["sgemm_alone"]), rel=1e-9)
    assert abs(t["concurrency"][1] - min(1.0, numpy_ratio)) <= 0.45, (t["concurrency"], numpy_ratio)
    sizes, calls = pr["allreduce_sizes_bytes"], pr["allreduce_call_s"]
    assert sizes == [128 * 256 * 4, 512 * 256 * 4] and all(0 < x < 0.05 for x in calls), pr
    if calls[1] > calls[0]:
        slope = (calls[1] - calls[0]) / (sizes[1] - sizes[0])
        assert 1 / t["allreduce_bytes_per_s"] == pytest.approx(slope, rel=1e-6)
        if calls[0] - sizes[0] * slope >= 0:  # the fit passes through both points
            for b, x in zip(sizes, calls):
                assert t["allreduce_latency_s"] + b / t["allreduce_bytes_per_s"] == pytest.approx(x, rel=1e-6, abs=1e-9)
        else:  # a negative intercept (cost grew faster than the size: noise) is clamped to no latency
            assert t["allreduce_latency_s"] == 0, t
    assert 0 <= t["micro_batch_overhead_s"] < 0.05 and 0 <= t["p2p_latency_s"] < 0.05, t
    assert t["micro_batch_overhead_s"] == pytest.approx(pr["dp_micro_batch_s"], rel=1e-12, abs=0)
    assert t["p2p_latency_s"] == pytest.approx(max(0, pr["pp_micro_batch_s"] - pr["dp_micro_batch_s"]), rel=1e-9, abs=1e-15)


def test_calibration_without_mpi_uses_memcpy():
    c = calibrate("nompi")
    assert c["device_type"]["link_bandwidth"] == int(c["measured"]["memcpy_bytes_per_s"])
    assert c["measured"]["mpi_latency_s"] == 0
