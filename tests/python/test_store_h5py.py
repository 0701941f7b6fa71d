"""Interop of the native store with h5py + hdf5plugin (filter 32015 "Zstandard").

1. ckpt writes (tests/tools/store_write_tool, compressed with shuffle + zstd and plain, with each
   piece digest), h5py reads every shard dataset; the tensors reassembled from the manifest equal
   the numpy source, and every piece's digest equals Python's hashlib.sha256 /
   xxhash.xxh3_128 of the bytes h5py read.
2. h5py + hdf5plugin write a store (manifest made here with hashlib or xxhash, in format version 1
   with "sha256" or version 2 with "digest"); `ckpt verify` and `ckpt inspect` accept it, and
   flipping one data byte makes verify fail naming the tensor.
3. Compressed writes on several pool threads, in whole pieces or odd slabs, give shard files
   byte-identical to one-thread writes, which h5py + hdf5plugin read back as the sources.
"""
import hashlib
import json
import shutil

import h5py
import hdf5plugin  # noqa: F401  (registers filter 32015 with h5py)
import numpy as np
import pytest
import xxhash
from native_h5py import read_native  # scripts/: h5py + hashlib + xxhash only, no ckpt code

HASH = {"sha256": lambda b: hashlib.sha256(b).hexdigest(), "xxh3-128": xxhash.xxh3_128_hexdigest}

ZSTD_ID = 32015
SHUFFLE_ID = 2


def bf16_bits(a):
    """float32 -> bf16 bit patterns (round to nearest even), as uint16."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return u.astype(np.uint16)


def make_sources(rng):
    return {
        "model.embed_tokens.weight": ("BF16", bf16_bits(rng.normal(0, 0.02, (100, 64)))),
        "model.layers.0.self_attn.q_proj.weight": ("F32", rng.normal(0, 0.02, (64, 64)).astype(np.float32)),
        "optimizer.exp_avg.model.norm.weight": ("F32", rng.normal(0, 1e-3, (64,)).astype(np.float32)),
        "counts": ("I64", rng.integers(-2**62, 2**62, (7, 3, 5), dtype=np.int64)),
        "half": ("F16", rng.normal(0, 1, (33, 17)).astype(np.float16)),
        "bytes": ("U8", rng.integers(0, 256, (1000,), dtype=np.uint8)),
    }


SPLITS = {"model.embed_tokens.weight": ("rows", 3), "model.layers.0.self_attn.q_proj.weight": ("cols", 2),
          "optimizer.exp_avg.model.norm.weight": ("flat", 3), "counts": ("flat", 4), "half": ("rows", 2),
          "bytes": ("whole", 1)}

NP_VIEW = {"BF16": np.uint16, "F16": np.uint16, "F32": np.float32, "I64": np.int64, "U8": np.uint8}


def write_with_tool(tool, tmp_path, sources, codec, ranks=2, digest="xxh3-128", threads=1, slab=0, tag=""):
    tensors = []
    for name, (dt, arr) in sources.items():
        raw = tmp_path / (name + ".bin")
        np.ascontiguousarray(arr).tofile(raw)
        split, parts = SPLITS[name]
        tensors.append({"name": name, "dtype": dt, "shape": list(arr.shape), "data": str(raw), "split": split,
                        "parts": parts})
    dst = tmp_path / ("store_" + codec.replace("+", "_") + "_" + digest + tag)
    spec = {"dst": str(dst), "codec": codec, "level": 1, "chunk_bytes": 4096, "ranks": ranks, "digest": digest,
            "threads": threads, "slab": slab,
            "metadata": {"profile": "reference", "layout": {"tp": 2}}, "tensors": tensors}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    import subprocess
    p = subprocess.run([tool("store_write_tool"), str(tmp_path / "spec.json")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return dst


@pytest.mark.parametrize("digest", ["xxh3-128", "sha256"])
@pytest.mark.parametrize("codec", ["shuffle+zstd", "none"])
def test_h5py_reads_ckpt_shards(tool, run_ckpt, tmp_path, codec, digest):
    rng = np.random.default_rng(0)
    sources = make_sources(rng)
    dst = write_with_tool(tool, tmp_path, sources, codec, digest=digest)
    man, got, filters = read_native(dst)  # raises if a digest differs from Python's
    assert man["version"] == 4
    with h5py.File(dst / man["pieces"][0]["file"], "r") as f:  # and checked here too, explicitly
        for p in (q for q in man["pieces"] if q["file"] == man["pieces"][0]["file"]):
            raw = np.ascontiguousarray(f[p["dataset"]][...]).tobytes()
            assert p["digest"] == f"{digest}:{HASH[digest](raw)}", p["tensor"]
            assert "sha256" not in p
    for name, (dt, arr) in sources.items():
        assert got[name].dtype == NP_VIEW[dt]
        np.testing.assert_array_equal(got[name].view(arr.dtype) if arr.dtype != got[name].dtype else got[name], arr,
                                      err_msg=name)
    if codec == "shuffle+zstd":
        assert ZSTD_ID in filters and SHUFFLE_ID in filters
    else:
        assert not filters
    run_ckpt("verify", dst)
    info = json.loads(run_ckpt("inspect", dst, "--json").stdout)
    assert info["totals"]["tensors"] == len(sources)
    assert info["totals"]["bytes"] == sum(a.nbytes for _, a in sources.values())
    assert info["layout"] == {"tp": 2}


def test_threaded_compressed_writes_are_byte_identical(tool, tmp_path):
    """Chunks compressed on 3 pool threads, written in odd slabs (chunks straddling write() calls,
    staged) and in one call per piece (whole chunks shuffled from the caller's buffer): every shard
    file equals the one-thread write byte for byte, and h5py + hdf5plugin read the sources back."""
    rng = np.random.default_rng(5)
    sources = make_sources(rng)
    one = write_with_tool(tool, tmp_path, sources, "shuffle+zstd", threads=1, tag="_t1")
    for threads, slab in ((3, 0), (3, 37), (2, 1000)):
        many = write_with_tool(tool, tmp_path, sources, "shuffle+zstd", threads=threads, slab=slab, tag=f"_t{threads}_{slab}")
        files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(many) for p in many.rglob("*") if p.is_file())
        for f in files:
            assert (one / f).read_bytes() == (many / f).read_bytes(), (threads, slab, f)
        _, got, filters = read_native(many)
        assert ZSTD_ID in filters and SHUFFLE_ID in filters
        for name, (dt, arr) in sources.items():
            np.testing.assert_array_equal(got[name].view(arr.dtype) if arr.dtype != got[name].dtype else got[name], arr,
                                          err_msg=f"{name} threads={threads} slab={slab}")


def write_with_h5py(dst, sources, version=2, digest="xxh3-128"):
    """A store written without ckpt: h5py + hdf5plugin.Zstd, manifest by hand (version 1: "sha256"
    per piece; version 2: "digest": "<digest>:<hex>")."""
    (dst / "shards").mkdir(parents=True)
    pieces = []
    with h5py.File(dst / "shards" / "r00000.h5", "w") as f:
        for i, (name, (dt, arr)) in enumerate(sources.items()):
            kw = dict(compression=hdf5plugin.Zstd(clevel=3), shuffle=True, chunks=True) if arr.size > 64 else {}
            f.create_dataset(f"/p{i:06d}", data=arr.view(NP_VIEW[dt]), **kw)
            pieces.append({"tensor": name, "file": "shards/r00000.h5", "dataset": f"/p{i:06d}",
                           "region": {"offset": [0] * arr.ndim, "extent": list(arr.shape)}, "dtype": dt,
                           "bytes": arr.nbytes, "codec": "shuffle+zstd" if kw else "none",
                           **({"codec_level": 3} if kw else {})})
            if version == 1:
                pieces[-1]["sha256"] = hashlib.sha256(arr.tobytes()).hexdigest()
            else:
                pieces[-1]["digest"] = f"{digest}:{HASH[digest](arr.tobytes())}"
    man = {"format": "ckpt-native", "version": version, "profile": "reference",
           "tensors": [{"name": n, "dtype": dt, "shape": list(a.shape)} for n, (dt, a) in sources.items()],
           "pieces": pieces}
    (dst / "manifest.json").write_text(json.dumps(man))
    return man


@pytest.mark.parametrize("version,digest", [(1, "sha256"), (2, "xxh3-128"), (2, "sha256")])
def test_ckpt_reads_h5py_written_store(run_ckpt, tmp_path, version, digest):
    rng = np.random.default_rng(1)
    sources = make_sources(rng)
    dst = tmp_path / "h5py_store"
    man = write_with_h5py(dst, sources, version, digest)
    v = json.loads(run_ckpt("verify", dst, "--json").stdout)
    assert v["ok"] and v["format"] == f"ckpt-native v{version}" and v["digests"] == [digest], v
    info = json.loads(run_ckpt("inspect", dst, "--json").stdout)
    assert info["totals"]["pieces"] == len(sources)
    assert info["totals"]["compression_ratio"] > 1.0
    # Flip one byte inside the (uncompressed-size-known) first chunk of a compressed dataset:
    # verify must fail (decompression error or checksum) and name the tensor.
    bad = tmp_path / "bad"
    shutil.copytree(dst, bad)
    name = "model.layers.0.self_attn.q_proj.weight"
    piece = next(p for p in man["pieces"] if p["tensor"] == name)
    with h5py.File(bad / piece["file"], "r") as f:
        info = f[piece["dataset"]].id.get_chunk_info(0)
        off, size = info.byte_offset, info.size
    with open(bad / piece["file"], "r+b") as fh:
        fh.seek(off + size // 2)
        b = fh.read(1)
        fh.seek(off + size // 2)
        fh.write(bytes([b[0] ^ 0x10]))
    p = run_ckpt("verify", bad, check=False)
    assert p.returncode != 0
    assert name in p.stderr
    # A piece whose bytes are intact but whose recorded digest is off by one bit: named, with the
    # algorithm, exit 1.
    bad2 = tmp_path / "bad2"
    shutil.copytree(dst, bad2)
    m2 = json.loads((bad2 / "manifest.json").read_text())
    key = "sha256" if version == 1 else "digest"
    last = m2["pieces"][-1][key]
    m2["pieces"][-1][key] = last[:-1] + ("0" if last[-1] != "0" else "1")
    (bad2 / "manifest.json").write_text(json.dumps(m2))
    p = run_ckpt("verify", bad2, check=False)
    assert p.returncode == 1 and "ChecksumMismatch" in p.stderr and f"{digest} expected" in p.stderr, p.stderr
