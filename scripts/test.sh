#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test, then builds again with
# AddressSanitizer + UndefinedBehaviorSanitizer and runs the C++ tests and the CLI-level Python
# tests under it, then a short fuzz smoke run. Exit code 0 only when everything passed.
#   scripts/test.sh            the default suite (CI runs exactly this)
#   CKPT_LONG=1 scripts/test.sh   longer property/crash/fuzz runs
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
bash scripts/setup.sh
PY="$here/.venv/bin/python"
JOBS=${CKPT_JOBS:-2}
total_pass=0; total_fail=0

run_ctest() {  # run_ctest BUILD_DIR [ctest args...]: runs ctest, adds its counts to the totals
  local dir=$1; shift
  local log; log=$(mktemp)
  set +e
  ctest --test-dir "$dir" -j"$JOBS" --output-on-failure "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local line; line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -1 || true)
  if [ -n "$line" ]; then
    local failed total
    failed=$(sed -E 's/.* ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.* tests failed out of ([0-9]+).*/\1/' <<<"$line")
    total_pass=$((total_pass + total - failed)); total_fail=$((total_fail + failed))
  elif [ "$rc" -ne 0 ]; then
    total_fail=$((total_fail + 1))
  fi
  rm -f "$log"
  return 0
}

echo "== build (RelWithDebInfo, -Werror) =="
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_PYTHON="$PY" >/dev/null
ninja -C build -j"$JOBS"
echo "== tests =="
run_ctest build

echo "== build (AddressSanitizer + UndefinedBehaviorSanitizer) =="
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=ON \
  -DCKPT_BUILD_BENCHMARKS=OFF -DCKPT_PYTHON="$PY" >/dev/null
ninja -C build-asan -j"$JOBS"
echo "== tests under ASan + UBSan =="
# C++ tests, and the Python tests that drive the ckpt CLI on bad input (label 'sanitize').
ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
  run_ctest build-asan -LE "python|slow"

if [ -x tests/fuzz/run_fuzz.sh ]; then
  echo "== fuzz smoke run =="
  if bash tests/fuzz/run_fuzz.sh "${CKPT_FUZZ_SECONDS:-15}"; then
    total_pass=$((total_pass + 1))
  else
    total_fail=$((total_fail + 1))
  fi
fi

echo
echo "tests: ${total_pass} passed, ${total_fail} failed"
[ "$total_fail" -eq 0 ]
