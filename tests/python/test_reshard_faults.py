"""Faults: `ckpt reshard` SIGKILLed at random moments (planning, writing shards, re-hashing SRC,
finalizing) never leaves a DST that is not a complete, verified checkpoint; at most a
`DST.partial` that ckpt refuses to take for a checkpoint and the next run replaces; SRC is never
modified (sha256 of every file before and after). CKPT_LONG=1 kills 40 times instead of 10."""
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

    rng = random.Random(1234)
    kills = 40 if os.environ.get("CKPT_LONG") else 10
    outcomes = {"none": 0, "partial": 0, "complete": 0}
    for i in range(kills):
        delay = rng.uniform(0.0, full * 1.1)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if dst.exists():
            # Killed after the rename: DST must be the complete, verified result.
            outcomes["complete"] += 1
            assert run_ckpt("verify", dst, check=False).returncode == 0
            assert digest(dst) == reference, f"kill {i} at {delay:.3f}s: DST differs from a clean run"
            subprocess.run(["rm", "-rf", str(dst)], check=True)
        elif partial.exists():
            outcomes["partial"] += 1
            # Never taken for a checkpoint, by any command that reads one.
            for args in (("verify", partial), ("inspect", partial), ("diff", partial, src),
                         ("reshard", partial, tmp_path / "never", "--tp", 1, "--pp", 1, "--dp", 1)):
                q = run_ckpt(*args, check=False)
                assert q.returncode not in (0, 1), f"kill {i}: `ckpt {args[0]}` took {partial} ({q.returncode})"
            assert not (tmp_path / "never").exists()
        else:
            outcomes["none"] += 1
        assert digest(src) == before, f"kill {i} at {delay:.3f}s modified SRC"
    # The next run replaces any stale partial output and gives the clean result.
    subprocess.run(cmd, check=True, capture_output=True)
    assert digest(dst) == reference and not partial.exists()
    assert digest(src) == before
    print("outcomes:", outcomes, f"full run {full:.2f}s")
