"""The Python module's `source_profile` keyword (``--source-profile`` of the CLI) on every command that reads a
checkpoint: a PaddleNLP save whose config no longer says it is one (paddle_helpers, fixtures/paddlenlp) is read
in the profile named, giving PaddleNLP's logits (to_hf) and the tensors the CLI reads (reshard, from_hf,
export_dcp, inspect, verify, diff); without the keyword, or with the wrong profile, the named errors."""
import json

import pytest

import ckpt
from test_paddlenlp_read import _check_hf_dir, _plain_config_dir

CASE = "bf16_fused_safetensors"
PROFILE = "paddlenlp-fused"


@pytest.fixture()
def plain(tmp_path):
    return _plain_config_dir(CASE, tmp_path / "plain")


def test_to_hf_and_from_hf_read_the_profile_named(plain, tmp_path):
    with pytest.raises(ckpt.Error, match="MissingTensor"):
        ckpt.to_hf(plain, tmp_path / "no", fsync=False)
    r = ckpt.to_hf(plain, tmp_path / "hf", fsync=False, source_profile=PROFILE)
    assert r["source"]["why"] == f"--source-profile {PROFILE}"
    _check_hf_dir(CASE, tmp_path / "hf")  # PaddleNLP's logits
    ckpt.from_hf(plain, tmp_path / "store", fsync=False, source_profile=PROFILE)
    ckpt.to_hf(tmp_path / "store", tmp_path / "hf2", fsync=False)
    _check_hf_dir(CASE, tmp_path / "hf2")
    with pytest.raises(ckpt.Error, match="ProfileTensorMismatch"):
        ckpt.to_hf(plain, tmp_path / "wrong", fsync=False, source_profile="paddlenlp")
    with pytest.raises(ckpt.Error, match="ProfileUnknown"):
        ckpt.to_hf(plain, tmp_path / "unknown", fsync=False, source_profile="no-such")


def test_reading_commands_take_the_keyword_as_the_cli_takes_the_flag(plain, run_ckpt, tmp_path):
    flag = ["--source-profile", PROFILE]
    got = ckpt.inspect(plain, source_profile=PROFILE)
    want = json.loads(run_ckpt("inspect", plain, "--json", *flag).stdout)
    assert [(t["name"], t["shape"]) for t in got["tensors"]] == [(t["name"], t["shape"]) for t in want["tensors"]]
    assert any(t["name"] == "model.layers.0.self_attn.q_proj.weight" for t in got["tensors"])  # HF's view
    v = ckpt.verify(plain, source_profile=PROFILE)
    assert v["ok"] is True and v["pieces"] == json.loads(run_ckpt("verify", plain, "--json", *flag).stdout)["pieces"]
    ckpt.reshard(plain, tmp_path / "tp2", tp=2, pp=1, dp=1, source_profile=PROFILE)
    run_ckpt("reshard", plain, tmp_path / "tp2_cli", "--tp", 2, "--pp", 1, "--dp", 1, *flag)
    d = ckpt.diff(tmp_path / "tp2", tmp_path / "tp2_cli")
    assert d["equal"] is True and d["counts"]["identical"] == len(got["tensors"])
    d = ckpt.diff(plain, tmp_path / "tp2", source_profile_a=PROFILE)
    assert d["equal"] is True, d["counts"]
    ckpt.export_dcp(plain, tmp_path / "dcp", fsync=False, source_profile=PROFILE)
    d = ckpt.diff(tmp_path / "dcp", tmp_path / "tp2")
    assert d["equal"] is True, d["counts"]
    with pytest.raises(ckpt.Error, match="SourceProfileUnsupported"):
        ckpt.inspect(tmp_path / "tp2", source_profile="paddlenlp")  # a native store records its own
