#!/usr/bin/env bash
# The main job: training goes on with the same loss when the cluster changes under it.
# Builds ckpt, then trains a 6-layer LLaMA (fixtures/demo/llama_6l.json) on cluster A (2 ranks of
# a memory-rich "hbm-large" type and 4 of a "fast" type, fixtures/demo/cluster_a.json) laid out
# by a FlagScale config (layout_a_flagscale.json: hetero_process_meshes, hetero_device_types...;
# the same as layout_a.json: 2 pipelines x [2 layers tp1 on hbm-large | 4 layers tp2 on fast],
# micro-batches 4 and 2, ZeRO-1) for 20 steps with a checkpoint at step 10. Then the
# cluster changes (cluster_b.json: the hbm-large machines replaced by another vendor's, 5 ranks):
# `ckpt reshard` moves the step-10 checkpoint (weights and Adam state) to a FlashFlex-style layout
# (layout_b.json: two pipelines with different stage splits and per-stage tp), `inspect` shows
# it, `diff` checks it equals the source in global view, and a new mpirun resumes on B to step 20.
# Its losses must equal the uninterrupted run's; to-hf exports it and transformers checks the
# export. Prints a summary and writes OUT/loss.png (both loss curves).
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
start=$SECONDS

step() { echo; echo "== $* =="; }
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
FX=fixtures/demo
# Every run: 12 sequences of 64 tokens per step (A and B: micro-batches 4 + 2, 2 per step).
TRAIN=("$CKPT" train --config $FX/llama_6l.json --seq-len 64 --grad-accum 2 --warmup 3 --total-steps 20 --seed 7)
nranks() { "$PY" -c 'import json,sys; print(sum(r["count"] for r in json.load(open(sys.argv[1]))["ranks"]))' "$1"; }
NA=$(nranks $FX/cluster_a.json); NB=$(nranks $FX/cluster_b.json)

step "1. cluster A ($NA ranks: 2 hbm-large, 4 fast), FlagScale-style meshes: train 20 steps, checkpoint at 10"
"${MPIRUN[@]}" -np "$NA" "${TRAIN[@]}" --cluster $FX/cluster_a.json --layout $FX/layout_a_flagscale.json \
  --steps 20 --save-every 10 --out "$OUT/a"
"$CKPT" verify "$OUT/a/step-00000010"

step "2. the cluster changes ($NB ranks: 2 vendor-c, 3 fast): reshard step 10 to the FlashFlex-style layout B"
"$CKPT" reshard "$OUT/a/step-00000010" "$OUT/b-step10" --layout $FX/layout_b.json
"$CKPT" inspect "$OUT/b-step10" > "$OUT/b-step10.inspect.txt"
awk '/^tensor /{exit} {print}' "$OUT/b-step10.inspect.txt"   # the header: format, step, layout
echo "  ... (one line per tensor: $OUT/b-step10.inspect.txt)"
grep '^totals' "$OUT/b-step10.inspect.txt"

step "3. the resharded checkpoint equals the original in global view (weights and Adam state)"
"$CKPT" diff "$OUT/a/step-00000010" "$OUT/b-step10" | tee "$OUT/diff.txt"

step "4. resume on cluster B with a new mpirun, to step 20"
"${MPIRUN[@]}" -np "$NB" "${TRAIN[@]}" --cluster $FX/cluster_b.json --layout $FX/layout_b.json \
  --steps 20 --save-every 10 --out "$OUT/b" --resume "$OUT/b-step10"

step "5. the step-20 checkpoints of both runs agree (float32 summation order aside)"
"$CKPT" diff --rtol 1e-5 --atol 5e-6 "$OUT/a/step-00000020" "$OUT/b/step-00000020" | tail -n 3

step "6. export to HuggingFace safetensors (bf16) and check it with transformers"
"$CKPT" to-hf "$OUT/b" "$OUT/hf" --dtype bf16
"$PY" scripts/check_hf_export.py "$OUT/hf" "$OUT/b" | tee "$OUT/hf_check.txt"

step "7. loss curves"
"$PY" scripts/plot_loss.py "$OUT/loss.png" "uninterrupted on cluster A ($NA ranks)=$OUT/a" \
  "resumed at step 10 on cluster B ($NB ranks)=$OUT/b" --mark-step 10 --rtol 1e-5 \
  --title "6-layer LLaMA: FlagScale-style meshes on A, resharded to FlashFlex-style pipelines on B" \
  | tee "$OUT/loss_compare.txt"

echo
echo "== summary =="
lay() { "$CKPT" inspect --json "$1" | "$PY" -c 'import json,sys
l = json.load(sys.stdin)["layout"]
if "pipelines" in l:
    print("; ".join("mb %d [%s]" % (p["micro_batch"], " | ".join("%d layers tp%d %s" % (s["layers"], s["tp"], s.get("device", ""))
                    for s in p["stages"])) for p in l["pipelines"]) + " zero=%d" % l["zero"])
else:
    print("tp=%d pp=%d dp=%d zero=%d" % (l["tp"], l["pp"], l["dp"], l["zero"]))'; }
echo "layout A ($NA ranks): $(lay "$OUT/a/step-00000010")"
echo "layout B ($NB ranks): $(lay "$OUT/b/step-00000020")"
echo "reshard A -> B, global view: $(tail -n 1 "$OUT/diff.txt")"
echo "losses of steps 11-20, resumed vs uninterrupted: $(sed -n 's/.*largest relative loss difference/largest relative difference/p' "$OUT/loss_compare.txt")"
echo "HuggingFace export (bf16) in transformers: $(tail -n 1 "$OUT/hf_check.txt" | sed 's/^check_hf_export: //; s/ (torch[^)]*)//; s/ cast by torch//')"
echo "loss curves: $OUT/loss.png"
echo "demo: done in $((SECONDS - start)) s after the build; outputs in $OUT"
