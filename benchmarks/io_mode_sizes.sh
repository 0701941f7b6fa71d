#!/bin/bash
# The --io auto threshold (docs/BENCHMARKS.md "--io auto threshold"). Run in a scratch directory on the disk to measure.
# buffered (+fsync) vs O_DIRECT (+fsync) writes of new files of several sizes, 3 runs each, bs=4M (1M for small)
uptime
for mb in 1 4 16 64 256 1024; do
  for mode in buffered direct; do
    ts=()
    for rep in 1 2 3; do
      bs=1M; cnt=$mb
      [ $mb -ge 16 ] && bs=4M && cnt=$((mb/4))
      flag=""; [ $mode = direct ] && flag="oflag=direct"
      s=$(date +%s.%N); dd if=/dev/zero of=f.bin bs=$bs count=$cnt $flag conv=fsync status=none; e=$(date +%s.%N)
      ts+=($(echo "$e - $s" | bc)); rm -f f.bin
    done
    echo "$mb MiB $mode ${ts[*]}"
  done
done
uptime
