"""Shared fixtures for the interop tests against the real Python stack.

The tests find ckpt's binaries through environment variables set by ctest:
CKPT_BIN (the ckpt executable) and CKPT_BINARY_DIR (the build dir, where tests/tools
executables are). Run directly with pytest, they fall back to ./build.
"""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # native_h5py: the h5py-only reader of native checkpoints


def _binary_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("CKPT_BINARY_DIR", ROOT / "build"))


@pytest.fixture(scope="session")
def ckpt_bin() -> str:
    path = os.environ.get("CKPT_BIN", str(_binary_dir() / "ckpt"))
    if not os.path.exists(path):
        pytest.fail(f"ckpt binary not found at {path}: build first (scripts/test.sh)")
    return path


@pytest.fixture(scope="session")
def tool():
    """tool('cast_tool') -> path of a tests/tools executable in the build dir."""

    def find(name: str) -> str:
        path = _binary_dir() / name
        if not path.exists():
            pytest.fail(f"test tool {name} not found at {path}")
        return str(path)

    return find


@pytest.fixture(scope="session")
def run_ckpt(ckpt_bin):
    """run_ckpt('inspect', path, check=True) -> CompletedProcess (text mode)."""

    def run(*args, check=True, timeout=600, **kw):
        cmd = [ckpt_bin, *[str(a) for a in args]]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    return run
