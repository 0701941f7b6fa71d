"""Runs pytest in a process forked from a server that has already imported the heavy Python stack.

Each tests/python/test_*.py is its own ctest test, so each starts an interpreter; importing torch,
transformers and megatron-core costs 2-6 s of CPU per file, about a quarter of the Python tests' time.
The server imports them once; each test is a fork of it, with the client's arguments, working
directory, environment and stdin/stdout/stderr, and the client exits as the test did.

  python pyfork.py serve SOCKET      the server (scripts/test.sh runs one beside each ctest run)
  python pyfork.py [PYTEST ARGS]     the client (the ctest command of the Python tests)

Without CKPT_PYTEST_SERVER naming a live server's socket, the client is `python -m pytest ARGS`
itself (exec), as when ctest runs outside scripts/test.sh. A fork starts from the server's modules
and nothing else: no test module, no conftest, no `ckpt` (each build dir has its own) is imported
by the server. The tests that measure their own process (label memory) and those that preload a
sanitizer runtime run as plain processes (CMakeLists.txt).
"""
import array
import json
import os
import signal
import socket
import struct
import sys

SERVER_ENV = "CKPT_PYTEST_SERVER"
_LEN = struct.Struct("!I")
_CODE = struct.Struct("!i")
_ANYIO_REWRITE = "Module already imported so cannot be rewritten; anyio"
_PRELOAD = ("numpy", "torch", "torch.distributed", "torch.distributed.checkpoint", "safetensors.numpy",
            "safetensors.torch", "h5py", "hdf5plugin", "ml_dtypes", "megatron.core", "pytest")


def _preload():
    import importlib
    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001: a missing or broken package is the importing test's to report
            pass
    try:
        import transformers
        transformers.LlamaConfig, transformers.LlamaForCausalLM  # noqa: B018: the lazy module loads them
    except Exception:  # noqa: BLE001
        pass
    import gc
    gc.collect()
    gc.freeze()  # the preloaded objects stay out of the forks' collections (fewer copy-on-write pages)


def _recv_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _receive_request(conn):
    """(request dict, [fd0, fd1, fd2]) as the client sent them."""
    fds = array.array("i")
    msg, anc, _, _ = conn.recvmsg(_LEN.size, socket.CMSG_LEN(3 * fds.itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    if len(msg) < _LEN.size:
        msg += _recv_exact(conn, _LEN.size - len(msg))
    (n,) = _LEN.unpack(msg)
    return json.loads(_recv_exact(conn, n)), list(fds)


def _run_child(req, fds, base_path):
    """In the fork: becomes the client's pytest run; never returns."""
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()  # its own process group: the server kills it whole if the client goes away
        for i, fd in enumerate(fds):
            os.dup2(fd, i)
            os.close(fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [req["cwd"]] + extra + base_path
        # A pytest plugin the server's modules imported (anyio, through transformers) cannot have its
        # asserts rewritten: pytest says so; a plain run imports it after pytest and says nothing.
        args = ["-W", f"ignore:{_ANYIO_REWRITE}:pytest.PytestAssertRewriteWarning"] + req["args"]
        sys.argv[:] = ["pytest"] + req["args"]
        import pytest
        code = int(pytest.main(args))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001: reported like an interpreter would, then the exit code
        import traceback
        traceback.print_exc()
        code = 1
    finally:
        try:
            import atexit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(children):
    """Sends each exited child's status to its client."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(_CODE.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass
            conn.close()


def serve(path):
    import select
    _preload()
    base_path = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    children = {}  # pid -> client connection
    forked = 0
    print(f"pyfork: serving {path}", flush=True)
    while not stop:
        ready, _, _ = select.select([listener, wake_r] + list(children.values()), [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        _reap(children)
        for conn in ready:
            if conn is listener:
                client, _ = listener.accept()
                try:
                    req, fds = _receive_request(client)
                except (OSError, EOFError, ValueError):
                    client.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for c in list(children.values()) + [client]:
                        c.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    _run_child(req, fds, base_path)
                for fd in fds:
                    os.close(fd)
                children[pid] = client
                forked += 1
            elif conn is not wake_r and conn in children.values():
                if not conn.recv(1):  # the client is gone (killed by a ctest timeout): so is its test
                    pid = next(p for p, c in children.items() if c is conn)
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    for pid in list(children):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.unlink(path)
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"pyfork: {forked} tests forked; CPU seconds: server {me.ru_utime + me.ru_stime:.1f}, "
          f"tests {kids.ru_utime + kids.ru_stime:.1f}", flush=True)


def client(args):
    path = os.environ.get(SERVER_ENV, "")
    conn = None
    if path:
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(path)
        except OSError:
            conn = None
    if conn is None:
        os.execv(sys.executable, [sys.executable, "-m", "pytest"] + args)
    req = json.dumps({"args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    conn.sendmsg([_LEN.pack(len(req))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
    conn.sendall(req)
    try:
        (code,) = _CODE.unpack(_recv_exact(conn, _CODE.size))
    except EOFError:
        print(f"pyfork: the server at {path} ended before the test did", file=sys.stderr)
        return 1
    if code < 0:  # killed by a signal: die by the same one, as the test did
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[1:]))
