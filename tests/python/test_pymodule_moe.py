"""Expert parallelism through the Python module (issue 37; python/ckpt/commands.py's ep/etp keywords, layouts given
as dicts or flag strings with ep/etp), against independent references: transformers' tiny Qwen3-MoE
(fixtures/moe/qwen3_moe/legacy, save_pretrained's safetensors) stacked with numpy; the stores read back with h5py
(scripts/native_h5py.py); every stored piece checked against Megatron-Core's expert placement restated in
tests/python/moe_reference.py. Needs PYTHONPATH=<build>/python (ctest sets it)."""
import json
import pathlib
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import moe_reference  # noqa: E402
from native_h5py import read_native  # noqa: E402  (scripts/, put on sys.path by conftest)

ckpt = pytest.importorskip("ckpt", reason="the ckpt module: build target ckpt_python, PYTHONPATH=<build>/python")
HF = HERE.parents[1] / "fixtures" / "moe" / "qwen3_moe" / "legacy"  # 3 layers (layer 1 MoE), 8 experts of width 24
CFG = json.loads((HF / "config.json").read_text())


def _check(store, lay, ref):
    man, got, _ = read_native(store)
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        assert np.array_equal(got[k], v), k
    assert moe_reference.check_pieces(man, CFG, lay)
    return man


def test_from_hf_and_reshard_take_ep_and_etp(tmp_path):
    ref, _ = moe_reference.fixture_tensors(HF)
    out = ckpt.from_hf(HF, tmp_path / "a", tp=1, pp=1, dp=4, ep=4, fsync=False)
    assert "ep=4 etp=1" in out["layout"], out["layout"]
    with ckpt.open(tmp_path / "a") as c:
        assert (c.layout["ep"], c.layout["etp"]) == (4, 1), c.layout
    _check(tmp_path / "a", dict(tp=1, dp=4, ep=4, etp=1, split=[3], zero=0), ref)
    ckpt.reshard(tmp_path / "a", tmp_path / "b", tp=2, pp=2, dp=2, pp_layers="1,2", ep=2, etp=1)
    _check(tmp_path / "b", dict(tp=2, dp=2, ep=2, etp=1, split=[1, 2], zero=0), ref)
    with ckpt.open(tmp_path / "b") as c:
        assert (c.layout["ep"], c.layout["etp"]) == (2, 1), c.layout
    ckpt.reshard(tmp_path / "b", tmp_path / "c", layout="tp=2 pp=1 dp=2 pp_layers=3 ep=4 etp=1")  # a flag string
    _check(tmp_path / "c", dict(tp=2, dp=2, ep=4, etp=1, split=[3], zero=0), ref)
    ckpt.reshard(tmp_path / "c", tmp_path / "d", layout={"tp": 4, "pp": 1, "dp": 1, "layers_per_stage": [3], "ep": 1, "etp": 2})
    _check(tmp_path / "d", dict(tp=4, dp=1, ep=1, etp=2, split=[3], zero=0), ref)


def test_state_dict_under_an_expert_parallel_layout(tmp_path):
    """Each rank's expert tensors are numpy's slice of the box Megatron-Core's rank order gives it."""
    ref, _ = moe_reference.fixture_tensors(HF)
    ckpt.from_hf(HF, tmp_path / "a", fsync=False)
    lay = dict(tp=2, dp=2, ep=2, etp=2, split=[3], zero=0)
    name = "model.layers.1.mlp.experts.down_proj.weight"
    with ckpt.open(tmp_path / "a") as c:
        for r in range(4):
            sd = c.state_dict(layout="tp=2 pp=1 dp=2 ep=2 etp=2", rank=r)
            off, ext = moe_reference.boxes(CFG, name, ref[name].shape, lay)[r]
            want = ref[name][tuple(slice(o, o + e) for o, e in zip(off, ext))]
            assert sd[name].shape == want.shape and np.array_equal(sd[name], want), (r, off, ext)


@pytest.mark.parametrize("kw,needle", [
    (dict(dp=4, ep=-1), "ep and etp"),
    (dict(dp=3, ep=3), "[LayoutRefused]"),       # 3 does not divide 8 experts
    (dict(dp=4, ep=4, etp=2), "[BadLayout]"),     # ep x etp = 8 does not divide tp x dp = 4
])
def test_impossible_expert_layouts_raise_named_errors(tmp_path, kw, needle):
    ckpt.from_hf(HF, tmp_path / "a", fsync=False)
    with pytest.raises(ckpt.Error) as e:
        ckpt.reshard(tmp_path / "a", tmp_path / "b", tp=1, pp=1, **kw)
    assert needle in str(e.value), str(e.value)
    assert kw["ep"] > 0 or isinstance(e.value, ckpt.InvalidArgumentError)
    assert not (tmp_path / "b").exists()
