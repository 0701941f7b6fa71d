"""Independent numpy references for quantized weights (issue 39), written from the reference
sources, not from ckpt. Not a test module.

- dequant_block_fp8: DeepSeek-V3 inference/kernel.py weight_dequant (the Triton kernel: block
  (pid_m, pid_n) of BLOCK_SIZE x BLOCK_SIZE, masked at the ragged edges, y = x.to(float32) * s,
  stored into a tensor of torch's default dtype, bf16 in fp8_cast_bf16.py: one rounding to
  nearest even), with leading (expert) dimensions as independent matrices.
- quantize_block_fp8: transformers 5.24 integrations/finegrained_fp8.py Fp8Quantize._quantize_one
  (per block amax in f32, scales = 448 / amax computed as torch does for a Python float over a
  tensor: reciprocal(amax) * 448; inv = 1 / scales (f32), zero blocks scale 1,
  clamp(x * scales, -448, 448).to(float8_e4m3fn)).
- dequant_mxfp4: gpt-oss / transformers integrations/mxfp4.py _convert_moe_packed_tensors without
  its final transpose(1, 2) (model layout): lut[idx_lo] -> [0::2], lut[idx_hi] -> [1::2],
  ldexp(value, scale - 127).
"""
import ml_dtypes
import numpy as np

FP8 = ml_dtypes.float8_e4m3fn
FP4_VALUES = np.array([+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def dequant_block_fp8(w_u8: np.ndarray, s: np.ndarray, bm: int = 128, bn: int = 128, out=ml_dtypes.bfloat16):
    """w_u8: [.., M, N] fp8 bytes; s: [.., ceil(M/bm), ceil(N/bn)] f32 scales."""
    x = w_u8.view(FP8).astype(np.float32)
    m, n = x.shape[-2:]
    y = np.empty_like(x)
    for i in range(0, m, bm):  # one program per block, as the kernel's grid
        for j in range(0, n, bn):
            y[..., i:i + bm, j:j + bn] = x[..., i:i + bm, j:j + bn] * s[..., i // bm, j // bn][..., None, None]
    return y.astype(out)


def dequant_scaled_fp8(w_u8: np.ndarray, scale: np.ndarray, out=ml_dtypes.bfloat16):
    """Per-tensor (scale of one element) or per-row ([M] / [M, 1]) scaled FP8: fp8 * scale in f32."""
    x = w_u8.view(FP8).astype(np.float32)
    s = scale.astype(np.float32).reshape(-1)
    y = x * (s[0] if s.size == 1 else s[:, None])
    return y.astype(out)


def quantize_block_fp8(w: np.ndarray, bm: int = 128, bn: int = 128):
    """w: [M, N] f32 with M % bm == 0 and N % bn == 0 -> (fp8 bytes [M, N], inv scales [M/bm, N/bn] f32)."""
    m, n = w.shape
    r = w.astype(np.float32).reshape(m // bm, bm, n // bn, bn)
    amax = np.abs(r).max(axis=(1, 3))
    safe = np.where(amax > 0, amax, np.float32(1))
    # `_FP8_MAX / safe_max_abs` is a Python float over a tensor: torch's __rtruediv__ is
    # reciprocal(tensor) * scalar, two f32 roundings (found against transformers itself).
    scales = np.where(amax > 0, (np.float32(1.0) / safe).astype(np.float32) * np.float32(448.0), np.float32(1)).astype(np.float32)
    inv = (np.float32(1.0) / scales).astype(np.float32)
    q = np.clip(r * scales[:, None, :, None], -448, 448).astype(np.float32).astype(FP8)
    return q.reshape(m, n).view(np.uint8), inv


def dequant_mxfp4(blocks: np.ndarray, scales: np.ndarray, out=ml_dtypes.bfloat16):
    """blocks: [.., G, 16] u8; scales: [.., G] u8 -> [.., G * 32]."""
    lo, hi = FP4_VALUES[blocks & 0x0F], FP4_VALUES[blocks >> 4]
    v = np.empty(blocks.shape[:-1] + (32,), np.float32)
    v[..., 0::2], v[..., 1::2] = lo, hi
    v = np.ldexp(v, scales.astype(np.int32)[..., None] - 127).astype(np.float32)
    return v.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32).astype(out)


def quantize_mxfp4(w: np.ndarray):
    """w: [.., C] f32 with C % 32 == 0 -> (blocks u8 [.., C/32, 16], scales u8 [.., C/32]): triton_kernels
    numerics_details/mxfp_details/_downcast_to_mxfp.py _compute_quant_and_scale (the kernel gpt-oss's
    quantize_to_mxfp4 calls through downcast_to_mxfp), fp4 output, DequantScaleRoundingMode.ROUND_UP:
    dequant_scale = max|x| / 6 (f32), its exponent rounded up by adding 0x007FFFFF to its bits,
    quant = x * (1 / 2^e), then its e2m1 bit recipe (sign, exponent rebased from 127 to 1, two
    mantissa bits kept, + 1 >> 1: ties up, min 7), evens | odds << 4."""
    x = w.astype(np.float32).reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    dq = (amax / np.float32(6.0)).astype(np.float32)
    exp_bits = (dq.view(np.uint32) + np.uint32(0x007FFFFF)) & np.uint32(0x7F800000)
    rounded = exp_bits.view(np.float32)
    with np.errstate(divide="ignore"):
        qs = np.where(rounded == 0, np.float32(0), (np.float32(1.0) / rounded)).astype(np.float32)
    q = (x * qs).astype(np.float32).view(np.uint32)
    signs, exps, mants = q & 0x80000000, (q >> 23) & 0xFF, q & 0x7FFFFF
    adj = (126 - exps.astype(np.int64)).clip(0, 63)
    den = np.where(adj >= 32, 0, (0x400000 | (mants >> 1)).astype(np.uint64) >> adj.astype(np.uint64)).astype(np.uint32)
    mants = np.where(exps < 127, den, mants)
    exps = np.maximum(exps, 126) - 126
    tmp = np.minimum((((exps << 2) | (mants >> 21)) + 1) >> 1, 7)
    e2m1 = ((signs >> 28) | tmp).astype(np.uint8)
    blocks = (e2m1[..., 0::2] | (e2m1[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (exp_bits[..., 0] >> 23).astype(np.uint8)
