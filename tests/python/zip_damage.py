"""A damaged byte in a zip entry (torch files, DCP items) and the refusal every reading command must
give it: shared by the integrity tests of each kind that stores torch zips."""
import io
import json
import pathlib
import struct
import zipfile


def flip_in_entry(path, base, length, pick):
    """Flips one byte in the middle of the data of the zip entry `pick(infolist)` of the zip at
    [base, base + length) of `path`; returns the entry's name."""
    data = bytearray(pathlib.Path(path).read_bytes())
    z = zipfile.ZipFile(io.BytesIO(bytes(data[base:base + length])))
    e = pick(z.infolist())
    assert e.compress_type == zipfile.ZIP_STORED and e.file_size > 0
    o = base + e.header_offset
    n, m = struct.unpack("<HH", data[o + 26:o + 30])
    data[o + 30 + n + m + e.file_size // 2] ^= 0x40
    pathlib.Path(path).write_bytes(bytes(data))
    return e.filename



def assert_refused(run_ckpt, src, entry, tmp_path):
    v = run_ckpt("verify", src, check=False)
    assert v.returncode != 0, v.stdout + v.stderr
    assert "ZipCrcMismatch" in v.stdout + v.stderr and entry in v.stdout + v.stderr, v.stdout + v.stderr
    vj = json.loads(run_ckpt("verify", "--json", src, check=False).stdout)
    assert vj["ok"] is False and vj["scheme"] == "zip CRC-32"
    assert any(f["code"] == "ZipCrcMismatch" and entry in f["message"] for f in vj["failures"]), vj
    h = run_ckpt("to-hf", src, tmp_path / "hf", check=False)
    assert h.returncode != 0 and "ZipCrcMismatch" in h.stderr, h.stdout + h.stderr
    assert not (tmp_path / "hf").exists()
    r = run_ckpt("reshard", src, tmp_path / "re", "--tp", 1, "--pp", 1, "--dp", 1, check=False)
    assert r.returncode != 0 and "ZipCrcMismatch" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "re").exists()
