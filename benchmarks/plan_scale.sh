#!/bin/sh
# The planner at scale (docs/PLAN.md "Scale", "Search at scale"): a 70B-class LLaMA
# (fixtures/llama_70b_config.json), global batch 8192 x 4096 tokens, on
# fixtures/clusters/scale_512_three_types.json with every node repeated FACTOR times (1: 512 devices
# on 64 nodes, 8: 4,096 on 512, 64: 32,768 on 4,096; the copies of a node follow it, so the
# types stay in blocks). Prints per factor the plan's summary lines and the search's CPU time, wall
# time and peak memory (/usr/bin/time), and the machine's load.
# Usage: benchmarks/plan_scale.sh [CKPT_BIN] [FACTOR...]   (default factors: 1 8 64)
# PLAN_MODEL=fixtures/mixtral_8x22b_config.json benchmarks/plan_scale.sh ...: the MoE variant (8 experts,
# top-2; the search then also weighs ep and etp, docs/PLAN.md "Mixture of experts").
set -e
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/build/ckpt}
[ $# -gt 0 ] && shift
factors=${*:-1 8 64}
model=${PLAN_MODEL:-$here/fixtures/llama_70b_config.json}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in $factors; do
  python3 - "$here/fixtures/clusters/scale_512_three_types.json" "$f" "$tmp/cluster_x$f.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
k = int(sys.argv[2])
c["nodes"] = [dict(n, name=f"{n['name']}_{i}" if k > 1 else n["name"]) for n in c["nodes"] for i in range(k)]
json.dump(c, open(sys.argv[3], "w"))
PY
  devices=$(python3 -c "import json,sys; print(sum(d['count'] for n in json.load(open(sys.argv[1]))['nodes'] for d in n['devices']))" \
    "$tmp/cluster_x$f.json")
  echo "== x$f: $devices devices; $(uptime | sed 's/.*load/load/')"
  /usr/bin/time -f "x$f: cpu %U s user + %S s sys, wall %e s, peak RSS %M KiB" "$bin" plan --cluster "$tmp/cluster_x$f.json" \
    --model "$model" --global-batch 8192 --seq-len 4096 --top 3 | grep -v '^  stage' | cut -c1-240
done
