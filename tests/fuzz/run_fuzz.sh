#!/usr/bin/env bash
# Runs the safetensors libFuzzer targets (header parser, index parser), seeded with valid files
# and a dictionary of the format's tokens. The libraries are built with coverage instrumentation
# (-fsanitize=fuzzer-no-link,address,undefined, see CMakeLists.txt CKPT_FUZZ) so libFuzzer is not blind.
#   tests/fuzz/run_fuzz.sh [seconds]          # smoke (scripts/test.sh: 15 s per target)
#   tests/fuzz/run_fuzz.sh 3600               # long run: one hour per target
#   CKPT_FUZZ_JOBS=2 tests/fuzz/run_fuzz.sh 3600   # long run on 2 cores (libFuzzer -fork=2)
# Builds (incrementally) into build-fuzz with clang-14 unless CKPT_FUZZ_DIR points elsewhere.
# Prints executions per target; exits non-zero if a target finds a crash, leak, OOM or timeout
# (reproducer in the printed artifacts directory), if a fuzzer exits non-zero for any reason, or
# if it executed fewer than CKPT_FUZZ_MIN_EXECS_PER_SEC (default 200) inputs per second of the run.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
secs="${1:-20}"
min_execs=$(( secs * ${CKPT_FUZZ_MIN_EXECS_PER_SEC:-200} ))
bdir="${CKPT_FUZZ_DIR:-$here/build-fuzz}"
if [ ! -f "$bdir/CMakeCache.txt" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S "$here" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_FUZZ=ON \
    -DCKPT_BUILD_TESTS=OFF -DCKPT_BUILD_BENCHMARKS=OFF -DCKPT_WERROR=OFF >/dev/null
fi
ninja -C "$bdir" -j2 safetensors_header_fuzz safetensors_index_fuzz >/dev/null
out="$(mktemp -d /tmp/ckpt_fuzz.XXXXXX)"
mkdir -p "$out/header" "$out/index"
# Seeds: valid headers (empty, tensors with metadata, scalar, zero-size) and indexes.
printf '\x02\0\0\0\0\0\0\0{}' > "$out/header/empty"
h='{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[],"data_offsets":[16,18]},"z":{"dtype":"U8","shape":[0],"data_offsets":[18,18]}}'
{ printf "$(printf '\\x%02x' $(( ${#h} & 255 )) $(( ${#h} >> 8 )))\0\0\0\0\0\0"; printf '%s' "$h"; head -c 18 /dev/zero; } > "$out/header/tensors"
printf '{"metadata":{"total_size":16},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}' > "$out/index/two"
printf '{"weight_map":{}}' > "$out/index/empty"
cat > "$out/dict" <<'EOF'
"{"
"}"
"["
"]"
":"
","
"\""
"\\u0000"
"__metadata__"
"dtype"
"shape"
"data_offsets"
"\"F32\""
"\"BF16\""
"\"F16\""
"\"U8\""
"\"BOOL\""
"\"F8_E4M3\""
"\"C64\""
"18446744073709551615"
"4294967296"
"null"
"weight_map"
"metadata"
"total_size"
".safetensors"
"../"
"/"
"\xef\xbb\xbf"
"\xed\xa0\x80"
EOF
status=0
for t in header index; do
  echo "== safetensors_${t}_fuzz for ${secs}s"
  extra=()
  if [ -n "${CKPT_FUZZ_JOBS:-}" ]; then extra=(-fork="$CKPT_FUZZ_JOBS" -ignore_crashes=0); fi
  log="$out/${t}.log"
  rc=0
  ( cd "$out" && "$bdir/safetensors_${t}_fuzz" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
      -dict="$out/dict" -print_final_stats=1 "${extra[@]}" -artifact_prefix="$out/${t}-" "$out/$t" >"$log" 2>&1 ) || rc=$?
  grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+ +DONE|ERROR|SUMMARY' "$log" | tail -5 || true
  if ls "$out/${t}-"* >/dev/null 2>&1; then echo "FINDING in $t: $(ls "$out/${t}-"*)"; status=1; fi
  if [ "$rc" -ne 0 ]; then echo "FAIL: safetensors_${t}_fuzz exited $rc (log: $log)"; status=1; fi
  # Executed inputs: the final stats line, or (with -fork, no final stats) the last "#N: cov:" line.
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p; s/^#([0-9]+): cov:.*/\1/p' "$log" | tail -1)
  if [ "${execs:-0}" -lt "$min_execs" ]; then
    echo "FAIL: safetensors_${t}_fuzz executed ${execs:-no} inputs in ${secs}s, expected at least $min_execs (log: $log)"
    status=1
  fi
done
echo "corpus, logs and artifacts: $out"
exit $status
