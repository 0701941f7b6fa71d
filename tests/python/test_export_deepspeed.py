"""`ckpt export-deepspeed`: DeepSpeed universal checkpoints written by ckpt (converters/deepspeed/
ds_universal_export.h), against DeepSpeed 0.19.8's own `ds_to_universal.py` output committed in
fixtures/deepspeed (README.md there) and read back with torch.load (weights_only):
  * for the two cases whose universal/ is committed (zero2_w2_fp32, zero3_w3_bf16): the same parameter
    directories, and per parameter fp32 / exp_avg / exp_avg_sq element for element equal, same dtype and
    shape, the stage-2 dicts with the same keys ({'cat_dim', 'param'}; stage 3's ds_to_universal saves the
    bare flat tensor, which its loader takes as the dict's 'param' viewed flat), step.pt equal to DeepSpeed's;
  * for every fixture case: the same against oracle.npz (ds_to_universal's numbers as numpy);
  * the model states files' param_shapes equal DeepSpeed's, the optimizer state's step and
    hyper-parameters equal the run's (case.json), latest_universal names the tag;
  * an HF model (no Adam state): refused by name without --weights-only, nothing written; with it,
    fp32 = the weights, zero moments, step 0;
  * --int-step writes a Python int; an existing OUT is refused.
That DeepSpeed resumes from these files and takes the uninterrupted run's next step is checked by
fixtures/deepspeed/check_resume.py in DeepSpeed's own venv (not in CI; docs/DEEPSPEED.md has its result).
"""
import json
import pathlib
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "deepspeed"
CASES = sorted(p.name for p in FIX.iterdir() if (p / "case.json").exists())
WITH_UNIVERSAL = ["zero2_w2_fp32", "zero3_w3_bf16"]
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from zip_damage import flip_in_entry  # noqa: E402


def case_json(name):
    return json.loads((FIX / name / "case.json").read_text())


def export(run_ckpt, name, tmp, *flags, check=True):
    src = tmp / "src"
    shutil.copytree(FIX / name / "ckpt", src)
    out = tmp / "universal"
    p = run_ckpt("export-deepspeed", src, out, "--json", *flags, check=check)
    return out, p


def load(path):
    return torch.load(path, weights_only=True, map_location="cpu")


def param_dirs(zero):
    return sorted(p.name for p in zero.iterdir() if p.is_dir())


@pytest.mark.parametrize("name", WITH_UNIVERSAL)
def test_files_equal_ds_to_universal(run_ckpt, tmp_path, name):
    out, p = export(run_ckpt, name, tmp_path)
    tag = (out / "latest_universal").read_text()
    assert tag == "global_step2" and json.loads(p.stdout)["tag"] == tag
    ours, theirs = out / tag / "zero", FIX / name / "universal" / "zero"
    assert param_dirs(ours) == param_dirs(theirs) and len(param_dirs(ours)) == 21
    for param in param_dirs(theirs):
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            mine, ref = load(ours / param / f"{state}.pt"), load(theirs / param / f"{state}.pt")
            assert set(mine) == {"cat_dim", "param"} and mine["cat_dim"] == 0
            if isinstance(ref, dict):
                assert set(ref) == set(mine) and ref["cat_dim"] == mine["cat_dim"]
                ref = ref["param"]
            got = mine["param"]
            if not isinstance(load(theirs / param / f"{state}.pt"), dict):  # stage 3: flat, which its loader views as -1
                assert ref.dim() == 1 and ref.numel() == got.numel()
                ref = ref.reshape(got.shape)
            assert got.dtype == ref.dtype == torch.float32 and got.shape == ref.shape, (param, state)
            assert torch.equal(got, ref.detach()), (param, state)
        step = load(ours / param / "step.pt")
        assert torch.is_tensor(step) and step.dtype == torch.float32 and step.shape == () and float(step) == 2
        if (theirs / param / "step.pt").exists():
            ref = load(theirs / param / "step.pt")
            assert ref.dtype == step.dtype and torch.equal(ref, step)
    # The model states: the file each stage's loader opens, param_shapes as DeepSpeed saved them.
    ref_states = next((FIX / name / "universal").glob("*model_states.pt"))
    ref_shapes = torch.load(ref_states, weights_only=False, map_location="cpu")["param_shapes"]
    for f in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"):
        sd = load(out / tag / f)
        assert sd["param_shapes"] == ref_shapes
        assert list(sd["param_shapes"][0]) == list(ref_shapes[0])  # named_parameters order
        assert sd["global_steps"] == 2 and sd["ds_version"] == "0.19.8"
        assert all(k in sd for k in ("dp_world_size", "mp_world_size", "skipped_steps", "lr_scheduler"))


@pytest.mark.parametrize("name", CASES)
def test_states_equal_oracle(run_ckpt, tmp_path, name):
    out, _ = export(run_ckpt, name, tmp_path)
    oracle = np.load(FIX / name / "oracle.npz")
    zero = out / "global_step2" / "zero"
    names = {k.rsplit("/", 1)[0] for k in oracle.files}
    assert set(param_dirs(zero)) == names
    for n in names:
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            got = load(zero / n / f"{state}.pt")["param"].numpy()
            assert got.dtype == np.float32
            ref = oracle[f"{n}/{state}"]
            assert ref.size == got.size, (n, state)
            np.testing.assert_array_equal(got, ref.reshape(got.shape), err_msg=f"{n}/{state}")  # stage 3's are flat
    opt = load(zero / "optimizer_state.pt")
    hp = case_json(name)["ds_config"]["optimizer"]["params"]
    step = opt["optimizer_state_dict"]["state"][0]["step"]
    assert torch.is_tensor(step) and float(step) == 2
    for g in opt["param_groups"] + opt["optimizer_state_dict"]["param_groups"]:
        assert g["lr"] == pytest.approx(hp["lr"]) and g["eps"] == pytest.approx(hp["eps"])
        assert g["betas"] == pytest.approx(tuple(hp["betas"])) and "weight_decay" not in g
    assert opt["ds_version"] == "0.19.8" and len(opt["param_groups"]) == 8


def hf_dir(tmp, name="zero2_w2_fp32"):
    d = tmp / "hf"
    d.mkdir()
    shutil.copy(FIX / name / "zero_to_fp32.safetensors", d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(case_json(name)["config"]))
    return d


def test_hf_without_optimizer_state_is_refused(run_ckpt, tmp_path):
    src = hf_dir(tmp_path)
    p = run_ckpt("export-deepspeed", src, tmp_path / "u", check=False)
    assert p.returncode != 0 and "DeepSpeedNoOptimizerState" in p.stderr and "--weights-only" in p.stderr
    assert not (tmp_path / "u").exists() and not (tmp_path / "u.partial").exists()


def test_hf_weights_only_is_a_fresh_adam(run_ckpt, tmp_path):
    from safetensors.numpy import load_file
    src = hf_dir(tmp_path)
    p = run_ckpt("export-deepspeed", src, tmp_path / "u", "--weights-only", "--json")
    assert json.loads(p.stdout)["fresh_adam"] is True
    weights = load_file(str(src / "model.safetensors"))
    zero = tmp_path / "u" / (tmp_path / "u" / "latest_universal").read_text() / "zero"
    assert set(param_dirs(zero)) == set(weights)
    for n, w in weights.items():
        np.testing.assert_array_equal(load(zero / n / "fp32.pt")["param"].numpy(), w)
        for m in ("exp_avg", "exp_avg_sq"):
            t = load(zero / n / f"{m}.pt")["param"]
            assert t.shape == w.shape and not t.any()
        assert float(load(zero / n / "step.pt")) == 0


def test_int_step_and_existing_out(run_ckpt, tmp_path):
    out, _ = export(run_ckpt, "zero1_w2_bf16", tmp_path, "--int-step")
    step = load(out / "global_step2" / "zero" / "lm_head.weight" / "step.pt")
    assert isinstance(step, int) and step == 2
    assert load(out / "global_step2" / "zero" / "optimizer_state.pt")["optimizer_state_dict"]["state"][0]["step"] == 2
    p = run_ckpt("export-deepspeed", tmp_path / "src", out, check=False)
    assert p.returncode != 0 and "exists" in p.stderr


def st_dir(tmp, name, tensors):
    from safetensors.numpy import save_file
    d = tmp / name
    d.mkdir()
    save_file(tensors, str(d / "model.safetensors"))
    return d


@pytest.mark.parametrize("kind,code", [("int_weight", "DeepSpeedNotFloat"), ("partial", "DeepSpeedPartialOptimizerState"),
                                       ("no_step", "DeepSpeedNoStep"), ("dotdot", "DeepSpeedParamName")])
def test_refused_sources(run_ckpt, tmp_path, kind, code):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    adam = {"optimizer.exp_avg.a.weight": w, "optimizer.exp_avg_sq.a.weight": w}
    tensors = {"int_weight": {"a.weight": w, "b.weight": np.arange(6, dtype=np.int32)},
               "partial": {"a.weight": w, "b.weight": w, **adam},
               "no_step": {"a.weight": w, **adam},
               "dotdot": {"..": w}}[kind]
    src = st_dir(tmp_path, kind, tensors)
    p = run_ckpt("export-deepspeed", src, tmp_path / "u", "--weights-only", check=False)
    assert p.returncode != 0 and f"[{code}]" in p.stderr and "internal error" not in p.stderr, p.stderr
    assert not (tmp_path / "u").exists() and not (tmp_path / "u.partial").exists()
    if kind == "no_step":  # the step given by hand
        run_ckpt("export-deepspeed", src, tmp_path / "u", "--step", "5")
        zero = tmp_path / "u" / "global_step5" / "zero"
        assert float(load(zero / "a.weight" / "step.pt")) == 5
        np.testing.assert_array_equal(load(zero / "a.weight" / "exp_avg_sq.pt")["param"].numpy(), w)


def test_damaged_source_is_refused(run_ckpt, tmp_path):
    """A flipped byte in a rank's optimizer file: the zip CRC-32 check before the commit refuses it."""
    src = tmp_path / "src"
    shutil.copytree(FIX / "zero3_w2_fp32" / "ckpt", src)
    f = src / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    entry = flip_in_entry(f, 0, f.stat().st_size, lambda infos: next(i for i in infos if "/data/" in i.filename and i.file_size > 1024))
    p = run_ckpt("export-deepspeed", src, tmp_path / "u", check=False)
    assert p.returncode != 0 and "ZipCrcMismatch" in p.stderr and entry in p.stderr, p.stderr
    assert not (tmp_path / "u").exists() and not (tmp_path / "u.partial").exists()


def test_python_module(tmp_path):
    """ckpt.export_deepspeed (python/ckpt/commands.py) runs the same job: same files, the named error as
    ckpt.InvalidArgumentError."""
    ckpt = pytest.importorskip("ckpt", reason="the ckpt module: build target ckpt_python, PYTHONPATH=<build>/python")
    src = tmp_path / "src"
    shutil.copytree(FIX / "zero2_w2_fp32" / "ckpt", src)
    res = ckpt.export_deepspeed(src, tmp_path / "u", fsync=False)
    assert res["tag"] == "global_step2" and res["params"] == 21 and res["step"] == 2 and res["fresh_adam"] is False
    got = load(tmp_path / "u" / "global_step2" / "zero" / "model.norm.weight" / "exp_avg.pt")["param"]
    ref = load(FIX / "zero2_w2_fp32" / "universal" / "zero" / "model.norm.weight" / "exp_avg.pt")["param"]
    assert torch.equal(got, ref)
    with pytest.raises(ckpt.InvalidArgumentError, match="DeepSpeedNoOptimizerState"):
        ckpt.export_deepspeed(hf_dir(tmp_path), tmp_path / "u2")
    assert not (tmp_path / "u2").exists()


def test_moe_model_is_refused_by_name(run_ckpt, tmp_path):
    """A mixture-of-experts model (fixtures/moe: transformers' Mixtral): its stacked experts are no
    module parameters, so the export refuses it by name (docs/MOE.md) and writes nothing."""
    src = ROOT / "fixtures" / "moe" / "mixtral" / "legacy"
    p = run_ckpt("export-deepspeed", src, tmp_path / "u", "--weights-only", check=False)
    assert p.returncode != 0 and "UnsupportedModel" in p.stderr and "export-deepspeed" in p.stderr, p.stderr
    assert not (tmp_path / "u").exists() and not (tmp_path / "u.partial").exists()
