"""`ckpt inspect` and `ckpt verify` on safetensors inputs: a single .safetensors file and a
HuggingFace directory (sharded with model.safetensors.index.json, or one model.safetensors),
all written by the real libraries (safetensors, transformers' save_pretrained). Expected values
come from those libraries (safe_open shapes/dtypes, the index JSON), never from ckpt itself.
safetensors has no checksums: verify validates the structure and reads every byte, and says so."""
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

ST_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
            torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
            torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


def sample_tensors():
    g = torch.Generator().manual_seed(7)
    return {
        "model.embed_tokens.weight": (torch.randn(96, 32, generator=g) * 0.02).to(torch.bfloat16),
        "model.norm.weight": torch.randn(32, generator=g),
        "half": torch.randn(5, 6, 7, generator=g).to(torch.float16),
        "double": torch.randn(9, generator=g).to(torch.float64),
        "ids": torch.randint(-2**40, 2**40, (4, 3), generator=g),
        "i32": torch.randint(-2**30, 2**30, (11,), generator=g).to(torch.int32),
        "i16": torch.randint(-2**14, 2**14, (3, 3), generator=g).to(torch.int16),
        "i8": torch.randint(-100, 100, (5,), generator=g).to(torch.int8),
        "bytes": torch.randint(0, 256, (300,), generator=g).to(torch.uint8),
        "mask": torch.rand(13, generator=g) > 0.5,
        "f8a": torch.randn(8, 4, generator=g).to(torch.float8_e4m3fn),
        "f8b": torch.randn(8, 4, generator=g).to(torch.float8_e5m2),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


def reference_listing(path):
    """{name: (dtype, shape, bytes)} as the safetensors library reports it."""
    out = {}
    with safe_open(str(path), framework="pt") as f:
        for k in f.keys():
            t = f.get_tensor(k)
            out[k] = (ST_DTYPE[t.dtype], list(t.shape), t.numel() * t.element_size())
    return out


@pytest.fixture(scope="module")
def st_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("st")
    p = d / "weights.safetensors"
    save_file(sample_tensors(), str(p), metadata={"format": "pt"})
    return p


def check_listing(info, ref):
    got = {t["name"]: (t["dtype"], t["shape"], t["bytes"]) for t in info["tensors"]}
    assert got == ref
    assert all(t["pieces"] == 1 for t in info["tensors"])
    assert info["totals"]["tensors"] == len(ref)
    assert info["totals"]["bytes"] == sum(b for _, _, b in ref.values())
    assert info["totals"]["compression_ratio"] == 1.0


def test_inspect_single_file(run_ckpt, st_file):
    info = json.loads(run_ckpt("inspect", st_file, "--json").stdout)
    assert info["format"] == "safetensors"
    check_listing(info, reference_listing(st_file))
    assert info["totals"]["files"] == 1
    assert "safetensors_metadata" in info["metadata_keys"]
    text = run_ckpt("inspect", st_file).stdout
    assert "model.embed_tokens.weight" in text and "BF16" in text and "[96,32]" in text and "totals:" in text


def test_verify_single_file_reads_every_byte(run_ckpt, st_file):
    p = run_ckpt("verify", st_file)
    assert p.stdout.startswith("OK:") and "no checksums" in p.stdout and "every byte read" in p.stdout
    v = json.loads(run_ckpt("verify", st_file, "--json").stdout)
    ref = reference_listing(st_file)
    assert v["ok"] and v["structure_ok"] and v["checksums"] is False and "no checksums" in v["note"]
    assert v["format"] == "safetensors"
    assert v["pieces"] == len(ref) and v["bytes"] == sum(b for _, _, b in ref.values())


def test_verify_single_file_bit_flip_is_not_detectable(run_ckpt, st_file, tmp_path):
    """Honest limit: without checksums a flipped data bit passes (and the output says why)."""
    bad = tmp_path / "flip.safetensors"
    raw = bytearray(st_file.read_bytes())
    raw[-5] ^= 0x01
    bad.write_bytes(bytes(raw))
    p = run_ckpt("verify", bad)
    assert "no checksums" in p.stdout


def header_of(path):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return raw, n, json.loads(raw[8:8 + n])


@pytest.mark.parametrize("damage,code,rc", [
    ("truncate_data", "MetadataIncompleteBuffer", 3),
    ("trailing_bytes", "MetadataIncompleteBuffer", 3),
    ("header_len_past_eof", "InvalidHeaderLength", 3),
    ("tiny_file", "HeaderTooSmall", 3),
    ("bad_json", "InvalidHeaderDeserialization", 3),
    ("offsets_gap", "InvalidOffset", 3),
    ("wrong_shape", "TensorInvalidInfo", 3),
    ("unknown_dtype", "InvalidHeaderDeserialization", 3),
])
def test_corrupt_single_file(run_ckpt, st_file, tmp_path, damage, code, rc):
    raw, n, hdr = header_of(st_file)
    data = raw[8 + n:]
    if damage == "truncate_data":
        out = raw[:-3]
    elif damage == "trailing_bytes":
        out = raw + b"\0\0\0\0"
    elif damage == "header_len_past_eof":
        out = struct.pack("<Q", len(raw)) + raw[8:]
    elif damage == "tiny_file":
        out = raw[:5]
    else:
        if damage == "bad_json":
            text = json.dumps(hdr)[:-2]
        else:
            if damage == "offsets_gap":
                hdr["half"]["data_offsets"][0] += 2
            elif damage == "wrong_shape":
                hdr["half"]["shape"] = [5, 6, 8]
            elif damage == "unknown_dtype":
                hdr["half"]["dtype"] = "F17"
            text = json.dumps(hdr)
        hb = text.encode()
        hb += b" " * (-len(hb) % 8)
        out = struct.pack("<Q", len(hb)) + hb + data
    bad = tmp_path / f"{damage}.safetensors"
    bad.write_bytes(out)
    for cmd in ("verify", "inspect"):
        p = run_ckpt(cmd, bad, check=False)
        assert p.returncode == rc, (cmd, p.returncode, p.stderr)
        assert code in p.stderr and str(bad) in p.stderr, p.stderr
        assert "Sanitizer" not in p.stderr and "runtime error" not in p.stderr, p.stderr
    j = json.loads(run_ckpt("verify", bad, "--json", check=False).stdout)
    assert not j["ok"] and j["failures"][0]["code"] == code


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """A tiny random LlamaForCausalLM saved by transformers: sharded (index) and single-file."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    base = tmp_path_factory.mktemp("hf")
    sharded, single = base / "sharded", base / "single"
    model.save_pretrained(sharded, max_shard_size="20KB", safe_serialization=True)
    model.save_pretrained(single, safe_serialization=True)
    assert (sharded / "model.safetensors.index.json").exists()
    assert not (single / "model.safetensors.index.json").exists() and (single / "model.safetensors").exists()
    return sharded, single


def hf_reference(d):
    idx = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(idx.read_text())["weight_map"].values())) if idx.exists() else ["model.safetensors"]
    ref = {}
    for f in files:
        ref.update(reference_listing(d / f))
    return ref, files


@pytest.mark.parametrize("which", ["sharded", "single"])
def test_inspect_and_verify_hf_dir(run_ckpt, hf_dirs, which):
    d = hf_dirs[0] if which == "sharded" else hf_dirs[1]
    ref, files = hf_reference(d)
    info = json.loads(run_ckpt("inspect", d, "--json").stdout)
    assert info["format"] == "huggingface safetensors directory"
    check_listing(info, ref)
    assert info["totals"]["files"] == len(files)
    if which == "sharded":
        assert len(files) > 2
    assert "model_config" in info["metadata_keys"]
    assert "model.layers.1.mlp.down_proj.weight" in run_ckpt("inspect", d).stdout
    v = json.loads(run_ckpt("verify", d, "--json").stdout)
    assert v["ok"] and v["checksums"] is False and v["pieces"] == len(ref)
    assert v["bytes"] == sum(b for _, _, b in ref.values())
    assert "no checksums" in run_ckpt("verify", d).stdout


def test_hf_dir_damaged(run_ckpt, hf_dirs, tmp_path):
    import shutil
    src = hf_dirs[0]
    idx = json.loads((src / "model.safetensors.index.json").read_text())
    files = sorted(set(idx["weight_map"].values()))
    # a shard listed in the index is missing: not found (4), naming it
    d = tmp_path / "missing"
    shutil.copytree(src, d)
    (d / files[1]).unlink()
    p = run_ckpt("verify", d, check=False)
    assert p.returncode == 4 and files[1] in p.stderr
    # the index maps a tensor to the wrong shard: corrupt (3), naming the tensor
    d = tmp_path / "mismatch"
    shutil.copytree(src, d)
    name = next(k for k, v in idx["weight_map"].items() if v == files[0])
    bad = dict(idx)
    bad["weight_map"] = dict(idx["weight_map"], **{name: files[1]})
    (d / "model.safetensors.index.json").write_text(json.dumps(bad))
    for cmd in ("verify", "inspect"):
        p = run_ckpt(cmd, d, check=False)
        assert p.returncode == 3 and "IndexMismatch" in p.stderr and name in p.stderr
    # a truncated shard: corrupt (3), naming the file
    d = tmp_path / "trunc"
    shutil.copytree(src, d)
    f = d / files[-1]
    f.write_bytes(f.read_bytes()[:-1])
    p = run_ckpt("verify", d, check=False)
    assert p.returncode == 3 and files[-1] in p.stderr
    # a weight_map entry escaping the directory is refused
    d = tmp_path / "escape"
    shutil.copytree(src, d)
    bad = dict(idx)
    bad["weight_map"] = dict(idx["weight_map"], **{name: "../" + files[0]})
    (d / "model.safetensors.index.json").write_text(json.dumps(bad))
    p = run_ckpt("verify", d, check=False)
    assert p.returncode == 3 and "IndexBadFileName" in p.stderr


def test_unknown_input_kinds(run_ckpt, tmp_path):
    (tmp_path / "empty").mkdir()
    for cmd in ("verify", "inspect"):
        p = run_ckpt(cmd, tmp_path / "empty", check=False)
        # the message lists every kind ckpt reads (converters/source/open_checkpoint.cc)
        assert p.returncode == 5 and "no checkpoint kind" in p.stderr and "native-store" in p.stderr and "empty" in p.stderr, p.stderr
    (tmp_path / "x.bin").write_bytes(b"hello")
    p = run_ckpt("inspect", tmp_path / "x.bin", check=False)
    assert p.returncode == 5
    p = run_ckpt("verify", tmp_path / "nope", check=False)
    assert p.returncode == 4
