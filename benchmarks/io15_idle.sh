#!/bin/bash
# issue 15, the 'idle' memory state: before every command 30 s of sleep and dropped page caches
# (root), then the command; to-hf from tp=2 and reshard tp=2 -> tp=1 with --io direct and
# buffered, against cp -r + sync of the same bytes. Usage: CKPT=build/ckpt io15_idle.sh DIR (io15_bench.py --dir)
B=${CKPT:-$PWD/build/ckpt}
cd "${1:-tmpbench/run}"
uptime
run() {
  name=$1; shift
  sync; sleep 30; echo 3 > /proc/sys/vm/drop_caches
  s=$(date +%s.%N); "$@" > /dev/null; sync; e=$(date +%s.%N)
  echo "$name $(echo "$e - $s" | bc)"
}
clean() { rm -rf idle_cp_hf idle_hf_direct idle_hf_buffered idle_rs_cp idle_rs_direct idle_rs_buffered; }
clean
run "cp -r hf + sync" cp -r hf idle_cp_hf
run "to-hf tp2 --io direct" $B to-hf tp2 idle_hf_direct --io direct
run "to-hf tp2 --io buffered" $B to-hf tp2 idle_hf_buffered --io buffered
clean
run "cp -r tp2 + sync" cp -r tp2 idle_rs_cp
run "reshard --io direct" $B reshard tp2 idle_rs_direct --tp 1 --pp 1 --dp 1 --io direct
run "reshard --io buffered" $B reshard tp2 idle_rs_buffered --tp 1 --pp 1 --dp 1 --io buffered
uptime
clean
