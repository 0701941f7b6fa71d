"""ckpt::cast_elements against independent references (numpy, torch, a naive exact rounder).

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
import fractions
import json
import math
import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(20261123)


def _tool_path() -> str:
    d = os.environ.get("CKPT_BINARY_DIR", str(ROOT / "build"))
    p = pathlib.Path(d) / "cast_tool"
    if not p.exists():
        pytest.fail(f"cast_tool not found at {p}: build it (ninja cast_tool)")
    return str(p)


def cast(arr: np.ndarray, frm: str, to: str, *flags, tmp_path):
    """Runs cast_tool; returns (output as raw unsigned ints or numeric array, stats dict, rc)."""
    inp = tmp_path / f"in_{frm}_{to}.bin"
    out = tmp_path / f"out_{frm}_{to}.bin"
    np.ascontiguousarray(arr).tofile(inp)
    p = subprocess.run([_tool_path(), frm, to, str(inp), str(out), *flags],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 3), f"cast_tool failed rc={p.returncode}: {p.stderr}"
    stats = json.loads(p.stdout)
    assert stats["ok"] == (p.returncode == 0)
    if p.returncode == 3:
        assert stats["code"] and stats["code"] in p.stderr
    raw = np.fromfile(out, dtype=RAW[to])
    return raw, stats, p.returncode


RAW = {"F64": np.uint64, "F32": np.uint32, "F16": np.uint16, "BF16": np.uint16,
       "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "I64": np.int64, "I32": np.int32,
       "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
       "U64": np.uint64, "BOOL": np.uint8}
ISA_MODES = [(), ("--portable",)]


def bits_of(t: torch.Tensor, np_dtype) -> np.ndarray:
    """Raw bits of a torch tensor (any 1/2/4-byte dtype) as an unsigned numpy array."""
    itemsize = t.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]
    return t.contiguous().view(view).numpy().view(np_dtype)


def f32_bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# ------------------------------------------------------------------------------------------
# A naive exact rounder, independent of the C++ code: Fraction arithmetic, round half to even.
FORMATS = {"F16": (5, 10, False), "BF16": (8, 7, False), "F8_E4M3": (4, 3, True),
           "F8_E5M2": (5, 2, False)}


def fmt_max(name):
    eb, mb, fn = FORMATS[name]
    bias = (1 << (eb - 1)) - 1
    if fn:
        return fractions.Fraction(2 ** mb + 2 ** mb - 2, 2 ** mb) * fractions.Fraction(2) ** ((1 << eb) - 1 - bias)
    return fractions.Fraction(2 ** (mb + 1) - 1, 2 ** mb) * fractions.Fraction(2) ** ((1 << eb) - 2 - bias)


def naive_round(x: float, name: str):
    """Returns (bits, overflow) of finite x rounded once to nearest even into `name` (no NaN)."""
    eb, mb, fn = FORMATS[name]
    bias = (1 << (eb - 1)) - 1
    sign = (1 << (eb + mb)) if math.copysign(1.0, x) < 0 else 0
    if math.isinf(x):
        return (sign | (0x7F if fn else ((1 << eb) - 1) << mb)), fn
    v = abs(fractions.Fraction(x))
    if v == 0:
        return sign, False
    # quantum of the binade holding v (subnormal quantum below the smallest normal)
    e = v.numerator.bit_length() - v.denominator.bit_length()
    if fractions.Fraction(2) ** e > v:
        e -= 1
    e = max(e, 1 - bias)
    q = fractions.Fraction(2) ** (e - mb)
    k = v / q
    n = math.floor(k)
    r = k - n
    if r > fractions.Fraction(1, 2) or (r == fractions.Fraction(1, 2) and n % 2 == 1):
        n += 1
    val = n * q
    if val > fmt_max(name):
        return (sign | (0x7F if fn else ((1 << eb) - 1) << mb)), True
    # encode val
    if val < fractions.Fraction(2) ** (1 - bias):
        return sign | int(val / fractions.Fraction(2) ** (1 - bias - mb)), False
    e2 = val.numerator.bit_length() - val.denominator.bit_length()
    if fractions.Fraction(2) ** e2 > val:
        e2 -= 1
    mant = int(val / fractions.Fraction(2) ** (e2 - mb)) - (1 << mb)
    return sign | ((e2 + bias) << mb) | mant, False


# ------------------------------------------------------------------------------------------
# Input sets.

def f32_patterns() -> np.ndarray:
    """~1.3M f32 bit patterns: every rounding tie class for 16-bit targets, values near every
    target's max finite, subnormal boundaries, NaN payloads, +-0, +-Inf, random bits."""
    hi = RNG.integers(0, 1 << 16, size=40000, dtype=np.uint32)
    lows = np.array([0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x2001, 0x3FFF,
                     0x7FFF, 0x8000, 0x8001, 0xBFFF, 0xC000, 0xFFFF], dtype=np.uint32)
    ties16 = (hi[:, None] << 16 | lows[None, :]).ravel()  # bf16 tie classes
    # f16 tie classes: the 13 dropped bits of a normal-range f16 value
    h = RNG.integers(0, 1 << 19, size=40000, dtype=np.uint32)
    low13 = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF], dtype=np.uint32)
    ties_f16 = ((h[:, None] << 13) | low13[None, :]).ravel()
    # f16 normal range exponent window (2^-25 .. 2^17) with tie classes
    mant = RNG.integers(0, 1 << 10, size=20000, dtype=np.uint32)
    exps = RNG.integers(127 - 26, 127 + 17, size=20000, dtype=np.uint32)
    sgn = RNG.integers(0, 2, size=20000, dtype=np.uint32) << 31
    f16win = ((sgn | (exps << 23) | (mant << 13))[:, None] | low13[None, :]).ravel()
    # near the max finite of every target, both signs, a few ulps of f32 around the edges
    edges = []
    for v in [65504.0, 65520.0, 65536.0, 3.3895313892515355e38, 3.4028234663852886e38, 448.0,
              464.0, 480.0, 57344.0, 59392.0, 61440.0, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
              3 * 2.0 ** -26, 2.0 ** -126, 2.0 ** -133, 2.0 ** -134, 2.0 ** -6, 2.0 ** -9,
              2.0 ** -10, 2.0 ** -16, 2.0 ** -17, 1.0, 1.5]:
        b = int(np.float32(v).view(np.uint32))
        for d in range(-300, 301):
            for s in (0, 0x80000000):
                edges.append(((b + d) & 0x7FFFFFFF) | s)
    edges = np.array(edges, dtype=np.uint32)
    # f32 subnormals, small and at the top
    sub = np.concatenate([np.arange(0, 5000, dtype=np.uint32),
                          np.arange(0x7FFFFF - 5000, 0x800001, dtype=np.uint32)])
    sub = np.concatenate([sub, sub | 0x80000000])
    # NaN payloads (quiet and signaling, both signs) and +-Inf
    nan_mant = np.concatenate([np.arange(1, 3000, dtype=np.uint32),
                               RNG.integers(1, 1 << 23, size=3000, dtype=np.uint32),
                               np.array([1 << 22, (1 << 22) | 1, (1 << 23) - 1, 1 << 13, 1 << 16,
                                         0x1FFF, 0xFFFF], dtype=np.uint32)])
    nans = np.concatenate([0x7F800000 | nan_mant, 0xFF800000 | nan_mant])
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000], dtype=np.uint32)
    rand = RNG.integers(0, 1 << 32, size=200000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([special, ties16, ties_f16, f16win, edges, sub, nans, rand])


ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
ALL8 = np.arange(256, dtype=np.uint16).astype(np.uint8)
F32SET = f32_patterns()


def is_nan32(b):
    return (b & 0x7FFFFFFF) > 0x7F800000


def is_nan16(b):
    return (b & 0x7FFF) > 0x7C00


def is_nan_bf16(b):
    return (b & 0x7FFF) > 0x7F80


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


def neighbours_and_midpoints_f16():
    """For every one of the 65,536 f16 patterns (NaN excluded): the f32 values exactly on it, on the
    midpoint (a rounding tie) to the next pattern away from zero, and one f32 ulp either side of
    that midpoint. The midpoint above 65504 is the overflow tie (65520 -> Inf / overflow)."""
    h = ALL16[~is_nan16(ALL16) & ((ALL16 & 0x7FFF) != 0x7C00)]  # finite patterns
    lo = h.view(np.float16).astype(np.float64)
    # the next magnitude up (for 0x7BFF that is 65536, beyond max finite)
    nxt = np.where((h & 0x7FFF) == 0x7BFF, np.copysign(65536.0, lo),
                   (h + 1).astype(np.uint16).view(np.float16).astype(np.float64))
    mid = ((lo + nxt) / 2).astype(np.float32)  # exact in f32 (f16 has 13 fewer mantissa bits)
    assert np.array_equal(mid.astype(np.float64), (lo + nxt) / 2)
    mb = mid.view(np.uint32)
    return np.concatenate([lo.astype(np.float32).view(np.uint32), mb, mb - 1, mb + 1])


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

def double_rounding_traps(n=4000):
    """f64 values just off an f16 tie: via f32 they would become an exact tie and round to even,
    a single rounding goes the other way."""
    h = RNG.integers(0x0001, 0x7BFF, size=n, dtype=np.uint16)
    lo = h.view(np.float16).astype(np.float64)
    hi = (h + 1).view(np.float16).astype(np.float64)
    mid = (lo + hi) / 2
    eps = (hi - lo) * 2.0 ** -35
    vals = np.concatenate([mid + eps, mid - eps, mid])
    return np.concatenate([vals, -vals])


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
# NaN policy, integers, bool.

def test_no_nan_rejects_nans(tmp_path):
    x = np.array([1.0, np.nan, 2.0, -np.nan], dtype=np.float32)
    _, st, rc = cast(x, "F32", "BF16", "--no-nan", tmp_path=tmp_path)
    assert rc == 3 and st["code"] == "CastNaN" and st["nans"] == 2 and st["first_bad"] == 1
    _, st, rc = cast(x, "F32", "F32", "--no-nan", tmp_path=tmp_path)
    assert rc == 3 and st["code"] == "CastNaN"
    _, st, rc = cast(x, "F32", "BF16", tmp_path=tmp_path)
    assert rc == 0 and st["nans"] == 2


INTS = ["I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64"]


def int_samples(frm):
    info = np.iinfo(RAW[frm])
    edge = [info.min, info.min + 1, -1 if info.min < 0 else 0, 0, 1, 127, 128, 255, 256, 32767, 32768,
            65535, 65536, 2 ** 24, 2 ** 24 + 1, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32,
            2 ** 53 + 1, 2 ** 63 - 1, info.max - 1, info.max]
    edge = [v for v in edge if info.min <= v <= info.max]
    rnd = RNG.integers(info.min, info.max, size=3000, dtype=RAW[frm], endpoint=True)
    return np.concatenate([np.array(edge, dtype=RAW[frm]), rnd])


@pytest.mark.parametrize("frm", INTS)
@pytest.mark.parametrize("to", INTS + ["BOOL"])
def test_int_to_int_vs_numpy(tmp_path, frm, to):
    if frm == to:
        return
    x = int_samples(frm)
    out, st, rc = cast(x, frm, to, tmp_path=tmp_path)
    sat, sst, src = cast(x, frm, to, "--saturate", tmp_path=tmp_path)
    lo, hi = (0, 1) if to == "BOOL" else (np.iinfo(RAW[to]).min, np.iinfo(RAW[to]).max)
    xi = [int(v) for v in x]
    oob = np.array([v < lo or v > hi for v in xi])
    assert st["overflowed"] == int(oob.sum()) == sst["overflowed"]
    assert (rc == 3) == bool(oob.any()) and src == 0
    if oob.any():
        assert st["code"] == "CastOverflow" and st["first_bad"] == int(np.argmax(oob))
    np.testing.assert_array_equal(out[~oob], x[~oob].astype(RAW[to]))
    np.testing.assert_array_equal(sat, np.clip(np.array(xi, dtype=object), lo, hi).astype(RAW[to]))


@pytest.mark.parametrize("frm", ["F16", "BF16", "F32", "F64"])
@pytest.mark.parametrize("to", ["I8", "U8", "I32", "U32", "I64", "U64", "BOOL"])
def test_float_to_int_strict(tmp_path, frm, to):
    lo, hi = (0, 1) if to == "BOOL" else (int(np.iinfo(RAW[to]).min), int(np.iinfo(RAW[to]).max))
    vals = np.concatenate([np.arange(-300, 301, dtype=np.float64), [0.5, -0.5, 1.5, 2.5, 1e-30, -0.0],
                           [lo, hi, lo - 1.0, hi + 1.0, 2.0 ** 63, -2.0 ** 63, 2.0 ** 64, 2.0 ** 31,
                            -2.0 ** 31, 2.0 ** 32, 1e20, -1e20, np.inf, -np.inf, np.nan],
                           np.round(RNG.uniform(-3e9, 3e9, 500))])
    if frm == "F64":
        x = vals
    elif frm == "F32":
        x = vals.astype(np.float32)
    elif frm == "F16":
        with np.errstate(over="ignore"):
            x = vals.astype(np.float16)
    else:
        x = bits_of(torch.from_numpy(vals).to(torch.bfloat16), np.uint16)
    exact = (torch.from_numpy(x.view(np.int16)).view(torch.bfloat16).to(torch.float64).numpy()
             if frm == "BF16" else x.astype(np.float64))
    out, st, rc = cast(x, frm, to, tmp_path=tmp_path)
    sat, sst, _ = cast(x, frm, to, "--saturate", tmp_path=tmp_path)
    nan = np.isnan(exact)
    # Python compares float with int exactly (numpy would round 2**63 - 1 to 2**63)
    oob = np.array([not math.isnan(v) and (v < lo or v > hi) for v in exact.tolist()])
    frac = ~nan & ~oob & (np.trunc(exact) != exact)
    good = ~nan & ~oob & ~frac
    assert st["overflowed"] == int(oob.sum()) and st["inexact"] == int(frac.sum())
    assert rc == 3
    assert st["first_bad"] == int(np.argmax(nan | oob | frac))
    ref = np.array([int(v) for v in exact[good]], dtype=object).astype(RAW[to])
    np.testing.assert_array_equal(out[good], ref)
    np.testing.assert_array_equal(sat[good], ref)
    np.testing.assert_array_equal(sat[oob], np.array([lo if v < lo else hi for v in exact[oob].tolist()],
                                                     dtype=object).astype(RAW[to]))


@pytest.mark.parametrize("frm", ["I32", "I64", "U64", "U8"])
@pytest.mark.parametrize("to", ["F64", "F32", "F16", "BF16", "F8_E4M3"])
def test_int_to_float_exact_or_error(tmp_path, frm, to):
    x = int_samples(frm)
    out, st, rc = cast(x, frm, to, tmp_path=tmp_path)
    xi = [int(v) for v in x]
    if to in ("F64", "F32"):
        ref_dt = np.float64 if to == "F64" else np.float32
        mx = float(np.finfo(ref_dt).max)
        rv = [fractions.Fraction(float(ref_dt(v))) if abs(v) <= mx else None for v in xi]
        over = np.array([r is None for r in rv])
        exact = np.array([r is not None and r == v for r, v in zip(rv, xi)])
        got = out.view(ref_dt)
    else:
        mx = fmt_max(to)
        over = np.array([abs(v) > mx for v in xi])
        nr = [naive_round(float(v), to)[0] if not o else 0 for v, o in zip(xi, over)]
        # exact iff the naive rounder's value equals the integer
        dec = {"F16": lambda b: float(np.uint16(b).view(np.float16)),
               "BF16": lambda b: float(torch.tensor([b], dtype=torch.int32).to(torch.int16).view(torch.bfloat16)),
               "F8_E4M3": lambda b: float(torch.tensor([b], dtype=torch.uint8).view(torch.float8_e4m3fn))}[to]
        exact = np.array([not o and dec(b) == v for b, o, v in zip(nr, over, xi)])
        got = out
    inexact = ~over & ~exact
    assert st["overflowed"] == int(over.sum()) and st["inexact"] == int(inexact.sum())
    assert (rc == 0) == (not over.any() and not inexact.any())
    if to in ("F64", "F32"):
        np.testing.assert_array_equal(got[exact], np.array(xi, dtype=object)[exact].astype(got.dtype))
    else:
        np.testing.assert_array_equal(got[exact], np.array(nr, dtype=np.int64)[exact].astype(got.dtype))


def test_bool_rules(tmp_path):
    b = np.array([0, 1, 1, 0, 2, 255], dtype=np.uint8)
    out, st, rc = cast(b, "BOOL", "F32", tmp_path=tmp_path)
    assert rc == 3 and st["code"] == "CastInvalidBool" and st["invalid_bool"] == 2 and st["first_bad"] == 4
    out, st, rc = cast(b[:4], "BOOL", "I64", tmp_path=tmp_path)
    assert rc == 0 and list(out) == [0, 1, 1, 0]
    out, st, rc = cast(np.array([0.0, 1.0, -0.0], np.float32), "F32", "BOOL", tmp_path=tmp_path)
    assert rc == 0 and list(out) == [0, 1, 0]
    out, st, rc = cast(np.array([0.0, 2.0, 0.5], np.float32), "F32", "BOOL", tmp_path=tmp_path)
    assert rc == 3 and st["overflowed"] == 1 and st["inexact"] == 1 and st["first_bad"] == 1


def test_bad_input_size_is_rejected(tmp_path):
    inp = tmp_path / "odd.bin"
    inp.write_bytes(b"\x00\x01\x02")
    p = subprocess.run([_tool_path(), "F32", "BF16", str(inp), str(tmp_path / "o.bin")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "multiple of 4" in p.stderr
