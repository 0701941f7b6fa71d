"""Faults: `ckpt reshard` SIGKILLed at random moments (planning, writing shards, re-hashing SRC,
finalizing) never leaves a DST that is not a complete, verified checkpoint; at most a
`DST.partial` that ckpt refuses to take for a checkpoint and the next run replaces; SRC is never
modified (sha256 of every file before and after). CKPT_LONG=1 kills 40 times instead of 10.
Half the kills are drawn inside the window where DST.partial exists (measured on a clean run) and
at least a quarter must land mid-write (DST.partial holding shard bytes after the kill), so the
test cannot pass on kills that all miss the write phase. The SRC re-hash child must not outlive
its parent: when it is alive at a kill, it is stopped first (SIGSTOP, as a child busy hashing),
then the parent is killed; the child must be gone within 5 s."""
import hashlib
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import megatron_reference as ref  # noqa: E402
from test_reshard_cli import BASE, model  # noqa: E402

CFG = dict(BASE, vocab_size=500, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
           num_attention_heads=8, num_key_value_heads=4, head_dim=16, torch_dtype="float32")


def digest(d):
    d = pathlib.Path(d)
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def _children(pid):
    """Child processes of `pid`, whichever of its threads forked them."""
    kids = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def _alive_after(pids, secs):
    """The pids still alive (not gone, not a zombie) after up to `secs` seconds."""
    deadline = time.monotonic() + secs
    while True:
        alive = []
        for k in pids:
            try:
                state = pathlib.Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state not in ("Z", "X"):
                alive.append(k)
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


def _partial_window(cmd, partial):
    """(first, last) seconds after the start at which a clean run had DST.partial, or None."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen = []
    while p.poll() is None:
        if partial.exists():
            seen.append(time.monotonic() - t0)
        time.sleep(0.0005)
    assert p.returncode == 0
    return (seen[0], seen[-1]) if seen else None


def test_sigkill_at_random_moments(tool, ckpt_bin, run_ckpt, tmp_path):
    tensors = model(CFG, seed=11)  # ~9 MB with optimizer state
    flat = tmp_path / "flat"
    ref.write_native_store(tool("store_write_tool"), tmp_path / "spec", flat, CFG, tensors)
    src = tmp_path / "src"
    run_ckpt("reshard", flat, src, "--tp", 2, "--pp", 2, "--dp", 2, "--zero", 1)
    before = digest(src)
    dst = tmp_path / "dst"
    partial = pathlib.Path(str(dst) + ".partial")
    cmd = [ckpt_bin, "reshard", str(src), str(dst), "--tp", "4", "--pp", "3", "--pp-layers", "1,2,1", "--dp", "1",
           "--zero", "1", "--max-memory", "8M", "--threads", "2"]
    t0 = time.monotonic()
    subprocess.run(cmd, check=True, capture_output=True)
    full = time.monotonic() - t0
    reference = digest(dst)
    subprocess.run(["rm", "-rf", str(dst)], check=True)

    window = _partial_window(cmd, partial)
    subprocess.run(["rm", "-rf", str(dst)], check=True)
    rng = random.Random(1234)
    kills = 40 if os.environ.get("CKPT_LONG") else 10
    outcomes = {"none": 0, "partial": 0, "complete": 0, "mid_write": 0, "verify_child": 0}
    for i in range(kills):
        lo, hi = window if (i % 2 and window) else (0.0, full * 1.1)
        delay = rng.uniform(lo, hi)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        kids = _children(p.pid)
        for k in kids:
            try:
                os.kill(k, signal.SIGSTOP)  # a child still busy when its parent dies
            except ProcessLookupError:
                pass
        p.send_signal(signal.SIGKILL)
        p.wait()
        outcomes["verify_child"] += bool(kids)
        survivors = _alive_after(kids, 5.0)
        for k in survivors:
            os.kill(k, signal.SIGKILL)  # do not leave it behind
        assert not survivors, f"kill {i} at {delay:.3f}s: the SRC verify child {survivors} outlived its parent"
        if dst.exists():
            # Killed after the rename: DST must be the complete, verified result.
            outcomes["complete"] += 1
            assert run_ckpt("verify", dst, check=False).returncode == 0
            assert digest(dst) == reference, f"kill {i} at {delay:.3f}s: DST differs from a clean run"
            subprocess.run(["rm", "-rf", str(dst)], check=True)
        elif partial.exists():
            outcomes["partial"] += 1
            outcomes["mid_write"] += any(f.stat().st_size > 0 for f in partial.glob("shards/*"))
            # Never taken for a checkpoint, by any command that reads one.
            for args in (("verify", partial), ("inspect", partial), ("diff", partial, src),
                         ("reshard", partial, tmp_path / "never", "--tp", 1, "--pp", 1, "--dp", 1)):
                q = run_ckpt(*args, check=False)
                assert q.returncode not in (0, 1), f"kill {i}: `ckpt {args[0]}` took {partial} ({q.returncode})"
            assert not (tmp_path / "never").exists()
        else:
            outcomes["none"] += 1
        assert digest(src) == before, f"kill {i} at {delay:.3f}s modified SRC"
    print("outcomes:", outcomes, f"full run {full:.2f}s, DST.partial window {window}")
    assert outcomes["mid_write"] >= kills // 4, f"too few kills landed mid-write: {outcomes}"
    assert outcomes["verify_child"] >= 1, f"no kill found the SRC verify child alive: {outcomes}"
    # The next run replaces any stale partial output and gives the clean result.
    subprocess.run(cmd, check=True, capture_output=True)
    assert digest(dst) == reference and not partial.exists()
    assert digest(src) == before
