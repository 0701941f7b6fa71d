#!/bin/sh
# The planner at scale (docs/PLAN.md "Scale"): a 70B-class LLaMA on 512 devices of 3 types over 64
# nodes. Prints the plan, the predicted gain over the hand-written layout and the search time.
# Usage: benchmarks/plan_scale.sh [CKPT_BIN]
set -e
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/build/ckpt}
/usr/bin/time -f "wall %e s, cpu %U s" "$bin" plan --cluster "$here/fixtures/clusters/scale_512_three_types.json" \
  --model "$here/fixtures/llama_70b_config.json" --global-batch 1024 --seq-len 4096 --top 3 | grep -v '^  stage'
