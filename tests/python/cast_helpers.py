"""Shared by test_casts.py and test_casts_int.py: the cast_tool driver, bit helpers, a naive exact
rounder independent of the C++ code, and the input pattern generators. Not a test module (the
name does not start with test_, so CMake makes no ctest of it).

RNG is one seeded generator for both test modules: each draws from it in its own test order.
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
       "F8_E4M3": np.uint8, "F8_E5M2": np.uint8, "F8_E8M0": np.uint8, "F4": np.uint8, "I64": np.int64, "I32": np.int32,
       "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
       "U64": np.uint64, "BOOL": np.uint8}
ISA_MODES = [(), ("--portable",)]


def bits_of(t: torch.Tensor, np_dtype) -> np.ndarray:
    """Raw bits of a torch tensor (any 1/2/4-byte dtype) as an unsigned numpy array."""
    itemsize = t.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[itemsize]
    return t.contiguous().view(view).numpy().view(np_dtype)


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


def is_nan32(b):
    return (b & 0x7FFFFFFF) > 0x7F800000


def is_nan16(b):
    return (b & 0x7FFF) > 0x7C00


def is_nan_bf16(b):
    return (b & 0x7FFF) > 0x7F80


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
