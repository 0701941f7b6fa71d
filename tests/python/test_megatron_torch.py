"""Megatron-LM's LEGACY per-rank torch checkpoints (iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt).

Import: real megatron-core 0.16.1 checkpoints (mcore_fixtures.py: GPTModel with the local spec,
GQA 8 heads / 2 groups, SwiGLU, RMSNorm, rope, vocab 300 padded; tp=1, tp=2, pp=2 split 2+4) go
through `ckpt to-hf`; transformers' LlamaForCausalLM on the result must give megatron-core's own
forward logits (fixture logits.npy) within 1e-5 relative. The older-names fixtures are renames of
real models' state dicts (mcore_legacy_names.legacy_nested: the names and nesting Megatron-LM's legacy
models saved, with both norm namings).

Export: a transformers LLaMA of the same shape -> `ckpt from-hf` -> `ckpt export-megatron --format
torch`; every file loads with torch.load(weights_only=True) (argparse.Namespace allowed, as
Megatron-LM registers it), every tensor equals an independent torch repacking of the HF tensors,
and megatron-core's GPTModel of that layout takes the files with load_state_dict(strict=True)
(tensors equal) and its forward gives the HF model's logits. Round trip: export -> import ->
`ckpt diff` against the native store: identical.
"""
import argparse
import json
import pathlib
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("megatron.core")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import mcore_fixtures as mf  # noqa: E402

V, H, K, HD, HID, FFN, L = mf.VOCAB, mf.HEADS, mf.GROUPS, mf.HIDDEN // mf.HEADS, mf.HIDDEN, mf.FFN, mf.LAYERS
LAYOUTS = {"tp1": (1, 1), "tp2": (2, 1), "pp2": (1, 2)}


def hf_config():
    return transformers.LlamaConfig(
        vocab_size=V, hidden_size=HID, intermediate_size=FFN, num_hidden_layers=L, num_attention_heads=H,
        num_key_value_heads=K, head_dim=HD, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        max_position_embeddings=mf.SEQ * 4, attention_bias=False, mlp_bias=False)


def hf_logits(model_dir, tokens):
    m = transformers.LlamaForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.from_numpy(tokens)).logits.numpy()


def rel_err(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.mark.parametrize("name", ["tp1", "tp2", "pp2", "tp1_legacy_names", "pp2_legacy_layernorm_names"])
def test_import_matches_megatron_core_logits(name, run_ckpt, tmp_path):
    fx = mf.fixture(name)
    run_ckpt("to-hf", fx, tmp_path / "hf")
    tokens = np.load(fx / "tokens.npy")
    ref = np.load(fx / "logits.npy")[:, :, :V]  # megatron-core's forward over the padded vocab
    got = hf_logits(tmp_path / "hf", tokens)
    assert got.shape == ref.shape
    assert rel_err(got, ref) < 1e-5


def test_inspect_shows_layout_and_config(run_ckpt):
    fx = mf.fixture("pp2")
    info = json.loads(run_ckpt("inspect", "--json", fx).stdout)
    lay = info["layout"]
    assert (lay["tp"], lay["pp"], lay["layers_per_stage"]) == (1, 2, [mf.FIRST_STAGE_LAYERS, L - mf.FIRST_STAGE_LAYERS])
    assert lay["vocab_divisor"] == mf.DIVISOR
    cfg = info["model_config"]
    assert (cfg["vocab_size"], cfg["num_key_value_heads"], cfg["num_hidden_layers"]) == (V, K, L)
    assert (cfg["intermediate_size"], cfg["hidden_size"], cfg["tie_word_embeddings"]) == (FFN, HID, False)
    assert "megatron" in info["metadata_keys"]


def test_bf16_fixture_imports(run_ckpt, tmp_path):
    fx = mf.fixture("tp1_bf16")
    run_ckpt("to-hf", fx, tmp_path / "hf")
    from safetensors.torch import load_file
    got = {}
    for f in (tmp_path / "hf").glob("*.safetensors"):
        got.update(load_file(str(f)))
    ck = torch.load(fx / "iter_0000010/mp_rank_00/model_optim_rng.pt", weights_only=False)
    emb = ck["model"]["embedding.word_embeddings.weight"]
    assert emb.dtype == torch.bfloat16
    assert torch.equal(got["model.embed_tokens.weight"].to(torch.bfloat16), emb[:V])


# ---- export ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def native(tmp_path_factory, ckpt_bin):
    """A random transformers LLaMA of the fixtures' shape, saved as HF and imported as a native store."""
    import subprocess
    d = tmp_path_factory.mktemp("native")
    torch.manual_seed(5)
    m = transformers.LlamaForCausalLM(hf_config())
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    m.save_pretrained(str(d / "hf"), safe_serialization=True)
    subprocess.run([ckpt_bin, "from-hf", str(d / "hf"), str(d / "store")], check=True, capture_output=True)
    sd = {k: v.detach().clone() for k, v in m.state_dict().items()}
    return d, sd


def expected_rank(sd, tp, pp, tp_rank, pp_rank, per_stage):
    """The mcore tensors of a rank, repacked from the HF tensors with torch (independent of ckpt)."""
    out = {}
    pv = mf.padded_vocab(tp)
    rows = pv // tp

    def vocab(t):
        full = torch.zeros(pv, HID, dtype=t.dtype)
        full[:V] = t
        return full[tp_rank * rows:(tp_rank + 1) * rows]

    if pp_rank == 0:
        out["embedding.word_embeddings.weight"] = vocab(sd["model.embed_tokens.weight"])
    first = sum(per_stage[:pp_rank])
    g = K // tp
    ip = FFN // tp
    for local in range(per_stage[pp_rank]):
        q, p = f"model.layers.{first + local}.", f"decoder.layers.{local}."
        qw = sd[q + "self_attn.q_proj.weight"].view(K, H // K * HD, HID)
        kw = sd[q + "self_attn.k_proj.weight"].view(K, HD, HID)
        vw = sd[q + "self_attn.v_proj.weight"].view(K, HD, HID)
        qkv = torch.cat([qw, kw, vw], dim=1)[tp_rank * g:(tp_rank + 1) * g]
        out[p + "self_attention.linear_qkv.weight"] = qkv.reshape(-1, HID)
        out[p + "self_attention.linear_proj.weight"] = sd[q + "self_attn.o_proj.weight"].chunk(tp, dim=1)[tp_rank]
        out[p + "input_layernorm.weight"] = sd[q + "input_layernorm.weight"]
        out[p + "pre_mlp_layernorm.weight"] = sd[q + "post_attention_layernorm.weight"]
        out[p + "mlp.linear_fc1.weight"] = torch.cat(
            [sd[q + "mlp.gate_proj.weight"][tp_rank * ip:(tp_rank + 1) * ip],
             sd[q + "mlp.up_proj.weight"][tp_rank * ip:(tp_rank + 1) * ip]])
        out[p + "mlp.linear_fc2.weight"] = sd[q + "mlp.down_proj.weight"].chunk(tp, dim=1)[tp_rank]
    if pp_rank == pp - 1:
        out["decoder.final_layernorm.weight"] = sd["model.norm.weight"]
        out["output_layer.weight"] = vocab(sd["lm_head.weight"])
    return out


def export(run_ckpt, store, dst, tp, pp, fmt="torch"):
    args = ["export-megatron", store, dst, "--format", fmt, "--tp", tp, "--pp", pp]
    if fmt == "torch":
        args += ["--local-norms", "--iteration", 10]
    if fmt == "torch_dist":  # loaded by the venv's megatron-core 0.16.1: common.pt (0.19 writes common_state)
        args += ["--megatron-version", "0.16"]
    if pp > 1:
        args += ["--pp-layers", f"{mf.FIRST_STAGE_LAYERS},{L - mf.FIRST_STAGE_LAYERS}"]
    run_ckpt(*args)


@pytest.mark.parametrize("name", ["tp1", "tp2", "pp2"])
def test_export_torch_loads_and_equals(name, native, run_ckpt, tmp_path):
    d, sd = native
    tp, pp = LAYOUTS[name]
    out = tmp_path / "mg"
    export(run_ckpt, d / "store", out, tp, pp)
    assert (out / "latest_checkpointed_iteration.txt").read_text().strip() == "10"
    per_stage = [mf.FIRST_STAGE_LAYERS, L - mf.FIRST_STAGE_LAYERS] if pp > 1 else [L]
    torch.serialization.add_safe_globals([argparse.Namespace])
    for p in range(pp):
        for r in range(tp):
            f = mf._rank_file(out, r, p, pp)
            ck = torch.load(f, weights_only=True)
            assert ck["checkpoint_version"] == 3.0 and ck["iteration"] == 10
            a = ck["args"]
            assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (tp, pp)
            assert (a.num_layers, a.hidden_size, a.num_query_groups, a.padded_vocab_size) == (L, HID, K, mf.padded_vocab(tp))
            assert a.params_dtype == torch.float32
            want = expected_rank(sd, tp, pp, r, p, per_stage)
            got = {k: v for k, v in ck["model"].items() if torch.is_tensor(v)}
            assert sorted(got) == sorted(want), f"{f}: {sorted(set(got) ^ set(want))}"
            for k, v in want.items():
                assert torch.equal(got[k], v), f"{f}: {k}"


def test_exports_load_in_megatron_core(native, run_ckpt, tmp_path):
    """tp=2 and pp=2 (uneven) exports in both formats, all loaded in one torchrun of megatron-core:
    --format torch with load_state_dict(strict=True) (tensors equal inside) and the forward logits
    equal to the HF model's; --format torch_dist with dist_checkpointing.load, every rank's
    model.state_dict() equal to the independent torch repacking (expected_rank)."""
    d, sd = native
    tokens = np.random.default_rng(0).integers(0, V, size=(mf.BATCH, mf.SEQ)).astype(np.int64)
    ref = hf_logits(d / "hf", tokens)
    legacy_jobs, dist_jobs = [], []
    for name in ("tp2", "pp2"):
        tp, pp = LAYOUTS[name]
        out = tmp_path / name
        out.mkdir()
        export(run_ckpt, d / "store", out / "mg", tp, pp)
        np.save(out / "tokens.npy", tokens)
        legacy_jobs.append((out / "mg", out, tp, pp))
        export(run_ckpt, d / "store", out / "dist", tp, pp, fmt="torch_dist")
        dist_jobs.append((out / "dist", out / "dump", tp, pp))
    for (run_dir, _, _, _), got in zip(legacy_jobs, mf.run_load(legacy_jobs, dist_jobs)):
        assert rel_err(got[:, :, :V], ref) < 1e-5, run_dir
    for _, dump, tp, pp in dist_jobs:
        per_stage = [mf.FIRST_STAGE_LAYERS, L - mf.FIRST_STAGE_LAYERS] if pp > 1 else [L]
        for p in range(pp):
            for r in range(tp):
                rank = f"mp_rank_{r:02d}" + (f"_{p:03d}" if pp > 1 else "")
                got = np.load(dump / f"{rank}.npz")
                want = expected_rank(sd, tp, pp, r, p, per_stage)
                assert set(got.files) == set(want), (dump, rank, sorted(set(got.files) ^ set(want)))
                for k, v in want.items():
                    np.testing.assert_array_equal(got[k], v.float().numpy(), err_msg=f"{dump} {rank} {k}")


@pytest.mark.parametrize("name", ["tp2", "pp2"])
def test_round_trip_diff_identical(name, native, run_ckpt, tmp_path):
    d, _ = native
    tp, pp = LAYOUTS[name]
    export(run_ckpt, d / "store", tmp_path / "mg", tp, pp)
    p = run_ckpt("diff", d / "store", tmp_path / "mg", "--json", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    assert rep.get("identical", rep.get("equal")) is True, rep


# ---- bad input -------------------------------------------------------------------------------

def copy_fixture(name, dst):
    shutil.copytree(mf.fixture(name), dst)
    return dst


def resave(f, edit):
    ck = torch.load(f, weights_only=False)
    edit(ck)
    torch.save(ck, f)


def test_bad_args_missing_key(run_ckpt, tmp_path):
    d = copy_fixture("tp1", tmp_path / "c")
    f = d / "iter_0000010/mp_rank_00/model_optim_rng.pt"
    resave(f, lambda ck: delattr(ck["args"], "num_query_groups"))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0
    assert "num_query_groups" in p.stderr and "model_optim_rng.pt" in p.stderr, p.stderr


def test_bad_args_wrong_type(run_ckpt, tmp_path):
    d = copy_fixture("tp1", tmp_path / "c")
    f = d / "iter_0000010/mp_rank_00/model_optim_rng.pt"
    resave(f, lambda ck: setattr(ck["args"], "hidden_size", "64"))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0
    assert "hidden_size" in p.stderr and "integer" in p.stderr, p.stderr


def test_rank_file_missing(run_ckpt, tmp_path):
    d = copy_fixture("tp2", tmp_path / "c")
    (d / "iter_0000010/mp_rank_01/model_optim_rng.pt").unlink()
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0
    assert "mp_rank_01/model_optim_rng.pt" in p.stderr and "missing" in p.stderr, p.stderr


def test_tensor_wrong_shape(run_ckpt, tmp_path):
    d = copy_fixture("tp2", tmp_path / "c")
    f = d / "iter_0000010/mp_rank_01/model_optim_rng.pt"
    name = "decoder.layers.3.mlp.linear_fc2.weight"
    resave(f, lambda ck: ck["model"].__setitem__(name, ck["model"][name][:, :-1].clone()))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0
    assert name in p.stderr and "mp_rank_01" in p.stderr and "shape" in p.stderr, p.stderr


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os
        return (os.system, (f"touch {self.marker}",))


def test_pickled_code_is_never_run(run_ckpt, tmp_path):
    d = copy_fixture("tp1", tmp_path / "c")
    marker = tmp_path / "pwned"
    resave(d / "iter_0000010/mp_rank_00/model_optim_rng.pt", lambda ck: ck.__setitem__("rng_state", _Payload(marker)))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0
    assert "ForbiddenGlobal" in p.stderr and "system" in p.stderr, p.stderr
    assert not marker.exists()


def test_reshard_straight_from_legacy_dir(run_ckpt, tmp_path):
    fx = mf.fixture("pp2")
    run_ckpt("reshard", fx, tmp_path / "native", "--tp", 2, "--pp", 1, "--dp", 1)
    run_ckpt("to-hf", fx, tmp_path / "hf")
    p = run_ckpt("diff", tmp_path / "native", tmp_path / "hf", "--json", check=False)
    assert p.returncode == 0 and json.loads(p.stdout)["equal"] is True, p.stdout + p.stderr


@pytest.mark.parametrize("fmt", ["torch", "torch_dist"])
def test_large_export_through_the_write_pool(fmt, run_ckpt, tmp_path):
    """A model whose rank files pass 32 MiB: the torch / torch_dist files are written direct in the
    write pool's 16 MiB requests, several in flight (--json "io"); the export imports back equal to
    its source, and the legacy file loads in torch with weights_only."""
    cfg = transformers.LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4, head_dim=64, tie_word_embeddings=False)
    torch.manual_seed(3)
    model = transformers.LlamaForCausalLM(cfg)
    model.save_pretrained(tmp_path / "hf")
    run_ckpt("from-hf", tmp_path / "hf", tmp_path / "store", "--no-fsync")
    out = tmp_path / "mg"
    extra = ["--local-norms"] if fmt == "torch" else []
    r = json.loads(run_ckpt("export-megatron", tmp_path / "store", out, "--format", fmt, *extra, "--json").stdout)
    assert r["io"]["requests"] >= 2 and r["io"]["in_flight"] >= 2, r["io"]
    d = json.loads(run_ckpt("diff", "--json", tmp_path / "store", out).stdout)
    assert d["equal"] is True, d
    if fmt == "torch":
        torch.serialization.add_safe_globals([argparse.Namespace])
        ck = torch.load(out / "iter_0000000" / "mp_rank_00" / "model_optim_rng.pt", weights_only=True)
        assert torch.equal(ck["model"]["embedding.word_embeddings.weight"][:8192], model.model.embed_tokens.weight.detach())
