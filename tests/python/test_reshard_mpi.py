"""`ckpt reshard` under mpirun.

- `-np 2` and `-np 3` (oversubscribed) give byte-identical output to one process: the same
  manifest.json, the same shard files byte for byte, the same values (numpy reference); and every
  rank did its share (per-rank reports, CKPT_DIST_TRACE: each rank wrote a disjoint, non-empty
  set of the shard files and its own write counter covers their bytes; it asked the source for
  at least what its files hold), so a run where rank 0 does all the work fails.
- Failure paths: a corrupt source piece (rank 0's check before committing), a non-root rank that
  fails (its compressed source chunk cannot be decoded; only that rank reads it), a non-root rank
  killed with SIGKILL while the ranks work: the job ends with an error in bounded time and no DST.
Skipped with a message when mpirun is not installed (a failure in CI, see conftest.py).
"""
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import megatron_reference as ref  # noqa: E402
from mpi_ranks import MPIRUN, SKIP_REASON, check_shares, load_traces, mpirun_cmd, rank_pid, run_traced  # noqa: E402
from test_reshard_cli import BASE, CFG_GQA, check_against_reference, layout_args, model  # noqa: E402

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
# ~9 MB with optimizer state: enough for the ranks to be at work when one is killed.
CFG_BIG = dict(BASE, vocab_size=500, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
               num_attention_heads=8, num_key_value_heads=4, head_dim=16, torch_dtype="float32")
TARGET = layout_args(4, [2, 1, 1], 2, 1)


def digest(d):
    d = pathlib.Path(d)
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def plan_files(ckpt_bin, src, target):
    j = json.loads(subprocess.run([ckpt_bin, "reshard", str(src), "/nonexistent/x", *map(str, target), "--dry-run", "--json"],
                                  capture_output=True, text=True, check=True).stdout)
    return {f["file"]: f["bytes_written"] for f in j["files"]}


def test_mpi_ranks_byte_identical(tool, ckpt_bin, run_ckpt, tmp_path):
    cfg = dict(CFG_GQA, hidden_size=32, intermediate_size=48, vocab_size=97)
    tensors = model(cfg, seed=5)
    src = tmp_path / "src"
    ref.write_native_store(tool("store_write_tool"), tmp_path / "spec", src, cfg, tensors)
    mid = tmp_path / "mid"  # a sharded source, so ranks read pieces of several files
    run_ckpt("reshard", src, mid, *layout_args(2, [1, 3], 2, 1))
    src_digest = digest(mid)
    one = tmp_path / "np1"
    run_ckpt("reshard", mid, one, *TARGET)
    outs = {1: digest(one)}
    files = plan_files(ckpt_bin, mid, TARGET)
    for n in (2, 3):
        dst = tmp_path / f"np{n}"
        p = run_traced(n, [ckpt_bin, "reshard", mid, dst, *TARGET], tmp_path / f"trace{n}")
        assert p.returncode == 0, f"{p.args}\n{p.stdout}\n{p.stderr}"
        assert not pathlib.Path(str(dst) + ".partial").exists()
        outs[n] = digest(dst)
        assert len(files) >= n  # every process had a file to write
        check_shares(dst, load_traces(tmp_path / f"trace{n}", n), files)
    assert outs[2] == outs[1], "mpirun -np 2 output differs from one process"
    assert outs[3] == outs[1], "mpirun -np 3 output differs from one process"
    check_against_reference(tmp_path / "np3", cfg, tensors, 4, [2, 1, 1], 2, 1, 128)
    assert digest(mid) == src_digest, "SRC was modified"
    assert np.all([k.startswith("shards/") or k == "manifest.json" for k in outs[1]])


def _big_source(tool, run_ckpt, tmp_path, *compress):
    """A sharded source of CFG_BIG (tp 2, pp 2, dp 2, ZeRO-1)."""
    flat = tmp_path / "flat"
    ref.write_native_store(tool("store_write_tool"), tmp_path / "spec", flat, CFG_BIG, model(CFG_BIG, seed=11))
    mid = tmp_path / "mid"
    run_ckpt("reshard", flat, mid, *layout_args(2, [2, 2], 2, 1), *compress)
    return mid


@pytest.fixture
def big_mid(tool, run_ckpt, tmp_path):
    """Compressed (shuffle+zstd), so a destroyed chunk fails the one rank that reads it."""
    return _big_source(tool, run_ckpt, tmp_path, "--compress", "shuffle+zstd")


def _no_output(dst):
    assert not pathlib.Path(dst).exists(), "DST was committed"
    assert not pathlib.Path(str(dst) + ".partial").exists(), "DST.partial left behind"


def test_mpi_corrupt_source_nothing_committed(tool, ckpt_bin, run_ckpt, tmp_path):
    """A flipped bit in an uncompressed source piece reads fine; rank 0's re-hash of the source
    before committing finds it: the job fails naming the tensor, and nothing is committed."""
    mid = _big_source(tool, run_ckpt, tmp_path)
    m = json.loads((mid / "manifest.json").read_text())
    victim = m["pieces"][len(m["pieces"]) // 2]
    path = mid / victim["file"]
    with h5py.File(path, "r") as f:
        off = f[victim["dataset"]].id.get_offset()
    raw = bytearray(path.read_bytes())
    raw[off + 3] ^= 0x10
    path.write_bytes(bytes(raw))
    before = digest(mid)
    dst = tmp_path / "dst"
    p = run_traced(2, [ckpt_bin, "reshard", mid, dst, *TARGET], tmp_path / "trace")
    assert p.returncode != 0, p.stderr
    assert victim["tensor"] in p.stderr and "nothing was committed" in p.stderr, p.stderr
    assert all(t["ok"] for t in load_traces(tmp_path / "trace", 2))  # the ranks' reads succeeded
    _no_output(dst)
    assert digest(mid) == before


def test_mpi_failing_non_root_rank(ckpt_bin, run_ckpt, big_mid, tmp_path):
    """Rank 1 alone reads a source piece whose compressed chunk is destroyed: rank 1 fails, rank 0
    does not commit, and reports rank 1's own error, naming the rank and the tensor."""
    dst = tmp_path / "clean"
    p = run_traced(2, [ckpt_bin, "reshard", big_mid, dst, *TARGET], tmp_path / "t0")
    assert p.returncode == 0, p.stderr
    t = load_traces(tmp_path / "t0", 2)
    only_1 = sorted(set(t[1]["source_pieces"]) - set(t[0]["source_pieces"]))
    assert only_1, "no source piece is read by rank 1 alone"
    m = json.loads((big_mid / "manifest.json").read_text())
    victim = m["pieces"][only_1[0]]
    path = big_mid / victim["file"]
    with h5py.File(path, "r") as f:
        off = f[victim["dataset"]].id.get_chunk_info(0)[2]
    raw = bytearray(path.read_bytes())
    raw[off:off + 16] = b"\0" * 16  # the zstd frame header: the chunk cannot be decoded
    path.write_bytes(bytes(raw))
    dst = tmp_path / "dst"
    p = run_traced(2, [ckpt_bin, "reshard", big_mid, dst, *TARGET, "--no-verify"], tmp_path / "t1")
    assert p.returncode == 3, (p.returncode, p.stderr)  # rank 1's own error (ReadFailed: corrupt input)
    t = load_traces(tmp_path / "t1", 2)
    assert t[0]["ok"] and not t[1]["ok"], t
    assert victim["tensor"] in t[1]["error"], t[1]["error"]
    # Rank 0 reports rank 1's own error (Status across MPI): its kind, the tensor and which rank.
    assert "reshard process 1 of 2" in p.stderr and victim["tensor"] in p.stderr, p.stderr
    assert "nothing was committed" in p.stderr, p.stderr
    _no_output(dst)


def test_mpi_killed_rank_ends_the_job(ckpt_bin, run_ckpt, big_mid, tmp_path):
    """SIGKILL to rank 1 once the ranks are at work (DST.partial exists): mpirun ends with an
    error within 60 s, rank 0 does not hang, and DST is never committed."""
    dst = tmp_path / "dst"
    partial = pathlib.Path(str(dst) + ".partial")
    cmd = mpirun_cmd(2, ckpt_bin, "reshard", big_mid, dst, *TARGET, "--max-memory", "1M", "--threads", "1")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:
        victim = victim or rank_pid(p.pid, 1)
        if victim and partial.exists():
            break
        time.sleep(0.001)
    assert victim and p.poll() is None, "the job ended before rank 1 could be killed at work"
    t_kill = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail("mpirun still running 60 s after a rank was killed")
    assert p.returncode != 0, f"the job succeeded although rank 1 was killed\n{err}"
    print(f"job ended {time.monotonic() - t_kill:.2f}s after the kill, exit {p.returncode}")
    assert not dst.exists(), "DST was committed"
    # The next run replaces any stale partial output.
    run_ckpt("reshard", big_mid, dst, *TARGET)
    assert run_ckpt("verify", dst, check=False).returncode == 0
    assert not partial.exists()
