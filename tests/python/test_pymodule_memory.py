"""Peak memory of Checkpoint.state_dict(layout, rank): reading one rank's shard of a native store
several times larger than the shard (136 MiB of float32 weights; the shard of rank 0 under
tp2 pp4 is 19 MiB) grows the process's peak resident set by at most the shard's bytes plus a
small constant. Measured in a fresh interpreter (VmRSS after open() as the base, the VmHWM
high-water mark after the read as the peak), so this test's own arrays do not count. The same
script reading every tensor whole shows the measure can fail (its growth is the whole store).
"""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import megatron_reference as ref  # noqa: E402
from pymodule_helpers import import_ckpt  # noqa: E402
from test_reshard_cli import BASE  # noqa: E402

pytestmark = pytest.mark.memory
CONSTANT_MIB = 16  # HDF5's caches, the plan, the dict, allocator slack

CFG = dict(BASE, vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=12,
           num_attention_heads=8, num_key_value_heads=8, head_dim=64, torch_dtype="float32")

# The child's peak is its mm's high-water mark (VmHWM, reset to the current RSS through clear_refs
# after open()): ru_maxrss would start at this test process's own peak (kept across fork + exec).
_SCRIPT = """import json, sys
sys.path.insert(0, sys.argv[1])
import ckpt


def status(key):
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith(key + ":"))


ck = ckpt.open(sys.argv[2])
layout = json.loads(sys.argv[3])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
sd = ck.state_dict(layout=layout, rank=0) if layout else ck.state_dict()
print(json.dumps({"base": base, "peak": status("VmHWM"), "bytes": sum(v.nbytes for v in sd.values()), "n": len(sd)}))
"""


@pytest.fixture(scope="module")
def big_store(tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("mem")
    rng = np.random.default_rng(0)
    t = ref.make_hf_model(CFG, rng, np.float32)
    ref.write_native_store(tool("store_write_tool"), d / "spec", d / "ck", CFG, t)
    for f in (d / "spec").glob("*.bin"):
        f.unlink()
    return d / "ck", sum(v.nbytes for v in t.values())


def _measure(path, layout):
    ckpt = import_ckpt()
    build_py = str(pathlib.Path(ckpt.__file__).resolve().parent.parent)
    p = subprocess.run([sys.executable, "-c", _SCRIPT, build_py, str(path), json.dumps(layout)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_rank_shard_within_shard_plus_constant(big_store):
    path, total = big_store
    r = _measure(path, {"tp": 2, "pp": 4, "dp": 1})
    growth = r["peak"] - r["base"]
    mib = 1 << 20
    print(f"store {total / mib:.1f} MiB, rank 0 shard {r['bytes'] / mib:.1f} MiB ({r['n']} tensors), "
          f"peak growth {growth / mib:.1f} MiB")
    assert total > 5 * r["bytes"], "the store must be several times the shard"
    assert growth <= r["bytes"] + CONSTANT_MIB * mib, \
        f"peak grew {growth / mib:.1f} MiB for a {r['bytes'] / mib:.1f} MiB shard of a {total / mib:.1f} MiB store"
    # The measure sees a whole-store read.
    w = _measure(path, None)
    assert w["peak"] - w["base"] >= 0.9 * total
