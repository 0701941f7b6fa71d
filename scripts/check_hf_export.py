#!/usr/bin/env python3
"""Checks a `ckpt to-hf` export with the real Python stack, independently of ckpt's own reader.

    check_hf_export.py HF_DIR NATIVE_CHECKPOINT_OR_RUN_DIR

1. transformers loads HF_DIR as a LlamaForCausalLM (config.json + safetensors, index if sharded).
2. The native checkpoint is read with h5py (+ hdf5plugin for zstd shards) straight from its
   manifest, every piece checked against its digest (hashlib / xxhash), and reassembled in global view.
3. Every HF tensor equals the native tensor cast by torch to the export dtype (bit for bit).
4. The model scores a fixed byte sequence; the loss must be finite and below ln(vocab), the loss
   of a model that learned nothing.
Exit status 0 when all hold; the first failure is printed and exits 1.
"""
import math
import pathlib
import sys

import torch
from transformers import AutoModelForCausalLM

from native_h5py import read_native  # scripts/native_h5py.py: h5py + hashlib + xxhash only


def fail(msg):
    print(f"check_hf_export: FAIL: {msg}")
    sys.exit(1)


def resolve(path: pathlib.Path) -> pathlib.Path:
    if (path / "manifest.json").exists():
        return path
    latest = path / "latest"
    if latest.exists():
        return path / latest.read_text().strip()
    fail(f"{path}: neither a checkpoint (manifest.json) nor a run directory (latest)")


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        sys.exit(2)
    hf_dir = pathlib.Path(sys.argv[1])
    ckpt = resolve(pathlib.Path(sys.argv[2]))
    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype="auto")
    model.eval()
    try:
        man, native, _ = read_native(ckpt, skip=lambda n: n.startswith("optimizer."))
    except (ValueError, KeyError, OSError) as e:
        fail(f"reading {ckpt} with h5py: {e}")
    sd = model.state_dict()
    cfg = model.config
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    checked = 0
    for name, arr in native.items():
        if tied and name == "lm_head.weight":
            continue
        if name not in sd:
            fail(f"native tensor {name} is missing from the HF model")
        want = torch.from_numpy(arr)
        native_dt = {t["name"]: t["dtype"] for t in man["tensors"]}[name]
        if native_dt in ("BF16", "F16"):  # raw bits
            want = want.view(torch.bfloat16 if native_dt == "BF16" else torch.float16)
        want = want.to(sd[name].dtype)
        got = sd[name]
        if tuple(got.shape) != tuple(want.shape):
            fail(f"{name}: HF shape {tuple(got.shape)}, native {tuple(want.shape)}")
        if not torch.equal(got.contiguous().reshape(-1).view(torch.uint8), want.contiguous().reshape(-1).view(torch.uint8)):
            d = float((got.float() - want.float()).abs().max())
            fail(f"{name}: HF tensor differs from the native one cast by torch (max abs diff {d:.3e})")
        checked += 1
    text = b"The quick brown fox jumps over the lazy dog. " * 4
    ids = torch.tensor([list(text[:128])], dtype=torch.long)
    with torch.no_grad():
        loss = float(model(input_ids=ids, labels=ids).loss)
    chance = math.log(cfg.vocab_size)
    if not math.isfinite(loss) or loss >= chance:
        fail(f"loss {loss:.4f} on a fixed byte sequence is not below ln(vocab) = {chance:.4f}")
    step = man.get("trainer", {}).get("step", "?")
    print(f"check_hf_export: OK: transformers loaded {hf_dir} ({sd[next(iter(sd))].dtype}); "
          f"{checked} tensors equal the native checkpoint {ckpt.name} (step {step}) cast by torch; "
          f"loss on a fixed byte sequence {loss:.4f} < ln(vocab) {chance:.4f}")


if __name__ == "__main__":
    main()
