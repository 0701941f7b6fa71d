"""Hostile torch.save files and pickles against formats/torch (through tests/tools/torch_dump):
each is refused with a clear error and exit code, and nothing runs: the payload's marker file is
never created. Each code-running payload is first proved real: Python's own pickle.loads, in a
subprocess, does create a (separate) marker from the same bytes. Also damaged zips, a zip bomb,
storages that run past their data, deep nesting and huge memo indices. Runs under ASan too
(CMakeLists.txt asan_py list)."""
import io
import os
import pathlib
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

from conftest import check_no_sanitizer_report

BUILD = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", pathlib.Path(__file__).resolve().parents[2] / "build"))
DUMP = BUILD / "torch_dump"
CORRUPT = 3


def binunicode(s):
    b = s.encode()
    return b"X" + struct.pack("<I", len(b)) + b


def glob(m, n):
    return b"c" + m.encode() + b"\n" + n.encode() + b"\n"


def payloads(marker):
    """name -> pickle bytes that run `touch marker` under pickle.loads."""
    cmd = f"touch {marker}"
    return {
        "os.system": b"\x80\x02" + glob("os", "system") + binunicode(cmd) + b"\x85R.",
        "posix.system": b"\x80\x02" + glob("posix", "system") + binunicode(cmd) + b"\x85R.",
        "builtins.eval": b"\x80\x02" + glob("builtins", "eval") + binunicode(f"__import__('os').system('{cmd}')") + b"\x85R.",
        "subprocess.Popen": b"\x80\x02" + glob("subprocess", "Popen") + b"](" + binunicode("touch") + binunicode(str(marker)) +
                            b"e\x85R.",
        "stack_global": b"\x80\x04" + b"\x8c\x02os\x94\x8c\x06system\x94\x93" + binunicode(cmd) + b"\x85R.",
        # A __reduce__ payload inside the arguments of an allowed-looking torch function.
        "via_rebuild_tensor": b"\x80\x02" + glob("torch._utils", "_rebuild_tensor_v2") + b"(" + glob("os", "system") +
                              binunicode(cmd) + b"\x85RtR.",
        "via_ordered_dict": b"\x80\x02" + glob("collections", "OrderedDict") + b")R" + binunicode("k") +
                            glob("os", "system") + binunicode(cmd) + b"\x85Rs.",
        "inst": b"\x80\x02(" + binunicode(cmd) + b"ios\nsystem\n.",
        "obj": b"\x80\x02(" + glob("os", "system") + binunicode(cmd) + b"o.",
    }


def not_runnable_payloads(marker):
    """Refused names whose code pickle.loads would also run, but not in a way a test can observe
    safely (other platforms, torch.load of a file)."""
    return {
        "nt.system": b"\x80\x02" + glob("nt", "system") + binunicode(f"touch {marker}") + b"\x85R.",
        "torch.load": b"\x80\x02" + glob("torch", "load") + binunicode(str(marker)) + b"\x85R.",
        "torch.serialization": b"\x80\x02" + glob("torch.serialization", "_load") + b")R.",
        "newobj_unknown": b"\x80\x02" + glob("subprocess", "Popen") + b")\x81.",
        "build_unknown": b"\x80\x02" + glob("collections", "Counter") + b")R}b.",
        "copyreg": b"\x80\x02" + glob("copyreg", "_reconstructor") + b")R.",
    }


def run_dump(path, *extra):
    p = subprocess.run([str(DUMP), str(path), *extra], capture_output=True, text=True, timeout=120)
    check_no_sanitizer_report(p)
    return p


def torch_zip(path, pkl, storages=None, byteorder=b"little"):
    """A zip laid out as torch.save writes it, with the given data.pkl and storages."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pkl)
        if byteorder is not None:
            z.writestr("archive/byteorder", byteorder)
        z.writestr("archive/version", b"3\n")
        for k, v in (storages or {}).items():
            z.writestr(f"archive/data/{k}", v)


@pytest.mark.parametrize("name", sorted(payloads("x")))
def test_payload_is_real_and_refused(tmp_path, name):
    proof = tmp_path / "proof_marker"
    (tmp_path / "p.pkl").write_bytes(payloads(proof)[name])
    subprocess.run([sys.executable, "-c", "import pickle,sys; pickle.loads(open(sys.argv[1],'rb').read())",
                    str(tmp_path / "p.pkl")], capture_output=True, timeout=60)
    assert proof.exists(), f"{name}: the payload does not run under pickle.loads, so it proves nothing"
    marker = tmp_path / "pwned"
    bare = tmp_path / "bare.pkl"
    bare.write_bytes(payloads(marker)[name])
    zipped = tmp_path / "model.pt"
    torch_zip(zipped, payloads(marker)[name])
    for path, extra in ((bare, ["--pickle"]), (zipped, [])):
        p = run_dump(path, *extra)
        assert p.returncode == CORRUPT, (name, p.returncode, p.stderr)
        assert "ForbiddenGlobal" in p.stderr or "PickleUnsupportedOpcode" in p.stderr, p.stderr
        assert "os.system" in p.stderr or "posix.system" in p.stderr or "builtins.eval" in p.stderr or \
            "subprocess.Popen" in p.stderr, p.stderr
    assert not marker.exists()


@pytest.mark.parametrize("name", sorted(not_runnable_payloads("x")))
def test_other_forbidden_globals(tmp_path, name):
    marker = tmp_path / "pwned"
    bare = tmp_path / "bare.pkl"
    bare.write_bytes(not_runnable_payloads(marker)[name])
    p = run_dump(bare, "--pickle")
    assert p.returncode == CORRUPT and "ForbiddenGlobal" in p.stderr, p.stderr
    assert not marker.exists()


def test_deep_nesting(tmp_path):
    pkl = b"\x80\x02" + b"]" * 200000 + b"a" * 199999 + b"."
    f = tmp_path / "deep.pkl"
    f.write_bytes(pkl)
    p = run_dump(f, "--pickle")
    assert p.returncode == CORRUPT and "PickleTooDeep" in p.stderr, p.stderr
    f.write_bytes(b"\x80\x02" + b"(" * 100000 + b".")
    p = run_dump(f, "--pickle")
    assert p.returncode == CORRUPT and "PickleTooDeep" in p.stderr, p.stderr


def test_huge_memo_index(tmp_path):
    f = tmp_path / "memo.pkl"
    f.write_bytes(b"\x80\x02Nr\xff\xff\xff\xff.")
    p = run_dump(f, "--pickle")
    assert p.returncode == CORRUPT and "PickleMemoIndex" in p.stderr, p.stderr
    f.write_bytes(b"\x80\x02j\xfe\xff\xff\x7f.")
    p = run_dump(f, "--pickle")
    assert p.returncode == CORRUPT and "PickleMemoIndex" in p.stderr, p.stderr


def tensor_pickle(numel, size, stride, offset, key="0"):
    tup = lambda xs: b"(" + b"".join(b"J" + struct.pack("<i", x) for x in xs) + b"t"
    pid = b"(" + binunicode("storage") + glob("torch", "FloatStorage") + binunicode(key) + binunicode("cpu") + \
        b"J" + struct.pack("<i", numel) + b"tQ"
    return (b"\x80\x02}" + binunicode("w") + glob("torch._utils", "_rebuild_tensor_v2") + b"(" + pid +
            b"J" + struct.pack("<i", offset) + tup(size) + tup(stride) + b"\x89" + glob("collections", "OrderedDict") +
            b")RtRs.")


@pytest.mark.parametrize("case,code", [
    ((4, [4], [1], 0, {"0": b"\0" * 16}), None),                      # the valid control
    ((10, [4], [1], 0, {"0": b"\0" * 16}), "TorchStorageSize"),       # numel larger than the bytes
    ((4, [4], [1], 1, {"0": b"\0" * 16}), "TorchTensorOutOfStorage"),  # offset runs past the end
    ((4, [3], [2], 0, {"0": b"\0" * 16}), "TorchTensorOutOfStorage"),  # stride runs past the end
    ((4, [2, 2], [2**30, 2**30], 0, {"0": b"\0" * 16}), "TorchTensorOutOfStorage"),
    ((4, [4], [1], 0, {}), "TorchStorageMissing"),
])
def test_storage_bounds(tmp_path, case, code):
    numel, size, stride, offset, storages = case
    f = tmp_path / "t.pt"
    torch_zip(f, tensor_pickle(numel, size, stride, offset), storages)
    p = run_dump(f, str(tmp_path))
    if code is None:
        assert p.returncode == 0, p.stderr
        assert torch.load(f)["w"].shape == (4,)  # torch agrees the control is valid
    else:
        assert p.returncode == CORRUPT and code in p.stderr, p.stderr
        assert "'w'" in p.stderr or "storage '0'" in p.stderr, p.stderr


def test_big_endian_refused(tmp_path):
    f = tmp_path / "be.pt"
    torch_zip(f, tensor_pickle(4, [4], [1], 0), {"0": b"\0" * 16}, byteorder=b"big")
    p = run_dump(f)
    assert p.returncode == 5 and "TorchByteOrder" in p.stderr, p.stderr


@pytest.fixture()
def real_file(tmp_path):
    f = tmp_path / "real.pt"
    torch.save({"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(3)}, f)
    return f


def test_not_a_zip(tmp_path):
    f = tmp_path / "text.pt"
    f.write_text("this is not a zip file at all\n" * 10)
    p = run_dump(f)
    assert p.returncode == CORRUPT and "TorchNotZip" in p.stderr, p.stderr
    e = tmp_path / "empty.pt"
    e.write_bytes(b"")
    p = run_dump(e)
    assert p.returncode == CORRUPT and "TorchNotZip" in p.stderr, p.stderr


@pytest.mark.parametrize("keep", [0.3, 0.6, 0.95])
def test_truncated_zip(real_file, tmp_path, keep):
    raw = real_file.read_bytes()
    f = tmp_path / "trunc.pt"
    f.write_bytes(raw[:int(len(raw) * keep)])
    p = run_dump(f, str(tmp_path))
    assert p.returncode == CORRUPT and ("TorchNotZip" in p.stderr or "TorchZipCorrupt" in p.stderr), p.stderr


def test_corrupt_central_directory(real_file, tmp_path):
    raw = bytearray(real_file.read_bytes())
    cd = raw.rfind(b"PK\x01\x02")
    assert cd > 0
    raw[cd + 42:cd + 46] = struct.pack("<I", 0x7ffffff0)  # the last entry's local header offset
    f = tmp_path / "cd.pt"
    f.write_bytes(bytes(raw))
    p = run_dump(f, str(tmp_path))
    assert p.returncode == CORRUPT and ("TorchZipCorrupt" in p.stderr or "TorchNotZip" in p.stderr), p.stderr


def test_zip_bomb_declared_size(real_file, tmp_path):
    """data.pkl's central directory entry declares 4 GB: refused before anything is inflated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(real_file) as zin, zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zout:
        for i in zin.infolist():
            zout.writestr(i.filename, zin.read(i.filename))
    raw = bytearray(buf.getvalue())
    def cd_name(at):
        return bytes(raw[at + 46:at + 46 + struct.unpack("<H", raw[at + 28:at + 30])[0]])
    cd = raw.find(b"PK\x01\x02")
    while cd >= 0 and not cd_name(cd).endswith(b"/data.pkl"):
        cd = raw.find(b"PK\x01\x02", cd + 4)
    assert cd >= 0, "no central directory entry for data.pkl"
    raw[cd + 24:cd + 28] = struct.pack("<I", 0xfffffff0)
    f = tmp_path / "bomb.pt"
    f.write_bytes(bytes(raw))
    p = run_dump(f, str(tmp_path))
    assert p.returncode == CORRUPT and ("TorchPickleTooLarge" in p.stderr or "TorchZipCorrupt" in p.stderr), p.stderr


def test_zip_bomb_real_inflation(tmp_path):
    """A deflated data.pkl of 64 MB of repeated bytes (a 60 KB file) whose pickle is garbage: read
    within the bound, refused by the unpickler with a clear error, no crash."""
    f = tmp_path / "bomb2.pt"
    with zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02" + b"]" * (64 << 20))
    assert f.stat().st_size < 1 << 20
    p = run_dump(f)
    assert p.returncode == CORRUPT and ("PickleTooDeep" in p.stderr or "PickleTooLarge" in p.stderr or
                                        "PickleTruncated" in p.stderr), p.stderr


def test_unsupported_compression(real_file, tmp_path):
    f = tmp_path / "bz.pt"
    with zipfile.ZipFile(real_file) as zin, zipfile.ZipFile(f, "w", zipfile.ZIP_BZIP2) as zout:
        for i in zin.infolist():
            zout.writestr(i.filename, zin.read(i.filename))
    p = run_dump(f, str(tmp_path))
    assert p.returncode == 5 and "TorchZipMethod" in p.stderr, p.stderr
