"""`ckpt train` with profiles (docs/TRAINER.md "Profiles"): a cluster file's device type names its stack's profile;
`train --resume` from a checkpoint in another profile converts on the way in (through the
canonical view, in the same pass as the layout change), and the run saves in the cluster's profile
with the trainer's F32 dtypes (docs/TRAINER.md "Profiles").

Runs (the 6-layer model of trainer_runs.py, 12 sequences of 8 tokens per step):
- A: a mix of two device types naming different profiles (paddlenlp, megatron-mcore), pp=2 on 2
  ranks, steps 1-8, checkpoints at 3, 6, 8: canonical ("reference"), as the rule for a mix says.
- A's step 3 converted with `ckpt convert` to megatron-mcore in fp32 (a --profile-file) and in its
  own bf16, both at tp=2 (packed QKV, fused gate/up per TP rank, vocabulary padded to 256).
- R0 (the run without the conversion): A's canonical step 3 resumed on tp=2 with a cluster whose
  device type names megatron-mcore, to step 6; it saves megatron-mcore with F32 dtypes
  ("megatron-mcore.fp32", h5py sees Megatron's names). Oracle for its losses: A's (the layout
  changed, so within trainer_runs.LOSS_RTOL).
- R1: the fp32 conversion resumed the same way: losses bit-identical to R0's, and its step-6
  checkpoint bit-identical to R0's (h5py) - the profile change happened exactly on the way in.
- R2: the bf16 conversion resumed the same way: the step-4 loss differs from R0's by at most
  sum |g| |w - bf16(w)|, and by the first-order prediction g . (bf16(w) - w) within 5%, both
  computed here with numpy/torch from R0's step-4 gradients (--dump-grads) and A's step-3 weights
  (h5py); later steps within 4x that bound.
- R3: R0's profile checkpoint resumed by one process without a cluster to step 8: A's losses.
- P: a layout whose stages name device types that both name paddlenlp: saved as paddlenlp (F32)
  under the layout's symmetric form; h5py: the weights are the transpose of A's; resumes in one
  process with A's losses.
- Overflow: a conversion to fp16 without --saturate stops at the first chunk that overflows.
- Errors before anything runs: an unknown profile name (ProfileUnknown naming the device type), a
  profile that is not a name (BadCluster), a saving profile on an asymmetric layout (Unsupported).
"""
import json
import pathlib
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON  # noqa: E402
from native_h5py import read_native  # noqa: E402  (scripts/: h5py + hashlib only)
from trainer_runs import (COMMON, CONFIG, assert_losses_close, ckpt, ckpt_path, launch, log,  # noqa: E402
                          run, step_dir)
from llama_shapes import hf_llama_shapes  # noqa: E402

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
ROOT = pathlib.Path(__file__).resolve().parents[2]
MID, END, LAST = 3, 6, 8
TYPE = {"memory": "24GiB", "peak_flops": 1e14, "link_bandwidth": "100GB/s"}
PP2 = ["--pp", 2, "--pp-layers", "3,3", "--micro-batch", 6, "--grad-accum", 2]
TP2 = ["--tp", 2, "--micro-batch", 12]


def cluster(path, types, ranks):
    """A cluster file: types {name: profile or None}, ranks [(type, count)]."""
    j = {"device_types": [dict(name=n, **TYPE, **({"profile": p} if p is not None else {})) for n, p in types.items()],
         "ranks": [{"type": t, "count": c} for t, c in ranks]}
    path.write_text(json.dumps(j))
    return path


def train(root, flags, *args, check=True):
    return run(launch(2, [ckpt_path(), "train", "--config", root / "config.json", *COMMON, *flags, *args]),
               check=check)


def bf16(x):
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16).float().numpy()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("train_profile")
    (d / "config.json").write_text(json.dumps(CONFIG))
    mix = cluster(d / "mix.json", {"a": "paddlenlp", "b": "megatron-mcore"}, [("a", 1), ("b", 1)])
    mcore = cluster(d / "mcore.json", {"b": "megatron-mcore"}, [("b", 2)])
    out = {"dir": d, "mcore": mcore}
    out["A"] = train(d, PP2, "--cluster", mix, "--out", d / "A", "--steps", LAST, "--save-every", MID)
    spec = json.loads((ROOT / "profiles" / "megatron-mcore.json").read_text())
    spec = dict(spec, name="megatron-mcore-f32", dtypes={k: "F32" for k in spec["dtypes"]})
    (d / "mcore_f32.json").write_text(json.dumps(spec))
    src = d / "A" / step_dir(MID)
    layout = ["--tp", 2, "--pp", 1, "--dp", 1]
    ckpt("convert", src, d / "conv_f32", "--profile-file", d / "mcore_f32.json", *layout)
    ckpt("convert", src, d / "conv_bf16", "--profile", "megatron-mcore", *layout)
    for name, frm in (("R0", src), ("R1", d / "conv_f32"), ("R2", d / "conv_bf16")):
        out[name] = train(d, TP2, "--cluster", mcore, "--out", d / name, "--steps", END, "--resume", frm,
                          "--dump-grads", d / f"grads_{name}")
    out["R3"] = run([ckpt_path(), "train", "--config", d / "config.json", *COMMON, "--micro-batch", 12,
                     "--out", d / "R3", "--steps", LAST, "--resume", d / "R0"])
    return out


def test_a_mix_naming_different_profiles_saves_canonical(runs):
    assert "checkpoints: canonical (profile 'reference'): the ranks' device types name different profiles " \
           "(megatron-mcore, paddlenlp)" in runs["A"].stdout
    man = json.loads((runs["dir"] / "A" / step_dir(MID) / "manifest.json").read_text())
    assert man["profile"] == "reference"
    assert {t["dtype"] for t in man["tensors"]} == {"F32"}


def test_resume_saves_in_the_cluster_profile_with_f32_dtypes(runs):
    d = runs["dir"]
    assert "checkpoints: profile 'megatron-mcore.fp32' (the cluster's 'megatron-mcore', dtypes raised to F32)" \
           in runs["R0"].stdout
    assert_losses_close(log(d / "A"), log(d / "R0"), range(MID + 1, END + 1))
    ck = d / "R0" / step_dir(END)
    assert (d / "R0" / "latest").read_text().strip() == step_dir(END)
    assert not list((d / "R0").glob("*.canonical*")), "the staged canonical checkpoint is removed"
    man, vals, _ = read_native(ck)
    md = man
    assert md["profile"] == "megatron-mcore.fp32" and md["profile_spec"]["dtypes"] == {
        "weight": "F32", "norm": "F32", "embedding": "F32", "optimizer": "F32"}
    assert md["trainer"]["step"] == END
    # Megatron's names and shapes at tp=2: packed qkv, fused [gate_r; up_r], vocab padded to 128 x tp.
    h, f, v = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    assert vals["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (3 * h, h)
    assert vals["decoder.layers.5.mlp.linear_fc1.weight"].shape == (2 * f, h)
    assert vals["embedding.word_embeddings.weight"].shape == (256 * 2, h)
    assert vals["optimizer.exp_avg_sq.output_layer.weight"].shape == (512, h)
    assert all(a.dtype == np.float32 for a in vals.values())
    assert not vals["embedding.word_embeddings.weight"][v:].any(), "padding rows are zeros"
    # The same run's canonical step 6 (A, other layout) holds the same values (ckpt diff reads
    # the profile store through its canonical view).
    p = ckpt("diff", "--json", "--rtol", 1e-5, "--atol", 5e-6, ck, d / "A" / step_dir(END), check=False)
    assert json.loads(p.stdout)["equal"], p.stdout[-2000:]


def test_fp32_profile_resume_is_bit_identical_to_the_unconverted_resume(runs):
    d = runs["dir"]
    l0, l1 = log(d / "R0"), log(d / "R1")
    assert [r["loss"] for r in l1] == [r["loss"] for r in l0] and len(l0) == END - MID
    m0, v0, _ = read_native(d / "R0" / step_dir(END))
    m1, v1, _ = read_native(d / "R1" / step_dir(END))
    assert sorted(v0) == sorted(v1)
    for k in v0:
        np.testing.assert_array_equal(v0[k].view(np.uint32), v1[k].view(np.uint32), err_msg=k)


def test_bf16_profile_resume_is_within_the_cast_error(runs):
    d = runs["dir"]
    _, w, _ = read_native(d / "A" / step_dir(MID), skip=lambda n: n.startswith("optimizer."))
    _, g, _ = read_native(d / "grads_R0")
    assert sorted(g) == sorted(w)
    dw = {k: (bf16(w[k]) - w[k]).astype(np.float64) for k in w}
    bound = sum(float(np.abs(g[k].astype(np.float64) * dw[k]).sum()) for k in w)  # sum |g| |dw|
    linear = sum(float((g[k].astype(np.float64) * dw[k]).sum()) for k in w)      # g . dw
    l0, l2 = log(d / "R0")[0]["loss"], log(d / "R2")[0]["loss"]
    assert l2 != l0, "the bf16 weights must change the loss"
    assert abs(l2 - l0) <= bound + 1e-6 * abs(l0), (l0, l2, bound)
    # The first-order prediction holds to a few percent (measured: 0.05%): the change is the cast's.
    assert abs((l2 - l0) - linear) <= 0.05 * abs(linear) + 1e-6 * abs(l0), (l2 - l0, linear)
    # Later steps stay within the same order (fp32 moments are exact; weights moved by ~2^-9 relative).
    for a, b in zip(log(d / "R0")[1:], log(d / "R2")[1:]):
        assert abs(a["loss"] - b["loss"]) <= 4 * bound + 1e-6 * abs(a["loss"]), (a, b, bound)


def test_the_run_resumes_from_its_own_profile_checkpoint(runs):
    d = runs["dir"]
    assert_losses_close(log(d / "A"), log(d / "R3"), range(END + 1, LAST + 1))
    man = json.loads((d / "R3" / step_dir(LAST) / "manifest.json").read_text())
    assert man["profile"] == "reference", "no cluster: canonical checkpoints"


@pytest.mark.parametrize("bad,code,words", [
    ({"profile": "no-such-stack"}, "ProfileUnknown", ["device type 'b'", "no-such-stack", "megatron-mcore"]),
    ({"profile": 5}, "BadCluster", ["key 'profile'"]),
    ({"profile": "Megatron Core"}, "BadCluster", ["key 'profile'"]),
])
def test_bad_cluster_profiles_are_refused_before_anything_runs(runs, bad, code, words):
    d = runs["dir"]
    j = json.loads(runs["mcore"].read_text())
    j["device_types"][0].update(bad)
    path = d / f"bad_{code}_{len(words)}.json"
    path.write_text(json.dumps(j))
    out = d / f"bad_out_{code}_{len(words)}"
    p = train(d, TP2, "--cluster", path, "--out", out, "--steps", 1, check=False)
    assert p.returncode != 0 and code in p.stderr, p.stderr[-2000:]
    for w in words:
        assert w in p.stderr, (w, p.stderr[-2000:])
    assert not out.exists(), "nothing is written"


def test_saving_profile_on_an_asymmetric_layout_is_refused(runs):
    d = runs["dir"]
    lay = d / "asym.json"
    # Two pipelines with different stage splits: no profile store holds that layout.
    lay.write_text(json.dumps({"pipelines": [{"micro_batch": 6, "stages": [{"layers": 6, "tp": 1}]},
                                             {"micro_batch": 3, "stages": [{"layers": 2, "tp": 1}, {"layers": 4, "tp": 1}]}],
                               "zero": 0}))
    cl = cluster(d / "asym_cluster.json", {"b": "megatron-mcore"}, [("b", 3)])
    p = run(launch(3, [ckpt_path(), "train", "--config", d / "config.json", *COMMON, "--layout", lay,
                       "--grad-accum", 4, "--cluster", cl, "--out", d / "asym_out", "--steps", 1]), check=False)
    assert p.returncode != 0 and "symmetric" in p.stderr and "megatron-mcore" in p.stderr, p.stderr[-2000:]
    assert not (d / "asym_out").exists()


def test_overflow_stops_at_the_first_overflowing_chunk(tmp_path):
    """Without --saturate a conversion stops at the first read that overflows: one
    tensor and its count are named, nothing is written; --saturate converts and reports both."""
    from safetensors.numpy import save_file
    cfg = dict(CONFIG, num_hidden_layers=2)
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    rng = np.random.default_rng(0)
    shapes = hf_llama_shapes(h, f, v, 2)
    t = {k: rng.normal(0, 0.02, s).astype(np.float32) for k, s in shapes.items()}
    big = ["model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"]
    t[big[0]][1, 2] = 7e4
    t[big[1]][0, 0] = -1e5
    (tmp_path / "hf").mkdir()
    save_file(t, str(tmp_path / "hf" / "model.safetensors"))
    (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
    ckpt("from-hf", tmp_path / "hf", tmp_path / "base", "--no-fsync")
    spec = json.loads((ROOT / "profiles" / "hf.json").read_text())
    spec.update(name="hf-fp16", dtypes={"weight": "F16", "norm": "F16", "embedding": "F16", "optimizer": "F32"})
    (tmp_path / "f16.json").write_text(json.dumps(spec))
    out = tmp_path / "out"
    p = ckpt("convert", tmp_path / "base", out, "--profile-file", tmp_path / "f16.json", "--threads", 1, check=False)
    named = [b for b in big if b in p.stderr]
    assert p.returncode != 0 and "CastOverflow" in p.stderr and len(named) == 1, p.stderr[-2000:]
    assert "1 of " in p.stderr and "(1 so far" in p.stderr, p.stderr[-2000:]
    assert not out.exists() and not (tmp_path / "out.partial").exists()
    p = ckpt("convert", tmp_path / "base", out, "--profile-file", tmp_path / "f16.json", "--saturate", "--json")
    steps = {(s["tensor"], s["step"]): s for s in json.loads(p.stdout)["exactness"]["steps"]}
    assert [steps[(b, "cast F32->F16")]["clamped"] for b in big] == [1, 1]


def test_device_named_layout_saves_its_symmetric_form_in_paddlenlp(runs):
    """Stages naming their device types (a general layout) whose types both name paddlenlp: the run
    saves paddlenlp (F32) under the layout's symmetric form; h5py sees PaddleNLP's names and [in, out]
    weights (the transpose of the canonical run's, within the cross-layout tolerance); one process
    resumes it with the canonical run's losses."""
    d = runs["dir"]
    lay = d / "named.json"
    lay.write_text(json.dumps({"pipelines": [{"micro_batch": 12, "stages": [
        {"layers": 2, "tp": 1, "device": "a"}, {"layers": 4, "tp": 1, "device": "b"}]}], "zero": 0}))
    cl = cluster(d / "paddle.json", {"a": "paddlenlp", "b": "paddlenlp"}, [("a", 1), ("b", 1)])
    p = train(d, ["--layout", lay], "--cluster", cl, "--out", d / "P", "--steps", MID)
    assert "checkpoints: profile 'paddlenlp'" in p.stdout
    man, vals, _ = read_native(d / "P" / step_dir(MID))
    assert man["profile"] == "paddlenlp"  # its dtypes are "keep" (issue 36): F32 kept, no .fp32 variant
    assert (man["layout"]["tp"], man["layout"]["pp"], man["layout"]["layers_per_stage"]) == (1, 2, [2, 4])
    _, ref, _ = read_native(d / "A" / step_dir(MID), skip=lambda n: n.startswith("optimizer."))
    for i in (0, 5):
        for m in ("self_attn.q_proj", "mlp.down_proj"):
            got = vals[f"llama.layers.{i}.{m}.weight"]
            np.testing.assert_allclose(got.T, ref[f"model.layers.{i}.{m}.weight"], rtol=1e-5, atol=5e-6)
    np.testing.assert_allclose(vals["lm_head.weight"].T, ref["lm_head.weight"], rtol=1e-5, atol=5e-6)
    r = run([ckpt_path(), "train", "--config", d / "config.json", *COMMON, "--micro-batch", 12,
             "--out", d / "P1", "--steps", END, "--resume", d / "P"])
    assert r.returncode == 0
    assert_losses_close(log(d / "A"), log(d / "P1"), range(MID + 1, END + 1))
