#!/usr/bin/env bash
# Installs what ckpt needs on a fresh Debian 12 machine, skipping what is already there:
# the C++ toolchain and libraries (apt) and a Python venv at .venv with the interop stack.
# Idempotent; safe to run again.
#   scripts/setup.sh            everything
#   scripts/setup.sh --build    what the build needs: apt packages, the venv with nanobind, the .pth file
#   scripts/setup.sh --python   the Python interop stack the tests use (torch, transformers, ...) into the
#                               venv --build made (scripts/test.sh installs it while the build compiles)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
part=${1:-all}
case "$part" in all | --build | --python) ;; *) echo "usage: $0 [--build | --python]" >&2; exit 2 ;; esac
VENV="$here/.venv"

apt_packages() {
  local pkgs=(g++ cmake ninja-build pkg-config libhdf5-dev libzstd-dev nlohmann-json3-dev libssl-dev
    libcli11-dev libopenblas-dev libxxhash-dev libzip-dev zlib1g-dev libopenmpi-dev openmpi-bin libgtest-dev libgmock-dev
    libbenchmark-dev clang libclang-rt-14-dev python3-venv)
  local missing=() p
  for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  # cmake or python may come from elsewhere (pyenv, pip): only ask apt when the command is absent.
  if command -v cmake >/dev/null 2>&1; then missing=("${missing[@]/cmake}"); fi
  if python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then missing=("${missing[@]/python3-venv}"); fi
  missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
  if ((${#missing[@]})); then
    echo "setup: installing apt packages: ${missing[*]}"
    local sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

build_deps() {
  apt_packages
  if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating Python venv at $VENV"
    python3 -m venv "$VENV"
  fi
  # nanobind: the build of the Python module (python/CMakeLists.txt) asks it for its CMake files.
  if ! "$VENV/bin/python" -c 'import nanobind' >/dev/null 2>&1; then
    echo "setup: installing nanobind into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check nanobind 2>&1 | grep -v "^WARNING: Location" || true
    "$VENV/bin/python" -c 'import nanobind' || { echo "setup: nanobind failed to install" >&2; exit 1; }
  fi
  # The Python module (`import ckpt`, docs/PYTHON.md) as built by `ninja -C build ckpt_python`: a .pth file
  # puts this checkout's build/python on the venv's sys.path (harmless before the build; PYTHONPATH,
  # which the tests set to their own build dir, comes first). `pip install .` builds a wheel instead.
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if [ "$(cat "$site/ckpt_build.pth" 2>/dev/null)" != "$here/build/python" ]; then
    echo "$here/build/python" > "$site/ckpt_build.pth"
    echo "setup: $site/ckpt_build.pth -> $here/build/python"
  fi
}

python_stack() {
  local pkgs=('torch==2.13.0' numpy h5py hdf5plugin safetensors transformers pytest matplotlib xxhash 'megatron-core==0.16.1'
    psutil nanobind ml_dtypes)
  local check='import torch, numpy, h5py, hdf5plugin, safetensors, transformers, pytest, matplotlib, xxhash, megatron.core, psutil, nanobind, ml_dtypes'
  if ! "$VENV/bin/python" -c "$check" >/dev/null 2>&1; then
    echo "setup: installing Python packages into $VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "${pkgs[@]}" 2>&1 | grep -v "^WARNING: Location" || true
    "$VENV/bin/python" -c "$check" || { echo "setup: Python packages failed to install" >&2; exit 1; }
  fi
}

if [ "$part" != "--python" ]; then build_deps; fi
if [ "$part" != "--build" ]; then
  [ -x "$VENV/bin/python" ] || { echo "setup: no venv at $VENV: run $0 --build first" >&2; exit 1; }
  python_stack
fi
