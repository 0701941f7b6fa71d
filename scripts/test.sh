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
  # ctest ends with "100% tests passed out of N" or "X% tests passed, F tests failed out of N".
  local line; line=$(grep -E "tests passed.* out of [0-9]+" "$log" | tail -1 || true)
  if [ -n "$line" ]; then
    local failed=0 total
    total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
    if grep -qE "tests failed" <<<"$line"; then
      failed=$(sed -E 's/.* ([0-9]+) tests failed.*/\1/' <<<"$line")
    fi
    total_pass=$((total_pass + total - failed)); total_fail=$((total_fail + failed))
  elif [ "$rc" -ne 0 ]; then
    total_fail=$((total_fail + 1))
  fi
  if [ "$rc" -ne 0 ] && [ -n "$line" ] && ! grep -qE "tests failed" <<<"$line"; then
    total_fail=$((total_fail + 1))  # ctest failed without a failing test (e.g. none found)
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
# The C++ tests (they include the CLI bad-file matrix and the store corruption matrix, which run
# the sanitized ckpt binary); the Python interop tests run once, in the build above.
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
