"""`mpirun -np 2` and `-np 3` (oversubscribed) `ckpt reshard` give byte-identical output to one
process: the same manifest.json, the same shard files byte for byte, the same values (numpy
reference). Skipped with a message when mpirun is not installed."""
import hashlib
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import megatron_reference as ref  # noqa: E402
from test_reshard_cli import CFG_GQA, check_against_reference, layout_args, model  # noqa: E402

MPIRUN = shutil.which("mpirun")


def digest(d):
    d = pathlib.Path(d)
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not found: install openmpi-bin to run the distributed reshard test")
def test_mpi_ranks_byte_identical(tool, ckpt_bin, run_ckpt, tmp_path):
    cfg = dict(CFG_GQA, hidden_size=32, intermediate_size=48, vocab_size=97)
    tensors = model(cfg, seed=5)
    src = tmp_path / "src"
    ref.write_native_store(tool("store_write_tool"), tmp_path / "spec", src, cfg, tensors)
    mid = tmp_path / "mid"  # a sharded source, so ranks read pieces of several files
    run_ckpt("reshard", src, mid, *layout_args(2, [1, 3], 2, 1))
    src_digest = digest(mid)
    target = layout_args(4, [2, 1, 1], 2, 1)
    one = tmp_path / "np1"
    run_ckpt("reshard", mid, one, *target)
    outs = {1: digest(one)}
    for n in (2, 3):
        dst = tmp_path / f"np{n}"
        cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader", "-np", str(n),
               ckpt_bin, "reshard", str(mid), str(dst), *map(str, target)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{' '.join(cmd)}\n{p.stdout}\n{p.stderr}"
        assert not pathlib.Path(str(dst) + ".partial").exists()
        outs[n] = digest(dst)
        j = json.loads(subprocess.run([ckpt_bin, "reshard", str(mid), str(tmp_path / "x"), *map(str, target),
                                       "--dry-run", "--json"], capture_output=True, text=True, check=True).stdout)
        assert len(j["files"]) >= n  # every process had a file to write
    assert outs[2] == outs[1], "mpirun -np 2 output differs from one process"
    assert outs[3] == outs[1], "mpirun -np 3 output differs from one process"
    check_against_reference(tmp_path / "np3", cfg, tensors, 4, [2, 1, 1], 2, 1, 128)
    assert digest(mid) == src_digest, "SRC was modified"
    assert np.all([k.startswith("shards/") or k == "manifest.json" for k in outs[1]])
