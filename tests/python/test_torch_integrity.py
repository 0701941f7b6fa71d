"""Integrity of the torch-based kinds (docs/INTEGRITY.md): zip CRC-32 checked, Python's dict semantics,
incomplete directories refused by name.

- A data byte flipped inside a storage entry of a real Megatron-LM `model_optim_rng.pt`
  (mcore_fixtures.py, written by megatron-core 0.16.1), of a `.distcp` tensor item (dcp_fixtures.py,
  written by torch.distributed.checkpoint) and of a Megatron-Core torch_dist `.distcp`: `ckpt
  verify` fails naming the zip entry (ZipCrcMismatch), `to-hf` and `reshard` refuse and leave
  nothing. The reference for "the entry" is Python's zipfile (the entry the byte lies in).
- A pickle with a second 'iteration' / 'model' key spliced in (re-zipped by zipfile, so every CRC
  is valid): ckpt's view equals torch.load's (the last value wins).
- A torch_dist iteration without metadata.json, a DCP without .metadata: IncompleteCheckpoint
  naming the missing file, never an export.
"""
import io
import json
import pathlib
import shutil
import struct
import sys
import zipfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import mcore_fixtures as mf  # noqa: E402
from dcp_fixtures import fixture_root  # noqa: E402
from zip_damage import assert_refused, flip_in_entry  # noqa: E402

RANK_FILE = "iter_0000010/mp_rank_00/model_optim_rng.pt"


def largest_storage(infos):
    return max((i for i in infos if "/data/" in i.filename), key=lambda i: i.file_size)


# ---- zip CRC-32 ------------------------------------------------------------------------------

def test_intact_torch_kinds_verify_with_zip_crc(run_ckpt):
    for src in (mf.fixture("tp1"), mf.fixture("tp1", "dist"), fixture_root() / "llama_fp32/dcp"):
        j = json.loads(run_ckpt("verify", "--json", src).stdout)
        assert j["ok"] is True and j["scheme"] == "zip CRC-32" and j["pieces"] > 0, j
        assert j["note"], j  # what the format cannot check, by name


def test_flipped_byte_in_megatron_legacy_storage_is_refused(run_ckpt, tmp_path):
    d = tmp_path / "legacy"
    shutil.copytree(mf.fixture("tp1"), d)
    f = d / RANK_FILE
    entry = flip_in_entry(f, 0, f.stat().st_size, largest_storage)
    assert_refused(run_ckpt, d, entry, tmp_path)


def change_version_entry(f):
    """'3' -> '4' in the <archive>/version entry of torch.save file `f` (an entry ckpt does not
    interpret, so only the CRC can tell); returns the entry's name."""
    z = zipfile.ZipFile(f)
    e = next(i for i in z.infolist() if i.filename.endswith("/version"))
    data = bytearray(pathlib.Path(f).read_bytes())
    o = e.header_offset
    n, m = struct.unpack("<HH", data[o + 26:o + 30])
    assert data[o + 30 + n + m:o + 30 + n + m + 1] == b"3"
    data[o + 30 + n + m] = ord("4")
    pathlib.Path(f).write_bytes(bytes(data))
    return e.filename


def test_changed_entry_that_holds_no_tensor_is_found(run_ckpt, tmp_path):
    # Every entry is checked, not only the storages.
    d = tmp_path / "legacy"
    shutil.copytree(mf.fixture("tp1"), d)
    entry = change_version_entry(d / RANK_FILE)
    v = run_ckpt("verify", d, check=False)
    assert v.returncode != 0 and "ZipCrcMismatch" in v.stdout + v.stderr and entry in v.stdout + v.stderr, v.stdout + v.stderr


def _dcp_item(d, fqn):
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(str(d)).read_metadata()
    info = next(v for k, v in md.storage_data.items() if k.fqn == fqn)
    return d / info.relative_path, info.offset, info.length


def test_flipped_byte_in_distcp_item_is_refused(run_ckpt, tmp_path):
    d = tmp_path / "dcp"
    shutil.copytree(fixture_root() / "llama_bf16/dcp", d)  # config.json in the directory: reshard knows the model
    path, off, length = _dcp_item(d, "model.layers.0.mlp.down_proj.weight")
    entry = flip_in_entry(path, off, length, largest_storage)
    assert_refused(run_ckpt, d, entry, tmp_path)


def test_flipped_byte_in_torch_dist_item_is_refused(run_ckpt, tmp_path):
    d = tmp_path / "dist"
    shutil.copytree(mf.fixture("tp1", "dist"), d)
    it = d / "iter_0000010"
    path, off, length = _dcp_item(it, "decoder.layers.self_attention.linear_qkv.weight")
    entry = flip_in_entry(path, off, length, largest_storage)
    assert_refused(run_ckpt, d, entry, tmp_path)


def test_flipped_byte_in_torch_dist_common_pt_is_found(run_ckpt, tmp_path):
    d = tmp_path / "dist"
    shutil.copytree(mf.fixture("tp1", "dist"), d)
    entry = change_version_entry(d / "iter_0000010/common.pt")
    v = run_ckpt("verify", d, check=False)
    assert v.returncode != 0 and "ZipCrcMismatch" in v.stdout + v.stderr and entry in v.stdout + v.stderr, v.stdout + v.stderr


# ---- duplicate dict keys: the last value wins, as torch.load ---------------------------------

def splice_key(f, key, value_ops):
    """Rewrites data.pkl of torch.save file `f` so that the root dict gets SETITEM(key, value)
    once more just before STOP (`value_ops`: the pickle opcodes pushing the value); re-zipped by
    zipfile (valid CRCs), every other entry as it was."""
    src = zipfile.ZipFile(f)
    entries = [(i, src.read(i.filename)) for i in src.infolist()]
    src.close()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as out:
        for info, data in entries:
            if info.filename.endswith("/data.pkl"):
                assert data.endswith(b".")
                k = key.encode()
                data = data[:-1] + b"X" + struct.pack("<I", len(k)) + k + value_ops + b"s."
            out.writestr(info.filename, data)
    pathlib.Path(f).write_bytes(buf.getvalue())


def test_duplicate_key_last_value_wins_as_in_torch_load(run_ckpt, tmp_path):
    d = tmp_path / "legacy"
    shutil.copytree(mf.fixture("tp1"), d)
    f = d / RANK_FILE
    splice_key(f, "iteration", b"K\x63")  # BININT1 99
    ref = torch.load(f, weights_only=False)
    assert ref["iteration"] == 99 and list(ref).count("iteration") == 1
    import ckpt  # the Python module (build/python): the source's metadata as ckpt reads it
    with ckpt.open(str(d)) as c:
        assert c.metadata["megatron"]["iteration"] == ref["iteration"], c.metadata["megatron"]


def test_duplicate_model_key_empty_model_as_in_torch_load(run_ckpt, tmp_path):
    d = tmp_path / "legacy"
    shutil.copytree(mf.fixture("tp1"), d)
    f = d / RANK_FILE
    splice_key(f, "model", b"}")  # EMPTY_DICT
    ref = torch.load(f, weights_only=False)
    assert ref["model"] == {}  # torch sees no model tensors
    p = run_ckpt("inspect", "--json", d, check=False)
    assert p.returncode != 0 and "MissingTensor" in p.stderr, p.stdout + p.stderr
    h = run_ckpt("to-hf", d, tmp_path / "hf", check=False)
    assert h.returncode != 0 and not (tmp_path / "hf").exists()


# ---- incomplete directories ------------------------------------------------------------------

@pytest.mark.parametrize("given", ["iteration", "run"])
def test_torch_dist_without_metadata_json_is_refused(run_ckpt, tmp_path, given):
    d = tmp_path / "dist"
    shutil.copytree(mf.fixture("tp1", "dist"), d)
    (d / "iter_0000010/metadata.json").unlink()
    src = d / "iter_0000010" if given == "iteration" else d
    for cmd in (("inspect", src), ("to-hf", src, tmp_path / "hf"), ("verify", src)):
        p = run_ckpt(*cmd, check=False)
        assert p.returncode != 0, (cmd, p.stdout, p.stderr)
        assert "IncompleteCheckpoint" in p.stderr and "metadata.json" in p.stderr, (cmd, p.stderr)
    assert not (tmp_path / "hf").exists()


def test_torch_dist_without_metadata_json_and_common_pt_is_refused(run_ckpt, tmp_path):
    # As megatron-core >= 0.19 writes it (no common.pt): the stacked layers give it away.
    d = tmp_path / "dist"
    shutil.copytree(mf.fixture("tp1", "dist") / "iter_0000010", d)
    (d / "metadata.json").unlink()
    (d / "common.pt").unlink()
    p = run_ckpt("to-hf", d, tmp_path / "hf", check=False)
    assert p.returncode != 0 and "IncompleteCheckpoint" in p.stderr and "metadata.json" in p.stderr, p.stderr
    assert not (tmp_path / "hf").exists()


def test_dcp_without_metadata_is_refused(run_ckpt, tmp_path):
    d = tmp_path / "dcp"
    shutil.copytree(fixture_root() / "llama_fp32/dcp", d)
    (d / ".metadata").unlink()
    for cmd in (("inspect", d), ("to-hf", d, tmp_path / "hf"), ("verify", d)):
        p = run_ckpt(*cmd, check=False)
        assert p.returncode != 0, (cmd, p.stdout, p.stderr)
        assert "IncompleteCheckpoint" in p.stderr and ".metadata" in p.stderr, (cmd, p.stderr)
    assert not (tmp_path / "hf").exists()


def test_torch_dist_without_dot_metadata_is_refused(run_ckpt, tmp_path):
    d = tmp_path / "dist"
    shutil.copytree(mf.fixture("tp1", "dist") / "iter_0000010", d)
    (d / ".metadata").unlink()
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0 and "IncompleteCheckpoint" in p.stderr and ".metadata" in p.stderr, p.stderr


# ---- check_piece: the Python module's reads check the entry holding the piece first -----------

def test_python_read_of_a_flipped_piece_raises(tmp_path):
    import ckpt
    d = tmp_path / "legacy"
    shutil.copytree(mf.fixture("tp1"), d)
    f = d / RANK_FILE
    entry = flip_in_entry(f, 0, f.stat().st_size, largest_storage)
    with ckpt.open(str(d)) as c:
        errors = []
        for name in c.keys():
            try:
                c.read(name)
            except Exception as e:  # noqa: BLE001 - the module's CorruptionError
                errors.append(str(e))
        assert errors and all("ZipCrcMismatch" in e and entry in e for e in errors), errors


def test_python_read_of_a_flipped_dcp_item_raises(tmp_path):
    import ckpt
    d = tmp_path / "dcp"
    shutil.copytree(fixture_root() / "llama_bf16/dcp", d)
    name = "model.layers.0.mlp.down_proj.weight"
    path, off, length = _dcp_item(d, name)
    entry = flip_in_entry(path, off, length, largest_storage)
    with ckpt.open(str(d)) as c:
        c.read("model.layers.0.mlp.up_proj.weight")  # another item: fine
        with pytest.raises(Exception, match="ZipCrcMismatch") as e:
            c.read(name)
        assert entry in str(e.value)
