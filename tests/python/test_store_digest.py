"""Piece digests end to end. Every command that writes a native checkpoint takes --digest
(xxh3-128 by default, or sha256) and every reader checks whatever each piece records; the digests
are checked here with Python's hashlib / xxhash on the bytes h5py reads (scripts/native_h5py.py),
not with ckpt.

 * `train --digest sha256` saves sha256 pieces; `train --resume` from that checkpoint (the
   trainer's own digest check) goes on and saves xxh3-128 pieces by default;
 * `reshard` writes the requested algorithm whatever the source's; its source check refuses a
   flipped bit in a source piece of either algorithm, naming the tensor and the algorithm;
 * a version 1 manifest (the sha256 checkpoint rewritten to v1 form: "sha256" per piece) still
   verifies and reshards, and the output equals the one from the v2 source;
 * `from-hf --digest sha256` and the default;
 * an unknown --digest is refused naming the flag (exit 2) before anything is written.
"""
import json
import pathlib
import shutil

import h5py
import pytest
from native_h5py import read_native  # scripts/: h5py + hashlib + xxhash only, no ckpt code

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = ["--config", ROOT / "fixtures" / "tiny_llama.json", "--micro-batch", "2", "--seq-len", "16", "--sync-save"]
ONE = ["--tp", "1", "--pp", "1", "--dp", "1"]


def algos(ckpt):
    """The set of digest algorithms of `ckpt`'s pieces; read_native raises if any digest differs
    from Python's hash of the bytes h5py reads."""
    man, _, _ = read_native(ckpt)
    assert man["version"] == 4
    return {p["digest"].split(":")[0] for p in man["pieces"]}


def latest(run):
    return run / (run / "latest").read_text().strip()


@pytest.fixture(scope="module")
def trained(run_ckpt, tmp_path_factory):
    """(sha256 checkpoint at step 2, xxh3-128 checkpoint at step 3 resumed from it)."""
    run = tmp_path_factory.mktemp("digest") / "run"
    run_ckpt("train", *TRAIN, "--steps", "2", "--out", run, "--digest", "sha256")
    sha = latest(run)
    run_ckpt("train", *TRAIN, "--steps", "3", "--out", run, "--resume", "latest")
    return sha, latest(run)


def test_train_saves_and_resumes_both(trained):
    sha, xxh = trained
    assert algos(sha) == {"sha256"}
    assert algos(xxh) == {"xxh3-128"}


def flip_first_piece(ckpt, tensor_prefix="model.layers.1.mlp"):
    """Flips one bit in the data of the first (contiguous) piece whose tensor starts with
    `tensor_prefix`; returns its tensor name."""
    man = json.loads((ckpt / "manifest.json").read_text())
    p = next(p for p in man["pieces"] if p["tensor"].startswith(tensor_prefix))
    with h5py.File(ckpt / p["file"], "r") as f:
        off = f[p["dataset"]].id.get_offset()
    with open(ckpt / p["file"], "r+b") as fh:
        fh.seek(off + 3)
        b = fh.read(1)
        fh.seek(off + 3)
        fh.write(bytes([b[0] ^ 0x08]))
    return p["tensor"]


@pytest.mark.parametrize("which", [0, 1], ids=["sha256_source", "xxh3_source"])
def test_reshard_output_algorithm_and_source_check(run_ckpt, trained, tmp_path, which):
    src = trained[which]
    src_algo = "sha256" if which == 0 else "xxh3-128"
    out_algo = "xxh3-128" if which == 0 else "sha256"
    dst = tmp_path / "out"
    run_ckpt("reshard", src, dst, "--tp", "2", "--pp", "2", "--dp", "1", "--digest", out_algo)
    assert algos(dst) == {out_algo}
    run_ckpt("verify", dst)
    # A flipped bit in a source piece: refused, named, nothing committed.
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    tensor = flip_first_piece(bad)
    p = run_ckpt("reshard", bad, tmp_path / "never", *ONE, check=False)
    assert p.returncode == 1, p.stderr
    assert tensor in p.stderr and f"{src_algo} expected" in p.stderr and "nothing was committed" in p.stderr, p.stderr
    assert not (tmp_path / "never").exists() and not (tmp_path / "never.partial").exists()


def test_version1_manifest_still_reads(run_ckpt, trained, tmp_path):
    v1 = tmp_path / "v1"
    shutil.copytree(trained[0], v1)
    man = json.loads((v1 / "manifest.json").read_text())
    man["version"] = 1
    del man["manifest_digest"]  # version 3's field
    for p in man["pieces"]:
        p["sha256"] = p.pop("digest").split(":", 1)[1]
    (v1 / "manifest.json").write_text(json.dumps(man, indent=1))
    man_again, _, _ = read_native(v1)  # Python's hashlib agrees with the v1 digests
    assert man_again["version"] == 1
    v = json.loads(run_ckpt("verify", v1, "--json").stdout)
    assert v["ok"] and v["format"] == "ckpt-native v1" and v["digests"] == ["sha256"], v
    run_ckpt("reshard", v1, tmp_path / "from_v1", *ONE)
    run_ckpt("reshard", trained[0], tmp_path / "from_v2", *ONE)
    assert algos(tmp_path / "from_v1") == {"xxh3-128"}
    # The same output whatever the source's version: manifests equal but for metadata that names
    # the source, shard files byte for byte.
    a = json.loads((tmp_path / "from_v1" / "manifest.json").read_text())
    b = json.loads((tmp_path / "from_v2" / "manifest.json").read_text())
    assert a["pieces"] == b["pieces"] and a["tensors"] == b["tensors"]
    for p in {q["file"] for q in a["pieces"]}:
        assert (tmp_path / "from_v1" / p).read_bytes() == (tmp_path / "from_v2" / p).read_bytes(), p
    # A flipped bit in the v1 source is still found by the source check.
    tensor = flip_first_piece(v1)
    p = run_ckpt("reshard", v1, tmp_path / "never", *ONE, check=False)
    assert p.returncode == 1 and tensor in p.stderr and "sha256 expected" in p.stderr, p.stderr


def test_from_hf_digest_and_bad_flag(run_ckpt, trained, tmp_path):
    hf = tmp_path / "hf"
    run_ckpt("to-hf", trained[1], hf, "--no-fsync")
    run_ckpt("from-hf", hf, tmp_path / "sha", "--digest", "sha256", "--no-fsync")
    assert algos(tmp_path / "sha") == {"sha256"}
    run_ckpt("from-hf", hf, tmp_path / "xxh", "--tp", "2", "--pp", "1", "--dp", "1", "--no-fsync")
    assert algos(tmp_path / "xxh") == {"xxh3-128"}
    for cmd in (["from-hf", hf, tmp_path / "x1"], ["reshard", trained[1], tmp_path / "x2", *ONE],
                ["train", *TRAIN, "--steps", "1", "--out", tmp_path / "x3"]):
        p = run_ckpt(*cmd, "--digest", "md5", check=False)
        assert p.returncode == 2 and "--digest" in p.stderr and "md5" in p.stderr, (cmd[0], p.stderr)
    assert not any((tmp_path / n).exists() for n in ("x1", "x2", "x1.partial", "x2.partial"))
    assert not (tmp_path / "x3" / "latest").exists()
