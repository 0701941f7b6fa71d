"""Peak memory of the streaming commands: `ckpt from-hf`, `ckpt reshard` and `ckpt to-hf` with
`--max-memory 64M` on checkpoints larger than that (~150 MB and ~310 MB of float32), in every
`--io` mode:

- budget: the peak resident set of the command (its own and its children's, from wait4) stays
  within BUDGET_MIB;
- constant: the peak on the 2x input is within a small margin of the peak on the 1x input, so
  nothing grows with the checkpoint's size (a whole tensor or file held in memory, a leak per
  piece).
The largest tensor (16 MiB) is far below both inputs; what varies is the number of layers.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

pytestmark = pytest.mark.memory
MAX_MEMORY = "64M"
# --max-memory is the whole process's budget: the commands reserve 48 MiB of it for the store
# writer, HDF5 and the process; the rest is chunk buffers. Measured: 25-50 MiB.
BUDGET_MIB = 64
MARGIN_MIB = 8  # 2x input vs 1x input
# Every --io mode: direct reads and writes hold their own buffers (once 165-310 MiB at 64M on a
# 3 GB reshard: malloc kept freed direct-read buffers, formats/io/io_buffer.h).
IO_MODES = ("auto", "buffered", "direct")
# Compressed stores, written and read on --threads 2 (the default), at a budget above their fixed
# costs (the writer's chunks in flight, each decoding thread's chunk and zstd context: a
# compressed -> compressed reshard needs ~100 MiB, docs/BENCHMARKS.md): the chunks in flight count
# in the budget (once 2 x threads + 1 of them on top of it).
CODEC_THREADS = 2
COMPRESSED_MAX_MEMORY, COMPRESSED_BUDGET_MIB = "128M", 128


def _config(layers):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "vocab_size": 4096, "hidden_size": 1024, "intermediate_size": 2048, "num_hidden_layers": layers,
            "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False,
            "torch_dtype": "float32"}


def _hf_dir(path, layers, rng):
    """A HuggingFace directory with one safetensors file per layer (about 40 MB each)."""
    cfg = _config(layers)
    h, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]

    def r(*shape):
        return rng.random(shape, dtype=np.float32)

    files = {"model-embed.safetensors": {"model.embed_tokens.weight": r(V, h), "lm_head.weight": r(V, h),
                                         "model.norm.weight": r(h)}}
    for i in range(layers):
        p = f"model.layers.{i}."
        files[f"model-layer{i}.safetensors"] = {
            p + "input_layernorm.weight": r(h), p + "post_attention_layernorm.weight": r(h),
            **{p + f"self_attn.{k}_proj.weight": r(h, h) for k in "qkvo"},
            p + "mlp.gate_proj.weight": r(f, h), p + "mlp.up_proj.weight": r(f, h), p + "mlp.down_proj.weight": r(h, f)}
    path.mkdir()
    weight_map, total = {}, 0
    for name, tensors in files.items():
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        for k, v in tensors.items():
            weight_map[k] = name
            total += v.nbytes
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                   "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(cfg))
    return total


# The peak RSS of a process starts at that of the process it was forked from (the kernel keeps
# the larger of the two across exec), and this test's Python holds hundreds of MB of numpy
# arrays: ckpt is started by a small launcher (python -I -S, ~9 MB) that reports wait4's ru_maxrss.
_LAUNCHER = """import os, sys
pid = os.fork()
if pid == 0:
    fd = os.open(os.environ.get("CKPT_MEMORY_STDOUT", os.devnull), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.execv(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
print(ru.ru_maxrss)
sys.exit(os.waitstatus_to_exitcode(status) & 255)
"""


def _run_measured(ckpt_bin, args, stdout_path=None):
    env = dict(os.environ, **({"CKPT_MEMORY_STDOUT": str(stdout_path)} if stdout_path else {}))
    p = subprocess.run([sys.executable, "-I", "-S", "-c", _LAUNCHER, ckpt_bin, *map(str, args)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, f"ckpt {args} exited {p.returncode}: {p.stderr}"
    return int(p.stdout.split()[-1]) / 1024.0, p.stderr  # KiB on Linux


def _peak_mib(ckpt_bin, *args):
    """Runs ckpt ARGS; returns its peak RSS in MiB (ru_maxrss of ckpt and its children)."""
    return _run_measured(ckpt_bin, args)[0]


def test_peak_rss_within_budget_and_constant(ckpt_bin, tmp_path):
    if os.environ.get("CKPT_SANITIZE") == "ON":
        pytest.skip("ASan's shadow memory and quarantine are not ckpt's")
    rng = np.random.default_rng(0)
    peaks = {}
    for scale, layers in (("1x", 3), ("2x", 7)):
        d = tmp_path / scale
        d.mkdir()
        size = _hf_dir(d / "hf", layers, rng)
        assert size > 2 * 64 << 20
        peaks[scale] = {}
        for io in IO_MODES:
            mm = ["--max-memory", MAX_MEMORY, "--io", io]
            peaks[scale].update({
                f"from-hf --io {io}": _peak_mib(ckpt_bin, "from-hf", d / "hf", d / f"native_{io}", *mm, "--no-fsync"),
                f"reshard --io {io}": _peak_mib(ckpt_bin, "reshard", d / f"native_{io}", d / f"tp2_{io}", "--tp", 2, "--pp", 1,
                                                "--dp", 1, *mm),
                f"to-hf --io {io}": _peak_mib(ckpt_bin, "to-hf", d / f"tp2_{io}", d / f"out_{io}", *mm, "--no-fsync"),
            })
        zc = ["--max-memory", COMPRESSED_MAX_MEMORY, "--threads", CODEC_THREADS, "--compress", "shuffle+zstd:1"]
        peaks[scale].update({
            "from-hf --compress": _peak_mib(ckpt_bin, "from-hf", d / "hf", d / "zstd", *zc, "--no-fsync"),
            "reshard --compress": _peak_mib(ckpt_bin, "reshard", d / "zstd", d / "zstd_tp2", "--tp", 2, "--pp", 1, "--dp", 1, *zc),
            "to-hf (compressed)": _peak_mib(ckpt_bin, "to-hf", d / "zstd_tp2", d / "zstd_out", *zc[:4], "--no-fsync"),
        })
        print(f"{scale}: {size / 2**20:.0f} MiB of tensors, peak RSS (MiB) " +
              ", ".join(f"{k} {v:.1f}" for k, v in peaks[scale].items()))
    for cmd in peaks["1x"]:
        one, two = peaks["1x"][cmd], peaks["2x"][cmd]
        budget = COMPRESSED_BUDGET_MIB if "compress" in cmd else BUDGET_MIB
        assert max(one, two) <= budget, f"{cmd}: peak RSS {max(one, two):.1f} MiB > {budget} MiB"
        assert two <= one + MARGIN_MIB, f"{cmd}: peak RSS grows with the input: {one:.1f} -> {two:.1f} MiB"


# Below a job's floor (its fixed buffers + 4 MiB of chunks, converters/jobs/memory_fit.h) --max-memory
# cannot be kept: the job runs at its floor, says so on stderr and reports the floor in --json.
# Compressed outputs and sources at 64M are below theirs on --threads 2 (84-114 MiB).
FLOOR_MARGIN_MIB = 8


def test_below_the_floor_runs_at_the_floor_and_says_so(ckpt_bin, tmp_path):
    if os.environ.get("CKPT_SANITIZE") == "ON":
        pytest.skip("ASan's shadow memory and quarantine are not ckpt's")
    _hf_dir(tmp_path / "hf", 3, np.random.default_rng(1))
    zc = ["--threads", CODEC_THREADS, "--compress", "shuffle+zstd:1", "--json"]
    mm = ["--max-memory", MAX_MEMORY]
    jobs = [("from-hf --compress", ["from-hf", tmp_path / "hf", tmp_path / "zstd", *mm, *zc, "--no-fsync"]),
            ("reshard --compress", ["reshard", tmp_path / "zstd", tmp_path / "zstd_tp2", "--tp", 2, "--pp", 1, "--dp", 1, *mm, *zc]),
            ("to-hf (compressed)", ["to-hf", tmp_path / "zstd_tp2", tmp_path / "out", *mm, *zc[:2], "--json", "--no-fsync"]),
            ("to-hf (compressed, threads 4)", ["to-hf", tmp_path / "zstd_tp2", tmp_path / "out4", *mm, "--threads", 4, "--json",
                                               "--no-fsync"])]
    floors = []
    for name, args in jobs:
        peak, err = _run_measured(ckpt_bin, args, tmp_path / "out.json")
        mem = json.loads((tmp_path / "out.json").read_text())["memory"]
        floor_mib = mem["floor"] / 2**20
        floors.append(floor_mib)
        assert mem["max_memory"] == 64 << 20, (name, mem)
        if floor_mib > 64:
            assert f"--max-memory 64 MiB is below the {int(-(-mem['floor'] // 2**20))} MiB" in err, (name, err)
        else:
            assert "note:" not in err, (name, err)
        print(f"{name}: peak {peak:.1f} MiB, floor {floor_mib:.0f} MiB")
        assert peak <= max(64, floor_mib) + FLOOR_MARGIN_MIB, f"{name}: peak RSS {peak:.1f} MiB > max(64, floor {floor_mib:.0f}) MiB"
    assert max(floors) > 64, f"no job below its floor at 64M: {floors}"  # else the notes and bounds go untested


# --io direct reads the sources of its copies ahead across pieces (formats/io/source_blocks.h) in what
# --max-memory leaves beside the writer, the copying threads' stages and 32 MiB of chunks: at 256M
# that is 160 MiB of 8 MiB blocks, which a 2x source (~310 MiB) fills. The peak stays in the budget.
READ_AHEAD_MAX_MEMORY, READ_AHEAD_BUDGET_MIB = "256M", 256


def test_direct_read_ahead_stays_in_the_budget(ckpt_bin, tmp_path):
    if os.environ.get("CKPT_SANITIZE") == "ON":
        pytest.skip("ASan's shadow memory and quarantine are not ckpt's")
    size = _hf_dir(tmp_path / "hf", 7, np.random.default_rng(2))
    mm = ["--max-memory", READ_AHEAD_MAX_MEMORY, "--io", "direct", "--json"]
    jobs = [("from-hf --io direct", ["from-hf", tmp_path / "hf", tmp_path / "native", *mm, "--no-fsync"]),
            ("reshard --io direct", ["reshard", tmp_path / "native", tmp_path / "tp2", "--tp", 2, "--pp", 1, "--dp", 1, *mm])]
    for name, args in jobs:
        peak, err = _run_measured(ckpt_bin, args, tmp_path / "out.json")
        mem = json.loads((tmp_path / "out.json").read_text())["memory"]
        print(f"{name}: peak {peak:.1f} MiB, read-ahead {mem['read_ahead'] / 2**20:.0f} MiB of {size / 2**20:.0f} MiB read")
        assert mem["read_ahead"] >= 128 << 20, (name, mem)  # the read-ahead is on, and larger than ...
        assert size > mem["read_ahead"], (name, size, mem)  # ... what it can hold at once
        assert mem["floor"] < 128 << 20, (name, mem)  # the read-ahead is not part of the floor
        assert peak <= READ_AHEAD_BUDGET_MIB + MARGIN_MIB, f"{name}: peak RSS {peak:.1f} MiB > {READ_AHEAD_BUDGET_MIB} MiB"
        assert "note:" not in err, (name, err)
