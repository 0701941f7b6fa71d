"""Hostile model_state.pdparams files (issue 36): the restricted unpickler reads a pdparams pickle;
anything but plain numpy arrays (and the StructuredToParameterName@@ map) is refused by name,
nothing is executed, truncated and wrong-shape arrays are named errors. Also: a pdparams written
by today's numpy (numpy._core, a different pickle than PaddleNLP 2.8.1's numpy 1.26) reads the same."""
import json
import os
import pickle
import shutil

import numpy as np
import pytest

from paddle_helpers import bf16_round, case_dir, hf_reference, read_safetensors

_reconstruct = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's own: numpy(._)core.multiarray._reconstruct


class _Array:
    """Pickles as numpy pickles a plain ndarray, with the state given (to forge shapes and data)."""

    def __init__(self, state):
        self.state = state

    def __reduce__(self):
        return (_reconstruct, (np.ndarray, (0,), b"b"), self.state)


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _weights():
    """The fp32 unfused case's tensors under Paddle names (numpy arrays), as PaddleNLP saved them."""
    z = np.load(case_dir("fp32_unfused_pdparams") / "unfused.npz")
    return {k: np.ascontiguousarray(z[k]) for k in z.files}


def _dir_with(tmp_path, state_dict, name="m"):
    d = tmp_path / name
    d.mkdir()
    shutil.copy(case_dir("fp32_unfused_pdparams") / "model" / "config.json", d / "config.json")
    (d / "model_state.pdparams").write_bytes(pickle.dumps(state_dict, protocol=4))
    return d


def _refused(run_ckpt, d, code, *words):
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0, p.stdout
    assert code in p.stderr, p.stderr
    for w in words:
        assert w in p.stderr, (w, p.stderr)
    return p


def test_numpy2_pdparams_reads_as_paddles(run_ckpt, tmp_path):
    sd = dict(_weights())
    sd["StructuredToParameterName@@"] = {k: f"p_{i}.w_0" for i, k in enumerate(sd)}
    d = _dir_with(tmp_path, sd)
    run_ckpt("to-hf", d, tmp_path / "hf", "--no-fsync")
    ref = hf_reference("fp32_unfused_pdparams")
    got, meta, _ = read_safetensors(tmp_path / "hf" / "model.safetensors")
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_code_is_never_run(run_ckpt, tmp_path):
    marker = tmp_path / "pwned"
    sd = dict(_weights())
    sd["llama.norm.weight"] = _Evil(marker)
    d = _dir_with(tmp_path, sd)
    _refused(run_ckpt, d, "ForbiddenGlobal", "posix.system")
    assert not marker.exists()


def test_allow_listed_non_array_refused_naming_class(run_ckpt, tmp_path):
    import argparse

    sd = dict(_weights())
    sd["llama.norm.weight"] = argparse.Namespace(a=1)
    _refused(run_ckpt, _dir_with(tmp_path, sd), "PdparamsBadArray", "llama.norm.weight", "argparse.Namespace")


def test_root_and_name_map_rules(run_ckpt, tmp_path):
    _refused(run_ckpt, _dir_with(tmp_path, [1, 2], "list"), "PdparamsNotStateDict")
    sd = dict(_weights())
    sd["StructuredToParameterName@@"] = {"a": 1}
    _refused(run_ckpt, _dir_with(tmp_path, sd, "map"), "PdparamsBadNameMap")


@pytest.mark.parametrize("cut", [0.5, 0.999])
def test_truncated_file_named(run_ckpt, tmp_path, cut):
    d = _dir_with(tmp_path, _weights())
    f = d / "model_state.pdparams"
    b = f.read_bytes()
    f.write_bytes(b[: int(len(b) * cut)])
    _refused(run_ckpt, d, "PickleTruncated")


def test_wrong_shape_and_data_size_named(run_ckpt, tmp_path):
    sd = dict(_weights())
    sd["llama.norm.weight"] = _Array((1, (33,), np.dtype("<f4"), False, np.zeros(32, np.float32).tobytes()))
    _refused(run_ckpt, _dir_with(tmp_path, sd, "size"), "PdparamsSizeMismatch", "llama.norm.weight", "132", "128")
    # Right size, wrong shape for the config: the profile's shape rule names it.
    sd = dict(_weights())
    sd["llama.norm.weight"] = np.zeros(31, np.float32)
    p = run_ckpt("to-hf", _dir_with(tmp_path, sd, "shape"), tmp_path / "o", check=False)
    assert p.returncode != 0 and "llama.norm.weight" in p.stderr, p.stderr


def test_dtype_rules(run_ckpt, tmp_path):
    sd = dict(_weights())
    sd["llama.norm.weight"] = _Array((1, (32,), np.dtype(">f4"), False, np.zeros(32, ">f4").tobytes()))
    _refused(run_ckpt, _dir_with(tmp_path, sd, "be"), "PdparamsBadDtype", "llama.norm.weight")
    sd["llama.norm.weight"] = _Array((1, (32,), np.dtype("<c8"), False, np.zeros(32, "<c8").tobytes()))
    _refused(run_ckpt, _dir_with(tmp_path, sd, "complex"), "PdparamsBadDtype", "c8")
    sd["llama.norm.weight"] = _Array((1, (4, 8), np.dtype("<f4"), True, np.zeros(32, "<f4").tobytes()))
    _refused(run_ckpt, _dir_with(tmp_path, sd, "fortran"), "PdparamsFortranOrder")
    # An integer weight (no bf16 config): read, then refused where a float weight is expected.
    sd = dict(_weights())
    sd["llama.norm.weight"] = np.zeros(32, np.uint16)
    p = run_ckpt("to-hf", _dir_with(tmp_path, sd, "u16"), tmp_path / "o", check=False)
    assert p.returncode != 0 and "NonFloatWeight" in p.stderr and "model.norm.weight" in p.stderr, p.stderr


def test_sharded_pdparams_index(run_ckpt, tmp_path):
    """model_state.pdparams.index.json over two shards: read as one; a tensor listed in the wrong
    shard, or a missing shard, named."""
    w = _weights()
    names = sorted(w)
    half = {k: w[k] for k in names[: len(names) // 2]}
    rest = {k: w[k] for k in names[len(names) // 2:]}
    d = tmp_path / "sharded"
    d.mkdir()
    shutil.copy(case_dir("fp32_unfused_pdparams") / "model" / "config.json", d / "config.json")
    files = {"model_state-00001-of-00002.pdparams": half, "model_state-00002-of-00002.pdparams": rest}
    for f, sd in files.items():
        (d / f).write_bytes(pickle.dumps(sd, protocol=4))
    wm = {k: f for f, sd in files.items() for k in sd}
    (d / "model_state.pdparams.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    run_ckpt("to-hf", d, tmp_path / "hf", "--no-fsync")
    got, _, _ = read_safetensors(tmp_path / "hf" / "model.safetensors")
    for k, v in hf_reference("fp32_unfused_pdparams").items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    wm[names[0]] = "model_state-00002-of-00002.pdparams"
    (d / "model_state.pdparams.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    _refused(run_ckpt, d, "IndexMismatch", names[0])
    wm[names[0]] = "model_state-00003-of-00002.pdparams"
    (d / "model_state.pdparams.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    _refused(run_ckpt, d, "IndexMissingFile")
    assert bf16_round  # (imported for symmetry with the read tests)
