"""ckpt::cast_elements to and from integers and bool against numpy, exact Python integers and the
naive exact rounder (cast_helpers.py): out-of-range values are CastOverflow (or clamped with
--saturate), fractional values CastInexact, bool bytes other than 0/1 CastInvalidBool.
"""
import fractions
import math
import pathlib
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from cast_helpers import RAW, RNG, bits_of, cast, fmt_max, naive_round  # noqa: E402


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

