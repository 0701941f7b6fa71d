"""`ckpt convert` between the shipped profiles (docs/PROFILES.md), against independent references:
- every ordered pair of shipped profiles on a tiny GQA SwiGLU model made with transformers, each
  conversion combined with a layout change (tp=2 pp=2 -> tp=1 pp=3 uneven 2,1,1): A -> B -> A is
  bit-identical (h5py reads of both stores) where B's dtypes hold A's values; otherwise the
  exactness report's counts and max errors equal a numpy/torch recomputation of the same casts;
- the stored PaddleNLP / PaddleNLP-fused / LiBai tensors equal tests/python/profile_refs.py (a
  numpy script written from those projects' conversion code);
- the HF export of a model that went through every profile gives the logits of the original
  (cast to bf16 at the first bf16 profile) in transformers;
- overflow: 7e4 into an fp16 profile fails naming the tensor and the count, nothing written;
  --saturate succeeds and reports the clamped count;
- bad profiles are refused before any output.
"""
import copy
import itertools
import json
import pathlib

import numpy as np
import pytest
import torch
from native_h5py import read_native  # scripts/: h5py + hashlib only, no ckpt code
from transformers import LlamaConfig, LlamaForCausalLM

import profile_refs

PROFILES = ["reference", "hf", "megatron-mcore", "megatron-legacy", "paddlenlp", "paddlenlp-fused"]
BF16_PROFILES = {"megatron-mcore", "megatron-legacy"}
KEEP_PROFILES = {"hf", "paddlenlp", "paddlenlp-fused"}  # "keep": the source's dtype (issue 36: PaddleNLP saves fp32 too)
IDS = torch.tensor([[1, 5, 9, 33, 77, 96, 2, 64]])


def _model(heads=4, kv=2, head_dim=16, seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=heads,
                      num_key_value_heads=kv, head_dim=head_dim, max_position_embeddings=64, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    return m


def _f32_state(m):
    return {k: v.detach().float().numpy() for k, v in m.state_dict().items() if "rotary" not in k}


def _bf16(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).float().numpy()


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).view(torch.uint16).numpy()


def _stored_dtype_is_bf16(profile, src_bf16):
    return profile in BF16_PROFILES or (profile in KEEP_PROFILES and src_bf16)


def _steps(report):
    return {(s["tensor"], s["step"]): s for s in report["steps"]}


def _expected_cast(vals: dict, to_bf16: bool):
    """{canonical name: (elements, changed, max_abs, max_rel)} of casting fp32 `vals` to bf16."""
    out = {}
    for k, a in vals.items():
        b = _bf16(a).astype(np.float64)
        a = a.astype(np.float64)
        d = np.abs(b - a)
        nz = a != 0
        out[k] = (a.size, int((a != b).sum()), float(d.max()), float((d[nz] / np.abs(a[nz])).max()) if nz.any() else 0.0)
    return out


@pytest.fixture(scope="module")
def stores(run_ckpt, tmp_path_factory):
    """The GQA model imported at tp=2 pp=2 (reference, fp32) and converted to every profile."""
    d = tmp_path_factory.mktemp("profiles")
    m = _model()
    m.save_pretrained(d / "hf_in")
    run_ckpt("from-hf", d / "hf_in", d / "base", "--tp", "2", "--pp", "2", "--dp", "1", "--no-fsync")
    out = {"dir": d, "model": m, "vals": _f32_state(m)}
    for p in PROFILES:
        r = run_ckpt("convert", d / "base", d / p, "--profile", p, "--json")
        out[p] = json.loads(r.stdout)
    return out


def _check_report_against_numpy(report, vals, to_bf16):
    steps = _steps(report)
    if not to_bf16:
        assert report["exact"] and not any(s["changed"] for s in steps.values()), report
        return
    for name, (n, changed, max_abs, max_rel) in _expected_cast(vals, True).items():
        s = steps[(name, "cast F32->BF16")]
        assert (s["elements"], s["changed"], s["clamped"]) == (n, changed, 0), (name, s)
        assert s["max_abs"] == pytest.approx(max_abs, rel=1e-12, abs=0) and s["max_rel"] == pytest.approx(max_rel, rel=1e-12), name


def test_first_conversions_report_the_casts(stores):
    for p in PROFILES:
        _check_report_against_numpy(stores[p]["exactness"], stores["vals"], p in BF16_PROFILES)
        assert stores[p]["profile"] == p


def test_every_ordered_pair_with_a_layout_change(run_ckpt, stores):
    d = stores["dir"]
    bf16_vals = {k: _bf16(v) for k, v in stores["vals"].items()}
    for a, b in itertools.permutations(PROFILES, 2):
        a_bf16 = a in BF16_PROFILES
        ab, aba = d / f"{a}--{b}", d / f"{a}--{b}--{a}"
        r = run_ckpt("convert", d / a, ab, "--profile", b, "--tp", "1", "--pp", "3", "--pp-layers", "2,1,1", "--dp", "1", "--json")
        rep = json.loads(r.stdout)["exactness"]
        man = json.loads((ab / "manifest.json").read_text())
        assert man["profile"] == b and man["layout"]["pp"] == 3 and man["exactness"]["steps"] == rep["steps"], (a, b)
        lossy = not a_bf16 and _stored_dtype_is_bf16(b, a_bf16)
        if lossy:  # only fp32 -> bf16 narrows here
            _check_report_against_numpy(rep, stores["vals"], True)
            continue
        assert rep["exact"], (a, b, rep)
        run_ckpt("convert", ab, aba, "--profile", a, "--tp", "2", "--pp", "2", "--dp", "1")
        _, want, _ = read_native(d / a)
        _, got, _ = read_native(aba)
        assert want.keys() == got.keys(), (a, b)
        for k in want:
            assert want[k].dtype == got[k].dtype and np.array_equal(want[k], got[k]), (a, b, k)
        if _stored_dtype_is_bf16(b, a_bf16) == a_bf16:  # same stored dtype: the canonical views are equal
            run_ckpt("diff", d / a, ab)
    assert bf16_vals  # (used by the reference test)


def test_paddlenlp_tensors_equal_the_numpy_reference(stores):
    d = stores["dir"]
    cfg = stores["model"].config.to_dict()
    vals = stores["vals"]  # fp32: the paddlenlp profiles keep the source's dtype (issue 36)
    for p, fused in (("paddlenlp", False), ("paddlenlp-fused", True)):
        _, got, _ = read_native(d / p)
        want = profile_refs.to_paddlenlp(vals, cfg, fused=fused, tp=2)
        assert set(got) == set(want), (p, set(got) ^ set(want))
        for k, v in want.items():
            assert got[k].dtype == np.float32 and np.array_equal(got[k], v), (p, k)


def test_libai_tensors_equal_the_numpy_reference_and_gqa_is_refused(run_ckpt, stores, tmp_path):
    m = _model(heads=4, kv=4, head_dim=8, seed=1)
    m.save_pretrained(tmp_path / "hf")
    run_ckpt("from-hf", tmp_path / "hf", tmp_path / "base", "--tp", "2", "--pp", "2", "--dp", "1", "--no-fsync")
    run_ckpt("convert", tmp_path / "base", tmp_path / "libai", "--profile", "libai")
    _, got, _ = read_native(tmp_path / "libai")
    want = profile_refs.to_libai(_f32_state(m), m.config.to_dict())
    assert set(got) == set(want)
    for k, v in want.items():
        assert np.array_equal(got[k], v), k
    run_ckpt("convert", tmp_path / "libai", tmp_path / "back", "--profile", "reference", "--tp", "1", "--pp", "3",
             "--pp-layers", "2,1,1", "--dp", "1")
    run_ckpt("diff", tmp_path / "base", tmp_path / "back")
    # The GQA model has no LiBai form: refused before any output.
    r = run_ckpt("convert", stores["dir"] / "reference", tmp_path / "gqa_libai", "--profile", "libai", check=False)
    assert r.returncode != 0 and "libai" in r.stderr.lower(), r.stderr
    assert not (tmp_path / "gqa_libai").exists() and not (tmp_path / "gqa_libai.partial").exists()


def test_hf_export_after_every_profile_gives_the_original_logits(run_ckpt, stores, tmp_path):
    d = stores["dir"]
    prev = d / "reference"
    for i, p in enumerate(["hf", "megatron-mcore", "paddlenlp-fused", "megatron-legacy", "paddlenlp", "hf"]):
        nxt = tmp_path / f"chain{i}-{p}"
        layout = ["--tp", "1", "--pp", "3", "--pp-layers", "2,1,1", "--dp", "1"] if i % 2 else ["--tp", "2", "--pp", "2", "--dp", "1"]
        run_ckpt("convert", prev, nxt, "--profile", p, *layout)
        prev = nxt
    insp = run_ckpt("inspect", prev).stdout
    assert "profile:    hf" in insp, insp
    run_ckpt("to-hf", prev, tmp_path / "out_hf", "--no-fsync")
    got = LlamaForCausalLM.from_pretrained(tmp_path / "out_hf", torch_dtype=torch.float32).eval()
    want = copy.deepcopy(stores["model"])
    with torch.no_grad():
        for p in want.parameters():  # the chain's first bf16 profile rounds once, to nearest even
            p.copy_(p.to(torch.bfloat16).float())
        assert torch.equal(got(IDS).logits, want(IDS).logits)


def _f16_profile(tmp_path, **extra):
    spec = json.loads((pathlib.Path(__file__).resolve().parents[2] / "profiles" / "hf.json").read_text())
    spec["name"] = "hf-fp16"
    spec["dtypes"] = {"weight": "F16", "norm": "F16", "embedding": "F16", "optimizer": "F32"}
    spec.update(extra)
    f = tmp_path / "f16.json"
    f.write_text(json.dumps(spec))
    return f


def test_overflow_fails_unless_saturate(run_ckpt, tmp_path):
    m = _model(seed=2)
    name = "model.layers.1.mlp.down_proj.weight"
    with torch.no_grad():
        m.state_dict()[name][3, 5] = 7e4
        m.state_dict()[name][0, 1] = -1e5
    m.save_pretrained(tmp_path / "hf")
    run_ckpt("from-hf", tmp_path / "hf", tmp_path / "base", "--no-fsync")
    f16 = _f16_profile(tmp_path)
    r = run_ckpt("convert", tmp_path / "base", tmp_path / "out", "--profile-file", f16, check=False)
    assert r.returncode != 0 and name in r.stderr and "2 of" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    r = run_ckpt("convert", tmp_path / "base", tmp_path / "out", "--profile-file", f16, "--saturate", "--json")
    steps = _steps(json.loads(r.stdout)["exactness"])
    s = steps[(name, "cast F32->F16")]
    assert s["clamped"] == 2 and s["max_abs"] == pytest.approx(1e5 - 65504)
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert man["profile"] == "hf-fp16" and man["profile_spec"]["name"] == "hf-fp16"  # readable without the file
    _, got, _ = read_native(tmp_path / "out")
    w = got[name].view(np.float16)
    assert w[3, 5] == np.float16(65504) and w[0, 1] == np.float16(-65504)
    # The store opens from its manifest alone: the canonical view widens back to what fp16 kept.
    run_ckpt("to-hf", tmp_path / "out", tmp_path / "out_hf", "--no-fsync")


@pytest.mark.parametrize("bad", [{"colour": "red"}, {"qkv_packing": "sideways"}, {"names": {"embed": "e"}}])
def test_bad_profiles_are_refused_before_any_output(run_ckpt, stores, tmp_path, bad):
    f = _f16_profile(tmp_path, **bad)
    r = run_ckpt("convert", stores["dir"] / "reference", tmp_path / "out", "--profile-file", f, check=False)
    assert r.returncode != 0 and "Profile" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()
    r = run_ckpt("convert", stores["dir"] / "reference", tmp_path / "out", "--profile", "no-such-stack", check=False)
    assert r.returncode != 0 and "no-such-stack" in r.stderr and not (tmp_path / "out").exists()
