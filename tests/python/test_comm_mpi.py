"""ckpt::Comm (reshard/dist/comm.h) under mpirun, through tests/tools/comm_check.cc.

- Every collective and point-to-point operation for float, double and int64 on 1 (with and
  without mpirun), 2 and 3 ranks, against the naive sums / maxima / concatenations of known
  per-rank data (computed by the tool with plain loops; it counts its checks and mismatches).
- LayoutGroups::make on 4 ranks (tp2 dp2, tp2 pp2, pp2 dp2, pp4, tp4, dp4) and 3 ranks (pp3, tp3,
  dp3): each group's world ranks, in order, against rank = (pp_rank*dp + dp_rank)*tp + tp_rank
  computed here; the embedding group is the first and last stage.
- A world size that differs from the layout's: every rank reports WorldSizeMismatch, exit 2.
- Bounded waits: one rank skips a collective; with CKPT_COMM_TIMEOUT_S=2 every rank stops with
  CommTimeout naming the operation, the communicator size and the element count, the job exits
  nonzero within seconds (no hang); the rank that skipped it learns the others' timeout.
- fail_all: rank 1 fails while the others wait in a collective and a recv: every rank prints the
  same message ("rank 1: ...") long before the timeout, and later operations return it at once.
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd  # noqa: E402

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)


def run(tool, n, *args, timeout_s=None, wall=60):
    """comm_check ARGS under `mpirun -np n` (n = 0: directly, without mpirun); (process, seconds)."""
    env = dict(os.environ)
    env.pop("CKPT_COMM_TIMEOUT_S", None)
    if timeout_s is not None:
        env["CKPT_COMM_TIMEOUT_S"] = str(timeout_s)
    cmd = [tool("comm_check"), *args] if n == 0 else mpirun_cmd(n, tool("comm_check"), *args)
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=wall, env=env)
    return p, time.monotonic() - t0


def error_lines(p):
    return [line for line in p.stderr.splitlines() if line.startswith("comm_check: ")]


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_collectives(tool, n):
    p, _ = run(tool, n, "collectives")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "MISMATCH" not in p.stderr, p.stderr
    lines = re.findall(r"rank (\d+) of (\d+) \((mpi|no mpi)\): (\d+) checks, (\d+) mismatches", p.stdout)
    assert sorted(int(r) for r, *_ in lines) == list(range(max(n, 1))), p.stdout
    for _, size, kind, checks, bad in lines:
        assert int(size) == max(n, 1) and kind == ("no mpi" if n == 0 else "mpi")
        # 4 counts x 3 types x 6 operations (7 with send/recv on 2+ ranks) + 7 string/split checks
        assert int(checks) == 4 * 3 * (6 if n <= 1 else 7) + 7 and int(bad) == 0, p.stdout


def expected_groups(tp, pp, dp):
    """Per world rank: its coordinates and the world ranks of its groups, from the rank formula."""
    def rank(p, d, t):
        return (p * dp + d) * tp + t

    out = {}
    for p in range(pp):
        for d in range(dp):
            for t in range(tp):
                ends = pp > 1 and p in (0, pp - 1)
                out[rank(p, d, t)] = {
                    "pp_rank": p, "dp_rank": d, "tp_rank": t,
                    "tp": [rank(p, d, x) for x in range(tp)],
                    "dp": [rank(p, x, t) for x in range(dp)],
                    "pp": [rank(x, d, t) for x in range(pp)],
                    "model": sorted(rank(x, d, y) for x in range(pp) for y in range(tp)),
                    "embedding": [rank(0, d, t), rank(pp - 1, d, t)] if ends else [rank(p, d, t)],
                }
    return out


@pytest.mark.parametrize("n,layouts", [(4, ["2,1,2", "2,2,1", "1,2,2", "1,4,1", "4,1,1", "1,1,4"]),
                                       (3, ["1,3,1", "3,1,1", "1,1,3"])])
def test_layout_groups(tool, n, layouts):
    p, _ = run(tool, n, "groups", *layouts)
    assert p.returncode == 0, p.stdout + p.stderr
    got = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert [g["layout"] for g in got] == layouts
    for g in got:
        tp, pp, dp = map(int, g["layout"].split(","))
        want = expected_groups(tp, pp, dp)
        assert sorted(r["rank"] for r in g["ranks"]) == list(range(n))
        for r in g["ranks"]:
            assert {k: v for k, v in r.items() if k != "rank"} == want[r["rank"]], (g["layout"], r)


def test_world_size_mismatch(tool):
    p, _ = run(tool, 3, "groups", "2,2,1")
    assert p.returncode == 2, p.stderr
    lines = error_lines(p)
    assert len(lines) == 3, p.stderr
    for line in lines:
        assert "[WorldSizeMismatch]" in line and "needs 4 ranks" in line and "3 were started" in line, line


def test_timeout_no_hang(tool):
    p, secs = run(tool, 3, "timeout", timeout_s=2, wall=60)
    assert p.returncode == 4, (p.returncode, p.stderr)
    assert 2 <= secs < 20, secs
    lines = error_lines(p)
    assert len(lines) == 3 and all("[CommTimeout]" in line and "not complete after" in line for line in lines), p.stderr
    # Ranks 1 and 2 wait in the all-reduce rank 0 skipped: the message names it, the size, the count
    # (rank 0, in a recv from 1 s on, normally gets their timeout before its own).
    named = [line for line in lines if "all_reduce_sum (float) on a communicator of 3 ranks, 1000 elements" in line]
    assert len(named) >= 2, p.stderr


def test_fail_all_same_message_everywhere(tool):
    p, secs = run(tool, 3, "fail", timeout_s=60, wall=60)
    assert p.returncode == 4, (p.returncode, p.stderr)
    assert secs < 20, f"{secs:.1f} s: the failure did not reach the waiting ranks before the timeout"
    lines = error_lines(p)
    assert lines == ["comm_check: I/O error [Io] file 'shard.h5': rank 1: the disk is on fire"] * 3, p.stderr
    assert "LATER DIFFERS" not in p.stderr, p.stderr
