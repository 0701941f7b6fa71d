"""Shared fixtures for the interop tests against the real Python stack.

The tests find ckpt's binaries through environment variables set by ctest:
CKPT_BIN (the ckpt executable) and CKPT_BINARY_DIR (the build dir, where tests/tools
executables are). Run directly with pytest, they fall back to ./build.

Sanitized binaries (CKPT_BIN from a -DCKPT_SANITIZE=ON build): every child inherits
ASAN_OPTIONS / UBSAN_OPTIONS ending in exitcode=86, so a sanitizer report is an exit code no
test expects, and run_ckpt fails on a report in stderr whatever the exit code.
CKPT_NO_SKIP=1 (scripts/test.sh sets it when CI=true, where every dependency is installed):
a skipped test is reported as a failure, except an opt-in one (its skip reason starts with
OPT_IN): it needs a library too heavy for CI in a venv of its own outside the repository
(PaddleNLP's /work/venv-paddle, fixtures/paddlenlp/README.md), which CI does not install.
"""
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # native_h5py: the h5py-only reader of native checkpoints

SANITIZER_EXIT = 86
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:")
for _var, _extra in (("ASAN_OPTIONS", "detect_leaks=0"), ("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")):
    _have = os.environ.get(_var, "")
    os.environ[_var] = ":".join(x for x in (_have or _extra, f"exitcode={SANITIZER_EXIT}") if x)


def sanitizer_report(stderr: str):
    """The first sanitizer line in `stderr`, or None."""
    for line in (stderr or "").splitlines():
        if any(m in line for m in SANITIZER_MARKS):
            return line
    return None


def check_no_sanitizer_report(p: subprocess.CompletedProcess):
    """Fails the test on a sanitizer report or the sanitizer exit code."""
    line = sanitizer_report(p.stderr if isinstance(p.stderr, str) else (p.stderr or b"").decode(errors="replace"))
    assert line is None and p.returncode != SANITIZER_EXIT, (
        f"sanitizer finding (exit {p.returncode}) in {p.args}: {line}\n{p.stderr}")


OPT_IN = "opt-in:"


def _skips_fail() -> bool:
    return os.environ.get("CKPT_NO_SKIP", "") not in ("", "0")


def _opt_in(rep) -> bool:
    """A skip whose reason starts with OPT_IN (longrepr of a skip: (file, line, "Skipped: reason"))."""
    r = rep.longrepr
    reason = r[2] if isinstance(r, tuple) and len(r) == 3 else str(r)
    return reason.removeprefix("Skipped: ").startswith(OPT_IN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if _skips_fail() and rep.skipped and not hasattr(rep, "wasxfail") and not _opt_in(rep):
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CKPT_NO_SKIP=1 (CI: every dependency is installed): {rep.longrepr}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    if _skips_fail() and rep.skipped:  # a module-level pytest.skip / importorskip
        rep.outcome = "failed"
        rep.longrepr = f"module skipped under CKPT_NO_SKIP=1: {rep.longrepr}"


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
    """run_ckpt('inspect', path, check=True) -> CompletedProcess (text mode). Fails on a
    sanitizer report even when check=False."""

    def run(*args, check=True, timeout=600, **kw):
        cmd = [ckpt_bin, *[str(a) for a in args]]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
        check_no_sanitizer_report(p)
        if check and p.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    return run
