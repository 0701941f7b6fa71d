"""A writer holds a lock on its output (docs/INTEGRITY.md): formats/base/fs_util.h PartialDir / DirLock.

 * `ckpt reshard SRC out` started while another is writing `out` (held before its commit by the
   test hook CKPT_TEST_HOLD_BEFORE_COMMIT_S): the second exits at once with DestinationBusy naming
   `out` and the first's pid; the first commits and its output verifies (before: the second took
   out.partial for a stale leftover and removed it, and both failed).
 * A writer killed with SIGKILL leaves out.partial (no lock any more): the next run replaces it.
 * Two `ckpt train --out RUN` at once: the second is refused, naming the first's pid.
"""
import os
import pathlib
import signal
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "fixtures" / "tiny_llama.json"
TRAIN = ["--config", str(TINY), "--seed", "3", "--micro-batch", "2", "--seq-len", "16", "--threads", "1"]
LAYOUT = ["--tp", "2", "--pp", "1", "--dp", "1"]


def _env(hold_s=None):
    env = dict(os.environ)
    env.pop("CKPT_TEST_HOLD_BEFORE_COMMIT_S", None)
    if hold_s is not None:
        env["CKPT_TEST_HOLD_BEFORE_COMMIT_S"] = str(hold_s)
    return env


@pytest.fixture(scope="module")
def src(tmp_path_factory, ckpt_bin):
    run = tmp_path_factory.mktemp("lock") / "run"
    p = subprocess.run([ckpt_bin, "train", *TRAIN, "--steps", "2", "--out", str(run)], capture_output=True, text=True,
                       timeout=300, env=_env())
    assert p.returncode == 0, p.stderr
    return run / (run / "latest").read_text().strip()


def _wait_for(path: pathlib.Path, timeout=30):
    t0 = time.monotonic()
    while not path.exists():
        assert time.monotonic() - t0 < timeout, f"{path} never appeared"
        time.sleep(0.02)


def test_second_reshard_to_one_destination_refused_at_once(src, ckpt_bin, run_ckpt, tmp_path):
    out = tmp_path / "out"
    first = subprocess.Popen([ckpt_bin, "reshard", str(src), str(out), *LAYOUT], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=_env(4))
    try:
        _wait_for(tmp_path / "out.partial")
        time.sleep(0.5)
        t0 = time.monotonic()
        second = subprocess.run([ckpt_bin, "reshard", str(src), str(out), *LAYOUT], capture_output=True, text=True,
                                timeout=60, env=_env())
        secs = time.monotonic() - t0
    finally:
        f_out, f_err = first.communicate(timeout=120)
    assert second.returncode == 2, f"exit {second.returncode}\n{second.stderr}"
    assert "DestinationBusy" in second.stderr and f"'{out}'" in second.stderr, second.stderr
    assert f"pid {first.pid}" in second.stderr, second.stderr
    assert secs < 3, f"the second writer took {secs:.1f} s to be refused"
    assert first.returncode == 0, f_err
    assert not (tmp_path / "out.partial").exists()
    run_ckpt("verify", out)


def test_killed_writer_leftover_is_replaced(src, ckpt_bin, run_ckpt, tmp_path):
    out = tmp_path / "out"
    first = subprocess.Popen([ckpt_bin, "reshard", str(src), str(out), *LAYOUT], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=_env(60))
    try:
        _wait_for(tmp_path / "out.partial")
        time.sleep(0.5)  # well inside the hold: the writer is still at work
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    assert (tmp_path / "out.partial").is_dir() and not out.exists()
    p = run_ckpt("reshard", src, out, *LAYOUT, env=_env())
    assert p.returncode == 0
    assert out.is_dir() and not (tmp_path / "out.partial").exists()
    run_ckpt("verify", out)


def test_two_trainers_on_one_run_dir(ckpt_bin, tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen([ckpt_bin, "train", *TRAIN, "--steps", "2", "--out", str(run), "--sync-save"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(4))
    try:
        _wait_for(run / "train_log.jsonl")
        time.sleep(0.5)
        t0 = time.monotonic()
        second = subprocess.run([ckpt_bin, "train", *TRAIN, "--steps", "2", "--out", str(run), "--sync-save"],
                                capture_output=True, text=True, timeout=120, env=_env())
        secs = time.monotonic() - t0
    finally:
        f_out, f_err = first.communicate(timeout=300)
    assert second.returncode == 2, f"exit {second.returncode}\n{second.stdout}\n{second.stderr}"
    assert "DestinationBusy" in second.stderr and f"pid {first.pid}" in second.stderr and str(run) in second.stderr
    assert secs < 5
    assert first.returncode == 0, f_err
    assert (run / "latest").read_text().strip() == "step-00000002"
    lines = (run / "train_log.jsonl").read_text().splitlines()
    assert len(lines) == 2, "the refused trainer wrote to the run's log"
