#!/usr/bin/env bash
# Runs the libFuzzer targets (safetensors header and index parsers, the store manifest parser,
# the restricted unpickler of formats/torch, the .pdparams parser of formats/paddle, the DCP .metadata parser, profile and cluster files), seeded with valid files
# and a dictionary of the format's tokens. The libraries are built with coverage instrumentation
# (-fsanitize=fuzzer-no-link,address,undefined, see CMakeLists.txt CKPT_FUZZ) so libFuzzer is not blind.
#   tests/fuzz/run_fuzz.sh [seconds]          # smoke (scripts/test.sh: 5 s per target)
#   tests/fuzz/run_fuzz.sh 3600               # long run: one hour per target
#   CKPT_FUZZ_JOBS=2 tests/fuzz/run_fuzz.sh 3600   # long run on 2 cores (libFuzzer -fork=2)
# Builds (incrementally) into build-fuzz with clang-14 unless CKPT_FUZZ_DIR points elsewhere.
# Prints executions per target; exits non-zero if a target finds a crash, leak, OOM or timeout
# (reproducer in the printed artifacts directory), if a fuzzer exits non-zero for any reason, or
# if it executed fewer than CKPT_FUZZ_MIN_EXECS_PER_SEC (default 200) inputs per second of the run.
# Two targets run at a time (CKPT_FUZZ_PARALLEL, default 2), each for the full time; reports print in order.
set -euo pipefail
here="$(cd "$(dirname "$0")/../.." && pwd)"
secs="${1:-20}"
min_execs=$(( secs * ${CKPT_FUZZ_MIN_EXECS_PER_SEC:-200} ))
bdir="${CKPT_FUZZ_DIR:-$here/build-fuzz}"
if [ ! -f "$bdir/CMakeCache.txt" ]; then
  # -O1 -g1: half the compile time of -O2 -g (the smoke run builds from scratch in CI), line tables kept.
  CC=clang-14 CXX=clang++-14 cmake -S "$here" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_FUZZ=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCKPT_BUILD_TESTS=OFF -DCKPT_BUILD_BENCHMARKS=OFF \
    -DCKPT_BUILD_PYTHON=OFF -DCKPT_WERROR=OFF >/dev/null
fi
ninja -C "$bdir" -j2 safetensors_header_fuzz safetensors_index_fuzz store_manifest_fuzz unpickler_fuzz dcp_metadata_fuzz \
  profile_fuzz cluster_fuzz pdparams_fuzz >/dev/null
out="$(mktemp -d /tmp/ckpt_fuzz.XXXXXX)"
mkdir -p "$out/header" "$out/index" "$out/manifest" "$out/unpickle" "$out/dcp_metadata" "$out/profile" "$out/cluster" "$out/pdparams"
# Profile seeds: the shipped profiles; cluster seeds: the example cluster files.
cp "$here/profiles/"*.json "$out/profile/"
cp "$here/fixtures/clusters/"*.json "$here/fixtures/demo/cluster_"*.json "$out/cluster/"
# DCP .metadata seeds: pickles written by torch.distributed.checkpoint.save (tests/fuzz/seeds/).
cp "$here/tests/fuzz/seeds/dcp_metadata/"* "$out/dcp_metadata/"
# Seeds: valid headers (empty, tensors with metadata, scalar, zero-size) and indexes.
printf '\x02\0\0\0\0\0\0\0{}' > "$out/header/empty"
h='{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[],"data_offsets":[16,18]},"z":{"dtype":"U8","shape":[0],"data_offsets":[18,18]}}'
{ printf "$(printf '\\x%02x' $(( ${#h} & 255 )) $(( ${#h} >> 8 )))\0\0\0\0\0\0"; printf '%s' "$h"; head -c 18 /dev/zero; } > "$out/header/tensors"
printf '{"metadata":{"total_size":16},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}' > "$out/index/two"
printf '{"weight_map":{}}' > "$out/index/empty"
sha=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef
printf '{"format":"ckpt-native","version":1,"model_config":{"a":[1]},"tensors":[{"name":"a","dtype":"F32","shape":[2,3]},{"name":"o","dtype":"F32","shape":[6]}],"pieces":[{"tensor":"a","file":"shards/r00000.h5","dataset":"p0","region":{"offset":[0,0],"extent":[2,3]},"dtype":"F32","bytes":24,"sha256":"%s","codec":"none"},{"tensor":"o","file":"shards/r00000.h5","dataset":"p1","region":{"offset":[0],"extent":[6],"flat":[0,3]},"dtype":"F32","bytes":12,"sha256":"%s","codec":"zstd","codec_level":3},{"tensor":"o","file":"shards/r00001.h5","dataset":"p2","region":{"offset":[0],"extent":[6],"flat":[3,6]},"dtype":"F32","bytes":12,"sha256":"%s","codec":"shuffle+zstd","codec_level":3}]}' "$sha" "$sha" "$sha" > "$out/manifest/three"
printf '{"format":"ckpt-native","version":1,"tensors":[],"pieces":[]}' > "$out/manifest/empty"
xxh=0123456789abcdef0123456789abcdef
printf '{"format":"ckpt-native","version":2,"layout":{"pipelines":[{"micro_batch":2,"stages":[{"layers":1,"tp":2,"device":"A"}]}]},"tensors":[{"name":"a","dtype":"F32","shape":[2,3]},{"name":"o","dtype":"F32","shape":[6]}],"pieces":[{"tensor":"a","file":"shards/r00000.h5","dataset":"p0","region":{"offset":[0,0],"extent":[2,3]},"dtype":"F32","bytes":24,"digest":"xxh3-128:%s","codec":"none"},{"tensor":"o","file":"shards/r00000.h5","dataset":"p1","region":{"offset":[0],"extent":[6],"flat":[0,3]},"dtype":"F32","bytes":12,"digest":"sha256:%s","codec":"zstd","codec_level":3},{"tensor":"o","file":"shards/r00001.h5","dataset":"p2","region":{"offset":[0],"extent":[6],"flat":[3,6]},"dtype":"F32","bytes":12,"digest":"xxh3-128:%s","codec":"none"}]}' "$xxh" "$sha" "$xxh" > "$out/manifest/three_v2"
# Unpickler seeds: data.pkl of torch.save files (tensors v2/v3, a Parameter, a transposed view;
# argparse.Namespace with a dtype, OrderedDict, scalars) and a protocol-4 pickle (sets, FRAME, MEMOIZE).
echo 'gAJ9cQAoWAEAAAB3cQFjdG9yY2guX3V0aWxzCl9yZWJ1aWxkX3RlbnNvcl92MgpxAigoWAcAAABzdG9yYWdlcQNjdG9yY2gKRmxvYXRTdG9yYWdlCnEEWAEAAAAwcQVYAwAAAGNwdXEGSwZ0cQdRSwBLA0sChnEISwFLA4ZxCYljY29sbGVjdGlvbnMKT3JkZXJlZERpY3QKcQopUnELdHEMUnENWAEAAABwcQ5jdG9yY2guX3V0aWxzCl9yZWJ1aWxkX3BhcmFtZXRlcgpxD2gCKChoA2gEWAEAAAAxcRBoBksCdHERUUsASwKFcRJLAYVxE4loCilScRR0cRVScRaIaAopUnEXh3EYUnEZWAEAAAB1cRpjdG9yY2guX3V0aWxzCl9yZWJ1aWxkX3RlbnNvcl92MwpxGygoaANjdG9yY2guc3RvcmFnZQpVbnR5cGVkU3RvcmFnZQpxHFgBAAAAMnEdaAZLBHRxHlFLAEsChXEfSwGFcSCJaAopUnEhY3RvcmNoCnVpbnQxNgpxInRxI1JxJHUu' | base64 -d > "$out/unpickle/tensors"
echo 'gAJ9cQAoWAQAAABhcmdzcQFjYXJncGFyc2UKTmFtZXNwYWNlCnECKYFxA31xBChYAQAAAGFxBUsBWAIAAABkdHEGY3RvcmNoCmJmbG9hdDE2CnEHdWJYAQAAAG9xCGNjb2xsZWN0aW9ucwpPcmRlcmVkRGljdApxCSlScQpYAQAAAGtxC11xDChLAUdABAAAAAAAAE6IY19jb2RlY3MKZW5jb2RlCnENWAEAAAB4cQ5YBgAAAGxhdGluMXEPhnEQUnERZXN1Lg==' | base64 -d > "$out/unpickle/args"
echo 'gASVLwAAAAAAAAB9lCiMAWGUSwGKBgAAAAAAAYaUjAFzlI+UKEsBkIwBZpQokZSMAWKUQwJ4eZR1Lg==' | base64 -d > "$out/unpickle/proto4"
# .pdparams seeds: paddle.save-style pickles of numpy arrays (numpy 1.26: numpy.core, with the name map;
# numpy 2: numpy._core, an empty array).
echo 'gASVHgEAAAAAAAB9lCiMAWGUjBVudW1weS5jb3JlLm11bHRpYXJyYXmUjAxfcmVjb25zdHJ1Y3SUk5SMBW51bXB5lIwHbmRhcnJheZSTlEsAhZRDAWKUh5RSlChLAUsCSwKGlGgFjAVkdHlwZZSTlIwCZjSUiYiHlFKUKEsDjAE8lE5OTkr/////Sv////9LAHSUYolDEAAAAAAAAIA/AAAAQAAAQECUdJRijAFilGgEaAdLAIWUaAmHlFKUKEsBSwOFlGgOjAJ1MpSJiIeUUpQoSwNoEk5OTkr/////Sv////9LAHSUYolDBgEAAQABAJR0lGKMG1N0cnVjdHVyZWRUb1BhcmFtZXRlck5hbWVAQJR9lGgBjAxsaW5lYXJfMC53XzCUc3Uu' | base64 -d > "$out/pdparams/np1"
echo 'gASV4QAAAAAAAAB9lCiMAWGUjBZudW1weS5fY29yZS5tdWx0aWFycmF5lIwMX3JlY29uc3RydWN0lJOUjAVudW1weZSMB25kYXJyYXmUk5RLAIWUQwFilIeUUpQoSwFLAksChpRoBYwFZHR5cGWUk5SMAmYylImIh5RSlChLA4wBPJROTk5K/////0r/////SwB0lGKJQwgAAAA8AEAAQpR0lGKMAWWUaARoB0sAhZRoCYeUUpQoSwFLAEsDhpRoDowCZjSUiYiHlFKUKEsDaBJOTk5K/////0r/////SwB0lGKJQwCUdJRidS4=' | base64 -d > "$out/pdparams/np2"
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
"format"
"ckpt-native"
"version"
"tensors"
"pieces"
"name"
"tensor"
"file"
"dataset"
"region"
"offset"
"extent"
"flat"
"bytes"
"sha256"
"digest"
"xxh3-128:"
"sha256:"
"_rebuild_tensor_v2"
"collections\x0aOrderedDict\x0a"
"numpy.core.multiarray"
"_reconstruct"
"ndarray"
"StructuredToParameterName@@"
"torch\x0aFloatStorage\x0a"
"storage"
"codec"
"codec_level"
"zstd"
"shuffle+zstd"
"torch.distributed.checkpoint.metadata"
"TensorStorageMetadata"
"ChunkStorageMetadata"
"MetadataIndex"
"_StorageInfo"
"relative_path"
"device_types"
"devices"
"nodes"
"links"
"ranks"
"peak_flops"
"memory"
"bandwidth"
"latency"
"efficiency"
"intra_node"
"inter_node"
"link_bandwidth"
"count"
"qkv_packing"
"mlp_packing"
"orientation"
"vocab_padding"
"multiple"
"scales_with_tp"
"dtypes"
"names"
"config_keys"
"megatron-groups"
"libai-heads"
"fused-per-tp"
"in-out"
"out-in"
"separate"
"keep"
"embedding"
"optimizer"
"norm"
"weight"
"{layer}"
"1GB/s"
"5us"
"16GiB"
EOF
status=0
fuzz_bin() {
  case "$1" in
    manifest) echo store_manifest_fuzz ;; unpickle) echo unpickler_fuzz ;; dcp_metadata | profile | cluster | pdparams) echo "$1_fuzz" ;;
    *) echo "safetensors_$1_fuzz" ;;
  esac
}
# fuzz_one TARGET: runs one fuzzer, writes its report to $out/TARGET.report and its verdict (0/1) to
# $out/TARGET.status (the targets run side by side, their reports are printed in order afterwards).
fuzz_one() {
  local t=$1 extra=() rc=0 st=0 execs
  if [ -n "${CKPT_FUZZ_JOBS:-}" ]; then extra=(-fork="$CKPT_FUZZ_JOBS" -ignore_crashes=0); fi
  local log="$out/${t}.log"
  {
    echo "== $(fuzz_bin "$t") for ${secs}s"
    ( cd "$out" && "$bdir/$(fuzz_bin "$t")" -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
        -dict="$out/dict" -print_final_stats=1 "${extra[@]}" -artifact_prefix="$out/${t}-" "$out/$t" >"$log" 2>&1 ) || rc=$?
    grep -E '^stat::number_of_executed_units|^stat::peak_rss_mb|^#[0-9]+ +DONE|ERROR|SUMMARY' "$log" | tail -5 || true
    if ls "$out/${t}-"* >/dev/null 2>&1; then echo "FINDING in $t: $(ls "$out/${t}-"*)"; st=1; fi
    if [ "$rc" -ne 0 ]; then echo "FAIL: $(fuzz_bin "$t") exited $rc (log: $log)"; st=1; fi
    # Executed inputs: the final stats line, or (with -fork, no final stats) the last "#N: cov:" line.
    execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1/p; s/^#([0-9]+): cov:.*/\1/p' "$log" | tail -1)
    if [ "${execs:-0}" -lt "$min_execs" ]; then
      echo "FAIL: $(fuzz_bin "$t") executed ${execs:-no} inputs in ${secs}s, expected at least $min_execs (log: $log)"
      st=1
    fi
  } >"$out/${t}.report"
  echo "$st" >"$out/${t}.status"
}
# CKPT_FUZZ_PARALLEL targets at a time (default: 2, one per core of a 2-core CI machine; 1 with
# CKPT_FUZZ_JOBS, whose -fork already uses that many cores per target).
par=${CKPT_FUZZ_PARALLEL:-2}
if [ -n "${CKPT_FUZZ_JOBS:-}" ]; then par=${CKPT_FUZZ_PARALLEL:-1}; fi
targets=(header index manifest unpickle dcp_metadata profile cluster pdparams)
running=0
for t in "${targets[@]}"; do
  if [ "$running" -ge "$par" ]; then wait -n || true; running=$((running - 1)); fi
  fuzz_one "$t" &
  running=$((running + 1))
done
wait || true
for t in "${targets[@]}"; do
  cat "$out/${t}.report" 2>/dev/null || echo "FAIL: no report from $(fuzz_bin "$t")"
  if [ "$(cat "$out/${t}.status" 2>/dev/null)" != "0" ]; then status=1; fi
done
echo "corpus, logs and artifacts: $out"
exit $status
