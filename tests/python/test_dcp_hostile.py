"""Hostile DCP directories: each is a real torch-written DCP (dcp.save in this process) with one
thing broken through torch's own metadata classes (or a pickle payload). ckpt must refuse each with
the rule's code, the exit code of its kind (3 corrupt input, 5 unsupported), no crash (the asan_py
run repeats this file with the sanitized binary) and nothing executed (a payload's marker file is
never created). A raw item (the chunk's bytes, no zip) is also read back and compared with torch."""
import os
import pickle
import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

warnings.filterwarnings("ignore")

A = torch.arange(6, dtype=torch.float32).reshape(2, 3)
W = torch.linspace(-1, 1, 12, dtype=torch.float32).reshape(4, 3)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("dcp") / "base"
    dcp.save({"a": A.clone(), "w": W.clone(), "step": 3}, checkpoint_id=str(d))
    return d


def _copy(base, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(base, d)
    return d


def _md(d):
    with open(d / ".metadata", "rb") as f:
        return pickle.load(f)  # our own fixture, written by torch a moment ago


def _write_md(d, md):
    with open(d / ".metadata", "wb") as f:
        pickle.dump(md, f)


def _entry(md, fqn):
    return next(k for k in md.storage_data if k.fqn == fqn)


def _refused(run_ckpt, d, code, exit_code=3):
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode == exit_code, (p.returncode, p.stderr)
    assert f"[{code}]" in p.stderr, p.stderr
    return p


def test_base_reads(base, run_ckpt, tmp_path):
    save_file({"a": A, "w": W}, tmp_path / "ref.safetensors")
    run_ckpt("diff", base, tmp_path / "ref.safetensors")


def test_chunk_outside_its_tensor(base, run_ckpt, tmp_path):
    d = _copy(base, tmp_path)
    md = _md(d)
    md.state_dict_metadata["a"].chunks[0] = ChunkStorageMetadata(offsets=torch.Size([1, 0]), sizes=torch.Size([2, 3]))
    _write_md(d, md)
    _refused(run_ckpt, d, "DcpChunkOutside")


def test_chunks_overlapping(base, run_ckpt, tmp_path):
    d = _copy(base, tmp_path)
    md = _md(d)
    md.state_dict_metadata["w"].chunks.append(ChunkStorageMetadata(offsets=torch.Size([3, 1]), sizes=torch.Size([1, 2])))
    _write_md(d, md)
    _refused(run_ckpt, d, "DcpChunkOverlap")


def test_chunk_without_storage(base, run_ckpt, tmp_path):
    d = _copy(base, tmp_path)
    md = _md(d)
    del md.storage_data[_entry(md, "w")]
    _write_md(d, md)
    _refused(run_ckpt, d, "DcpMissingStorage")


def test_offset_past_the_file(base, run_ckpt, tmp_path):
    d = _copy(base, tmp_path)
    md = _md(d)
    info = md.storage_data[_entry(md, "w")]
    info.offset = os.path.getsize(d / info.relative_path) - 10
    _write_md(d, md)
    _refused(run_ckpt, d, "DcpItemPastFile")


@pytest.mark.parametrize("path", ["../outside.distcp", "/etc/passwd", "sub/../../x"])
def test_relative_path_escaping(base, run_ckpt, tmp_path, path):
    d = _copy(base, tmp_path)
    md = _md(d)
    md.storage_data[_entry(md, "a")].relative_path = path
    _write_md(d, md)
    _refused(run_ckpt, d, "DcpBadPath")


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("where", ["root", "nested"])
def test_metadata_naming_os_system_is_never_run(base, run_ckpt, tmp_path, where):
    d = _copy(base, tmp_path)
    marker = tmp_path / "PWNED"
    if where == "root":
        blob = pickle.dumps(_Payload(marker), protocol=2)
    else:
        md = _md(d)
        md.state_dict_metadata["evil"] = _Payload(marker)
        blob = pickle.dumps(md)
    (d / ".metadata").write_bytes(blob)
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode == 3, p.stderr
    assert "system" in p.stderr and ("posix" in p.stderr or "os" in p.stderr), p.stderr
    assert not marker.exists()


@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_metadata(base, run_ckpt, tmp_path, keep):
    d = _copy(base, tmp_path)
    blob = (d / ".metadata").read_bytes()
    (d / ".metadata").write_bytes(blob[: int(len(blob) * keep)])
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode == 3, p.stderr
    assert "ckpt: " in p.stderr and ".metadata" in p.stderr


def test_zip_item_of_the_wrong_shape(base, run_ckpt, tmp_path):
    d = _copy(base, tmp_path)
    md = _md(d)
    t = md.state_dict_metadata["a"]
    t.size = torch.Size([3, 3])
    t.chunks[0] = ChunkStorageMetadata(offsets=torch.Size([0, 0]), sizes=torch.Size([3, 3]))
    _write_md(d, md)
    _refused(run_ckpt, d, "DcpItemMismatch")


def test_unknown_dtype(tmp_path, run_ckpt):
    d = tmp_path / "c"
    dcp.save({"z": torch.zeros(2, dtype=torch.complex64)}, checkpoint_id=str(d))
    _refused(run_ckpt, d, "DcpUnknownDType", exit_code=5)


def _raw_dir(base, tmp_path, length_delta=0):
    """`w` stored raw: its 48 bytes appended to a new file, the storage entry pointing there."""
    d = _copy(base, tmp_path)
    md = _md(d)
    raw = W.numpy().tobytes()
    (d / "raw.distcp").write_bytes(b"x" * 7 + raw)
    info = md.storage_data[_entry(md, "w")]
    info.relative_path, info.offset, info.length = "raw.distcp", 7, len(raw) + length_delta
    _write_md(d, md)
    return d


def test_raw_item_reads_like_torch(base, run_ckpt, tmp_path):
    d = _raw_dir(base, tmp_path)
    save_file({"a": A, "w": W}, tmp_path / "ref.safetensors")
    run_ckpt("diff", d, tmp_path / "ref.safetensors")
    out = tmp_path / "bad.safetensors"
    save_file({"a": A, "w": W + (W == W[2, 1]).float()}, out)  # one element differs
    assert run_ckpt("diff", d, out, check=False).returncode == 1


def test_raw_item_of_the_wrong_size(base, run_ckpt, tmp_path):
    d = _raw_dir(base, tmp_path, length_delta=-4)
    _refused(run_ckpt, d, "DcpItemSize")


def test_transform_descriptors_are_refused(base, run_ckpt, tmp_path):
    d = _copy(base, tmp_path)
    md = _md(d)
    md.storage_data[_entry(md, "a")].transform_descriptors = ["zstandard/1"]
    _write_md(d, md)
    _refused(run_ckpt, d, "DcpTransform", exit_code=5)
