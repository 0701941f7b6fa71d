"""ckpt::cast_elements between float types against independent references (numpy, torch, a naive
exact rounder); integer and bool casts are in test_casts_int.py, shared helpers in cast_helpers.py.

Drives tests/tools/cast_tool (raw input file -> raw output file + JSON stats, exit 3 when the
cast fails). Every hot cast runs twice: with the ISA kernels (AVX2/F16C where present) and with
--portable (the plain loops), against the same reference.

Documented differences from the references (everything else must match bit for bit):
- NaN bits: torch's f32->bf16 and f32->f16 give canonical NaNs (e.g. 0xFFFF); numpy is exact
  for f16 and is compared bit for bit. Elsewhere NaN-ness and sign are compared, and our payload
  rule (leading payload bits kept, lowest bit set if none is left) is checked by a naive formula.
- Overflow: where the reference gives Inf (torch/numpy) or saturates (torch float8) from a
  finite input, ckpt errors (CastOverflow) unless asked to saturate. We assert the error count
  and first index equal the reference's, and that --saturate gives +-max exactly there.
- float8_e4m3fn: torch saturates overflow and Inf to +-448; ckpt calls them overflow (with
  --saturate, +-448 too). float8_e5m2: torch gives Inf from >= 61440; ckpt overflows there.
- f32 <-> f64 NaN: numpy's hardware conversion quiets signaling NaNs; ckpt keeps the payload.
"""
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cast_helpers import (ALL8, ALL16, FORMATS, ISA_MODES, RNG, _tool_path, bits_of, cast,  # noqa: E402
                          double_rounding_traps, f32_patterns, fmt_max, is_nan16, is_nan32, is_nan_bf16,
                          naive_round, neighbours_and_midpoints_f16)

F32SET = f32_patterns()


# ------------------------------------------------------------------------------------------
# Widening, exhaustive.

@pytest.mark.parametrize("flags", ISA_MODES)
def test_bf16_to_f32_all_patterns(tmp_path, flags):
    out, st, rc = cast(ALL16, "BF16", "F32", *flags, tmp_path=tmp_path)
    assert rc == 0 and st["overflowed"] == 0
    ref = bits_of(torch.from_numpy(ALL16.view(np.int16)).view(torch.bfloat16).to(torch.float32),
                  np.uint32)
    # torch's bf16 -> f32 is the exact bit shift, NaN payloads included.
    np.testing.assert_array_equal(out, ref)
    assert st["nans"] == int(is_nan_bf16(ALL16).sum()) == 2 * 127


@pytest.mark.parametrize("flags", ISA_MODES)
def test_f16_to_f32_all_patterns(tmp_path, flags):
    out, st, rc = cast(ALL16, "F16", "F32", *flags, tmp_path=tmp_path)
    assert rc == 0
    ref = ALL16.view(np.float16).astype(np.float32).view(np.uint32)
    np.testing.assert_array_equal(out, ref)  # numpy is bit exact here, NaN payloads included
    assert st["nans"] == int(is_nan16(ALL16).sum()) == 2 * 1023


def test_f16_to_f64_and_bf16_to_f64_all_patterns(tmp_path):
    out, _, rc = cast(ALL16, "F16", "F64", tmp_path=tmp_path)
    assert rc == 0
    ref = ALL16.view(np.float16).astype(np.float64)
    got = out.view(np.float64)
    fin = ~np.isnan(ref)
    np.testing.assert_array_equal(got[fin].view(np.uint64), ref[fin].view(np.uint64))
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.array_equal(np.signbit(got), np.signbit(ref))
    out, _, rc = cast(ALL16, "BF16", "F64", tmp_path=tmp_path)
    assert rc == 0
    ref = torch.from_numpy(ALL16.view(np.int16)).view(torch.bfloat16).to(torch.float64).numpy()
    got = out.view(np.float64)
    fin = ~np.isnan(ref)
    np.testing.assert_array_equal(got[fin], ref[fin])
    assert np.array_equal(np.isnan(got), np.isnan(ref))


@pytest.mark.parametrize("name,tdt", [("F8_E4M3", torch.float8_e4m3fn), ("F8_E5M2", torch.float8_e5m2)])
def test_f8_to_f32_all_patterns(tmp_path, name, tdt):
    out, st, rc = cast(ALL8, name, "F32", tmp_path=tmp_path)
    assert rc == 0
    ref = torch.from_numpy(ALL8).view(tdt).to(torch.float32).numpy()
    got = out.view(np.float32)
    fin = ~np.isnan(ref)
    np.testing.assert_array_equal(got[fin].view(np.uint32), ref[fin].view(np.uint32))
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.array_equal(np.signbit(got), np.signbit(ref))
    assert st["nans"] == (2 if name == "F8_E4M3" else 6)
    # and to F16 / BF16 / F64: all exact
    for to, refdt in (("F16", torch.float16), ("BF16", torch.bfloat16)):
        o, _, rc = cast(ALL8, name, to, tmp_path=tmp_path)
        assert rc == 0
        r = torch.from_numpy(ALL8).view(tdt).to(torch.float32).to(refdt)
        rb = bits_of(r, np.uint16)
        fin = ~torch.isnan(r).numpy()
        np.testing.assert_array_equal(o[fin], rb[fin])


# ------------------------------------------------------------------------------------------
# Narrowing from f32.

def check_narrow(out, st, rc, ref_bits, ref_overflow, sat_out, max_bits, nan_check):
    """ref_overflow: bool mask of finite inputs the reference maps beyond max finite."""
    n_over = int(ref_overflow.sum())
    assert st["overflowed"] == n_over
    if n_over:
        assert rc == 3 and st["code"] == "CastOverflow"
        assert st["first_bad"] == int(np.argmax(ref_overflow))
    else:
        assert rc == 0
    ok = ~ref_overflow & ~nan_check
    np.testing.assert_array_equal(out[ok], ref_bits[ok])
    np.testing.assert_array_equal(sat_out[ok], ref_bits[ok])
    # saturated exactly where the reference overflowed, with the sign kept
    np.testing.assert_array_equal(sat_out[ref_overflow] & max_bits, np.full(n_over, max_bits, sat_out.dtype))


@pytest.mark.parametrize("flags", ISA_MODES)
def test_f32_to_bf16_vs_torch(tmp_path, flags):
    x = F32SET
    out, st, rc = cast(x, "F32", "BF16", *flags, tmp_path=tmp_path)
    sat, sst, src = cast(x, "F32", "BF16", "--saturate", *flags, tmp_path=tmp_path)
    assert src == 0 and sst["overflowed"] == st["overflowed"]
    ref = bits_of(torch.from_numpy(x.view(np.int32)).view(torch.float32).to(torch.bfloat16), np.uint16)
    nan_in = is_nan32(x)
    ref_over = ((ref & 0x7FFF) == 0x7F80) & ((x & 0x7FFFFFFF) != 0x7F800000)
    assert ref_over.sum() > 300  # the set does reach the overflow boundary
    check_narrow(out, st, rc, ref, ref_over, sat, 0x7F7F, nan_in)
    # NaN: torch only tells NaN-ness; the payload rule by formula
    assert np.all(is_nan_bf16(ref[nan_in])) and np.all(is_nan_bf16(out[nan_in]))
    p = (x[nan_in] >> 16) & 0x7F
    expect = ((x[nan_in] >> 16) & 0x8000) | 0x7F80 | np.where(p == 0, 1, p)
    np.testing.assert_array_equal(out[nan_in], expect.astype(np.uint16))
    assert st["nans"] == int(nan_in.sum())


@pytest.mark.parametrize("flags", ISA_MODES)
def test_f32_to_f16_vs_numpy(tmp_path, flags):
    x = F32SET
    out, st, rc = cast(x, "F32", "F16", *flags, tmp_path=tmp_path)
    sat, _, src = cast(x, "F32", "F16", "--saturate", *flags, tmp_path=tmp_path)
    assert src == 0
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.view(np.float32).astype(np.float16).view(np.uint16)
    ref_over = ((ref & 0x7FFF) == 0x7C00) & ((x & 0x7FFFFFFF) != 0x7F800000)
    assert ref_over.sum() > 1000
    # numpy keeps NaN payloads like ckpt: compare NaNs bit for bit too
    check_narrow(out, st, rc, ref, ref_over, sat, 0x7BFF, np.zeros(len(x), bool))
    # torch agrees on every non-NaN value (second reference)
    t = bits_of(torch.from_numpy(x.view(np.int32)).view(torch.float32).to(torch.float16), np.uint16)
    nn = ~is_nan32(x)
    np.testing.assert_array_equal(t[nn], ref[nn])


def test_f16_round_trip_identity_all_patterns(tmp_path):
    for flags in ISA_MODES:
        wide, _, rc = cast(ALL16, "F16", "F32", *flags, tmp_path=tmp_path)
        back, _, rc2 = cast(wide, "F32", "F16", *flags, tmp_path=tmp_path)
        assert rc == 0 and rc2 == 0
        np.testing.assert_array_equal(back, ALL16)
        wide, _, rc = cast(ALL16, "BF16", "F32", *flags, tmp_path=tmp_path)
        back, _, rc2 = cast(wide, "F32", "BF16", *flags, tmp_path=tmp_path)
        assert rc == 0 and rc2 == 0
        np.testing.assert_array_equal(back, ALL16)


@pytest.mark.parametrize("flags", ISA_MODES)
def test_f32_to_f16_every_pattern_and_tie_vs_numpy(tmp_path, flags):
    x = neighbours_and_midpoints_f16()
    assert len(x) == 4 * (65536 - 2 * 1024)
    out, st, rc = cast(x, "F32", "F16", *flags, tmp_path=tmp_path)
    sat, sst, src = cast(x, "F32", "F16", "--saturate", *flags, tmp_path=tmp_path)
    with np.errstate(over="ignore"):
        ref = x.view(np.float32).astype(np.float16).view(np.uint16)
    ref_over = (ref & 0x7FFF) == 0x7C00  # all inputs are finite
    # 65520 (the tie above max) rounds to even = Inf, i.e. overflow, and so does one ulp above it
    assert ref_over.sum() == 2 * 2 and src == 0
    check_narrow(out, st, rc, ref, ref_over, sat, 0x7BFF, np.zeros(len(x), bool))
    # torch agrees bit for bit on the same inputs (second reference)
    t = bits_of(torch.from_numpy(x.view(np.int32)).view(torch.float32).to(torch.float16), np.uint16)
    np.testing.assert_array_equal(t, ref)
    # every f16 pattern is hit exactly by the first quarter, so each one is produced
    assert np.array_equal(np.unique(out[: len(x) // 4]), np.unique(ALL16[~is_nan16(ALL16) & ((ALL16 & 0x7FFF) != 0x7C00)]))


@pytest.mark.parametrize("flags", ISA_MODES)
def test_f32_to_bf16_every_pattern_and_tie_vs_torch(tmp_path, flags):
    """Each of the 65,536 bf16 patterns as the upper half of f32 inputs, with every rounding class
    of the dropped 16 bits: exact, just below / on / just above the tie, just below the next."""
    lows = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    x = ((ALL16.astype(np.uint32)[:, None] << 16) | lows[None, :]).ravel()
    out, st, rc = cast(x, "F32", "BF16", *flags, tmp_path=tmp_path)
    sat, sst, src = cast(x, "F32", "BF16", "--saturate", *flags, tmp_path=tmp_path)
    ref = bits_of(torch.from_numpy(x.view(np.int32)).view(torch.float32).to(torch.bfloat16), np.uint16)
    nan_in = is_nan32(x)
    ref_over = ((ref & 0x7FFF) == 0x7F80) & ((x & 0x7FFFFFFF) != 0x7F800000)
    # 0x7F7F8000 (tie above max finite) and everything above it up to Inf, both signs
    assert ref_over.sum() == 2 * 3 and src == 0 and sst["overflowed"] == 6
    check_narrow(out, st, rc, ref, ref_over, sat, 0x7F7F, nan_in)
    # and against the naive exact rounder on the finite, non-overflowing inputs (third opinion)
    fin = ~nan_in & ~ref_over & ((x & 0x7FFFFFFF) != 0x7F800000)
    pick = np.nonzero(fin)[0][::97]
    naive = np.array([naive_round(float(v), "BF16")[0] for v in x[pick].view(np.float32)], dtype=np.uint16)
    np.testing.assert_array_equal(out[pick], naive)
    # Inf stays Inf, NaN stays NaN with its sign
    inf = (x & 0x7FFFFFFF) == 0x7F800000
    np.testing.assert_array_equal(out[inf], ((x[inf] >> 16) & 0x8000 | 0x7F80).astype(np.uint16))
    assert np.all(is_nan_bf16(out[nan_in])) and np.array_equal(out[nan_in] >> 15, (x[nan_in] >> 31).astype(np.uint16))


# ------------------------------------------------------------------------------------------
# f64 sources: one rounding (no double rounding through f32).

def test_f64_to_f16_single_rounding_vs_numpy(tmp_path):
    x = np.concatenate([double_rounding_traps(), F32SET[~is_nan32(F32SET)].view(np.float32).astype(np.float64),
                        np.array([65519.99999999, 65520.0, 1e300, -1e300, 5e-324, 2.0 ** -25, 2.0 ** -25 * (1 + 2.0 ** -40)])])
    out, st, rc = cast(x, "F64", "F16", "--saturate", tmp_path=tmp_path)
    assert rc == 0
    with np.errstate(over="ignore"):
        ref = x.astype(np.float16).view(np.uint16)  # numpy rounds f64 -> f16 once
        via32 = x.astype(np.float32).astype(np.float16).view(np.uint16)
    assert (via32 != ref).sum() > 1000  # the traps do separate single from double rounding
    over = ((ref & 0x7FFF) == 0x7C00) & np.isfinite(x)
    np.testing.assert_array_equal(out[~over], ref[~over])
    assert np.all((out[over] & 0x7FFF) == 0x7BFF)
    assert st["overflowed"] == int(over.sum()) > 0


@pytest.mark.parametrize("to", ["BF16", "F8_E4M3", "F8_E5M2"])
def test_f64_to_narrow_vs_naive_rounder(tmp_path, to):
    eb, mb, fn = FORMATS[to]
    # traps around ties of the target + random values across the target's range + specials
    if to == "BF16":
        base = RNG.integers(0x0001, 0x7F7F, size=700, dtype=np.uint16)
        lo = torch.from_numpy(base.view(np.int16)).view(torch.bfloat16).to(torch.float64).numpy()
        hi = torch.from_numpy((base + 1).view(np.int16)).view(torch.bfloat16).to(torch.float64).numpy()
    else:
        tdt = torch.float8_e4m3fn if fn else torch.float8_e5m2
        base = np.arange(1, 0x7E if fn else 0x7B, dtype=np.uint8)
        lo = torch.from_numpy(base).view(tdt).to(torch.float64).numpy()
        hi = torch.from_numpy(base + 1).view(tdt).to(torch.float64).numpy()
    mid = (lo + hi) / 2
    eps = (hi - lo) * 2.0 ** -35
    mx = float(fmt_max(to))
    x = np.concatenate([mid, mid + eps, mid - eps, lo, RNG.uniform(-mx * 1.2, mx * 1.2, 1500),
                        np.exp2(RNG.uniform(-30 if to != "BF16" else -140, 3, 1000)),
                        np.array([0.0, -0.0, mx, -mx, mx * 1.0001, 1e300, np.inf, -np.inf, 5e-324])])
    x = np.concatenate([x, -x])
    out, st, rc = cast(x, "F64", to, tmp_path=tmp_path)
    sat, _, src = cast(x, "F64", to, "--saturate", tmp_path=tmp_path)
    assert src == 0
    ref = [naive_round(float(v), to) for v in x]
    ref_bits = np.array([b for b, _ in ref], dtype=out.dtype)
    ref_over = np.array([o for _, o in ref])
    assert ref_over.sum() > 0 and st["overflowed"] == int(ref_over.sum())
    assert rc == 3 and st["first_bad"] == int(np.argmax(ref_over))
    np.testing.assert_array_equal(out[~ref_over], ref_bits[~ref_over])
    maxb = (((1 << eb) - 1) << mb | ((1 << mb) - 2)) if fn else (((1 << eb) - 2) << mb | ((1 << mb) - 1))
    np.testing.assert_array_equal(sat[~ref_over], ref_bits[~ref_over])
    np.testing.assert_array_equal(sat[ref_over] & ((1 << (eb + mb)) - 1), maxb)


# ------------------------------------------------------------------------------------------
# float8 from f32 against torch.

@pytest.mark.parametrize("name,tdt", [("F8_E4M3", torch.float8_e4m3fn), ("F8_E5M2", torch.float8_e5m2)])
def test_f32_to_f8_vs_torch(tmp_path, name, tdt):
    eb, mb, fn = FORMATS[name]
    # f32 patterns concentrated on the f8 range: all f32 with 20 random low bits cleared around
    # every f8 value, and the big general set
    around = ALL8.copy()
    v = torch.from_numpy(around).view(tdt).to(torch.float32).numpy()
    vb = v[np.isfinite(v)].view(np.uint32)
    d = np.arange(-2000, 2001, dtype=np.int64)
    near = ((vb[:, None].astype(np.int64) + d[None, :] * 997) & 0xFFFFFFFF).astype(np.uint32).ravel()
    x = np.concatenate([near, F32SET])
    out, st, rc = cast(x, "F32", name, tmp_path=tmp_path)
    sat, sst, src = cast(x, "F32", name, "--saturate", tmp_path=tmp_path)
    assert src == 0
    xf = x.view(np.float32)
    tref = bits_of(torch.from_numpy(x.view(np.int32)).view(torch.float32).to(tdt), np.uint8)
    nan_in = np.isnan(xf)
    # where ckpt overflows: finite values whose round-to-nearest-even magnitude exceeds max
    # (the reference for the boundary is the naive exact rounder on the inputs near max), and Inf
    # into e4m3fn.
    mx = float(fmt_max(name))
    ax = np.abs(np.where(nan_in, 0, xf).astype(np.float64))
    # the rounding boundary lies below 1.1 * max for both formats; decide the band exactly
    over = (ax >= 1.1 * mx) & (np.isfinite(ax) | fn)
    for i in np.nonzero((ax > mx) & (ax < 1.1 * mx))[0]:
        over[i] = naive_round(float(xf[i]), name)[1]
    assert st["overflowed"] == int(over.sum()) > 0 and rc == 3
    assert st["first_bad"] == int(np.argmax(over))
    ok = ~over & ~nan_in
    np.testing.assert_array_equal(out[ok], tref[ok])
    np.testing.assert_array_equal(sat[ok], tref[ok])
    # saturated: torch saturates too (e4m3fn; e5m2 below 61440) or gives Inf (e5m2 >= 61440)
    maxb = 0x7E if fn else 0x7B
    np.testing.assert_array_equal(sat[over] & 0x7F, np.full(int(over.sum()), maxb, np.uint8))
    tm = tref[over] & 0x7F
    assert np.all((tm == maxb) | (tm == 0x7C)) and np.array_equal(sat[over] & 0x80, tref[over] & 0x80)
    # NaN stays NaN with its sign
    tn = torch.from_numpy(sat[nan_in]).view(tdt).to(torch.float32)
    assert torch.isnan(tn).all()
    assert np.array_equal(np.signbit(tn.numpy()), np.signbit(xf[nan_in]))


# ------------------------------------------------------------------------------------------
# f32 <-> f64, f16 <-> bf16.

def test_f32_f64_both_ways(tmp_path):
    x = F32SET
    out, _, rc = cast(x, "F32", "F64", tmp_path=tmp_path)
    assert rc == 0
    with np.errstate(invalid="ignore"):
        ref = x.view(np.float32).astype(np.float64)
    got = out.view(np.float64)
    nn = ~np.isnan(ref)
    np.testing.assert_array_equal(got[nn].view(np.uint64), ref[nn].view(np.uint64))
    # NaN payload kept exactly (numpy would quiet signaling ones)
    nb = x[~nn].astype(np.uint64)
    expect = ((nb >> 31) << 63) | (np.uint64(0x7FF) << np.uint64(52)) | ((nb & 0x7FFFFF) << np.uint64(29))
    np.testing.assert_array_equal(out[~nn], expect)
    back, _, rc = cast(out, "F64", "F32", tmp_path=tmp_path)
    assert rc == 0
    np.testing.assert_array_equal(back, x)
    # f64 -> f32 rounding and overflow vs numpy
    y = np.concatenate([RNG.standard_normal(50000) * np.exp2(RNG.uniform(-160, 140, 50000)),
                        np.array([3.4028235677973366e38, 3.4028235677973362e38, 1e39, -1e39, 1e-46, 7e-46])])
    out, st, rc = cast(y, "F64", "F32", "--saturate", tmp_path=tmp_path)
    with np.errstate(over="ignore"):
        ref = y.astype(np.float32)
    over = np.isinf(ref) & np.isfinite(y)
    assert st["overflowed"] == int(over.sum()) > 0
    np.testing.assert_array_equal(out[~over], ref[~over].view(np.uint32))
    np.testing.assert_array_equal(out[over] & 0x7FFFFFFF, np.full(int(over.sum()), 0x7F7FFFFF, np.uint32))


def test_f16_bf16_all_patterns(tmp_path):
    # f16 -> bf16: one rounding from the exact value (f32 holds every f16 exactly).
    out, st, rc = cast(ALL16, "F16", "BF16", tmp_path=tmp_path)
    assert rc == 0 and st["overflowed"] == 0
    r = torch.from_numpy(ALL16.view(np.float16).astype(np.float32)).to(torch.bfloat16)
    rb = bits_of(r, np.uint16)
    nn = ~is_nan16(ALL16)
    np.testing.assert_array_equal(out[nn], rb[nn])
    # bf16 -> f16: overflow above 65504, subnormals below 2^-14 (numpy from exact f32 values)
    out, st, rc = cast(ALL16, "BF16", "F16", tmp_path=tmp_path)
    x32 = torch.from_numpy(ALL16.view(np.int16)).view(torch.bfloat16).to(torch.float32).numpy()
    with np.errstate(over="ignore"):
        ref = x32.astype(np.float16).view(np.uint16)
    over = np.isinf(ref.view(np.float16)) & np.isfinite(x32)
    assert rc == 3 and st["code"] == "CastOverflow" and st["overflowed"] == int(over.sum()) > 0
    assert st["first_bad"] == int(np.argmax(over))
    nn = ~np.isnan(x32) & ~over
    np.testing.assert_array_equal(out[nn], ref[nn])


# ------------------------------------------------------------------------------------------
# NaN policy, input size.

def test_no_nan_rejects_nans(tmp_path):
    x = np.array([1.0, np.nan, 2.0, -np.nan], dtype=np.float32)
    _, st, rc = cast(x, "F32", "BF16", "--no-nan", tmp_path=tmp_path)
    assert rc == 3 and st["code"] == "CastNaN" and st["nans"] == 2 and st["first_bad"] == 1
    _, st, rc = cast(x, "F32", "F32", "--no-nan", tmp_path=tmp_path)
    assert rc == 3 and st["code"] == "CastNaN"
    _, st, rc = cast(x, "F32", "BF16", tmp_path=tmp_path)
    assert rc == 0 and st["nans"] == 2



def test_bad_input_size_is_rejected(tmp_path):
    inp = tmp_path / "odd.bin"
    inp.write_bytes(b"\x00\x01\x02")
    p = subprocess.run([_tool_path(), "F32", "BF16", str(inp), str(tmp_path / "o.bin")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "multiple of 4" in p.stderr
