"""DeepSpeed universal checkpoints read by ckpt (converters/deepspeed/ds_universal_source.h), kind
`deepspeed-universal`, against DeepSpeed 0.19.8's own numbers (fixtures/deepspeed, README.md there):
  * DeepSpeed's own `ds_to_universal` output (the committed universal/ of zero2_w2_fp32, a stage-2
    dict layout with step.pt, and zero3_w3_bf16, stage 3's flat bare tensors without step.pt):
    `ckpt to-hf` gives zero_to_fp32's weights exactly, `ckpt reshard` into a native store (read with
    h5py) holds oracle.npz's fp32 / exp_avg / exp_avg_sq and DeepSpeed's step and Adam settings;
  * ckpt's own universal checkpoint (`export-deepspeed`) read back: the same;
  * detection (`inspect --json`) and the named errors of a damaged layout (a missing fp32.pt, a tensor of
    the wrong size, a hostile parameter name, moments for some parameters only).
"""
import json
import pathlib
import shutil
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "deepspeed"
sys.path.insert(0, str(ROOT / "scripts"))
from native_h5py import read_native  # noqa: E402
from zip_damage import assert_refused, flip_in_entry  # noqa: E402

KINDS = {"fp32": "", "exp_avg": "optimizer.exp_avg.", "exp_avg_sq": "optimizer.exp_avg_sq."}


def case_json(name):
    return json.loads((FIX / name / "case.json").read_text())


def ds_universal(name, tmp):
    """DeepSpeed's own universal step directory, with the model's config.json beside it."""
    d = tmp / "universal"
    shutil.copytree(FIX / name / "universal", d)
    (d / "config.json").write_text(json.dumps(case_json(name)["config"]))
    return d


def ckpt_universal(run_ckpt, name, tmp):
    src = tmp / "src"
    shutil.copytree(FIX / name / "ckpt", src)
    run_ckpt("export-deepspeed", src, tmp / "u")
    (tmp / "u" / "config.json").write_text(json.dumps(case_json(name)["config"]))
    return tmp / "u"


def check_against_deepspeed(run_ckpt, name, d, tmp):
    from safetensors.numpy import load_file
    run_ckpt("to-hf", d, tmp / "hf")
    got = {}
    for f in sorted((tmp / "hf").glob("*.safetensors")):
        got.update(load_file(f))
    want = load_file(FIX / name / "zero_to_fp32.safetensors")
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype == np.float32 and got[k].shape == w.shape, k
        np.testing.assert_array_equal(got[k], w, err_msg=k)
    run_ckpt("reshard", d, tmp / "native", "--tp", 1, "--pp", 1, "--dp", 1)
    man, native, _ = read_native(tmp / "native")
    oracle = np.load(FIX / name / "oracle.npz")
    params = {k.rsplit("/", 1)[0] for k in oracle.files}
    assert set(native) == {pre + p for pre in KINDS.values() for p in params}
    for p in params:
        for kind, pre in KINDS.items():
            np.testing.assert_array_equal(native[pre + p].reshape(-1), oracle[f"{p}/{kind}"].reshape(-1), err_msg=f"{p} {kind}")
    assert man["deepspeed"]["optimizer_step"] == 2 and man["deepspeed"]["kind"] == "universal"
    hp = case_json(name)["ds_config"]["optimizer"]["params"]
    assert man["adam"]["lr"] == pytest.approx(hp["lr"]) and man["adam"]["beta2"] == pytest.approx(hp["betas"][1])
    info = json.loads(run_ckpt("inspect", "--json", d).stdout)
    assert "DeepSpeed universal checkpoint" in info["detected"] and "21 parameters with Adam state" in info["detected"]


@pytest.mark.parametrize("name", ["zero2_w2_fp32", "zero3_w3_bf16"])
def test_deepspeeds_universal(run_ckpt, tmp_path, name):
    check_against_deepspeed(run_ckpt, name, ds_universal(name, tmp_path), tmp_path)


@pytest.mark.parametrize("name", ["zero1_w3_bf16", "zero3_w2_fp32"])
def test_ckpts_universal_read_back(run_ckpt, tmp_path, name):
    check_against_deepspeed(run_ckpt, name, ckpt_universal(run_ckpt, name, tmp_path), tmp_path)
    assert run_ckpt("verify", tmp_path / "u").returncode == 0


def damage(kind, d):
    zero = d / "zero"
    if kind == "missing":
        (zero / "model.norm.weight" / "fp32.pt").unlink()
    elif kind == "size":
        shutil.copy(zero / "model.norm.weight" / "fp32.pt", zero / "lm_head.weight" / "fp32.pt")
    elif kind == "partial":
        (zero / "model.norm.weight" / "exp_avg.pt").unlink()
    elif kind == "latest":
        (d.parent / "latest_universal").write_text("../etc")
        return d.parent
    return d


@pytest.mark.parametrize("kind,code", [("missing", "DeepSpeedUniversal"), ("size", "DeepSpeedUniversal"), ("partial", "DeepSpeedUniversal"),
                                       ("latest", "DeepSpeedLatest")])
def test_damaged_layout_is_refused(run_ckpt, tmp_path, kind, code):
    d = ds_universal("zero2_w2_fp32", tmp_path / "x")
    src = damage(kind, d)
    p = run_ckpt("to-hf", src, tmp_path / "hf", check=False)
    assert p.returncode != 0 and code in p.stderr, p.stderr
    assert not (tmp_path / "hf").exists()


def test_hostile_parameter_name_is_refused(run_ckpt, tmp_path):
    """A param_shapes name that would leave zero/ ('../..'): refused by name, no file outside is opened."""
    torch = pytest.importorskip("torch")
    from collections import OrderedDict
    d = tmp_path / "step"
    (d / "zero").mkdir(parents=True)
    torch.save({"param_groups": [{"lr": 0.1}]}, d / "zero" / "optimizer_state.pt")
    torch.save({"param_shapes": [OrderedDict([("../../x", torch.Size([2]))])], "global_steps": 1}, d / "mp_rank_00_model_states.pt")
    p = run_ckpt("to-hf", d, tmp_path / "hf", check=False)
    assert p.returncode != 0 and "DeepSpeedUniversal" in p.stderr and "../../x" in p.stderr, p.stderr


@pytest.mark.parametrize("name", ["zero2_w2_fp32", "zero3_w3_bf16"])
def test_damaged_byte_in_a_parameter_file_is_caught(run_ckpt, tmp_path, name):
    """One byte flipped inside a stored tensor of one parameter's exp_avg.pt: verify names the file and its
    entry (zip CRC-32), to-hf and reshard refuse it and leave nothing (DeepSpeed's files carry no other checksum)."""
    d = ds_universal(name, tmp_path / "x")
    assert run_ckpt("verify", d).returncode == 0
    f = d / "zero" / "model.embed_tokens.weight" / "exp_avg.pt"
    entry = flip_in_entry(f, 0, f.stat().st_size, lambda infos: next(i for i in infos if "/data/" in i.filename))
    v = run_ckpt("verify", d, check=False)
    assert "model.embed_tokens.weight" in v.stdout + v.stderr, v.stdout + v.stderr
    assert_refused(run_ckpt, d, entry, tmp_path)
