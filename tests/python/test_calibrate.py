"""Calibration of this machine as a device type (trainer/plan/calibrate.h), through
tests/tools/calibrate_tool (calibrate_device; `ckpt plan --calibrate` prints the same JSON).

Each measured figure against an independent measurement of the same quantity, taken here right
after it. The machine has 2 cores and is shared: each tolerance covers the ratios seen over
repeated runs and stays below 2x, so that a figure wrong by 2x fails; a figure passes when one of
up to 3 calibrations agrees with its reference (a burst of load elsewhere slows one measurement):
- sgemm FLOP/s: numpy (its own OpenBLAS, 1 thread) at the same shapes (rows 512, hidden 256, ffn
  704: the four GEMMs of an MLP projection pair, forward and backward): within 1.5x (two BLAS
  builds; ratios seen 0.94-1.27);
- trainer FLOP/s: `ckpt train` of the calibration model (calibrate_probe.cc calibration_model:
  micro-batch 4 x 128 tokens, 1 thread) timed from outside, (time of 13 steps - time of 3 steps)
  / 10, with the step's FLOPs counted here (projections, attention, MLP, head; backward twice the
  forward): within 1.6x (ratios seen 0.96-1.09, once 0.68 under load);
- memcpy bandwidth: numpy's copy of a 64 MiB array: within 1.5x (ratios seen 0.76-1.12, once 0.55
  under load);
- MPI latency and bandwidth (mpirun -np 2, ckpt's hidden calibrate-mpi-probe): tests/tools/
  mpi_pingpong, plain MPI calls under the same mpirun options. ckpt's communicator waits by polling
  (reshard/dist/comm_wait.cc), so the latency is compared with the ping-pong's polled wait (within
  3x: a round trip of a few microseconds is what the scheduling of two shared cores moves most --
  ratios seen 1.05-1.40 on a quiet machine, 1.7-2.9 with a build on the other core -- so this catches
  a wrong unit or a probe that times something else, not a 2x error; 3-4x the blocking one, which it
  must not beat); the bandwidth with the ping-pong's polled one, a polled barrier before each round
  trip as ckpt's (within 1.5x; ratios seen 0.99-1.01 here, 0.75-0.93 run by hand, on a 2026-11 Xeon
  where blocking MPI moves 16 MiB at 9-10 GB/s and polled waits at 5.6: the geometric mean of both,
  the reference until then, put ckpt at 0.41-0.66);
- memory: psutil's physical memory, exactly; without MPI the link bandwidth is the memcpy one;
- cost terms (docs/PLAN.md "Calibrated terms"): the concurrency factor (sgemm FLOP/s per process
  with 2 processes at once / alone) against the same ratio measured here with numpy in 1 and 2
  concurrent processes (within 0.45: noisy shared machine; catches an inverted or unscaled ratio);
  the all-reduce fit passes through its two measured points (a negative intercept: zero latency); per-micro-batch and per-message costs
  are the measured slopes (0 .. 50 ms) and the file's cost_terms are what `ckpt plan --calibration`
  reads; the 16 MiB gradient all-reduce no faster than the ping-pong link, the optimizer update no
  faster than the memory bandwidth allows, the efficiency = the step without the update recomputed here.
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
from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd  # noqa: E402

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


# The calibration model of trainer/plan/calibrate_probe.cc (calibration_model), as a config file.
CALIBRATION_MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "vocab_size": 264,
                     "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 6, "num_attention_heads": 8,
                     "num_key_value_heads": 4, "head_dim": 32, "rms_norm_eps": 1e-5, "max_position_embeddings": 512,
                     "bos_token_id": 256, "eos_token_id": 257, "tie_word_embeddings": False}
MICRO_BATCH, SEQ = 4, 128


def step_flops(m, b, s):
    """FLOPs of one training step of LLaMA config `m` on b sequences of s tokens: 2 per multiply-add,
    forward = the projections (q, k, v, o, gate, up, down, head) + Q K^T and P V; backward = 2 x forward."""
    n, d, f, v = b * s, m["hidden_size"], m["intermediate_size"], m["vocab_size"]
    q, kv = m["num_attention_heads"] * m["head_dim"], m["num_key_value_heads"] * m["head_dim"]
    layer = 2 * n * d * (q + 2 * kv) + 2 * n * q * d + 3 * 2 * n * d * f + 2 * 2 * b * s * s * q
    return 3 * (m["num_hidden_layers"] * layer + 2 * n * d * v)


def ckpt_train_flops(tmp_path):
    """Training FLOP/s of the calibration model timed from outside `ckpt train`: two runs that differ
    by 10 steps; their wall-time difference excludes start-up."""
    cfg = tmp_path / "calibration_model.json"
    cfg.write_text(json.dumps(CALIBRATION_MODEL))
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")

    def wall(steps):
        t0 = time.perf_counter()
        r = subprocess.run([ckpt_path(), "train", "--config", str(cfg), "--steps", str(steps), "--micro-batch", str(MICRO_BATCH),
                            "--seq-len", str(SEQ), "--threads", "1"], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return time.perf_counter() - t0
    per_step = statistics.median((wall(13) - wall(3)) / 10 for _ in range(2))
    return step_flops(CALIBRATION_MODEL, MICRO_BATCH, SEQ) / per_step


def numpy_copy_bytes_per_s(seconds=0.5):
    import numpy as np
    a = np.ones(64 << 20, np.uint8)
    b = np.empty_like(a)
    np.copyto(b, a)
    rates, end = [], time.time() + seconds
    while len(rates) < 5 or time.time() < end:
        t = time.perf_counter()
        np.copyto(b, a)
        rates.append(a.nbytes / (time.perf_counter() - t))
    return statistics.median(rates)


def mpi_pingpong():
    r = subprocess.run(mpirun_cmd(2, BIN / "mpi_pingpong", "0.5"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def within(x, ref, factor):
    return ref / factor <= x <= ref * factor


def test_step_flops_counts_a_known_layer():
    # One layer, no head, 1 sequence of 2 tokens, hidden 4 = 1 head of 4, ffn 8, vocab 0: q, k, v, o
    # 4 x (2 tokens x 4 x 4 x 2) = 256, MLP 3 x 2 x 4 x 8 x 2 = 384, attention 2 x (2 x 2 x 4 x 2) = 64.
    m = {"hidden_size": 4, "intermediate_size": 8, "vocab_size": 0, "num_attention_heads": 1, "num_key_value_heads": 1,
         "head_dim": 4, "num_hidden_layers": 1}
    assert step_flops(m, 1, 2) == 3 * (256 + 384 + 64)


def measured_vs_references(tmp_path):
    """One calibration and the references measured right after it: {figure: (measured, reference,
    tolerance factor)}, plus the calibration itself."""
    c = calibrate()
    dev, m = c["device_type"], c["measured"]
    mpi = mpi_pingpong()
    figures = {
        "sgemm": (dev["peak_flops"], numpy_sgemm_flops(), 1.5),
        "trainer": (m["trainer_flops"], ckpt_train_flops(tmp_path), 1.6),
        "memcpy": (m["memcpy_bytes_per_s"], numpy_copy_bytes_per_s(), 1.5),
        "latency": (m["mpi_latency_s"], mpi["polled_latency_s"], 3.0),
        "bandwidth": (dev["link_bandwidth"], mpi["polled_bytes_per_s"], 1.5),
    }
    assert m["mpi_latency_s"] >= mpi["latency_s"] / 1.6, (m["mpi_latency_s"], mpi)  # no faster than blocking MPI
    return figures, c


@pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
def test_calibration_against_independent_measurements(tmp_path):
    # Another process's burst (a build on the other core) can slow one measurement of a pair by 2x:
    # a figure passes when one of up to 3 calibrations agrees with its reference. A calibration
    # wrong by 2x disagrees every time.
    # The figures are compared only while the machine is not oversubscribed (1-minute load below twice
    # the core count: the suite runs this test alone, its own two ranks and the tests before it make
    # about the core count): with far more runnable processes than cores every figure and its
    # reference measure the scheduler (sgemm 4x, memcpy 0.35x and an MPI
    # round trip 1000x were seen with builds beside the test).
    import psutil
    pending, seen, loaded = None, {}, []
    for _ in range(3):
        busy = os.getloadavg()[0] >= 2 * os.cpu_count()
        figures, c = measured_vs_references(tmp_path)
        busy = busy or os.getloadavg()[0] >= 2 * os.cpu_count()
        loaded.append(busy)
        for k, (x, ref, factor) in figures.items():
            seen.setdefault(k, []).append(round(x / ref, 3))
        pending = [k for k in (pending or figures) if not within(*figures[k]) and not busy]
        print("ratios to the references:", {k: v[-1] for k, v in seen.items()}, "loaded" if busy else "")
        if not pending:
            break
    if all(loaded):
        print("figures not compared: the machine was oversubscribed in every attempt")
    assert not pending, {k: seen[k] for k in pending}
    dev = c["device_type"]
    assert dev["memory"] == psutil.virtual_memory().total
    assert dev["dtype"] == "fp32" and dev["name"] == "this-machine"
    # Cost terms: concurrency against numpy's 2-process / 1-process ratio measured now.
    t, pr = c["cost_terms"], c["cost_terms"]["measured"]
    numpy_ratio = numpy_sgemm_flops(procs=2) / numpy_sgemm_flops()
    assert t["concurrency"][0] == 1 and 0 < t["concurrency"][1] <= 1, t
    assert t["concurrency"][1] == pytest.approx(min(1.0, pr["sgemm_concurrent"] / pr["sgemm_alone"]), rel=1e-9)
    assert abs(t["concurrency"][1] - min(1.0, numpy_ratio)) <= 0.45, (t["concurrency"], numpy_ratio)
    for k in ("allreduce", "a2a"):  # the TP all-reduce and the expert all-to-all: the same fit
        sizes, calls = pr[f"{k}_sizes_bytes"], pr[f"{k}_call_s"]
        assert sizes == [128 * 256 * 4, 512 * 256 * 4] and all(0 < x < 0.05 for x in calls), pr
        if calls[1] > calls[0]:
            slope = (calls[1] - calls[0]) / (sizes[1] - sizes[0])
            assert 1 / t[f"{k}_bytes_per_s"] == pytest.approx(slope, rel=1e-6)
            if calls[0] - sizes[0] * slope >= 0:  # the fit passes through both points
                for b, x in zip(sizes, calls):
                    assert t[f"{k}_latency_s"] + b / t[f"{k}_bytes_per_s"] == pytest.approx(x, rel=1e-6, abs=1e-9)
            else:  # a negative intercept (cost grew faster than the size: noise) is clamped to no latency
                assert t[f"{k}_latency_s"] == 0, t
        else:  # no size dependence measured: all latency
            assert t[f"{k}_latency_s"] == calls[1] and t[f"{k}_bytes_per_s"] == 1e15, t
    assert 0 <= t["micro_batch_overhead_s"] < 0.05 and 0 <= t["p2p_latency_s"] < 0.05, t
    assert t["micro_batch_overhead_s"] == pytest.approx(pr["dp_micro_batch_s"], rel=1e-12, abs=0)
    assert t["p2p_latency_s"] == pytest.approx(max(0, pr["pp_micro_batch_s"] - pr["dp_micro_batch_s"]), rel=1e-9, abs=1e-15)
    # The gradient sync's 16 MiB all-reduce (issue 38): no faster than the ping-pong link (a ring of
    # 2 moves each byte once each way and sums it); the file carries the probe's figure.
    assert 0 < t["sync_bytes_per_s"] == pr["sync_bytes_per_s"] <= 1.5 * dev["link_bandwidth"], (t, dev)
    # The optimizer update: no faster than memory allows (the norm, clipping and AdamW move at least
    # 40 bytes a parameter; a memcpy moves 2 bytes per byte copied); the efficiency is the step's FLOPs
    # over its time less the calibration model's update, recomputed here from a hand count of its parameters.
    m, ups = c["measured"], t["update_params_per_s"]
    assert 0 < ups <= 1.5 * 2 * m["memcpy_bytes_per_s"] / 40, (ups, m)
    cm = CALIBRATION_MODEL
    d, q, kv = cm["hidden_size"], cm["num_attention_heads"] * cm["head_dim"], cm["num_key_value_heads"] * cm["head_dim"]
    params = cm["num_hidden_layers"] * (2 * d * q + 2 * d * kv + 3 * d * cm["intermediate_size"] + 2 * d) + 2 * cm["vocab_size"] * d + d
    flops = step_flops(cm, MICRO_BATCH, SEQ)
    assert c["efficiency"] == pytest.approx(flops / (flops / m["trainer_flops"] - params / ups) / dev["peak_flops"], rel=1e-9)


def test_calibration_without_mpi_uses_memcpy():
    c = calibrate("nompi")
    assert c["device_type"]["link_bandwidth"] == int(c["measured"]["memcpy_bytes_per_s"])
    assert c["measured"]["mpi_latency_s"] == 0
