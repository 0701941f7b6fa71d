"""`ckpt verify` / `ckpt inspect` on native stores: exit codes and messages for damaged stores
(flipped bit, truncated or deleted shard, bad manifests), checked with independent tools
(h5py for data offsets, hashlib for checksums, json for manifest edits)."""
import json
import shutil

import h5py
import numpy as np
import pytest

from test_store_h5py import make_sources, write_with_tool


@pytest.fixture(scope="module")
def clean_store(tool, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    return write_with_tool(tool, tmp, make_sources(np.random.default_rng(3)), "none", ranks=2)


def copy(clean_store, tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(clean_store, dst)
    return dst


def test_inspect_text_and_json(run_ckpt, clean_store):
    out = run_ckpt("inspect", clean_store).stdout
    assert "model.embed_tokens.weight" in out and "[100,64]" in out and "totals:" in out
    j = json.loads(run_ckpt("inspect", clean_store, "--json").stdout)
    emb = next(t for t in j["tensors"] if t["name"] == "model.embed_tokens.weight")
    assert emb["pieces"] == 3 and emb["bytes"] == 100 * 64 * 2 and emb["dtype"] == "BF16"
    assert j["totals"]["files"] == 2
    v = json.loads(run_ckpt("verify", clean_store, "--json").stdout)
    assert v["ok"] and v["pieces"] == j["totals"]["pieces"]


def test_verify_flipped_bit_names_tensor(run_ckpt, clean_store, tmp_path):
    dst = copy(clean_store, tmp_path, "flip")
    man = json.loads((dst / "manifest.json").read_text())
    p = next(p for p in man["pieces"] if p["tensor"] == "half")
    with h5py.File(dst / p["file"], "r") as f:
        off = f[p["dataset"]].id.get_offset()
    with open(dst / p["file"], "r+b") as fh:
        fh.seek(off + 5)
        b = fh.read(1)
        fh.seek(off + 5)
        fh.write(bytes([b[0] ^ 0x01]))
    r = run_ckpt("verify", dst, check=False)
    assert r.returncode == 1
    assert "ChecksumMismatch" in r.stderr and "'half'" in r.stderr and p["dataset"] in r.stderr
    j = json.loads(run_ckpt("verify", dst, "--json", check=False).stdout)
    assert not j["ok"] and j["failures"][0]["tensor"] == "half"


def test_verify_truncated_and_deleted_shard(run_ckpt, clean_store, tmp_path):
    dst = copy(clean_store, tmp_path, "trunc")
    f = dst / "shards" / "r00001.h5"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 3])
    r = run_ckpt("verify", dst, check=False)
    assert r.returncode == 3 and "BadShard" in r.stderr and "r00001.h5" in r.stderr
    dst = copy(clean_store, tmp_path, "deleted")
    (dst / "shards" / "r00000.h5").unlink()
    r = run_ckpt("verify", dst, check=False)
    assert r.returncode == 4 and "ShardMissing" in r.stderr


@pytest.mark.parametrize("edit,code,rc", [
    ("version", "UnsupportedVersion", 5),
    ("invalid_json", "InvalidJson", 3),
    ("overlap", "PieceOverlap", 3),
    ("gap", "PieceGap", 3),
    ("oob", "RegionOutOfBounds", 3),
    ("dtype", "DTypeMismatch", 3),
])
def test_verify_bad_manifest(run_ckpt, clean_store, tmp_path, edit, code, rc):
    dst = copy(clean_store, tmp_path, edit)
    man = json.loads((dst / "manifest.json").read_text())
    emb = [p for p in man["pieces"] if p["tensor"] == "model.embed_tokens.weight"]
    if edit == "version":
        man["version"] = 2
    elif edit == "overlap":
        emb[1]["region"]["offset"][0] -= 1
    elif edit == "gap":
        emb[0]["region"]["extent"][0] -= 1
        emb[0]["bytes"] -= 64 * 2
    elif edit == "oob":
        emb[2]["region"]["offset"][0] += 5
    elif edit == "dtype":
        emb[0]["dtype"] = "I16"
    text = json.dumps(man)
    if edit == "invalid_json":
        text = text[:-10]
    (dst / "manifest.json").write_text(text)
    r = run_ckpt("verify", dst, check=False)
    assert r.returncode == rc, r.stderr
    assert code in r.stderr


def test_run_dir_follows_latest_and_refuses_partial(run_ckpt, clean_store, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copytree(clean_store, run / "step-00000010")
    shutil.copytree(clean_store, run / "step-00000020.partial")
    (run / "latest").write_text("step-00000010\n")
    assert "step-00000010" in run_ckpt("verify", run).stdout
    r = run_ckpt("verify", run / "step-00000020.partial", check=False)
    assert r.returncode != 0 and "NotCheckpoint" in r.stderr
    (run / "latest").write_text("step-00000020.partial\n")
    r = run_ckpt("verify", run, check=False)
    assert r.returncode != 0 and "BadLatest" in r.stderr
