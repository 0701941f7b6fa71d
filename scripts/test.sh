#!/usr/bin/env bash
# The test command: installs what is missing, builds, runs every test, then builds again with
# AddressSanitizer + UndefinedBehaviorSanitizer (clang-14, with the libFuzzer targets) and runs the C++ tests and the hostile-input /
# bit-flip Python CLI tests (ctest label asan_py, the sanitized ckpt as their subprocess) under
# it, then a short fuzz smoke run of that build's fuzz targets. Exit code 0 only when everything passed.
#   scripts/test.sh            the default suite (CI runs exactly this)
#   CKPT_LONG=1 scripts/test.sh   longer property/crash/fuzz runs
# Each ctest run must find at least a minimum number of tests (a glob or discovery that finds
# nothing fails): 499 / 454 by default, a little under what the suite holds (the normal run: the
# gtest cases + one test per Python file; the sanitized run: the gtest cases + the asan_py
# files); raise them
# as tests are added. With CI=true, where every dependency is installed, a skipped test is a
# failure (CKPT_NO_SKIP=1 for pytest, see tests/python/conftest.py; ctest's "Skipped" for gtest).
# CKPT_BUILD_LOCK=FILE: each ninja run holds flock FILE (machines where several checkouts build).
# The end prints the seconds each phase took.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
cd "$here"
phase_names=(); phase_secs=(); phase_start=$SECONDS
phase() {  # phase NAME: ends the running phase (its seconds recorded) and starts NAME
  if ((${#phase_names[@]})); then phase_secs+=($((SECONDS - phase_start))); fi
  phase_names+=("$1"); phase_start=$SECONDS
  echo "== $1 =="
}
build() {  # build DIR: ninja, under the build lock when CKPT_BUILD_LOCK names one
  if [ -n "${CKPT_BUILD_LOCK:-}" ]; then flock "$CKPT_BUILD_LOCK" ninja -C "$1" -j"$JOBS"; else ninja -C "$1" -j"$JOBS"; fi
}
phase "setup (apt packages, the venv with nanobind)"
bash scripts/setup.sh --build
PY="$here/.venv/bin/python"
JOBS=${CKPT_JOBS:-2}
# The Python interop stack (torch, transformers, megatron-core...: on a fresh clone about a minute of
# pip, mostly one core) installs while the first build compiles; the tests wait for it.
py_setup_log=$(mktemp)
bash scripts/setup.sh --python >"$py_setup_log" 2>&1 &
py_setup_pid=$!
pyfork_pid=""
pytest_server_start() {  # the Python tests fork from one interpreter that imported torch & co. once
  pyfork_sock=$(mktemp -u /tmp/ckpt-pyfork.XXXXXX)
  "$PY" tests/python/pyfork.py serve "$pyfork_sock" >"$pyfork_sock.log" 2>&1 &
  pyfork_pid=$!
  export CKPT_PYTEST_SERVER=$pyfork_sock  # tests/python/pyfork.py: until it listens, plain pytest runs
  for _ in $(seq 100); do  # its imports take a few seconds: the first (longest) tests fork too
    if [ -S "$pyfork_sock" ] || ! kill -0 "$pyfork_pid" 2>/dev/null; then break; fi
    sleep 0.2
  done
}
pytest_server_stop() {
  if [ -z "$pyfork_pid" ]; then return 0; fi
  kill -TERM "$pyfork_pid" 2>/dev/null || true
  wait "$pyfork_pid" 2>/dev/null || true
  tail -1 "$pyfork_sock.log"; rm -f "$pyfork_sock.log"
  pyfork_pid=""; unset CKPT_PYTEST_SERVER
}
trap 'wait "$py_setup_pid" 2>/dev/null || true; rm -f "$py_setup_log" "${why_log:-}"; pytest_server_stop
  if [ -n "${asan_pid:-}" ]; then pkill -TERM -P "$asan_pid" 2>/dev/null || true; wait "$asan_pid" 2>/dev/null || true; fi' EXIT
total_pass=0; total_fail=0
why_log=$(mktemp)
if [ "${CI:-}" = "true" ]; then export CKPT_NO_SKIP=1; fi
# Sanitizer findings exit with a code no test expects, and stop at the first UB.
SAN_EXIT=86

run_ctest() {  # run_ctest BUILD_DIR MIN_TESTS [ctest args...]: runs ctest, adds its counts to the totals
  local dir=$1 min=$2; shift 2
  local log; log=$(mktemp)
  set +e
  ctest --test-dir "$dir" -j"$JOBS" --output-on-failure --no-tests=error "$@" 2>&1 | tee "$log"
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
    if [ "$total" -lt "$min" ]; then
      echo "ctest in $dir ran $total tests, expected at least $min"; total_fail=$((total_fail + 1))
    fi
  elif [ "$rc" -ne 0 ]; then
    total_fail=$((total_fail + 1))
  fi
  if [ "$rc" -ne 0 ] && [ -n "$line" ] && ! grep -qE "tests failed" <<<"$line"; then
    total_fail=$((total_fail + 1))  # ctest failed without a failing test (e.g. none found)
  fi
  # ctest lists GTEST_SKIP'd and otherwise skipped tests as "<n> - <name> (Skipped)".
  local skipped; skipped=$(grep -cE "\(Skipped\)" "$log" || true)
  if [ "$skipped" -gt 0 ] && [ "${CKPT_NO_SKIP:-}" = "1" ]; then
    echo "$skipped skipped test(s) in $dir: a failure in CI"; total_fail=$((total_fail + skipped))
  fi
  # Why tests failed, for the end of the output (CI shows its tail): pytest's failure headers, its
  # E lines and summary, GoogleTest's FAILED lines: the first 40 of each ctest run, 80 in all.
  grep -E "^(_{3,} .+ _{3,}|E   .+|FAILED .+|\[  FAILED  \] .+)$" "$log" | cut -c1-300 | head -40 >>"$why_log" || true
  rm -f "$log"
  return 0
}

# The sanitized build (below) compiles beside the first build and the tests, at nice 19: it takes only
# the CPU they leave idle (a build's last single-core steps, the tests' waits on disk and on their
# subprocesses), about a third of its own time. Not with CKPT_BUILD_LOCK (both builds would queue on it).
asan_configure() {
  # One sanitized build serves the tests and the fuzz smoke run: clang-14 (which libFuzzer needs) with
  # coverage instrumentation, at -O0: clang-14 with ASan compiles -O1 2.2x slower (this build: ~900
  # CPU seconds at -O1, ~450 at -O0), which costs more than the tests' slowdown at -O0 (their
  # property tests run an eighth of their cases under ASan: tests/test_cases.h); the fuzzers still
  # run thousands of inputs a second.
  if [ -f build-asan/CMakeCache.txt ] && ! grep -q '^CMAKE_CXX_COMPILER:.*clang++-14' build-asan/CMakeCache.txt; then
    rm -rf build-asan  # configured by an older test.sh with g++: a cache keeps its compiler
  fi
  CC=clang-14 CXX=clang++-14 cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O0 -g1" \
    -DCKPT_WERROR=ON -DCKPT_SANITIZE=ON -DCKPT_FUZZ=ON -DCKPT_BUILD_BENCHMARKS=OFF -DCKPT_TEST_FLAGS= \
    -DCKPT_PYTHON="$PY" >/dev/null
}
asan_pid=""; asan_log=$(mktemp)
if [ -z "${CKPT_BUILD_LOCK:-}" ]; then
  (asan_configure && nice -n 19 ninja -C build-asan -j"$JOBS") >"$asan_log" 2>&1 &
  asan_pid=$!
fi

phase "build (RelWithDebInfo, -Werror)"
# -g1: line tables (backtraces, sanitizer reports) without full debug info: a fifth less compile time.
# -Werror here (CKPT_WERROR is off by default, for users' builds). The GoogleTest binaries' own code
# at -Og (CKPT_TEST_FLAGS; the libraries, ckpt, the tools and the Python module stay at -O2): a third
# less of their compile time, their run time as at -O2 within a few seconds.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
  -DCKPT_WERROR=ON -DCKPT_TEST_FLAGS=-Og -DCKPT_PYTHON="$PY" >/dev/null
build build
phase "tests"
if ! wait "$py_setup_pid"; then cat "$py_setup_log"; echo "setup.sh --python failed"; exit 1; fi
cat "$py_setup_log"
pytest_server_start
run_ctest build "$(( ${CKPT_MIN_TESTS:-499} - 2 ))" -LE serial

phase "build (AddressSanitizer + UndefinedBehaviorSanitizer, clang-14, with the libFuzzer targets)"
if [ -n "$asan_pid" ]; then
  if ! wait "$asan_pid"; then cat "$asan_log"; echo "the sanitized build failed"; exit 1; fi
  tail -1 "$asan_log"
else
  asan_configure
  build build-asan
fi
rm -f "$asan_log"
phase "timing tests (label serial: alone on the machine)"
run_ctest build 2 -L serial

phase "tests under ASan + UBSan"
# The C++ tests (they include the CLI bad-file matrix and the store corruption matrix, which run
# the sanitized ckpt binary) and the asan_py Python tests; the other Python tests run once, above.
ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:exitcode=$SAN_EXIT \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=$SAN_EXIT \
  run_ctest build-asan "${CKPT_MIN_ASAN_TESTS:-454}" -LE "python|slow"
pytest_server_stop

phase "line limits (functions <= 90 lines in production code, files <= 450 lines)"
if "$PY" scripts/line_limits.py; then
  total_pass=$((total_pass + 1))
else
  total_fail=$((total_fail + 1))
fi
phase "include rules (each folder includes only what its README.md's 'May include:' allows)"
if "$PY" scripts/check_includes.py; then
  total_pass=$((total_pass + 1))
else
  total_fail=$((total_fail + 1))
fi

if [ -x tests/fuzz/run_fuzz.sh ]; then
  phase "fuzz smoke run"
  if CKPT_FUZZ_DIR="$here/build-asan" bash tests/fuzz/run_fuzz.sh "${CKPT_FUZZ_SECONDS:-5}"; then
    total_pass=$((total_pass + 1))
  else
    total_fail=$((total_fail + 1))
  fi
fi

phase_secs+=($((SECONDS - phase_start)))
echo
for i in "${!phase_names[@]}"; do printf '%6d s  %s\n' "${phase_secs[$i]}" "${phase_names[$i]}"; done
printf '%6d s  in all\n' "$SECONDS"
if [ -s "$why_log" ]; then echo; echo "why tests failed (first lines):"; head -80 "$why_log"; fi
rm -f "$why_log"
echo "tests: ${total_pass} passed, ${total_fail} failed"
[ "$total_fail" -eq 0 ]
