#!/usr/bin/env bash
# Smoke run of the safetensors libFuzzer targets (default 20 s each), seeded with valid files.
#   tests/fuzz/run_fuzz.sh [seconds]          # smoke (CI)
#   tests/fuzz/run_fuzz.sh 3600               # long run, one hour per target
# Builds into build-fuzz (clang-14) unless CKPT_FUZZ_DIR points at an existing fuzz build.
# Exit status is non-zero if a target finds a crash, leak or timeout (artifacts in $out/).
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
secs="${1:-20}"
bdir="${CKPT_FUZZ_DIR:-$here/build-fuzz}"
if [ ! -x "$bdir/safetensors_header_fuzz" ] || [ ! -x "$bdir/safetensors_index_fuzz" ]; then
  CC=clang-14 CXX=clang++-14 cmake -S "$here" -B "$bdir" -G Ninja -DCKPT_FUZZ=ON -DCKPT_BUILD_TESTS=OFF \
    -DCKPT_BUILD_BENCHMARKS=OFF -DCKPT_WERROR=OFF >/dev/null
  ninja -C "$bdir" -j2 safetensors_header_fuzz safetensors_index_fuzz
fi
out="$(mktemp -d /tmp/ckpt_fuzz.XXXXXX)"
mkdir -p "$out/header" "$out/index"
# Seeds: valid headers (empty, tensors with metadata, scalar, zero-size) and indexes.
printf '\x02\0\0\0\0\0\0\0{}' > "$out/header/empty"
h='{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[],"data_offsets":[16,18]},"z":{"dtype":"U8","shape":[0],"data_offsets":[18,18]}}'
{ printf "$(printf '\\x%02x' $(( ${#h} & 255 )) $(( ${#h} >> 8 )))\0\0\0\0\0\0"; printf '%s' "$h"; head -c 18 /dev/zero; } > "$out/header/tensors"
printf '{"metadata":{"total_size":16},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}' > "$out/index/two"
printf '{"weight_map":{}}' > "$out/index/empty"
status=0
for t in header index; do
  echo "== safetensors_${t}_fuzz for ${secs}s"
  ( cd "$out" && "$bdir/safetensors_${t}_fuzz" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$out/${t}-" "$out/$t" 2>&1 | grep -E '^#[0-9]+.*(DONE|pulse)|ERROR|SUMMARY|Done' | tail -3 ) || true
  if ls "$out/${t}-"* >/dev/null 2>&1; then echo "FINDING in $t: $(ls "$out/${t}-"*)"; status=1; fi
done
echo "corpus and artifacts: $out"
exit $status
