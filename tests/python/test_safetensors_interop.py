"""safetensors interop: files written by the official library (torch / numpy) are read by ckpt
identically, and every file ckpt writes is byte-identical to what the official library writes for
the same tensors (so it opens with `safetensors` and every tensor compares equal). Bad files make
`ckpt to-hf` exit non-zero (3 = corrupt input) naming the rule."""
import json
import os
import pathlib
import struct
import subprocess

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.numpy import save_file as np_save_file
from safetensors.torch import load_file, save_file
from conftest import check_no_sanitizer_report

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _ckpt_bin():
    b = os.environ.get("CKPT_BIN")
    if b:
        return b
    d = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", ROOT / "build-hf"))
    return str(d / "ckpt")


def run(*args, check=True):
    p = subprocess.run([_ckpt_bin(), *map(str, args)], capture_output=True, text=True, timeout=300)
    check_no_sanitizer_report(p)
    if check and p.returncode != 0:
        raise AssertionError(f"ckpt {args} exited {p.returncode}: {p.stderr}")
    return p


def _tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(17, 8, generator=g).to(torch.bfloat16),
        "a.f32": torch.randn(3, 5, 7, generator=g),
        "b.f16": torch.randn(33, generator=g).to(torch.float16),
        "c.i64": torch.arange(-5, 6, dtype=torch.int64),
        "d.u8": torch.randint(0, 255, (4, 4), dtype=torch.uint8, generator=g),
        "e.bool": torch.tensor([True, False, True]),
        "f.scalar": torch.tensor(3.5, dtype=torch.float64),
        "g.empty": torch.zeros(0, 4),
        "h.f8": torch.randn(6, generator=g).to(torch.float8_e4m3fn),
        "i.i32": torch.randint(-1000, 1000, (2, 2), dtype=torch.int32, generator=g),
    }


def _assert_same(a: torch.Tensor, b: torch.Tensor, name):
    assert a.dtype == b.dtype and a.shape == b.shape, name
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), name


def test_torch_file_roundtrip_is_byte_identical(tmp_path):
    ts = _tensors()
    src = tmp_path / "in.safetensors"
    save_file(ts, src, metadata={"format": "pt"})
    run("to-hf", src, tmp_path / "out", "--no-fsync")
    out = tmp_path / "out" / "model.safetensors"
    got = load_file(out)
    assert set(got) == set(ts)
    for k in ts:
        _assert_same(got[k], ts[k], k)
    # ckpt's layout (order, alignment, padding, __metadata__) equals the reference writer's.
    assert out.read_bytes() == src.read_bytes()
    with safe_open(out, "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_numpy_file_and_sub_dtypes(tmp_path):
    rng = np.random.default_rng(1)
    arrs = {"x": rng.standard_normal((5, 3)).astype(np.float32), "y": rng.integers(0, 9, (7,), dtype=np.int16),
            "z": rng.standard_normal((2, 2, 2)).astype(np.float64), "w": np.array(7, dtype=np.uint32)}
    src = tmp_path / "np.safetensors"
    np_save_file(arrs, src)  # no __metadata__
    run("to-hf", src, tmp_path / "o", "--no-fsync")
    from safetensors.numpy import load_file as np_load
    got = np_load(tmp_path / "o" / "model.safetensors")
    for k, v in arrs.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape and np.array_equal(got[k], v), k


def test_dtype_cast_matches_torch(tmp_path):
    g = torch.Generator().manual_seed(3)
    ts = {"w": torch.randn(64, 33, generator=g), "n": torch.randn(33, generator=g), "i": torch.arange(4)}
    src = tmp_path / "f32.safetensors"
    save_file(ts, src)
    run("to-hf", src, tmp_path / "bf", "--dtype", "bf16", "--no-fsync")
    got = load_file(tmp_path / "bf" / "model.safetensors")
    _assert_same(got["w"], ts["w"].to(torch.bfloat16), "w")  # round to nearest even, like torch
    _assert_same(got["n"], ts["n"].to(torch.bfloat16), "n")
    _assert_same(got["i"], ts["i"], "i")  # integers are not cast
    ref = tmp_path / "ref.safetensors"
    save_file({"w": ts["w"].to(torch.bfloat16), "n": ts["n"].to(torch.bfloat16), "i": ts["i"]}, ref, metadata={"format": "pt"})
    assert (tmp_path / "bf" / "model.safetensors").read_bytes() == ref.read_bytes()


def test_sharded_export_layout(tmp_path):
    ts = {f"t{i}": torch.full((10, 10), float(i)) for i in range(5)}  # 400 bytes each
    src = tmp_path / "s.safetensors"
    save_file(ts, src)
    run("to-hf", src, tmp_path / "sh", "--max-shard-size", "900B", "--no-fsync")
    d = tmp_path / "sh"
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert idx["metadata"]["total_size"] == 2000
    files = sorted(set(idx["weight_map"].values()))
    assert files == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    seen = {}
    for fn in files:
        with safe_open(d / fn, "pt") as f:
            assert f.metadata() == {"format": "pt"}
            for k in f.keys():
                assert idx["weight_map"][k] == fn
                seen[k] = f.get_tensor(k)
    assert set(seen) == set(ts)
    for k in ts:
        _assert_same(seen[k], ts[k], k)
    assert not (tmp_path / "sh.partial").exists()
    # Every shard is byte-identical to the official writer's file for the same tensors.
    for fn in files:
        ref = tmp_path / ("ref-" + fn)
        save_file({k: ts[k] for k, f in idx["weight_map"].items() if f == fn}, ref, metadata={"format": "pt"})
        assert (d / fn).read_bytes() == ref.read_bytes(), fn


def _write_raw(path, header: bytes, data: bytes, n=None):
    path.write_bytes(struct.pack("<Q", len(header) if n is None else n) + header + data)


BAD = [
    ("too_small", lambda p: p.write_bytes(b"\x01\x02"), "HeaderTooSmall"),
    ("huge_header", lambda p: _write_raw(p, b"{}", b"", n=2**40), "HeaderTooLarge"),
    ("past_end", lambda p: _write_raw(p, b"{}", b"", n=50), "InvalidHeaderLength"),
    ("not_utf8", lambda p: _write_raw(p, b'{"\xff":1}', b""), "InvalidHeader"),
    ("bad_json", lambda p: _write_raw(p, b'{"a":', b""), "InvalidHeaderDeserialization"),
    ("trailing", lambda p: _write_raw(p, b"{}\x00\x00", b""), "InvalidHeaderDeserialization"),
    ("dtype", lambda p: _write_raw(p, b'{"a":{"dtype":"X9","shape":[1],"data_offsets":[0,1]}}', b"\x00"),
     "InvalidHeaderDeserialization"),
    ("gap", lambda p: _write_raw(p, b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x00\x00"), "InvalidOffset"),
    ("size", lambda p: _write_raw(p, b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', b"\x00" * 4),
     "TensorInvalidInfo"),
    ("missing", lambda p: _write_raw(p, b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b"\x00" * 4),
     "MetadataIncompleteBuffer"),
    ("dup", lambda p: _write_raw(p, b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                                    b'"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}', b"\x00\x00"), "DuplicateKey"),
    ("overflow", lambda p: _write_raw(p, b'{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}', b""),
     "ValidationOverflow"),
    ("overlap", lambda p: _write_raw(p, b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                        b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"\x00" * 12), "InvalidOffset"),
    ("past_end_offsets", lambda p: _write_raw(p, b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', b"\x00" * 8),
     "MetadataIncompleteBuffer"),
    ("trailing_data", lambda p: _write_raw(p, b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', b"\x00" * 9),
     "MetadataIncompleteBuffer"),
    ("bom", lambda p: _write_raw(p, b"\xef\xbb\xbf{}", b""), "InvalidHeaderDeserialization"),
    ("second_object", lambda p: _write_raw(p, b"{}{}", b""), "InvalidHeaderDeserialization"),
]


@pytest.mark.parametrize("name,make,code", BAD, ids=[b[0] for b in BAD])
def test_bad_file_cli_exit_code(tmp_path, name, make, code):
    p = tmp_path / f"{name}.safetensors"
    make(p)
    # The official library refuses these too (except ckpt's stricter duplicate-key rule).
    if name != "dup":
        with pytest.raises(Exception):
            load_file(p)
    r = run("to-hf", p, tmp_path / "out", check=False)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert code in r.stderr and p.name in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    # The same file as an HF directory's model.safetensors: from-hf and inspect refuse it too.
    d = tmp_path / "hfdir"
    d.mkdir()
    p.rename(d / "model.safetensors")
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 4, "hidden_size": 2, "intermediate_size": 4,
                                               "num_hidden_layers": 1, "num_attention_heads": 1}))
    for args in (("from-hf", d, tmp_path / "native"), ("inspect", d / "model.safetensors"), ("inspect", d)):
        r = run(*args, check=False)
        assert r.returncode == 3 and code in r.stderr and "model.safetensors" in r.stderr, (args, r.returncode, r.stderr)
    assert not (tmp_path / "native").exists() and not (tmp_path / "native.partial").exists()


def test_index_outside_directory_is_refused(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    save_file({"a": torch.zeros(2)}, d / "model-00001-of-00001.safetensors")
    save_file({"b": torch.zeros(2)}, tmp_path / "evil.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": 16},
         "weight_map": {"a": "model-00001-of-00001.safetensors", "b": "../evil.safetensors"}}))
    r = run("to-hf", d, tmp_path / "out", check=False)
    assert r.returncode == 3 and "IndexBadFileName" in r.stderr, r.stderr
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00001.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    r = run("to-hf", d, tmp_path / "out", check=False)
    assert r.returncode == 4 and "IndexMissingFile" in r.stderr, r.stderr
