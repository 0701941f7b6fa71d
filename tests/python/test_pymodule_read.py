"""ckpt.open() / Checkpoint.read() of the Python module against independent readers of the same bytes:

 * a native store (pieces cut in rows, columns and flat ranges over 2 shard files, uncompressed and
   shuffle+zstd; f32, f16, bf16, fp8, int32, a 0-d tensor): every tensor equals the global array
   that h5py's reads of the pieces assemble (and the numpy array written);
 * safetensors files written by torch (bf16, fp8, f16, int64) and a HuggingFace directory with an
   index: every tensor equals safetensors.torch.load_file's, bit for bit;
 * a PyTorch DCP directory saved by 2 processes (sharded DTensors): equal to torch's own dcp.load;
 * boxes as (offset, extent), slices and ints equal numpy slicing of the whole tensor;
 * dtype casts equal torch's (round to nearest even) and numpy's widening; read_torch shares the
   numpy buffer (no copy; bf16 / fp8 through a bit view);
 * the listing (tensors, dtype, shape), len / in / iteration, metadata (layout, profile, trainer
   state), close and the context manager.
"""
import json
import sys
import pathlib

import ml_dtypes
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from pymodule_helpers import h5py_globals, import_ckpt, same_bits, write_store  # noqa: E402

ckpt = import_ckpt()


def _tensors(seed=0):
    rng = np.random.default_rng(seed)
    f32 = rng.standard_normal((12, 10)).astype(np.float32)
    return {
        "a.f32_rows": f32,
        "b.f16_cols": rng.standard_normal((6, 9)).astype(np.float16),
        "c.bf16_flat": rng.standard_normal((7, 5, 3)).astype(ml_dtypes.bfloat16),
        "d.fp8_rows": rng.uniform(-4, 4, (8, 4)).astype(ml_dtypes.float8_e4m3fn),
        "e.i32_whole": rng.integers(-1000, 1000, (5, 3), dtype=np.int32),
        "f.scalar": np.array(3.25, dtype=np.float32),
        "g.f32_vec_flat": rng.standard_normal(37).astype(np.float32),
    }


SPLITS = {"a.f32_rows": ("rows", 3), "b.f16_cols": ("cols", 2), "c.bf16_flat": ("flat", 3),
          "d.fp8_rows": ("rows", 2), "g.f32_vec_flat": ("flat", 4)}
META = {"layout": {"tp": 1, "pp": 1, "dp": 1, "layers_per_stage": [1], "profile": "reference"},
        "trainer": {"step": 42, "data_cursor": 7}, "model_config": {"note": "not a llama"}}


@pytest.fixture(scope="module", params=["none", "shuffle+zstd"])
def store(request, tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("store")
    t = _tensors()
    write_store(tool("store_write_tool"), d / "spec", d / "ck", t, META, ranks=2, codec=request.param, splits=SPLITS)
    return d / "ck", t


def test_native_store_every_tensor_equals_h5py(store):
    path, written = store
    ref = h5py_globals(path)
    with ckpt.open(path) as ck:
        assert ck.kind == "native-store"
        assert set(ck.tensors) == set(written) and len(ck) == len(written)
        for name, want in ref.items():
            info = ck.tensors[name]
            assert info.shape == want.shape and info.numpy_dtype == want.dtype, name
            got = ck.read(name)
            assert same_bits(got, want), name
            assert same_bits(got, written[name]), name  # and what was written
            assert same_bits(ck[name], want), name


def test_native_store_metadata_and_container(store):
    path, written = store
    ck = ckpt.open(path)
    assert ck.layout["tp"] == 1 and ck.profile == "reference"
    assert ck.trainer_state == {"step": 42, "data_cursor": 7}
    assert ck.metadata["model_config"] == {"note": "not a llama"}
    assert "a.f32_rows" in ck and "nope" not in ck
    assert sorted(ck) == sorted(written)
    assert ck.tensors["c.bf16_flat"] == ckpt.TensorInfo("c.bf16_flat", "bfloat16", (7, 5, 3))
    assert ck.tensors["d.fp8_rows"].dtype == "float8_e4m3fn"
    assert "native-store" in repr(ck)
    ck.close()
    assert ck.closed and "closed" in repr(ck)
    with pytest.raises(ckpt.InvalidArgumentError, match="closed"):
        ck.read("a.f32_rows")
    assert ck.tensors["a.f32_rows"].shape == (12, 10)  # the listing stays


def test_boxes_equal_numpy_slicing(store):
    path, written = store
    rng = np.random.default_rng(1)
    with ckpt.open(path) as ck:
        for name, whole in written.items():
            if whole.ndim == 0:
                assert same_bits(ck.read(name, box=((), ())), whole)
                continue
            for _ in range(6):
                lo = [int(rng.integers(0, s)) for s in whole.shape]
                hi = [int(rng.integers(a + 1, s + 1)) for a, s in zip(lo, whole.shape)]
                sl = tuple(slice(a, b) for a, b in zip(lo, hi))
                want = whole[sl]
                assert same_bits(ck.read(name, box=(lo, [b - a for a, b in zip(lo, hi)])), want), (name, sl)
                assert same_bits(ck.read(name, box=sl), want), (name, sl)
            # Partial tuples, negative bounds, ints drop their dimension, empty boxes.
            assert same_bits(ck.read(name, box=slice(1, None)), whole[1:]), name
            assert same_bits(ck.read(name, box=(-1,)), whole[-1]), name
            assert same_bits(ck.read(name, box=(slice(0, 0),)), whole[0:0]), name
            if whole.ndim >= 2:
                assert same_bits(ck.read(name, box=(slice(None), 1)), whole[:, 1]), name
                assert same_bits(ck.read(name, box=(2, slice(-3, None))), whole[2, -3:]), name


def test_casts_equal_torch_and_numpy(store):
    path, written = store
    with ckpt.open(path) as ck:
        # f32 -> bf16 and f16: torch rounds to nearest even as the store's casts do.
        got = ck.read("a.f32_rows", dtype="bfloat16")
        want = torch.from_numpy(written["a.f32_rows"]).to(torch.bfloat16).view(torch.int16).numpy()
        assert got.dtype == ml_dtypes.bfloat16 and np.array_equal(got.view(np.int16), want)
        got = ck.read("a.f32_rows", box=(slice(2, 9), slice(3, 8)), dtype=np.float16)
        assert same_bits(got, written["a.f32_rows"][2:9, 3:8].astype(np.float16))
        # Widening casts are exact (numpy's).
        assert same_bits(ck.read("b.f16_cols", dtype="F32"), written["b.f16_cols"].astype(np.float32))
        assert same_bits(ck.read("c.bf16_flat", dtype=torch.float32), written["c.bf16_flat"].astype(np.float32))
        assert same_bits(ck.read("d.fp8_rows", dtype="fp32"), written["d.fp8_rows"].astype(np.float32))
        assert same_bits(ck.read("e.i32_whole", dtype="int64"), written["e.i32_whole"].astype(np.int64))


def _tbytes(t):
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def test_read_torch_shares_the_buffer(store):
    path, written = store
    with ckpt.open(path) as ck:
        for name, whole in written.items():
            t = ck.read_torch(name)
            assert tuple(t.shape) == whole.shape, name
            assert t.element_size() == whole.dtype.itemsize, name
            assert _tbytes(t) == np.ascontiguousarray(whole).tobytes(), name
        assert ck.read_torch("c.bf16_flat").dtype == torch.bfloat16
        assert ck.read_torch("d.fp8_rows").dtype == torch.float8_e4m3fn
        arr = ck.read("c.bf16_flat")
        t = ckpt.to_torch(arr)
        assert t.data_ptr() == arr.ctypes.data  # no copy
        t[0, 0, 0] = 1.5
        assert float(arr[0, 0, 0]) == 1.5
        assert ck.read("a.f32_rows", framework="torch").dtype == torch.float32


def test_safetensors_file_and_hf_dir_equal_safetensors_torch(tmp_path):
    g = torch.Generator().manual_seed(3)
    sd = {"w.bf16": torch.randn(9, 6, generator=g).to(torch.bfloat16),
          "w.f16": torch.randn(4, 5, generator=g).to(torch.float16),
          "w.fp8": (torch.randn(6, 4, generator=g) * 8).to(torch.float8_e4m3fn),
          "w.fp8e5": (torch.randn(3, 4, generator=g) * 8).to(torch.float8_e5m2),
          "ids": torch.arange(-5, 7, dtype=torch.int64).reshape(3, 4),
          "f64": torch.randn(5, generator=g, dtype=torch.float64)}
    f = tmp_path / "one.safetensors"
    save_file(sd, str(f))
    ref = load_file(str(f))
    with ckpt.open(f) as ck:
        assert ck.kind == "safetensors" and ck.layout is None
        assert set(ck.tensors) == set(ref)
        for name, t in ref.items():
            got = ck.read(name)
            assert tuple(got.shape) == tuple(t.shape)
            assert got.tobytes() == t.contiguous().view(torch.uint8).numpy().tobytes(), name
            tt = ck.read_torch(name)
            assert tt.dtype == t.dtype and _tbytes(tt) == _tbytes(t), name
        assert same_bits(ck.read("w.bf16", box=(slice(2, 5), slice(1, 4))).view(np.int16),
                         ref["w.bf16"][2:5, 1:4].contiguous().view(torch.int16).numpy())
    # A HuggingFace directory with an index over two files.
    hf = tmp_path / "hf"
    hf.mkdir()
    names = sorted(sd)
    wm = {}
    for i, part in enumerate((names[:3], names[3:])):
        fn = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({k: sd[k] for k in part}, str(hf / fn))
        wm.update({k: fn for k in part})
    (hf / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": wm}))
    with ckpt.open(hf) as ck:
        assert ck.kind == "hf-dir" and set(ck.tensors) == set(sd)
        for name, t in sd.items():
            assert ck.read(name).tobytes() == t.contiguous().view(torch.uint8).numpy().tobytes(), name


def test_dcp_sharded_equals_torch_dcp_load():
    import dcp_fixtures
    root = dcp_fixtures.fixture_root()
    ref = load_file(str(root / "sharded" / "ref.safetensors"))
    with ckpt.open(root / "sharded" / "dcp") as ck:
        assert ck.kind == "dcp"
        for name, t in ref.items():
            assert name in ck, name
            got = ck.read_torch(name)
            assert got.dtype == t.dtype and tuple(got.shape) == tuple(t.shape) and _tbytes(got) == _tbytes(t), name
        whole = ref["w_cols_uneven"].numpy()
        assert same_bits(ck.read("w_cols_uneven", box=(slice(1, 4), slice(2, 6))), whole[1:4, 2:6])


@pytest.mark.parametrize("fmt", ["safetensors", "torch_dist", "torch"])
def test_megatron_dirs_equal_the_hf_tensors(fmt, run_ckpt, tmp_path):
    """export-megatron of an HF model (tp2 pp2: packed QKV, fused gate/up, padded vocab in the
    files); opened with ckpt.open, every tensor in global view equals the HF numpy array."""
    import megatron_reference as ref
    from test_reshard_cli import CFG_GQA
    cfg = dict(CFG_GQA, torch_dtype="float32")
    hf = ref.make_hf_model(cfg, np.random.default_rng(9))
    src = tmp_path / "hf"
    src.mkdir()
    from safetensors.numpy import save_file as save_np
    save_np(hf, str(src / "model.safetensors"), metadata={"format": "pt"})
    (src / "config.json").write_text(json.dumps(cfg))
    run_ckpt("from-hf", src, tmp_path / "native", "--no-fsync")
    out = tmp_path / "meg"
    run_ckpt("export-megatron", tmp_path / "native", out, "--format", fmt, "--tp", 2, "--pp", 2)
    with ckpt.open(out) as ck:
        assert ck.kind.startswith("megatron"), ck.kind
        assert ck.model_config["num_hidden_layers"] == cfg["num_hidden_layers"]
        for name, want in hf.items():
            assert name in ck, name
            assert same_bits(ck.read(name), want), name
            assert same_bits(ck.read(name, box=(slice(1, 3),)), want[1:3]), name
