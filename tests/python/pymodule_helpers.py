"""Shared helpers of the ckpt Python module's tests (tests/python/test_pymodule_*.py): import of the
built module, the tiny model's config and the CLI runner of the command tests, native stores written
by store_write_tool from numpy arrays, and h5py reads of them (the independent reference: the pieces
as HDF5 datasets, assembled into global tensors by numpy)."""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def import_ckpt():
    """The built module: as PYTHONPATH finds it (ctest sets <build>/python), else ./build/python."""
    import sys
    try:
        import ckpt
        return ckpt
    except ImportError:
        pass
    build_py = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", ROOT / "build")) / "python"
    sys.path.insert(0, str(build_py))
    try:
        import ckpt
    except ImportError as e:
        pytest.fail(f"the ckpt module is not built ({e}): ninja -C build ckpt_python")
    return ckpt


# The tiny LLaMA (GQA, untied) of the command and job tests: an HF config.json.
CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5,
       "rope_theta": 10000.0, "max_position_embeddings": 64, "vocab_size": 37, "hidden_size": 16,
       "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 4, "torch_dtype": "float32", "tie_word_embeddings": False}


def run_cli(*args, check=True):
    exe = os.environ.get("CKPT_BIN", str(pathlib.Path(os.environ.get("CKPT_BINARY_DIR", "build")) / "ckpt"))
    p = subprocess.run([exe, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"ckpt {args} exited {p.returncode}: {p.stderr}")
    return p


def no_partial(path: pathlib.Path):
    return not path.exists() and not pathlib.Path(str(path) + ".partial").exists()


ST_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int32": "I32",
            "int64": "I64", "uint8": "U8", "int8": "I8", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def write_store(tool, workdir, dst, tensors, metadata=None, ranks=2, codec="none", splits=None):
    """Writes {name: numpy array} as a native store through store_write_tool: each tensor cut as
    splits[name] = (split, parts) ("whole", "rows", "cols", "flat"), pieces dealt to `ranks`."""
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    spec = {"dst": str(dst), "ranks": ranks, "codec": codec, "metadata": metadata or {}, "tensors": [],
            "chunk_bytes": 4096}
    for i, (name, a) in enumerate(tensors.items()):
        f = workdir / f"t{i}.bin"
        np.ascontiguousarray(a).tofile(f)
        split, parts = (splits or {}).get(name, ("whole", 1))
        spec["tensors"].append({"name": name, "dtype": ST_NAMES[a.dtype.name], "shape": list(a.shape),
                                "data": str(f), "split": split, "parts": parts})
    (workdir / "spec.json").write_text(json.dumps(spec))
    subprocess.run([tool, str(workdir / "spec.json")], check=True, capture_output=True, timeout=120)
    return dst


def h5py_globals(ckpt_dir):
    """{name: numpy array} of a native store read with h5py alone: every piece's dataset placed at
    its region (a flat range of a box as row-major elements) in a global array of the manifest's
    dtype (16-bit and 8-bit floats are stored as integers: viewed as ml_dtypes types)."""
    import h5py
    import hdf5plugin  # noqa: F401  (zstd filter 32015)
    import ml_dtypes
    d = pathlib.Path(ckpt_dir)
    m = json.loads((d / "manifest.json").read_text())
    np_of = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "BF16": ml_dtypes.bfloat16,
             "I32": np.int32, "I64": np.int64, "U8": np.uint8, "I8": np.int8,
             "F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}
    out = {t["name"]: np.zeros(t["shape"], dtype=np_of[t["dtype"]]) for t in m["tensors"]}
    files = {}
    try:
        for p in m["pieces"]:
            f = files.get(p["file"]) or files.setdefault(p["file"], h5py.File(d / p["file"], "r"))
            data = f[p["dataset"]][()]
            g = out[p["tensor"]]
            data = data.view(g.dtype) if data.dtype != g.dtype else data
            reg = p["region"]
            sl = tuple(slice(o, o + e) for o, e in zip(reg["offset"], reg["extent"]))
            if "flat" in reg:
                box = g[sl].copy()
                box.reshape(-1)[reg["flat"][0]:reg["flat"][1]] = data.reshape(-1)
                g[sl] = box
            else:
                g[sl] = data.reshape(g[sl].shape)
    finally:
        for f in files.values():
            f.close()
    return out


def same_bits(a, b) -> bool:
    """Equal dtype, shape and bytes (NaN payloads and -0.0 included)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
