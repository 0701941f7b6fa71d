"""F8_E8M0 and F4 (issue 39) against the references: ml_dtypes 0.6.0 (float8_e8m0fnu,
float4_e2m1fn), torch 2.13 (float8_e8m0fnu, float4_e2m1fn_x2) and safetensors 0.8.0 (its writer's
bytes, header order and safe_open).

Casts go through tests/tools/cast_tool (cast_elements; F4 through f4_unpack / f4_pack: two
values per byte, the first in the low nibble). Where the references disagree (E8M0 of zero and
negatives: ml_dtypes NaN, torch drops the sign) ckpt refuses (CastInexact), so those inputs are
compared as refusals only.
"""
import json
import struct

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from cast_helpers import RNG, cast

E8 = ml_dtypes.float8_e8m0fnu
F4 = ml_dtypes.float4_e2m1fn


def _positive_f32():
    """Positive finite f32 patterns: every exponent with mantissas around the 1.5 tie, subnormals
    around 2^-127, random bits."""
    exps = np.arange(0, 255, dtype=np.uint32)
    mants = np.array([0, 1, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFF, 0x200000, 0x600000], dtype=np.uint32)
    grid = (exps[:, None] << 23 | mants[None, :]).ravel()
    rnd = RNG.integers(0, 0x7F800000, size=200000, dtype=np.uint32)
    return np.concatenate([grid, rnd]).view(np.float32)


@pytest.mark.parametrize("to", ["F32", "BF16"])
def test_e8m0_decodes_every_byte_as_ml_dtypes_and_torch(to, tmp_path):
    codes = np.arange(256, dtype=np.uint8)
    raw, stats, rc = cast(codes, "F8_E8M0", to, tmp_path=tmp_path)
    assert rc == 0 and stats["nans"] == 1
    want_np = codes.view(E8).astype(np.float32)
    want_t = torch.from_numpy(codes).view(torch.float8_e8m0fnu).to(torch.float32 if to == "F32" else torch.bfloat16)
    got = raw.view(np.float32) if to == "F32" else raw.astype(np.uint32) << 16
    got = got.view(np.float32)
    assert np.array_equal(got[:255], want_np[:255]) and np.isnan(got[255])
    assert np.array_equal(got[:255], want_t.to(torch.float32).numpy()[:255])


@pytest.mark.parametrize("frm", ["F32", "BF16"])
def test_e8m0_encodes_positive_values_as_ml_dtypes_and_torch(frm, tmp_path):
    x = _positive_f32()
    x = x[(x > 0) & (x <= np.float32(1.5 * 2.0 ** 127) * np.float32(0.99))]  # zero: refused, beyond: overflow (below)
    if frm == "BF16":
        x = np.unique(x.astype(ml_dtypes.bfloat16))
        x = x[x > 0]
        src = x.view(np.uint16)
        x32 = x.astype(np.float32)
    else:
        src, x32 = x, x
    raw, stats, rc = cast(src, frm, "F8_E8M0", tmp_path=tmp_path)
    assert rc == 0, stats
    assert np.array_equal(raw, x32.astype(E8).view(np.uint8))
    assert np.array_equal(raw, torch.from_numpy(x32).to(torch.float8_e8m0fnu).view(torch.uint8).numpy())


def test_e8m0_refuses_what_it_cannot_hold(tmp_path):
    raw, stats, rc = cast(np.array([1.0, 0.0, -4.0, 2.0], np.float32), "F32", "F8_E8M0", tmp_path=tmp_path)
    assert rc == 3 and stats["code"] == "CastInexact" and stats["inexact"] == 2 and stats["first_bad"] == 1
    big = np.array([np.inf, 2.0 ** 127 * 1.75], np.float32)
    raw, stats, rc = cast(big, "F32", "F8_E8M0", tmp_path=tmp_path)
    assert rc == 3 and stats["code"] == "CastOverflow" and stats["overflowed"] == 2
    raw, stats, rc = cast(big, "F32", "F8_E8M0", "--saturate", tmp_path=tmp_path)
    assert rc == 0 and list(raw) == [254, 254]
    raw, stats, rc = cast(np.array([np.nan], np.float32), "F32", "F8_E8M0", tmp_path=tmp_path)
    assert rc == 0 and list(raw) == [255] == list(np.array([np.nan], np.float32).astype(E8).view(np.uint8))


@pytest.mark.parametrize("to", ["F32", "BF16"])
def test_f4_unpacks_every_byte_as_ml_dtypes(to, tmp_path):
    b = np.arange(256, dtype=np.uint8)
    raw, stats, rc = cast(b, "F4", to, tmp_path=tmp_path)
    assert rc == 0 and raw.size == 512
    got = raw.view(np.float32) if to == "F32" else (raw.astype(np.uint32) << 16).view(np.float32)
    # The reference: each byte as two ml_dtypes float4_e2m1fn values, low nibble first (gpt-oss's
    # idx_lo -> [0::2], idx_hi -> [1::2]).
    want = np.stack([b & 0xF, b >> 4], axis=-1).reshape(-1).view(F4).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("frm", ["F32", "BF16"])
def test_f4_packs_as_ml_dtypes_rounds(frm, tmp_path):
    grid = np.array([0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6, 6.5, 6.99], np.float32)
    x = np.concatenate([grid, -grid, (RNG.standard_normal(20000) * 2).clip(-6.9, 6.9).astype(np.float32)])
    if frm == "BF16":
        x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    x = x[np.abs(x) < 7]  # 7 and beyond overflow (below)
    x = x[: x.size // 2 * 2]
    src = x.astype(ml_dtypes.bfloat16).view(np.uint16) if frm == "BF16" else x
    raw, stats, rc = cast(src, frm, "F4", tmp_path=tmp_path)
    assert rc == 0, stats
    codes = x.astype(F4).view(np.uint8) & 0xF
    assert np.array_equal(raw, (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8))


def test_f4_overflow_nan_and_saturation(tmp_path):
    x = np.array([1.0, 7.0, -100.0, 2.0], np.float32)
    raw, stats, rc = cast(x, "F32", "F4", tmp_path=tmp_path)
    assert rc == 3 and stats["code"] == "CastOverflow" and stats["overflowed"] == 2 and stats["first_bad"] == 1
    raw, stats, rc = cast(x, "F32", "F4", "--saturate", tmp_path=tmp_path)
    codes = x.astype(F4).view(np.uint8) & 0xF  # ml_dtypes saturates to +-6
    assert rc == 0 and np.array_equal(raw, (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8))
    raw, stats, rc = cast(np.array([np.nan, 1.0], np.float32), "F32", "F4", "--saturate", tmp_path=tmp_path)
    assert rc == 3 and stats["code"] == "CastNaN"


def _st_header(path):
    d = path.read_bytes()
    n = struct.unpack("<Q", d[:8])[0]
    return d[8:8 + n], d[8 + n:]


def _low_precision_tensors():
    """F4 (torch.float4_e2m1fn_x2: [rows, pairs]), F8_E8M0 and neighbours, random bytes."""
    u8 = lambda *s: torch.from_numpy(RNG.integers(0, 256, size=s, dtype=np.uint8))  # noqa: E731
    return {
        "blocks": u8(4, 6, 16).view(torch.float4_e2m1fn_x2),
        "scales": u8(4, 6).clamp(max=254).view(torch.float8_e8m0fnu),
        "w": u8(8, 3).view(torch.float8_e4m3fn),
        "bias": torch.arange(5, dtype=torch.float32),
        "flag": torch.tensor([True, False]),
    }


def test_safetensors_reads_what_ckpt_writes(run_ckpt, tool, tmp_path):
    """SRC written by safetensors 0.8.0. ckpt exports it (to-hf), and a native store holding the same
    tensors split over two ranks (manifest v4, F4 shapes in packed pairs) exports it too: safe_open
    reads every tensor, equal to the originals, and each file is byte for byte the one
    safetensors' own writer made of them."""
    import subprocess
    ts = _low_precision_tensors()
    src = tmp_path / "src.safetensors"
    save_file(ts, str(src), metadata={"format": "pt"})
    spec = {"dst": str(tmp_path / "store"), "ranks": 2, "tensors": []}
    names = {torch.float4_e2m1fn_x2: "F4", torch.float8_e8m0fnu: "F8_E8M0", torch.float8_e4m3fn: "F8_E4M3",
             torch.float32: "F32", torch.bool: "BOOL"}
    for k, v in ts.items():
        raw = tmp_path / f"{k}.bin"
        v.contiguous().view(torch.uint8).numpy().tofile(raw)
        spec["tensors"].append({"name": k, "dtype": names[v.dtype], "shape": list(v.shape), "data": str(raw),
                                "split": "rows" if v.dim() > 1 else "whole", "parts": 2 if v.dim() > 1 else 1})
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    subprocess.run([tool("store_write_tool"), str(tmp_path / "spec.json")], check=True, timeout=120)
    man = json.loads((tmp_path / "store" / "manifest.json").read_text())
    assert man["version"] == 4
    shapes = {t["name"]: (t["dtype"], t["shape"]) for t in man["tensors"]}
    assert shapes["blocks"] == ("F4", [4, 6, 16]) and shapes["scales"] == ("F8_E8M0", [4, 6])  # F4: packed pairs
    for name, from_ in (("direct", src), ("store", tmp_path / "store")):
        out = tmp_path / f"out_{name}"
        run_ckpt("to-hf", from_, out, "--no-fsync")
        with safe_open(str(out / "model.safetensors"), "pt") as f:
            assert sorted(f.keys()) == sorted(ts)
            for k, v in ts.items():
                got = f.get_tensor(k)
                assert got.dtype == v.dtype and got.shape == v.shape, k
                assert torch.equal(got.contiguous().view(torch.uint8), v.contiguous().view(torch.uint8)), k
        assert (out / "model.safetensors").read_bytes() == src.read_bytes(), name
        head, _ = _st_header(out / "model.safetensors")
        assert b'"blocks":{"dtype":"F4","shape":[4,6,32]' in head
    # A version 3 manifest cannot name the dtypes version 4 brought (resealed, so only that rule fails).
    from native_h5py import manifest_digest
    man["version"] = 3
    man["manifest_digest"] = manifest_digest({k: v for k, v in man.items() if k != "manifest_digest"})
    (tmp_path / "store" / "manifest.json").write_text(json.dumps(man))
    p = run_ckpt("verify", tmp_path / "store", check=False)
    assert p.returncode != 0 and "[UnknownDType]" in p.stderr and "version 4" in p.stderr, p.stderr


def test_python_module_reads_f4_packed_and_e8m0_as_ml_dtypes(tmp_path):
    ckpt = pytest.importorskip("ckpt")
    ts = _low_precision_tensors()
    src = tmp_path / "src.safetensors"
    save_file(ts, str(src))
    with ckpt.open(src) as ck:
        info = ck.tensors
        assert info["blocks"].dtype == "float4_e2m1fn_x2" and tuple(info["blocks"].shape) == (4, 6, 16)
        b = ck.read("blocks")
        assert b.dtype == np.uint8 and np.array_equal(b, ts["blocks"].view(torch.uint8).numpy())
        vals = ckpt.unpack_f4(b)
        assert vals.dtype == F4 and vals.shape == (4, 6, 32)
        assert np.array_equal(ckpt.pack_f4(vals), b)
        s = ck.read("scales")
        assert s.dtype == E8 and np.array_equal(s.view(np.uint8), ts["scales"].view(torch.uint8).numpy())


def test_f4_odd_last_dimension_is_refused_by_name(run_ckpt, tmp_path):
    # [2, 3] F4: 6 values in 3 bytes, valid for safetensors, but each row ends inside a byte.
    header = json.dumps({"a": {"dtype": "F4", "shape": [2, 3], "data_offsets": [0, 3]}}).encode()
    header += b" " * (-len(header) % 8)
    bad = tmp_path / "odd.safetensors"
    bad.write_bytes(struct.pack("<Q", len(header)) + header + b"\x12\x34\x56")
    with safe_open(str(bad), "np") as f:  # the reference opens it
        assert list(f.keys()) == ["a"]
    p = run_ckpt("to-hf", bad, tmp_path / "out", check=False)
    assert p.returncode != 0 and "F4OddLastDim" in p.stderr, p.stderr
