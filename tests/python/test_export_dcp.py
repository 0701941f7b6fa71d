"""`ckpt export-dcp` against torch's own DCP loader: a random LLaMA saved by transformers
(save_pretrained, safetensors) -> `ckpt from-hf` (single rank, and laid out tp=2 pp=2 dp=1) ->
`ckpt export-dcp` -> torch.distributed.checkpoint.load (single process, no process group) into
the transformers model's state_dict: every tensor equal to the original, and the model's logits
equal; straight from the HF directory too, with --dtype bf16 equal to torch's own cast. Non-LLaMA
sources (a plain .safetensors of assorted dtypes) keep their names and dtypes. Every other kind
ckpt opens exports too: Megatron-LM checkpoints written by megatron-core itself (legacy per-rank
torch files and torch_dist; the loaded model's logits equal megatron-core's own forward), ckpt's
own Megatron exports (per-rank safetensors and legacy torch files; every tensor equal to the HF
original) and a DCP written by torch.distributed.checkpoint.save. A failed export (a read-only
destination, a corrupt source, an existing destination) leaves no DST and no DST.partial."""
import json
import os
import pathlib
import stat
import warnings

import sys

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def _config():
    cfg = json.loads((ROOT / "fixtures" / "tiny_llama.json").read_text())
    cfg.update(hidden_size=32, intermediate_size=48, vocab_size=97, head_dim=8, num_hidden_layers=4)
    return LlamaConfig(**cfg)


def _model(seed=0):
    torch.manual_seed(seed)
    m = LlamaForCausalLM(_config()).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    return m


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("hf") / "model"
    _model().save_pretrained(d)
    return d


def _reference(hf: pathlib.Path):
    return load_file(hf / "model.safetensors")


def _dcp_load_into_model(out: pathlib.Path, dtype=torch.float32):
    m = LlamaForCausalLM(_config()).to(dtype).eval()
    sd = m.state_dict()
    with torch.no_grad():
        for v in sd.values():
            v.fill_(float("nan") if v.is_floating_point() else 0)
    dcp.load(sd, checkpoint_id=str(out))
    return m, sd


def _logits(model):
    ids = torch.tensor([[1, 5, 9, 33, 77, 96, 2, 64]])
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("layout,chunks", [([], []), (["--tp", "2", "--pp", "2", "--dp", "1"], []),
                                           (["--tp", "2", "--pp", "2", "--dp", "2"], ["--source-chunks"])])
def test_native_to_dcp_loads_in_torch(run_ckpt, hf_dir, tmp_path, layout, chunks):
    nat, out = tmp_path / "native", tmp_path / "dcp"
    run_ckpt("from-hf", hf_dir, nat, *layout, "--no-fsync")
    p = run_ckpt("export-dcp", nat, out, "--files", "3", "--json", "--max-memory", "1M", *chunks)
    summary = json.loads(p.stdout)
    ref = _reference(hf_dir)
    assert summary["tensors"] == len(ref) and summary["files"] == 3
    md = dcp.FileSystemReader(str(out)).read_metadata()
    n_chunks = sum(len(m.chunks) for m in md.state_dict_metadata.values())
    assert summary["chunks"] == n_chunks
    if chunks:  # tp=2: q/k/v/o, gate/up/down and the embeddings come in two chunks each (replicas once)
        assert len(md.state_dict_metadata["model.layers.0.self_attn.q_proj.weight"].chunks) == 2
        assert len(md.state_dict_metadata["model.norm.weight"].chunks) == 1
        assert n_chunks > len(ref)
    else:
        assert n_chunks == len(ref)
    assert sorted(f.name for f in out.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    m, sd = _dcp_load_into_model(out)
    assert set(sd) == set(ref)
    for k, v in ref.items():
        assert torch.equal(sd[k], v), k
    original = LlamaForCausalLM.from_pretrained(hf_dir).eval()
    assert torch.equal(_logits(m), _logits(original))
    # and back: ckpt reads its own export as a checkpoint (formats/torch/dcp/dcp.h), equal to the source
    p = run_ckpt("diff", "--json", nat, out)
    d = json.loads(p.stdout)
    assert d["equal"] is True and d["counts"]["identical"] == len(ref), p.stdout


def test_hf_dir_to_dcp_with_cast(run_ckpt, hf_dir, tmp_path):
    out = tmp_path / "dcp_bf16"
    run_ckpt("export-dcp", hf_dir, out, "--dtype", "bf16")
    _, sd = _dcp_load_into_model(out, torch.bfloat16)
    md = dcp.FileSystemReader(str(out)).read_metadata()
    for k, v in _reference(hf_dir).items():
        assert md.state_dict_metadata[k].properties.dtype == torch.bfloat16
        assert torch.equal(sd[k], v.to(torch.bfloat16)), k


def test_plain_safetensors_keeps_names_and_dtypes(run_ckpt, tmp_path):
    g = torch.Generator().manual_seed(3)
    tensors = {
        "a.weight": torch.randn(5, 7, generator=g),
        "b.half": torch.randn(3, 2, generator=g).half(),
        "c.ids": torch.randint(-1000, 1000, (11,), generator=g),
        "d.mask": torch.rand(4, 4, generator=g) > 0.5,
        "e.scalar": torch.tensor(3.5, dtype=torch.float64),
    }
    src, out = tmp_path / "x.safetensors", tmp_path / "dcp"
    save_file(tensors, src)
    run_ckpt("export-dcp", src, out)
    sd = {k: torch.zeros_like(v) for k, v in tensors.items()}
    dcp.load(sd, checkpoint_id=str(out))
    for k, v in tensors.items():
        assert sd[k].dtype == v.dtype and torch.equal(sd[k], v), k


def _mcore_hf_config(mf):
    return LlamaConfig(vocab_size=mf.VOCAB, hidden_size=mf.HIDDEN, intermediate_size=mf.FFN, num_hidden_layers=mf.LAYERS,
                       num_attention_heads=mf.HEADS, num_key_value_heads=mf.GROUPS, head_dim=mf.HIDDEN // mf.HEADS,
                       rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=mf.SEQ * 4,
                       tie_word_embeddings=False, attention_bias=False, mlp_bias=False, hidden_act="silu")


@pytest.mark.parametrize("name,kind", [("tp2", "legacy"), ("pp2", "legacy"), ("tp2", "dist"), ("pp2", "dist")])
def test_megatron_core_checkpoint_to_dcp_logits(run_ckpt, tmp_path, name, kind):
    """A checkpoint written by megatron-core (tests/python/mcore_fixtures.py) -> export-dcp -> torch's
    DCP loader into a transformers model: its logits equal megatron-core's own forward."""
    pytest.importorskip("megatron.core")
    import mcore_fixtures as mf
    fx = mf.fixture(name, kind)
    out = tmp_path / "dcp"
    summary = json.loads(run_ckpt("export-dcp", fx, out, "--json", "--files", "2").stdout)
    assert summary["source_check"]["how"] == "process", summary  # zip CRC-32 of the torch files
    m = LlamaForCausalLM(_mcore_hf_config(mf)).eval()
    sd = m.state_dict()
    with torch.no_grad():
        for v in sd.values():
            v.fill_(float("nan"))
    dcp.load(sd, checkpoint_id=str(out))
    assert summary["tensors"] == len(sd) and all(torch.isfinite(v).all() for v in sd.values())
    tokens = torch.from_numpy(np.load(fx / "tokens.npy"))
    with torch.no_grad():
        got = m(tokens).logits.numpy()
    want = np.load(fx / "logits.npy")[..., : mf.VOCAB]
    assert got.shape == want.shape
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-5, rel


@pytest.mark.parametrize("fmt,layout", [("safetensors", ["--tp", "2", "--pp", "2"]), ("torch", ["--tp", "1", "--pp", "2"])])
def test_ckpt_megatron_export_to_dcp(run_ckpt, hf_dir, tmp_path, fmt, layout):
    """ckpt's own Megatron exports (vocabulary padded to 128, QKV packed per group, split over tp
    and pp) read back and exported as a DCP: every tensor equal to the HF original."""
    nat, meg, out = tmp_path / "native", tmp_path / "megatron", tmp_path / "dcp"
    run_ckpt("from-hf", hf_dir, nat, "--no-fsync")
    run_ckpt("export-megatron", nat, meg, "--format", fmt, *layout)
    p = run_ckpt("export-dcp", meg, out, "--source-chunks")
    assert p.stdout.startswith("wrote %d tensors" % len(_reference(hf_dir))), p.stdout
    _, sd = _dcp_load_into_model(out)
    ref = _reference(hf_dir)
    assert set(sd) == set(ref)
    for k, v in ref.items():
        assert torch.equal(sd[k], v), k


def test_torch_written_dcp_to_dcp(run_ckpt, tmp_path):
    """A DCP saved by torch.distributed.checkpoint.save (bf16 and fp32 tensors) -> export-dcp in two
    files with a cast to fp16 -> torch's loader: every tensor equal to torch's own cast."""
    m = _model(seed=4)
    state = {k: (v.to(torch.bfloat16) if "mlp" in k else v.clone()) for k, v in m.state_dict().items()}
    src, out = tmp_path / "torch_dcp", tmp_path / "dcp"
    dcp.save(state, checkpoint_id=str(src))
    run_ckpt("export-dcp", src, out, "--files", "2", "--dtype", "fp16")
    sd = {k: torch.zeros_like(v, dtype=torch.float16) for k, v in state.items()}
    dcp.load(sd, checkpoint_id=str(out))
    md = dcp.FileSystemReader(str(out)).read_metadata()
    for k, v in state.items():
        assert md.state_dict_metadata[k].properties.dtype == torch.float16, k
        assert torch.equal(sd[k], v.to(torch.float16)), k


def _nothing_at(out: pathlib.Path):
    return not out.exists() and not pathlib.Path(str(out) + ".partial").exists()


def test_failed_exports_leave_nothing(run_ckpt, hf_dir, tmp_path):
    # A corrupt source: a truncated safetensors file.
    bad = tmp_path / "bad.safetensors"
    data = (hf_dir / "model.safetensors").read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out1"
    p = run_ckpt("export-dcp", bad, out, check=False)
    assert p.returncode == 3 and _nothing_at(out), p.stderr
    # A destination that cannot be written: a read-only directory (root ignores its mode: then a
    # destination whose parent is a regular file).
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        dst = ro / "out"
        if os.access(ro, os.W_OK):
            (tmp_path / "plainfile").write_text("x")
            dst = tmp_path / "plainfile" / "out"
        p = run_ckpt("export-dcp", hf_dir, dst, check=False)
        assert p.returncode in (2, 4) and "ckpt:" in p.stderr and _nothing_at(dst), p.stderr
    finally:
        ro.chmod(stat.S_IRWXU)
    # An existing non-empty destination is refused and kept as it was.
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep").write_text("x")
    p = run_ckpt("export-dcp", hf_dir, existing, check=False)
    assert p.returncode == 2 and (existing / "keep").read_text() == "x", p.stderr
    assert not pathlib.Path(str(existing) + ".partial").exists()


@pytest.mark.parametrize("io", ["auto", "direct"])
def test_large_files_through_the_write_pool(run_ckpt, tmp_path, io):
    """Files of >= 32 MiB are written direct in the write pool's 16 MiB requests, several in flight
    (formats/io/write_pool.h; --json "io" says how many went, and under auto what its probes
    measured): torch's DCP loader reads every tensor equal to the source, and `ckpt to-hf` of the
    same source through the same engine loads in safetensors equal too."""
    rng = np.random.default_rng(34)
    ref = {f"w{k}": torch.from_numpy(rng.standard_normal((1024, 2048 + 64 * k), dtype=np.float32)) for k in range(6)}
    ref["odd"] = torch.from_numpy(rng.standard_normal(12345, dtype=np.float32))  # not a multiple of 4 KiB
    src = tmp_path / "src.safetensors"
    save_file(ref, str(src))
    out = tmp_path / "dcp"
    s = json.loads(run_ckpt("export-dcp", src, out, "--files", "2", "--io", io, "--json").stdout)
    assert s["io"]["mode"] == io and s["io"]["writes"] in ("direct", "buffered", "probing"), s["io"]
    assert s["io"]["requests"] >= 2 and s["memory"]["write_pool"] > 0, s
    md = dcp.FileSystemReader(str(out)).read_metadata()
    sd = {k: torch.full(v.shape, float("nan")) for k, v in ref.items()}
    assert set(md.state_dict_metadata) == set(sd)
    dcp.load(sd, checkpoint_id=str(out))
    for k, v in ref.items():
        assert torch.equal(sd[k], v), k
    hf = tmp_path / "hf"
    s = json.loads(run_ckpt("to-hf", src, hf, "--io", io, "--json").stdout)
    assert s["io"]["requests"] >= 2 and s["memory"]["write_pool"] > 0, s
    got = load_file(hf / "model.safetensors")
    assert set(got) == set(ref) and all(torch.equal(got[k], v) for k, v in ref.items())
