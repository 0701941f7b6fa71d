"""ckpt reads PyTorch Distributed Checkpoint directories written by torch itself
(tests/python/dcp_fixtures.py: dcp.save of a transformers LlamaForCausalLM state_dict in one
process, fp32 and bf16; a 2-process gloo save of DTensors sharded along dim 0 and dim 1).
References, all independent of ckpt: torch's own DCP metadata reader (shapes, chunks), torch's
dcp.load (every tensor value), transformers (logits of the converted model vs the original)."""
import json
import pathlib

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file

from dcp_fixtures import TOKENS, fixture_root, llama_model, sharded_globals


@pytest.fixture(scope="module")
def fx():
    return fixture_root()


def _torch_metadata(d):
    return dcp.FileSystemReader(str(d)).read_metadata()


def _dcp_load(d, like):
    sd = {k: torch.zeros_like(v) for k, v in like.items()}
    dcp.load(sd, checkpoint_id=str(d))
    return sd


@pytest.mark.parametrize("name", ["llama_fp32/dcp", "llama_bf16/dcp", "sharded/dcp"])
def test_inspect_lists_every_tensor_with_its_global_shape(fx, run_ckpt, name):
    d = fx / name
    s = json.loads(run_ckpt("inspect", "--json", d).stdout)
    got = {t["name"]: t for t in s["tensors"]}
    md = _torch_metadata(d)
    want = {k: v for k, v in md.state_dict_metadata.items() if hasattr(v, "chunks")}
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k]["shape"] == list(v.size), k
        assert got[k]["pieces"] == len([c for c in v.chunks if torch.Size(c.sizes).numel() > 0]), k
    assert s["format"] == "PyTorch DCP"  # as verify names it


def test_sharded_chunks_are_pieces_and_values_equal_torch_dcp_load(fx, run_ckpt):
    d = fx / "sharded" / "dcp"
    md = _torch_metadata(d)
    assert len(md.state_dict_metadata["w_cols_uneven"].chunks) == 2  # Shard(1): two chunks at column offsets 0, 4
    # ckpt diff against what torch's dcp.load returns (written by dcp_fixtures.py as safetensors).
    p = run_ckpt("diff", "--json", d, fx / "sharded" / "ref.safetensors")
    rep = json.loads(p.stdout)
    assert p.returncode == 0, p.stdout
    assert rep["equal"] is True
    # and the reference itself is the globals that were sharded
    ref = load_file(fx / "sharded" / "ref.safetensors")
    for k, (t, _) in sharded_globals().items():
        assert torch.equal(ref[k], t), k


def test_sharded_diff_sees_a_changed_value(fx, run_ckpt, tmp_path):
    # The same comparison must fail when one element differs (the diff above can fail).
    from safetensors.torch import save_file
    ref = load_file(fx / "sharded" / "ref.safetensors")
    ref["w_cols_uneven"][4, 6] += 1.0  # in the second chunk (column offset 4)
    save_file(ref, tmp_path / "bad.safetensors")
    p = run_ckpt("diff", fx / "sharded" / "dcp", tmp_path / "bad.safetensors", check=False)
    assert p.returncode == 1 and "w_cols_uneven" in p.stdout


@pytest.mark.parametrize("name,dtype", [("llama_fp32", torch.float32), ("llama_bf16", torch.bfloat16)])
def test_to_hf_equals_torch_dcp_load_and_gives_the_same_logits(fx, run_ckpt, tmp_path, name, dtype):
    from transformers import LlamaForCausalLM
    d = fx / name / "dcp"
    out = tmp_path / "hf"
    run_ckpt("to-hf", d, out)
    got = {}
    for f in sorted(out.glob("*.safetensors")):
        got.update(load_file(f))
    original = llama_model(dtype)
    want = _dcp_load(d, original.state_dict())
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    if dtype != torch.float32:
        return
    ids = torch.tensor(TOKENS)
    with torch.no_grad():
        ref = original(ids).logits
        conv = LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()(ids).logits
    torch.testing.assert_close(conv, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["llama_fp32", "llama_bf16"])
def test_diff_dcp_against_hf_dir_is_identical(fx, run_ckpt, name):
    p = run_ckpt("diff", fx / name / "dcp", fx / name / "hf")
    assert p.returncode == 0


def test_reshard_from_dcp_then_to_hf_is_unchanged(fx, run_ckpt, tmp_path):
    d = fx / "llama_fp32" / "dcp"
    run_ckpt("reshard", d, tmp_path / "native", "--tp", 2, "--pp", 1, "--dp", 1, "--no-verify")
    run_ckpt("diff", tmp_path / "native", fx / "llama_fp32" / "hf")


def test_unrecognized_path_lists_every_kind(run_ckpt, tmp_path):
    (tmp_path / "junk").mkdir()
    p = run_ckpt("inspect", tmp_path / "junk", check=False)
    assert p.returncode != 0
    for kind in ("dcp", "native-store", "hf-dir", "safetensors", "megatron-safetensors"):
        assert kind in p.stderr, p.stderr


def test_verify_reads_every_chunk(fx, run_ckpt):
    rep = json.loads(run_ckpt("verify", "--json", fx / "sharded" / "dcp").stdout)
    md = _torch_metadata(fx / "sharded" / "dcp")
    chunks = sum(len(v.chunks) for v in md.state_dict_metadata.values() if hasattr(v, "chunks"))
    byte_items = sum(1 for v in md.state_dict_metadata.values() if not hasattr(v, "chunks"))
    # Units are the items (one per chunk, then the bytes items), each zip entry CRC-checked.
    assert rep["ok"] is True and rep["format"] == "PyTorch DCP" and rep["scheme"] == "zip CRC-32"
    assert rep["pieces"] == chunks + byte_items, rep


def test_from_hf_accepts_a_dcp_of_hf_names(fx, run_ckpt, tmp_path):
    run_ckpt("from-hf", fx / "llama_bf16" / "dcp", tmp_path / "native", "--no-fsync")
    run_ckpt("diff", tmp_path / "native", fx / "llama_bf16" / "hf")
