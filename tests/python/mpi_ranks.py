"""Helpers for the tests that run ckpt under mpirun: the command line, finding one rank's process
from outside, and checking each rank's share of the work from the per-rank reports that
CKPT_DIST_TRACE=DIR makes every process write (DIR/rank<R>.json, see reshard/store_reshard.cc):
the shard files it wrote, the source pieces and bytes it asked for, its /proc/self/io counters.
"""
import atexit
import json
import os
import pathlib
import shutil
import subprocess
import tempfile

MPIRUN = shutil.which("mpirun")
SKIP_REASON = "mpirun not found: install openmpi-bin to run the distributed tests"


_SESSION_BASE = []  # this process's parent of the session directories below (removed at exit)


def session_dir():
    """A new directory for one mpirun's session files. Open MPI 4 keeps every job of a user under one
    directory, /tmp/ompi.<host>.<uid>, that a job creates when it starts and removes when it ends: two
    jobs starting and ending at once (ctest -j2) race on it, and one fails with "A call to mkdir was
    unable to create the desired directory ... File exists" (open-mpi/ompi#8510; 1 of 3,428 jobs with
    four loops of `mpirun -np 2 true` here, once on CI). Given a directory of its own
    (orte_tmpdir_base), no job shares it."""
    if not _SESSION_BASE:
        _SESSION_BASE.append(tempfile.mkdtemp(prefix="ckpt-ompi-"))
        atexit.register(shutil.rmtree, _SESSION_BASE[0], True)
    return tempfile.mkdtemp(dir=_SESSION_BASE[0])


def mpirun_cmd(n, *args):
    return [MPIRUN, "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader", "--mca", "pml", "ob1",
            "--mca", "orte_tmpdir_base", session_dir(), "-np", str(n), *map(str, args)]


def run_traced(n, args, trace_dir, timeout=300):
    """mpirun -np n ARGS with CKPT_DIST_TRACE=trace_dir (created empty)."""
    trace_dir = pathlib.Path(trace_dir)
    shutil.rmtree(trace_dir, ignore_errors=True)
    trace_dir.mkdir(parents=True)
    env = dict(os.environ, CKPT_DIST_TRACE=str(trace_dir))
    return subprocess.run(mpirun_cmd(n, *args), capture_output=True, text=True, timeout=timeout, env=env)


def load_traces(trace_dir, n):
    trace_dir = pathlib.Path(trace_dir)
    found = sorted(p.name for p in trace_dir.glob("rank*.json"))
    assert found == sorted(f"rank{r}.json" for r in range(n)), f"per-rank reports: {found}, expected {n}"
    return [json.loads((trace_dir / f"rank{r}.json").read_text()) for r in range(n)]


def rank_pid(mpirun_pid, rank):
    """pid of the process of `rank` among mpirun's children (None until it is started)."""
    try:
        kids = pathlib.Path(f"/proc/{mpirun_pid}/task/{mpirun_pid}/children").read_text().split()
    except OSError:
        return None
    for k in kids:
        try:
            env = pathlib.Path(f"/proc/{k}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(k)
    return None


def check_shares(dst, traces, plan_files=None):
    """Every rank wrote a disjoint, non-empty share of DST's shard files and really wrote their
    bytes (its own write counter covers the piece bytes its files hold, per DST's manifest), and
    asked the source for at least those bytes (each output byte comes from a source byte).
    `plan_files`: the "files" of `ckpt reshard --dry-run --json` (file -> bytes_written); None
    (an import that may cast): the source bytes are only checked to be non-zero."""
    dst = pathlib.Path(dst)
    data = {}  # shard file -> piece bytes it holds
    for p in json.loads((dst / "manifest.json").read_text())["pieces"]:
        data[p["file"]] = data.get(p["file"], 0) + p["bytes"]
    assert len({t["pid"] for t in traces}) == len(traces), "two ranks in one process"
    seen = set()
    for t in traces:
        mine = set(t["files"])
        assert t["ok"], t
        assert mine, f"rank {t['rank']} wrote no shard file: {traces}"
        assert not (mine & seen), f"rank {t['rank']} wrote files another rank wrote: {mine & seen}"
        seen |= mine
        size = sum(data[f] for f in mine)
        assert t["io"]["wchar"] >= size, f"rank {t['rank']} wrote {t['io']['wchar']} bytes, its files hold {size}"
        if len(traces) > 1:
            assert size < sum(data.values()), f"rank {t['rank']} holds every file"
        assert t["source_pieces"] and t["source_bytes"] > 0, t
        if plan_files is not None:
            need = sum(plan_files[f] for f in mine)
            assert need == size, (t["rank"], need, size)
            assert need <= t["source_bytes"] <= 2 * need + (1 << 20), (t["rank"], need, t["source_bytes"])
    assert seen == set(data), f"files written by the ranks {sorted(seen)} != DST's files {sorted(data)}"
