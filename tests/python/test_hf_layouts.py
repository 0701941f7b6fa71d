"""HF interop across layouts, against the real Python stack:
- `ckpt to-hf` from a trained checkpoint resharded to tp=2 pp=3 (uneven 1,2,1) dp=2 zero=1 gives
  the same bytes as from the single-rank checkpoint; every tensor equals the global tensor that
  h5py assembles from the resharded shards; transformers loads it; optimizer state is left out.
- `ckpt from-hf --tp --pp --pp-layers --dp --zero` lays the import out through the reshard
  planner: h5py sees the HF tensors bit for bit in the right boxes, `ckpt diff` finds it equal to
  a plain import, to-hf gives back save_pretrained's bytes and identical logits; the same under
  mpirun -np 2; impossible layouts are refused before anything is written.
- tokenizer files (a real `tokenizers` tokenizer saved by transformers, a binary tokenizer.model,
  generation_config.json) survive from-hf -> reshard -> to-hf byte for byte and load in
  AutoTokenizer.
"""
import json
import os
import pathlib
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from native_h5py import read_native  # scripts/: h5py + hashlib only, no ckpt code
from mpi_ranks import MPIRUN, SKIP_REASON, check_shares, load_traces, run_traced
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _model(seed=0, dtype=torch.bfloat16, layers=4):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    return m.to(dtype)


def _logits(model):
    ids = torch.tensor([[1, 5, 9, 33, 77, 96, 2, 64]])
    with torch.no_grad():
        return model(ids).logits


def _state(d: pathlib.Path):
    out = {}
    for f in sorted(d.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _as_np(t: torch.Tensor):
    if t.dtype in (torch.bfloat16, torch.float16):  # raw bits, as the store and read_native hold them
        return t.view(torch.uint16).numpy()
    return t.numpy()


def _files_bytes(d: pathlib.Path):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_to_hf_from_resharded_trained_checkpoint(run_ckpt, tmp_path):
    run = tmp_path / "run"
    run_ckpt("train", "--config", ROOT / "fixtures" / "tiny_llama.json", "--steps", "2", "--micro-batch", "2", "--seq-len", "16",
             "--out", run, "--sync-save")
    src = run / (run / "latest").read_text().strip()
    resh = tmp_path / "resharded"
    run_ckpt("reshard", src, resh, "--tp", "2", "--pp", "3", "--pp-layers", "1,2,1", "--dp", "2", "--zero", "1")
    man, glob, _ = read_native(resh)
    assert man["layout"]["tp"] == 2 and man["layout"]["zero"] == 1
    assert len({p["file"] for p in man["pieces"]}) >= 6  # spread over many ranks' shard files
    assert any(p["tensor"].startswith("optimizer.") for p in man["pieces"])
    # A 1 MiB buffer budget (64 KiB chunks): the export streams chunks, never a whole-model gather.
    run_ckpt("to-hf", resh, tmp_path / "hf_resh", "--max-shard-size", "100KB", "--max-memory", "1M", "--threads", "2",
             "--no-fsync")
    run_ckpt("to-hf", src, tmp_path / "hf_single", "--max-shard-size", "100KB", "--no-fsync")
    a, b = _files_bytes(tmp_path / "hf_resh"), _files_bytes(tmp_path / "hf_single")
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a), "export depends on the source layout"
    got = _state(tmp_path / "hf_resh")
    model_names = {t for t in glob if not t.startswith("optimizer.")}
    assert set(got) == model_names
    for k, v in got.items():
        assert np.array_equal(_as_np(v), glob[k]), k
    idx = json.loads((tmp_path / "hf_resh" / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) >= 2
    m = LlamaForCausalLM.from_pretrained(tmp_path / "hf_resh").eval()
    sd = m.state_dict()
    for k, v in got.items():
        assert torch.equal(sd[k], v), k


def test_from_hf_with_layout_flags(run_ckpt, tmp_path):
    m = _model(seed=3)
    hf = tmp_path / "hf"
    m.save_pretrained(hf)
    lay = tmp_path / "laid"
    r = run_ckpt("from-hf", hf, lay, "--tp", "2", "--pp", "3", "--pp-layers", "1,2,1", "--dp", "2", "--zero", "1", "--no-fsync")
    assert "tp=2" in r.stdout, r.stdout
    man, glob, _ = read_native(lay)
    lj = man["layout"]
    assert (lj["tp"], lj["pp"], lj["dp"], lj["zero"]) == (2, 3, 2, 1), lj
    ref = load_file(hf / "model.safetensors")
    assert set(glob) == set(ref)
    for k, v in ref.items():
        assert np.array_equal(glob[k], _as_np(v)), k
    # Column-parallel q_proj is split on dim 0 over 2 TP ranks; row-parallel o_proj on dim 1.
    q = [p for p in man["pieces"] if p["tensor"] == "model.layers.0.self_attn.q_proj.weight"]
    assert sorted(p["region"]["offset"][0] for p in q) == [0, 32]
    o = [p for p in man["pieces"] if p["tensor"] == "model.layers.1.self_attn.o_proj.weight"]
    assert sorted(p["region"]["offset"][1] for p in o) == [0, 32]
    # Same global view as a plain import resharded by the engine.
    run_ckpt("from-hf", hf, tmp_path / "plain", "--no-fsync")
    run_ckpt("diff", tmp_path / "plain", lay)
    run_ckpt("reshard", tmp_path / "plain", tmp_path / "eng", "--tp", "2", "--pp", "3", "--pp-layers", "1,2,1", "--dp", "2",
             "--zero", "1")
    man_eng = json.loads((tmp_path / "eng" / "manifest.json").read_text())
    key = lambda p: (p["tensor"], json.dumps(p["region"], sort_keys=True), p["file"], p["digest"])  # noqa: E731
    assert sorted(map(key, man["pieces"])) == sorted(map(key, man_eng["pieces"]))
    # And back to HF: save_pretrained's bytes exactly, identical logits.
    run_ckpt("to-hf", lay, tmp_path / "back", "--no-fsync")
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == (hf / "model.safetensors").read_bytes()
    m2 = LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert torch.equal(_logits(m), _logits(m2))


@pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
def test_from_hf_layout_under_mpirun(ckpt_bin, run_ckpt, tmp_path):
    """Same pieces and bytes as one process, and each rank wrote its own share (per-rank reports)."""
    m = _model(seed=4)
    hf = tmp_path / "hf"
    m.save_pretrained(hf, max_shard_size="40KB")
    args = ["--tp", "2", "--pp", "2", "--dp", "1", "--no-fsync"]
    run_ckpt("from-hf", hf, tmp_path / "one", *args)
    p = run_traced(2, [ckpt_bin, "from-hf", hf, tmp_path / "two", *args], tmp_path / "trace")
    assert p.returncode == 0, p.stderr
    a = json.loads((tmp_path / "one" / "manifest.json").read_text())
    b = json.loads((tmp_path / "two" / "manifest.json").read_text())
    assert a["pieces"] == b["pieces"]
    for f in {p["file"] for p in a["pieces"]}:
        assert (tmp_path / "one" / f).read_bytes() == (tmp_path / "two" / f).read_bytes(), f
    check_shares(tmp_path / "two", load_traces(tmp_path / "trace", 2))


def test_from_hf_refuses_impossible_layouts(run_ckpt, tmp_path):
    m = _model(seed=5, layers=2)
    hf = tmp_path / "hf"
    m.save_pretrained(hf)
    r = run_ckpt("from-hf", hf, tmp_path / "o1", "--tp", "3", "--pp", "1", "--dp", "1", check=False)
    assert r.returncode == 2 and "LayoutRefused" in r.stderr, r.stderr
    r = run_ckpt("from-hf", hf, tmp_path / "o2", "--tp", "1", "--pp", "3", "--dp", "1", check=False)
    assert r.returncode == 2, r.stderr
    r = run_ckpt("from-hf", hf, tmp_path / "o3", "--tp", "2", check=False)
    assert r.returncode == 2 and "--pp" in r.stderr, r.stderr
    r = run_ckpt("from-hf", hf, tmp_path / "o4", "--tp", "1", "--pp", "2", "--pp-layers", "2,1", "--dp", "1", check=False)
    assert r.returncode == 2, r.stderr
    for o in ("o1", "o2", "o3", "o4"):
        assert not (tmp_path / o).exists() and not (tmp_path / (o + ".partial")).exists()


def _save_tokenizer(d: pathlib.Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "hello", "world", "ckpt", "shards", "é"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(d)
    (d / "tokenizer.model").write_bytes(bytes(range(256)) * 3 + b"\x00\xff")  # binary, sentencepiece-like
    return fast


def test_tokenizer_files_survive_import_reshard_export(run_ckpt, tmp_path):
    from transformers import AutoTokenizer
    m = _model(seed=6, dtype=torch.float32)
    hf = tmp_path / "hf"
    m.save_pretrained(hf)
    fast = _save_tokenizer(hf)
    side = {p.name: p.read_bytes() for p in hf.iterdir()
            if p.name.startswith(("tokenizer", "special_tokens", "generation_config"))}
    assert {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"} <= set(side)
    r = run_ckpt("from-hf", hf, tmp_path / "native", "--no-fsync")
    assert f"carried {len(side)}" in r.stdout, r.stdout
    man = json.loads((tmp_path / "native" / "manifest.json").read_text())
    assert set(man["hf_files"]) == set(side)
    shutil.rmtree(hf)  # the export must not need the original directory
    run_ckpt("reshard", tmp_path / "native", tmp_path / "tp2", "--tp", "2", "--pp", "2", "--dp", "1")
    run_ckpt("to-hf", tmp_path / "tp2", tmp_path / "back", "--no-fsync")
    for name, content in side.items():
        assert (tmp_path / "back" / name).read_bytes() == content, name
    tok = AutoTokenizer.from_pretrained(tmp_path / "back")
    text = "hello world ckpt shards é unknown"
    assert tok(text)["input_ids"] == fast(text)["input_ids"]
    assert LlamaForCausalLM.from_pretrained(tmp_path / "back") is not None


def test_tampered_side_file_is_refused(run_ckpt, tmp_path):
    m = _model(seed=7, dtype=torch.float32, layers=1)
    hf = tmp_path / "hf"
    m.save_pretrained(hf)
    (hf / "tokenizer.json").write_text('{"version": "1.0"}')
    run_ckpt("from-hf", hf, tmp_path / "native", "--no-fsync")
    mf = tmp_path / "native" / "manifest.json"
    man = json.loads(mf.read_text())
    import base64
    man["hf_files"]["tokenizer.json"]["base64"] = base64.b64encode(b'{"version": "2.0"}').decode()
    mf.write_text(json.dumps(man))
    # The manifest checksum (v3) finds the edit first ...
    r = run_ckpt("to-hf", tmp_path / "native", tmp_path / "out", check=False)
    assert r.returncode == 1 and "ManifestChecksumMismatch" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    # ... and with the manifest resealed, the side file's own checksum does.
    from native_h5py import reseal
    mf.write_text(json.dumps(reseal(man)))
    r = run_ckpt("to-hf", tmp_path / "native", tmp_path / "out", check=False)
    assert r.returncode == 1 and "HfFilesChecksum" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
