#!/bin/bash
# reshard tp=2 -> tp=1 of the 2.2 GB store with each --io (source check on), vs cp -r + sync of the source; 2 rounds
B=${CKPT:-$PWD/build/ckpt}
cd "${1:-tmpbench/run}"  # the io15_bench.py --dir (holds tp2/)
uptime
for r in 1 2; do
  for c in cp buffered direct auto; do
    rm -rf rs_$c; sync
    python3 -c "import numpy as np; a=np.ones(3*(1<<30)//8); del a"
    s=$(date +%s.%N)
    if [ $c = cp ]; then cp -r tp2 rs_cp && sync; else $B reshard tp2 rs_$c --tp 1 --pp 1 --dp 1 --io $c > /dev/null; fi
    e=$(date +%s.%N)
    echo "round $r $c $(echo "$e - $s" | bc)"
  done
done
uptime
