"""Errors of the Python module raise the ckpt.Error subclass of their kind, with a message (and the
.file / .tensor attributes) naming what is wrong, and never crash the interpreter:

 * a missing tensor -> NotFoundError (a LookupError) naming it; a missing path -> NotFoundError;
   a directory of no known kind -> UnsupportedError listing the kinds;
 * a box outside the tensor, of the wrong rank, or with a step -> InvalidArgumentError (ValueError);
 * a corrupt file: a manifest that is not JSON, a truncated safetensors file, a shard file that is
   not HDF5, a flipped byte in a compressed piece -> CorruptionError / ChecksumError / IoError
   naming the file;
 * a cast that overflows -> CastOverflowError naming the tensor (saturate=True clamps);
 * state_dict: a checkpoint without model_config, a rank outside the layout, a layout the model
   refuses, a bad layout string -> errors naming them;
 * reads release the GIL: another Python thread runs while a large read is in progress.
"""
import json
import pathlib
import shutil
import sys
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from pymodule_helpers import import_ckpt, write_store  # noqa: E402

ckpt = import_ckpt()


@pytest.fixture(scope="module")
def store(tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("err")
    rng = np.random.default_rng(0)
    t = {"w": rng.standard_normal((16, 8)).astype(np.float32), "big": np.full((4,), 1e6, dtype=np.float32)}
    write_store(tool("store_write_tool"), d / "spec", d / "ck", t, {"note": 1}, ranks=2,
                splits={"w": ("rows", 2)})
    return d / "ck"


def _attrs(e):
    assert isinstance(e, ckpt.Error)
    return e.kind, e.code, e.file, e.tensor, e.message


def test_missing_tensor_and_path(store, tmp_path):
    with ckpt.open(store) as ck:
        with pytest.raises(ckpt.NotFoundError, match="no_such_tensor") as ei:
            ck.read("no_such_tensor")
        assert isinstance(ei.value, LookupError)
        kind, _, _, tensor, _ = _attrs(ei.value)
        assert kind == "not found" and tensor == "no_such_tensor"
        with pytest.raises(ckpt.NotFoundError):
            ck.read_torch("also.missing")
    with pytest.raises(ckpt.NotFoundError, match="nowhere"):
        ckpt.open(tmp_path / "nowhere")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("x")
    with pytest.raises(ckpt.UnsupportedError, match="safetensors"):
        ckpt.open(tmp_path / "junk")


def test_box_outside_the_tensor(store):
    with ckpt.open(store) as ck:
        for box in (([0, 0], [17, 8]), ([15, 0], [2, 8]), ([0, -1], [1, 1]), ([0], [1]),
                    (slice(0, 17),), (slice(3, 2),), (slice(None), slice(0, 9))):
            with pytest.raises(ckpt.InvalidArgumentError, match="'w'") as ei:
                ck.read("w", box=box)
            assert isinstance(ei.value, ValueError) and ei.value.tensor == "w", box
        with pytest.raises(ckpt.InvalidArgumentError, match="step"):
            ck.read("w", box=(slice(0, 8, 2),))
        with pytest.raises(ckpt.InvalidArgumentError, match="dtype"):
            ck.read("w", dtype="float7")


def test_cast_overflow_names_the_tensor(store):
    with ckpt.open(store) as ck:
        with pytest.raises(ckpt.CastOverflowError, match="big") as ei:
            ck.read("big", dtype="float16")
        assert ei.value.tensor == "big" and isinstance(ei.value, ArithmeticError)
        assert np.array_equal(ck.read("big", dtype="float16", saturate=True), np.full(4, 65504, np.float16))


def test_corrupt_manifest(store, tmp_path):
    bad = tmp_path / "bad_manifest"
    shutil.copytree(store, bad)
    (bad / "manifest.json").write_text("{ not json")
    with pytest.raises(ckpt.CorruptionError, match="manifest.json") as ei:
        ckpt.open(bad)
    assert "manifest.json" in ei.value.file or "manifest.json" in ei.value.message


def test_corrupt_shard_file(store, tmp_path):
    bad = tmp_path / "bad_shard"
    shutil.copytree(store, bad)
    m = json.loads((bad / "manifest.json").read_text())
    shard = bad / m["pieces"][0]["file"]
    shard.write_bytes(b"\x00garbage" * (shard.stat().st_size // 8))
    with pytest.raises((ckpt.CorruptionError, ckpt.IoError)) as ei:
        with ckpt.open(bad) as ck:
            ck.read(m["pieces"][0]["tensor"])
    assert m["pieces"][0]["file"].split("/")[-1] in str(ei.value), str(ei.value)


def test_flipped_byte_in_compressed_piece(tool, tmp_path):
    rng = np.random.default_rng(1)
    t = {"w": rng.standard_normal((64, 64)).astype(np.float32)}
    d = write_store(tool("store_write_tool"), tmp_path / "spec", tmp_path / "z", t, ranks=1, codec="zstd")
    m = json.loads((d / "manifest.json").read_text())
    shard = d / m["pieces"][0]["file"]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # inside the compressed chunks
    shard.write_bytes(bytes(raw))
    with pytest.raises((ckpt.CorruptionError, ckpt.ChecksumError, ckpt.IoError)) as ei:
        with ckpt.open(d) as ck:
            ck.read("w")
    assert shard.name in str(ei.value), str(ei.value)


def test_truncated_safetensors(tmp_path):
    f = tmp_path / "m.safetensors"
    save_file({"a": np.arange(100, dtype=np.float32)}, str(f))
    raw = f.read_bytes()
    f.write_bytes(raw[:-40])
    with pytest.raises(ckpt.CorruptionError, match="m.safetensors") as ei:
        with ckpt.open(f) as ck:
            ck.read("a")
    assert "m.safetensors" in ei.value.file or "m.safetensors" in ei.value.message
    f.write_bytes(b"\xff" * 8 + b"{}")  # header length far beyond the file
    with pytest.raises(ckpt.CorruptionError, match="m.safetensors"):
        ckpt.open(f)


def test_state_dict_errors(store, tool, tmp_path):
    with ckpt.open(store) as ck:
        with pytest.raises(ckpt.Error, match="model_config"):
            ck.state_dict(layout={"tp": 2, "pp": 1}, rank=0)
        with pytest.raises(ckpt.InvalidArgumentError, match="unknown key"):
            ck.state_dict(layout="tp=2 colour=blue", rank=0)
        with pytest.raises(ckpt.InvalidArgumentError):
            ck.state_dict(layout=3, rank=0)


def test_reads_release_the_gil(tool, tmp_path):
    """Another Python thread runs while the main thread is inside a large read: with the GIL held
    from before t0 to after t1 it could not record a time between them."""
    n = 6 << 20  # 24 MiB of f32, compressed, read as f16 (decode and a cast over every element)
    d = write_store(tool("store_write_tool"), tmp_path / "spec", tmp_path / "big",
                    {"w": np.random.default_rng(2).standard_normal(n).astype(np.float32)}, ranks=1,
                    codec="shuffle+zstd")
    stamps, stop, started = [], threading.Event(), threading.Event()

    def spin():
        started.set()
        i = 0
        while not stop.is_set():
            i += 1
            if i % 256 == 0:
                stamps.append(time.perf_counter())

    inside = 0
    with ckpt.open(d) as ck:
        th = threading.Thread(target=spin)
        th.start()
        started.wait()
        try:
            for _ in range(3):
                t0 = time.perf_counter()
                ck.read("w", dtype="float16")
                t1 = time.perf_counter()
                inside += sum(1 for s in list(stamps) if t0 < s < t1)
        finally:
            stop.set()
            th.join()
    assert inside > 0, "no other thread ran during three large reads: the GIL was held"
