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


def numpy_sgemm_flops(seconds=0.3):
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
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return float(r.stdout)


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


def test_calibration_without_mpi_uses_memcpy():
    c = calibrate("nompi")
    assert c["device_type"]["link_bandwidth"] == int(c["measured"]["memcpy_bytes_per_s"])
    assert c["measured"]["mpi_latency_s"] == 0
