"""formats/torch read side against torch itself: torch.save files written here by torch are read
through tests/tools/torch_dump (the restricted unpickler + the libzip reader) and every object and
tensor is compared with torch.load's result (torch is the independent reference): all dtypes,
views sharing one storage, storage offsets, transposed tensors, 0-d and empty tensors, nested
containers, argparse.Namespace with torch dtypes and megatron-core enums, io.BytesIO extra state,
Megatron's rng_state (random / numpy / torch), re-zipped as ZIP64 and with deflated entries, and
embedded at a byte range of a larger file. Also a DCP .metadata written by
torch.distributed.checkpoint.save, parsed as records."""
import argparse
import collections
import io
import json
import os
import pathlib
import random
import subprocess
import warnings
import zipfile

import numpy as np
import pytest
import torch

from conftest import check_no_sanitizer_report

BUILD = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", pathlib.Path(__file__).resolve().parents[2] / "build"))
DUMP = BUILD / "torch_dump"

DTYPES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.uint16: "U16",
    torch.int32: "I32", torch.uint32: "U32", torch.int64: "I64", torch.uint64: "U64", torch.float16: "F16",
    torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64", torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def run_dump(path, out=None, *extra):
    args = [str(DUMP), str(path)] + ([str(out)] if out else []) + list(extra)
    p = subprocess.run(args, capture_output=True, text=True, timeout=120)
    check_no_sanitizer_report(p)
    return p


def load_dump(path, tmp, *extra):
    out = tmp / ("out_" + pathlib.Path(path).name)
    out.mkdir(exist_ok=True)
    p = run_dump(path, out, *extra)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), out


def some_tensor(dtype, shape, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 4).to(dtype)
    info_max = {torch.uint8: 255, torch.int8: 127, torch.int16: 30000, torch.uint16: 60000, torch.int32: 2**31 - 1,
                torch.uint32: 2**32 - 1, torch.int64: 2**62, torch.uint64: 2**63}[dtype]
    vals = torch.randint(0, 2**62, shape, generator=gen, dtype=torch.int64) % info_max
    return vals.to(dtype) if dtype not in (torch.uint16, torch.uint32, torch.uint64) else vals.to(dtype)


def megatron_like_state():
    gen = torch.Generator().manual_seed(1234)
    base = torch.randn(6, 8, generator=gen)
    model = collections.OrderedDict()
    for dt in DTYPES:
        model[f"all.{str(dt)}"] = some_tensor(dt, (3, 5), gen)
    model.update({
        "base": base, "row_view": base[2:4], "col_view": base[:, 3], "transposed": base.t(),
        "strided": base[::2, 1::3], "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4), "empty_view": base[6:],
        "param": torch.nn.Parameter(torch.ones(3, 2)), "bf16_t": torch.randn(4, 3, generator=gen).bfloat16().t(),
    })
    random.seed(7)
    np.random.seed(7)
    from megatron.core.enums import ModelType
    from megatron.core.transformer.enums import AttnBackend
    args = argparse.Namespace(tensor_model_parallel_size=2, num_layers=4, params_dtype=torch.bfloat16, hidden_size=64,
                              model_type=ModelType.encoder_or_decoder, attention_backend=AttnBackend.auto,
                              seq_length=128, lr=3e-4, swiglu=True, data_path=["a", "b"], empty=None)
    extra = io.BytesIO(b"fp8 extra state \x00\x01\xff")
    rng_state = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                  "torch_rng_state": torch.get_rng_state(), "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()}}]
    return {"args": args, "iteration": 1000, "checkpoint_version": 3.0, "model": model,
            "model_extra": {"layer._extra_state": extra, "nested": [{"a": (1, 2, [3])}, torch.Size([2, 3])]},
            "rng_state": rng_state, "num_floating_point_operations_so_far": 2**40 + 5, "neg": -7, "name": "héllo"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("torchread")
    state = megatron_like_state()
    path = d / "model_optim_rng.pt"
    torch.save(state, path)
    return d, path, torch.load(path, weights_only=False)


def to_numpy_dtype_name(rec):
    return rec["args"]["tuple"][0]


def compare(j, ref, out, where="root"):
    """Asserts that the dumped JSON tree `j` describes the torch.load result `ref`."""
    if isinstance(ref, torch.Tensor):
        t = j["tensor"]
        assert t["dtype"] == DTYPES[ref.dtype], where
        assert t["size"] == list(ref.shape) and t["stride"] == list(ref.stride()), where
        assert t["offset"] == ref.storage_offset(), where
        assert t["parameter"] == isinstance(ref, torch.nn.Parameter) and t["requires_grad"] == ref.requires_grad, where
        got = (out / t["file"]).read_bytes()
        want = ref.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if ref.numel() else b""
        assert got == want, f"{where}: tensor bytes differ"
    elif isinstance(ref, torch.dtype):
        assert j["record"] == str(ref), where
    elif isinstance(ref, argparse.Namespace):
        assert j["record"] == "argparse.Namespace"
        compare(j["state"], vars(ref), out, where + ".args")
    elif isinstance(ref, io.BytesIO):
        assert j["record"] == "io.BytesIO"
        assert bytes.fromhex(j["state"]["tuple"][0]["bytes"]) == ref.getvalue(), where
    elif hasattr(ref, "__class__") and ref.__class__.__module__.startswith("megatron") and hasattr(ref, "value"):
        assert j["record"] == f"{type(ref).__module__}.{type(ref).__name__}", where
        compare(j["args"]["tuple"][0], ref.value, out, where + ".value")
    elif isinstance(ref, np.ndarray):
        assert j["record"] in ("numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct"), where
        state = j["state"]["tuple"]
        assert state[1]["tuple"] == list(ref.shape), where
        assert bytes.fromhex(state[4]["bytes"]) == ref.tobytes(), where
    elif isinstance(ref, torch.Size):
        assert [x for x in j["tuple"]] == list(ref), where
    elif isinstance(ref, dict):
        assert [k for k, _ in j["dict"]] == list(ref.keys()), where
        for (k, v), rv in zip(j["dict"], ref.values()):
            compare(v, rv, out, f"{where}.{k}")
    elif isinstance(ref, (list, tuple)):
        kind = "list" if isinstance(ref, list) else "tuple"
        assert kind in j and len(j[kind]) == len(ref), where
        for i, (a, b) in enumerate(zip(j[kind], ref)):
            compare(a, b, out, f"{where}[{i}]")
    elif isinstance(ref, float):
        assert j["float"] == ref, where
    elif isinstance(ref, bytes):
        assert bytes.fromhex(j["bytes"]) == ref, where
    else:
        assert isinstance(ref, (int, str, bool, type(None))), f"{where}: unexpected {type(ref)}"
        assert j == ref and type(j) is type(ref), f"{where}: {j!r} != {ref!r}"


def test_read_matches_torch_load(saved, tmp_path):
    d, path, ref = saved
    j, out = load_dump(path, tmp_path)
    compare(j, ref, out)


def tensors_of(ref, prefix="root"):
    if isinstance(ref, torch.Tensor):
        yield prefix, ref
    elif isinstance(ref, dict):
        for k, v in ref.items():
            yield from tensors_of(v, f"{prefix}.{k}")
    elif isinstance(ref, (list, tuple)):
        for i, v in enumerate(ref):
            yield from tensors_of(v, f"{prefix}[{i}]")


def test_sub_box_reads(saved, tmp_path):
    """read_tensor of the sub-box [size/2:] of every dimension equals torch's slice, for every
    tensor (strided, transposed, views, 0-d, empty, every dtype)."""
    _, path, ref = saved
    out = tmp_path / "halves"
    out.mkdir()
    p = run_dump(path, out, "--halves")
    assert p.returncode == 0, p.stderr
    files = sorted(out.glob("*.bin.half"), key=lambda f: int(f.name.split(".")[0]))
    tensors = [t for t in tensors_of(ref["model"])]
    # torch_dump numbers tensors in the JSON's order; find each by its file name in the JSON
    j = json.loads(p.stdout)
    model = dict((k, v) for k, v in j["dict"])["model"]["dict"]
    assert len(model) == len(tensors)
    checked = 0
    for (k, v), (_, t) in zip(model, tensors):
        want_t = t.detach()[tuple(slice(s // 2, None) for s in t.shape)].contiguous()
        want = want_t.reshape(-1).view(torch.uint8).numpy().tobytes() if want_t.numel() else b""
        got = (out / (v["tensor"]["file"] + ".half")).read_bytes()
        assert got == want, k
        checked += 1
    assert checked >= 20 and files


def test_views_share_one_storage(saved, tmp_path):
    _, path, _ = saved
    j, _ = load_dump(path, tmp_path)
    model = dict((k, v) for k, v in j["dict"][[k for k, _ in j["dict"]].index("model")][1]["dict"])
    keys = {model[k]["tensor"]["key"] for k in ("base", "row_view", "col_view", "transposed", "strided")}
    assert len(keys) == 1
    assert model["row_view"]["tensor"]["offset"] == 16 and model["col_view"]["tensor"]["stride"] == [8]


def rezip(src, dst, **kw):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", **{k: v for k, v in kw.items() if k != "force_zip64"}) as zout:
        for info in zin.infolist():
            with zout.open(info.filename, "w", force_zip64=kw.get("force_zip64", False)) as f:
                f.write(zin.read(info.filename))


@pytest.mark.parametrize("kind", ["zip64", "deflated"])
def test_rezipped(saved, tmp_path, kind):
    d, path, ref = saved
    dst = tmp_path / f"{kind}.pt"
    if kind == "zip64":
        rezip(path, dst, compression=zipfile.ZIP_STORED, force_zip64=True)
    else:
        rezip(path, dst, compression=zipfile.ZIP_DEFLATED, compresslevel=6)
        with zipfile.ZipFile(dst) as z:
            assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in z.infolist())
    assert torch.load(dst, weights_only=False)["iteration"] == 1000  # torch reads it too
    j, out = load_dump(dst, tmp_path)
    compare(j, ref, out)


def test_zip64_header_really_zip64(saved, tmp_path):
    _, path, _ = saved
    dst = tmp_path / "z64.pt"
    rezip(path, dst, compression=zipfile.ZIP_STORED, force_zip64=True)
    raw = dst.read_bytes()
    # Every local header carries a ZIP64 extra field (id 0x0001, 16 bytes of sizes).
    assert raw.count(b"\x01\x00\x10\x00") >= len(zipfile.ZipFile(dst).infolist())
    j, out = load_dump(dst, tmp_path)
    assert [k for k, _ in j["dict"]][0] == "args"


def test_byte_range(saved, tmp_path):
    _, path, ref = saved
    blob = tmp_path / "blob.bin"
    zbytes = path.read_bytes()
    blob.write_bytes(b"\x07" * 1000 + zbytes + b"trailing junk" * 10)
    j, out = load_dump(blob, tmp_path, "--offset", "1000", "--length", str(len(zbytes)))
    compare(j, ref, out)


@pytest.mark.parametrize("kind", ["stored", "zip64", "deflated", "byte_range"])
def test_file_extents(saved, tmp_path, kind):
    """TorchFile::tensor_extent (the range the store copies file to file): offered for every
    non-empty tensor that is one contiguous run of a stored entry, never for strided views or
    deflated entries; the file's bytes at that range equal torch's tensor bytes."""
    _, path, ref = saved
    args = []
    if kind == "stored":
        src = path
    elif kind == "byte_range":
        src = tmp_path / "blob.bin"
        zbytes = path.read_bytes()
        src.write_bytes(b"\x07" * 1000 + zbytes + b"trailing junk" * 10)
        args = ["--offset", "1000", "--length", str(len(zbytes))]
    else:
        src = tmp_path / f"{kind}.pt"
        if kind == "zip64":
            rezip(path, src, compression=zipfile.ZIP_STORED, force_zip64=True)
        else:
            rezip(path, src, compression=zipfile.ZIP_DEFLATED, compresslevel=6)
    j, out = load_dump(src, tmp_path, "--extents", *args)
    model = dict((k, v) for k, v in j["dict"])["model"]["dict"]
    raw = src.read_bytes()
    with_extent = 0
    for (k, v), (_, t) in zip(model, tensors_of(ref["model"])):
        t = t.detach()
        tj = v["tensor"]
        if kind == "deflated" or t.numel() == 0 or not t.is_contiguous():
            assert "extent" not in tj, k
            continue
        assert "extent" in tj, k
        off, n = tj["extent"]
        want = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        assert n == len(want) and raw[off:off + n] == want, k
        assert (out / (tj["file"] + ".extent")).read_bytes() == want, k
        with_extent += 1
    assert kind == "deflated" or with_extent >= 18


def test_old_archive_prefix(tmp_path):
    """Files saved under a custom archive name (the zip's top folder is the file's stem)."""
    t = torch.arange(10, dtype=torch.float32)
    path = tmp_path / "weights.bin"
    torch.save({"w": t[2:7]}, path)
    raw = tmp_path / "renamed.pt"
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(raw, "w") as zout:
        for i in zin.infolist():
            zout.writestr(i.filename.replace("archive/", "some_stem/", 1), zin.read(i.filename))
    ref = torch.load(raw)
    j, out = load_dump(raw, tmp_path)
    compare(j, ref, out)


def test_dcp_metadata(tmp_path):
    import torch.distributed.checkpoint as dcp
    sd = {"w": torch.ones(4, 4), "b": torch.zeros(3, dtype=torch.bfloat16), "step": 5, "extra": {"x": b"abc"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id=str(tmp_path / "dcp"))
    meta_path = tmp_path / "dcp" / ".metadata"
    p = run_dump(meta_path, None, "--pickle")
    assert p.returncode == 0, p.stderr
    j = json.loads(p.stdout)
    assert j["record"] == "torch.distributed.checkpoint.metadata.Metadata"
    import pickle
    ref = pickle.loads(meta_path.read_bytes())
    state = dict((k, v) for k, v in j["state"]["dict"])
    sdm = dict((k, v) for k, v in state["state_dict_metadata"]["dict"])
    assert set(sdm) == set(ref.state_dict_metadata)
    w = sdm["w"]
    assert w["record"] == "torch.distributed.checkpoint.metadata.TensorStorageMetadata"
    wstate = dict((k, v) for k, v in w["state"]["dict"])
    assert wstate["size"]["tuple"] == [4, 4]
    chunks = wstate["chunks"]["list"]
    assert len(chunks) == len(ref.state_dict_metadata["w"].chunks)
    c0 = dict((k, v) for k, v in chunks[0]["state"]["dict"])
    assert c0["sizes"]["tuple"] == list(ref.state_dict_metadata["w"].chunks[0].sizes)
    # TensorProperties.__getstate__: (dtype, layout, requires_grad, memory_format, pin_memory)
    props = wstate["properties"]["state"]["tuple"]
    assert props[0]["record"] == "torch.float32" and props[1]["args"]["tuple"] == ["torch.strided"]
    storage = state["storage_data"]["dict"]
    assert len(storage) == len(ref.storage_data)
    for key, info in storage:
        assert key["record"] == "torch.distributed.checkpoint.metadata.MetadataIndex"
        assert info["record"] == "torch.distributed.checkpoint.filesystem._StorageInfo"
    assert sdm["extra.x"]["record"] == "torch.distributed.checkpoint.metadata.BytesStorageMetadata"


def test_pickle_protocols(tmp_path):
    """Plain pickles of every protocol 2-5 (the opcodes differ) parse to the same tree."""
    import pickle
    obj = {"a": [1, -2, 2**40, -(2**50), 1.25, None, True, False], "b": (b"xy", "z" * 300, ()),
           "c": collections.OrderedDict(k=(1,)), "d": {1, 2}, "e": frozenset([3])}
    trees = []
    for proto in (2, 3, 4, 5):
        p = tmp_path / f"p{proto}.pkl"
        p.write_bytes(pickle.dumps(obj, protocol=proto))
        r = run_dump(p, None, "--pickle")
        assert r.returncode == 0, (proto, r.stderr)
        trees.append(json.loads(r.stdout))
    for t in trees[1:]:
        assert t == trees[0]
    t = dict((k, v) for k, v in trees[0]["dict"])
    assert t["a"]["list"][2] == 2**40 and t["a"]["list"][3] == -(2**50)
    assert bytes.fromhex(t["b"]["tuple"][0]["bytes"]) == b"xy"
    assert sorted(t["d"]["list"]) == [1, 2] and t["e"]["list"] == [3]
