"""Every command checks its source by the format's own checks before a byte leaves ckpt.

A native store's piece digests are recomputed by `verify` and before every command commits
an output that came from it: a store written in a profile (whose canonical view wrapped the
reader and hid its digests from `verify` and `to-hf`), and the exports (`to-hf`, `export-dcp`,
`export-megatron` in its three formats), `diff`, `reshard`, `convert` and the Python module.
A flipped data byte (located with h5py, the independent reader) must give a named error
(ChecksumMismatch), exit non-zero and leave no output; `--no-verify` is the explicit way out.
Formats without checksums (safetensors) say so by name."""
import json
import shutil

import h5py
import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

import ckpt


def _tiny_hf(path):
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)


@pytest.fixture(scope="module")
def stores(run_ckpt, tmp_path_factory):
    """hf, native (reference profile) and pd (paddlenlp profile) stores of one tiny model."""
    d = tmp_path_factory.mktemp("checks")
    _tiny_hf(d / "hf")
    run_ckpt("from-hf", d / "hf", d / "native")
    run_ckpt("convert", d / "native", d / "pd", "--profile", "paddlenlp")
    return d


def flip_data_byte(store, dataset_index=3, at=10):
    """Flips one bit of a data byte of the `dataset_index`-th dataset of shard r00000.h5, found
    with h5py (the dataset's file offset). Returns the dataset's name."""
    shard = store / "shards" / "r00000.h5"
    with h5py.File(shard, "r") as f:
        name = sorted(f.keys())[dataset_index]
        off = f[name].id.get_offset()
    assert off is not None, "the dataset is not contiguous"
    b = bytearray(shard.read_bytes())
    b[off + at] ^= 0x40
    shard.write_bytes(bytes(b))
    return name


@pytest.fixture
def bad(stores, tmp_path):
    """A copy of each store with one data byte flipped."""
    out = {}
    for kind in ("native", "pd"):
        shutil.copytree(stores / kind, tmp_path / kind)
        flip_data_byte(tmp_path / kind)
        out[kind] = tmp_path / kind
    return out


def _refused(p, out=None):
    assert p.returncode != 0, p.stdout + p.stderr
    assert "[ChecksumMismatch]" in p.stderr, p.stderr
    if out is not None:
        assert not out.exists() and not out.with_name(out.name + ".partial").exists()


@pytest.mark.parametrize("kind", ["native", "pd"])
def test_verify_checks_the_digests_of_every_store(run_ckpt, bad, kind):
    # pd: the store in a profile opens as its canonical view; its digests must still be checked.
    p = run_ckpt("verify", bad[kind], "--json", check=False)
    j = json.loads(p.stdout)
    assert p.returncode == 1 and not j["ok"] and j["checksums"], j
    assert j["format"].startswith("ckpt-native v") and "piece digests" in j["scheme"], j
    assert [f["code"] for f in j["failures"]] == ["ChecksumMismatch"], j
    assert j["failures"][0]["dataset"] and j["failures"][0]["tensor"], j
    assert "note" not in j or "no checksums" not in j["note"], j


@pytest.mark.parametrize("kind", ["native", "pd"])
@pytest.mark.parametrize("command", [
    ["to-hf"], ["export-dcp"], ["export-megatron", "--tp", "1", "--pp", "1"],
    ["export-megatron", "--tp", "1", "--pp", "1", "--format", "torch"],
    ["export-megatron", "--tp", "1", "--pp", "1", "--format", "torch_dist"],
    ["reshard", "--tp", "2", "--pp", "1", "--dp", "1"],
    ["convert", "--profile", "megatron-mcore"],
    ["export-deepspeed", "--weights-only"],
], ids=lambda c: "-".join(c[:1] + c[-1:]) if isinstance(c, list) else c)
def test_every_command_refuses_a_corrupt_store(run_ckpt, bad, tmp_path, kind, command):
    out = tmp_path / "out"
    _refused(run_ckpt(command[0], bad[kind], out, *command[1:], check=False), out)


def test_no_verify_is_the_explicit_way_out(run_ckpt, bad, stores, tmp_path):
    out = tmp_path / "hf_out"
    j = json.loads(run_ckpt("to-hf", bad["native"], out, "--no-verify", "--json").stdout)
    assert j["source_check"]["how"] == "none"
    ref = load_file(stores / "hf" / "model.safetensors")
    got = load_file(out / "model.safetensors")
    differ = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert len(differ) == 1, differ  # the flipped byte, passed on because the user asked


def test_clean_exports_say_how_the_source_was_checked(run_ckpt, stores, tmp_path):
    j = json.loads(run_ckpt("to-hf", stores / "pd", tmp_path / "o1", "--json").stdout)
    assert j["source_check"]["how"] in ("process", "inline") and "piece digests" in j["source_check"]["scheme"], j
    ref = load_file(stores / "hf" / "model.safetensors")
    got = load_file(tmp_path / "o1" / "model.safetensors")
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    # A format without checksums: said by name, nothing re-read.
    j = json.loads(run_ckpt("to-hf", stores / "hf", tmp_path / "o2", "--json").stdout)
    assert j["source_check"]["scheme"] == "" and "safetensors has no checksums" in j["source_check"]["note"], j


def test_diff_refuses_a_corrupt_side(run_ckpt, bad, stores):
    _refused(run_ckpt("diff", stores / "native", bad["native"], check=False))
    p = run_ckpt("diff", stores / "native", bad["native"], "--no-verify", check=False)
    assert p.returncode == 1, p.stderr  # compared as asked: one tensor differs


def test_python_module_checks_before_reading(bad, stores, tmp_path):
    ds = None
    with h5py.File(bad["native"] / "shards" / "r00000.h5", "r") as f:
        ds = "/" + sorted(f.keys())[3]
    man = json.loads((bad["native"] / "manifest.json").read_text())
    corrupt = next(p["tensor"] for p in man["pieces"] if p["dataset"] == ds)
    with ckpt.open(bad["native"]) as c:
        others = [t for t in c.tensors if t != corrupt]
        c.read(others[0])  # another piece reads
        with pytest.raises(ckpt.Error, match="ChecksumMismatch"):
            c.read(corrupt)
    with pytest.raises(ckpt.Error, match="ChecksumMismatch"):
        ckpt.to_hf(bad["native"], tmp_path / "py_out")
    assert not (tmp_path / "py_out").exists()
    rep = ckpt.verify(bad["pd"])
    assert not rep["ok"] and rep["failures"][0]["code"] == "ChecksumMismatch"


def test_to_hf_direct_checks_from_its_own_reads(run_ckpt, stores, bad, tmp_path):
    """--io direct (as for a cold source under auto): SRC's digests from the copy's own reads, SRC
    read once; a flipped byte is still found, and nothing is committed."""
    j = json.loads(run_ckpt("to-hf", stores / "native", tmp_path / "o", "--io", "direct", "--json").stdout)
    sc = j["source_check"]
    man = json.loads((stores / "native" / "manifest.json").read_text())
    assert sc["how"] == "copy" and sc["bytes_from_copy"] + sc["bytes_reread"] == sum(p["bytes"] for p in man["pieces"]), sc
    assert sc["bytes_from_copy"] > 0, sc
    ref = load_file(stores / "hf" / "model.safetensors")
    got = load_file(tmp_path / "o" / "model.safetensors")
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    _refused(run_ckpt("to-hf", bad["native"], tmp_path / "o2", "--io", "direct", check=False), tmp_path / "o2")
