"""Reads a ckpt native checkpoint with h5py + numpy only (no ckpt code).

The independent reader of the interop tests and of scripts/check_hf_export.py: it follows
manifest.json (format versions 1 to 4; version 3's and 4's "manifest_digest" is checked here against the
canonical text of the rest of the manifest: manifest_digest()), reads every piece's dataset with h5py (hdf5plugin decodes
zstd, filter 32015), checks it against the manifest's digest (version 2: "digest":
"xxh3-128:<hex>" with the xxhash package or "sha256:<hex>" with hashlib, as in version 3; version 1: "sha256":
"<hex>") and places it in its global tensor (box regions and flat ranges of a box).
Half-precision and 8-bit floats come back as their raw bits (uint16 / uint8), as the store holds
them; version 4's F8_E8M0 too, and F4 as its packed bytes (the shape counts pairs, docs/STORE_FORMAT.md).
"""
import hashlib
import json
import pathlib

import h5py
import hdf5plugin  # noqa: F401  (registers the zstd filter 32015 with h5py)
import numpy as np
import xxhash

RAW = {"F64": np.float64, "F32": np.float32, "F16": np.uint16, "BF16": np.uint16, "I64": np.int64,
       "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.uint8,
       "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8, "F4": np.uint8}


HASHERS = {"sha256": lambda b: hashlib.sha256(b).hexdigest(), "xxh3-128": xxhash.xxh3_128_hexdigest}


def canonical_text(man):
    """The canonical text a version 3 manifest's "manifest_digest" is the digest of: the manifest
    without that key, keys sorted, no whitespace, UTF-8 (docs/STORE_FORMAT.md)."""
    rest = {k: v for k, v in man.items() if k != "manifest_digest"}
    return json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def manifest_digest(man, algo="xxh3-128"):
    """-> "<algo>:<hex>" of the canonical text of `man` (to check a manifest, or reseal an edited one)."""
    return f"{algo}:{HASHERS[algo](canonical_text(man))}"


def reseal(man):
    """`man` (a version 3 manifest dict) with its manifest_digest recomputed, in place; returns it."""
    algo = man.get("manifest_digest", "xxh3-128:").partition(":")[0]
    man.pop("manifest_digest", None)
    man["manifest_digest"] = manifest_digest(man, algo)
    return man


def piece_digest(man, p):
    """-> (algorithm, hex) that the manifest records for piece `p`."""
    if man["version"] == 1:
        return "sha256", p["sha256"]
    algo, _, hexd = p["digest"].partition(":")
    if algo not in HASHERS:
        raise ValueError(f"{p['file']}:{p['dataset']}: unknown digest algorithm {algo!r}")
    return algo, hexd


def read_native(ckpt, skip=lambda name: False):
    """-> (manifest, {tensor name: global array in its raw view}, set of HDF5 filter ids seen).

    Tensors whose name `skip` accepts are left out. Raises ValueError naming the file, dataset and
    tensor when a piece does not match the manifest (dtype, shape, digest, dataset attribute)."""
    ckpt = pathlib.Path(ckpt)
    man = json.loads((ckpt / "manifest.json").read_text())
    if man.get("format") != "ckpt-native" or man.get("version") not in (1, 2, 3, 4):
        raise ValueError(f"{ckpt}: not a ckpt-native v1 to v4 manifest")
    if man["version"] >= 3:
        algo = man.get("manifest_digest", "").partition(":")[0]
        if algo not in HASHERS or manifest_digest(man, algo) != man["manifest_digest"]:
            raise ValueError(f"{ckpt}: manifest_digest {man.get('manifest_digest')!r} differs from "
                             f"{manifest_digest(man, algo if algo in HASHERS else 'xxh3-128')!r} of its canonical text")
    metas = {t["name"]: t for t in man["tensors"]}
    out, filters, files = {}, set(), {}
    try:
        for p in man["pieces"]:
            name = p["tensor"]
            if skip(name):
                continue
            meta = metas[name]
            if name not in out:
                out[name] = np.zeros(meta["shape"], dtype=RAW[meta["dtype"]])
            where = f"{p['file']}:{p['dataset']} ({name})"
            f = files.setdefault(p["file"], h5py.File(ckpt / p["file"], "r"))
            ds = f[p["dataset"]]
            plist = ds.id.get_create_plist()
            filters |= {plist.get_filter(i)[0] for i in range(plist.get_nfilters())}
            tn = ds.attrs["tensor"]
            if (tn.decode() if isinstance(tn, bytes) else tn) != name:
                raise ValueError(f"{where}: dataset attribute 'tensor' is {tn!r}")
            data = np.ascontiguousarray(ds[...])
            if data.dtype != RAW[p["dtype"]] or p["dtype"] != meta["dtype"]:
                raise ValueError(f"{where}: dataset dtype {data.dtype}, manifest {p['dtype']} (tensor {meta['dtype']})")
            algo, want = piece_digest(man, p)
            if HASHERS[algo](data.tobytes()) != want:
                raise ValueError(f"{where}: {algo} digest differs from the manifest")
            off, ext = p["region"]["offset"], p["region"]["extent"]
            box = tuple(slice(o, o + e) for o, e in zip(off, ext))
            g = out[name]
            if "flat" in p["region"]:
                b, e = p["region"]["flat"]
                view = g[box].copy().reshape(-1)
                view[b:e] = data.reshape(-1)
                g[box] = view.reshape(ext)
            else:
                g[box] = data.reshape(ext)
    finally:
        for f in files.values():
            f.close()
    return man, out, filters
