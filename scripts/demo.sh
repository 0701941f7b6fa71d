#!/usr/bin/env bash
# The main job on the embedded default: build ckpt, train a tiny LLaMA on 4 MPI ranks as an
# uneven pipeline [1,3] with heterogeneous data parallelism (micro-batches 6 and 2) and ZeRO-1,
# reshard its checkpoint (weights + Adam state) to tensor parallelism with another uneven
# pipeline, check the result in global view, resume training from it on 6 ranks of that layout,
# and export to HuggingFace safetensors that transformers loads and scores like the trainer did.
#   scripts/demo.sh [OUT_DIR]     (default: ./out/demo; removed and re-created)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
bash scripts/setup.sh
PY="$here/.venv/bin/python"
OUT="${1:-$here/out/demo}"

echo "== build =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_PYTHON="$PY" >/dev/null
ninja -C build -j2 ckpt >/dev/null
CKPT="$here/build/ckpt"
rm -rf "$OUT"; mkdir -p "$OUT"

step() { echo; echo "== $* =="; }
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

step "1. train a tiny LLaMA (fixtures/tiny_llama.json) for 30 steps on 4 ranks: pp=2 [1,3], dp=2 with micro-batches [6,2], ZeRO-1"
"${MPIRUN[@]}" -np 4 "$CKPT" train --config fixtures/tiny_llama.json --steps 30 --save-every 15 --out "$OUT/run" \
  --pp 2 --pp-layers 1,3 --dp 2 --micro-batches 6,2 --zero 1

step "2. inspect and verify the checkpoint"
"$CKPT" inspect "$OUT/run"
"$CKPT" verify "$OUT/run"

step "3. reshard to tp=2, pp=3 with an uneven split [1,1,2], dp=1"
"$CKPT" reshard "$OUT/run" "$OUT/tp2pp3" --tp 2 --pp 3 --pp-layers 1,1,2 --dp 1 --zero 0
"$CKPT" inspect "$OUT/tp2pp3"
"$CKPT" verify "$OUT/tp2pp3"

step "4. the resharded checkpoint equals the original in global view (weights and Adam state)"
"$CKPT" diff "$OUT/run" "$OUT/tp2pp3"

step "5. resume training from the resharded checkpoint for 10 more steps on 6 ranks of its layout"
"${MPIRUN[@]}" -np 6 "$CKPT" train --config fixtures/tiny_llama.json --steps 40 --save-every 10 --out "$OUT/resumed" \
  --resume "$OUT/tp2pp3" --tp 2 --pp 3 --pp-layers 1,1,2 --dp 1 --micro-batch 8

step "6. export to HuggingFace safetensors (bf16) and check it with transformers"
"$CKPT" to-hf "$OUT/resumed" "$OUT/hf" --dtype bf16
"$PY" scripts/check_hf_export.py "$OUT/hf" "$OUT/resumed"

echo
echo "demo: done; outputs in $OUT"
