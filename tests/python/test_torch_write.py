"""torch.save files written by ckpt (formats/torch/torch_file_writer.h, through
tests/tools/torch_write_tool) load in torch.load(weights_only=True) (argparse.Namespace allowed
with add_safe_globals, as Megatron-LM does), pass zipfile's CRC check, keep torch's 64-byte data
alignment, and their data.pkl also loads with a plain restricted pickle.Unpickler. Every tensor
equals the one torch rebuilds itself from the same storage bytes with as_strided (dtype, shape,
strides, storage offset, shared storages, parameters)."""
import argparse
import collections
import json
import pickle
import struct
import subprocess
import zipfile

import numpy as np
import pytest
import torch

torch.serialization.add_safe_globals([argparse.Namespace])

DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "U16": torch.uint16,
    "I32": torch.int32, "U32": torch.uint32, "I64": torch.int64, "U64": torch.uint64, "F16": torch.float16,
    "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


def storage_bytes(k, dtype, numel):
    """The tool's pattern, computed with numpy: byte j of storage k."""
    n = numel * torch.empty((), dtype=DTYPES[dtype]).element_size()
    j = np.arange(n, dtype=np.int64)
    b = (j + k) % 2 if dtype == "BOOL" else (31 * j + 17 * k + 3) % 251
    return b.astype(np.uint8).tobytes()


def expected_tensor(spec, node):
    idx = next(i for i, s in enumerate(spec["storages"]) if s["key"] == node["storage"])
    s = spec["storages"][idx]
    if s["numel"] == 0:
        return torch.empty(node["size"], dtype=DTYPES[s["dtype"]])
    flat = torch.frombuffer(bytearray(storage_bytes(idx, s["dtype"], s["numel"])), dtype=torch.uint8)
    flat = flat.view(DTYPES[s["dtype"]])
    return flat.as_strided(node["size"], node["stride"], node.get("offset", 0))


def raw(t):
    flat = torch.empty(t.numel(), dtype=t.dtype)
    flat.copy_(t.reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


REFS = {}


def check_value(spec, node, got):
    """Compares what torch.load returned with the spec node (independent expectation)."""
    if node is None or isinstance(node, (bool, int, float, str)):
        assert type(got) is type(node) and got == node, (got, node)
        return
    t = node["t"]
    if t == "ref":
        node = REFS[node["id"]]
        t = node["t"]
    if "id" in node:
        REFS[node["id"]] = node
    if t in ("list", "tuple"):
        assert type(got) is (list if t == "list" else tuple) and len(got) == len(node["v"])
        for n, g in zip(node["v"], got):
            check_value(spec, n, g)
    elif t in ("dict", "odict", "ns"):
        want = {"dict": dict, "odict": collections.OrderedDict, "ns": argparse.Namespace}[t]
        assert type(got) is want, (type(got), want)
        items = list(vars(got).items()) if t == "ns" else list(got.items())
        assert len(items) == len(node["v"])
        for (k, g), kv in zip(items, node["v"]):
            check_value(spec, kv[0], k)
            check_value(spec, kv[1], g)
    elif t == "bytes":
        assert got == bytes.fromhex(node["hex"])
    elif t == "dtype":
        assert got is getattr(torch, node["v"].split(".")[1])
    elif t == "tensor":
        exp = expected_tensor(spec, node)
        assert isinstance(got, torch.nn.Parameter) == bool(node.get("param", False))
        assert got.requires_grad == bool(node.get("requires_grad", False))
        assert got.dtype == exp.dtype and tuple(got.shape) == tuple(node["size"])
        assert tuple(got.stride()) == tuple(node["stride"]) and got.storage_offset() == node.get("offset", 0)
        assert raw(got.detach()) == raw(exp)
    else:
        raise AssertionError(t)


def write(tool, tmp_path, spec, name="out.pt"):
    p = tmp_path / "spec.json"
    p.write_text(json.dumps(spec))
    out = tmp_path / name
    r = subprocess.run([tool("torch_write_tool"), str(p), str(out)], capture_output=True, text=True, timeout=60)
    return r, out


def check_zip(path, zip64):
    with zipfile.ZipFile(path) as z:
        assert z.testzip() is None
        names = z.namelist()
        arch = names[0].split("/")[0]
        for want in ("data.pkl", "byteorder", "version", ".format_version", ".storage_alignment", ".data/serialization_id"):
            assert f"{arch}/{want}" in names
        assert z.read(f"{arch}/byteorder") == b"little" and z.read(f"{arch}/version") == b"3\n"
        data = path.read_bytes()
        for info in z.infolist():  # torch's kFieldAlignment: every record's data at a multiple of 64
            n, e = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
            assert (info.header_offset + 30 + n + e) % 64 == 0, info.filename
            assert info.compress_type == zipfile.ZIP_STORED
    assert (b"PK\x06\x06" in data[-200:]) == zip64
    return arch


class RestrictedUnpickler(pickle.Unpickler):
    """A plain allow-list unpickler: rebuild functions return their arguments."""
    ALLOWED = {("collections", "OrderedDict"), ("argparse", "Namespace"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        if module == "torch._utils" and name.startswith("_rebuild_"):
            return lambda *a: (name, a)
        if module in ("torch", "torch.storage"):
            return f"{module}.{name}"
        raise pickle.UnpicklingError(f"forbidden global {module}.{name}")

    def persistent_load(self, pid):
        assert pid[0] == "storage" and len(pid) == 5
        return pid


def tensor(storage, size, stride, offset=0, **kw):
    return {"t": "tensor", "storage": storage, "size": size, "stride": stride, "offset": offset, **kw}


def contiguous_strides(size):
    st, acc = [], 1
    for d in reversed(size):
        st.insert(0, acc)
        acc *= d
    return st


def all_dtypes_spec():
    shapes = [[3, 5], [7], [], [2, 0, 3], [2, 3, 4], [1, 1, 1, 1, 2], [4, 4], [33], [2, 2, 2], [5, 1],
              [9], [3, 3], [6, 2], [1], [2, 5]]
    storages, entries = [], []
    for k, (name, shape) in enumerate(zip(DTYPES, shapes)):
        numel = int(np.prod(shape)) if shape else 1
        storages.append({"key": str(k), "dtype": name, "numel": numel})
        entries.append([f"t_{name}", tensor(str(k), shape, contiguous_strides(shape))])
    return {"storages": storages, "root": {"t": "dict", "v": entries}, "slab": 5}


def nested_spec(zip64=False):
    shared = {"t": "list", "id": 1, "v": [1, 2, {"t": "bytes", "hex": ""}]}
    root = {"t": "odict", "v": [
        ["model", {"t": "odict", "v": [
            ["w", tensor("0", [4, 6], [6, 1])],
            ["w_t", tensor("0", [6, 4], [1, 6])],               # transposed view of the same storage
            ["w_row2", tensor("0", [2, 3], [6, 2], offset=13)],  # strided view with an offset
            ["p", tensor("1", [3, 2], [2, 1], param=True, requires_grad=True)],
            ["g", tensor("1", [6], [1], requires_grad=True)],
        ]}],
        ["args", {"t": "ns", "v": [["tensor_model_parallel_size", 2], ["lr", 3e-4], ["bf16", True],
                                   ["name", "héllo ✓"], ["none", None], ["big", 2**40 + 3],
                                   ["neg", -(2**62)], ["small_neg", -7], ["layers", {"t": "list", "v": [1, 2, 3]}]]}],
        ["iteration", 1000],
        ["rng", {"t": "tuple", "v": ["MT19937", {"t": "bytes", "hex": "00ff80417f"}, 624, 0, 0.5, -1.25e300]}],
        ["nested", {"t": "dict", "v": [[1, "int key"], [{"t": "tuple", "v": [1, 2]}, "tuple key"],
                                       ["deep", {"t": "list", "v": [{"t": "list", "v": [{"t": "tuple", "v": []}]}]}]]}],
        ["a", shared], ["b", {"t": "ref", "id": 1}],
        ["dtype", {"t": "dtype", "v": "torch.bfloat16"}],
        ["many", {"t": "list", "v": list(range(2500))}],
    ]}
    storages = [{"key": "0", "dtype": "F32", "numel": 24}, {"key": "1", "dtype": "BF16", "numel": 6}]
    return {"storages": storages, "root": root, "force_zip64": zip64, "slab": 3}


@pytest.mark.parametrize("name,spec_fn", [("dtypes", all_dtypes_spec), ("nested", nested_spec),
                                          ("zip64", lambda: nested_spec(zip64=True))])
def test_torch_load_weights_only(tool, tmp_path, monkeypatch, name, spec_fn):
    spec = spec_fn()
    r, out = write(tool, tmp_path, spec, name=f"{name}.pt")
    assert r.returncode == 0, r.stderr
    arch = check_zip(out, zip64=spec.get("force_zip64", False))
    assert arch == name  # torch.save names the archive after the file
    got = torch.load(out, weights_only=True)
    check_value(spec, spec["root"], got)
    check_value(spec, spec["root"], torch.load(out, weights_only=True, mmap=True))  # storages sliced at their offsets
    if not spec.get("force_zip64"):  # torch computing each storage's offset from miniz's layout rules
        from torch.utils.serialization import config
        monkeypatch.setenv("TORCH_SERIALIZATION_DEBUG", "1")  # asserts computed == actual offsets
        config.load.calculate_storage_offsets = True
        try:
            check_value(spec, spec["root"], torch.load(out, weights_only=True, mmap=True))
        finally:
            config.load.calculate_storage_offsets = False
    if name == "nested":
        m = got["model"]
        assert m["w"].untyped_storage().data_ptr() == m["w_t"].untyped_storage().data_ptr()
        assert got["a"] is got["b"]  # one object, written once (memo)
    with zipfile.ZipFile(out) as z:
        plain = RestrictedUnpickler(__import__("io").BytesIO(z.read(f"{arch}/data.pkl"))).load()
    assert isinstance(plain, (dict, collections.OrderedDict))


def test_restricted_unpickler_sees_torch_form(tool, tmp_path):
    spec = nested_spec()
    r, out = write(tool, tmp_path, spec)
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(out) as z:
        data = z.read("out/data.pkl")
    assert data[:2] == b"\x80\x02"  # protocol 2, torch.save's default
    plain = RestrictedUnpickler(__import__("io").BytesIO(data)).load()
    name, args = plain["model"]["w_row2"]
    assert name == "_rebuild_tensor_v2"
    assert args[0] == ("storage", "torch.FloatStorage", "0", "cpu", 24)
    assert args[1:5] == (13, (2, 3), (6, 2), False) and args[5] == collections.OrderedDict()
    pname, pargs = plain["model"]["p"]
    assert pname == "_rebuild_parameter" and pargs[0][0] == "_rebuild_tensor_v2" and pargs[1] is True
    assert plain["args"].lr == 3e-4 and plain["rng"][1] == b"\x00\xff\x80\x41\x7f"


def test_refused_trees_leave_nothing(tool, tmp_path):
    bad = [
        {"storages": [{"key": "0", "dtype": "F32", "numel": 4}], "root": tensor("0", [5], [1])},      # past the storage
        {"storages": [{"key": "0", "dtype": "F32", "numel": 4}], "root": tensor("0", [2], [1], offset=3)},
        {"storages": [{"key": "0", "dtype": "F32", "numel": 4}, {"key": "0", "dtype": "F32", "numel": 4}], "root": None},
    ]
    for spec in bad:
        r, out = write(tool, tmp_path, spec)
        assert r.returncode == 3, r.stderr
        assert "TorchWriteInvalid" in r.stderr
        assert list(tmp_path.glob("out.pt*")) == []


# --- DCP directories (formats/torch/dcp/dcp_writer.h) ------------------------------------------------

def global_tensor(k, dtype, shape):
    n = int(np.prod(shape)) if shape else 1
    flat = torch.frombuffer(bytearray(storage_bytes(k, dtype, n)), dtype=torch.uint8).view(DTYPES[dtype])
    return flat.reshape(shape)


def write_dcp(tool, tmp_path, spec, name="dcp"):
    p = tmp_path / "dcp_spec.json"
    p.write_text(json.dumps(spec))
    out = tmp_path / name
    r = subprocess.run([tool("torch_write_tool"), "--dcp", str(p), str(out)], capture_output=True, text=True, timeout=60)
    return r, out


def dcp_spec(zip64=False):
    def grid(shape, cuts, ranks):  # chunks of a 2-D tensor cut at rows `cuts[0]` and columns `cuts[1]`
        rows = [0, *cuts[0], shape[0]]
        cols = [0, *cuts[1], shape[1]]
        out, i = [], 0
        for r0, r1 in zip(rows, rows[1:]):
            for c0, c1 in zip(cols, cols[1:]):
                out.append({"offset": [r0, c0], "extent": [r1 - r0, c1 - c0], "rank": ranks[i % len(ranks)]})
                i += 1
        return out
    return {
        "tensors": [
            {"name": "layers.0.w", "dtype": "F32", "shape": [6, 10], "chunks": grid([6, 10], ([2, 3], [7]), [0, 1, 2])},
            {"name": "layers.0.b", "dtype": "BF16", "shape": [10], "chunks": [
                {"offset": [0], "extent": [4], "rank": 1}, {"offset": [4], "extent": [6], "rank": 0}]},
            {"name": "step", "dtype": "I64", "shape": [], "chunks": [{"offset": [], "extent": [], "rank": 2}]},
            {"name": "emb", "dtype": "F16", "shape": [5, 3], "chunks": grid([5, 3], ([1], []), [2])},
            {"name": "u8", "dtype": "U8", "shape": [4, 4], "chunks": grid([4, 4], ([2], [2]), [0, 1])},
        ],
        "bytes": [{"fqn": "extra_state", "rank": 1,
                   "obj": {"t": "dict", "v": [["iteration", 7], ["name", "run"], ["shape", {"t": "tuple", "v": [1, 2]}]]}}],
        "force_zip64": zip64, "slab": 5, "flat_planner_data": not zip64,
    }


@pytest.mark.parametrize("zip64", [False, True])
def test_dcp_load(tool, tmp_path, zip64):
    import torch.distributed.checkpoint as dcp
    spec = dcp_spec(zip64)
    r, out = write_dcp(tool, tmp_path, spec)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    sd = {t["name"]: torch.zeros(t["shape"], dtype=DTYPES[t["dtype"]]) for t in spec["tensors"]}
    sd["extra_state"] = None
    dcp.load(sd, checkpoint_id=str(out))
    for k, t in enumerate(spec["tensors"]):
        assert torch.equal(sd[t["name"]], global_tensor(k, t["dtype"], t["shape"])), t["name"]
    assert sd["extra_state"] == {"iteration": 7, "name": "run", "shape": (1, 2)}
    # The metadata as torch reads it: the real dataclasses, chunk boxes and byte ranges.
    md = pickle.loads((out / ".metadata").read_bytes())
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, Metadata, MetadataIndex,
                                                       TensorStorageMetadata)
    assert isinstance(md, Metadata) and md.version == "1.0.0"
    w = md.state_dict_metadata["layers.0.w"]
    assert isinstance(w, TensorStorageMetadata) and w.size == torch.Size([6, 10]) and len(w.chunks) == 6
    assert w.properties.dtype == torch.float32 and w.properties.memory_format == torch.contiguous_format
    assert isinstance(md.state_dict_metadata["extra_state"], BytesStorageMetadata)
    assert md.planner_data == (None if zip64 else {k: (k,) for k in sd})
    info = md.storage_data[MetadataIndex("layers.0.w", torch.Size([2, 7]))]
    blob = (out / info.relative_path).read_bytes()[info.offset:info.offset + info.length]
    with zipfile.ZipFile(__import__("io").BytesIO(blob)) as z:  # each item is a torch.save zip
        assert z.testzip() is None
    item = torch.load(__import__("io").BytesIO(blob), weights_only=True)
    assert torch.equal(item, global_tensor(0, "F32", [6, 10])[2:3, 7:10])


def test_dcp_refused_layouts_leave_nothing(tool, tmp_path):
    base = {"name": "w", "dtype": "F32", "shape": [4, 4]}
    bad = [
        [{**base, "chunks": [{"offset": [0, 0], "extent": [4, 3]}]}],                                  # not covered
        [{**base, "chunks": [{"offset": [0, 0], "extent": [4, 4]}, {"offset": [1, 1], "extent": [1, 1]}]}],  # overlap
        [{**base, "chunks": [{"offset": [2, 0], "extent": [4, 4]}]}],                                  # outside
    ]
    for tensors in bad:
        r, out = write_dcp(tool, tmp_path, {"tensors": tensors})
        assert r.returncode == 3 and "DcpWriteInvalid" in r.stderr, r.stderr
        assert not (tmp_path / "dcp").exists() and not (tmp_path / "dcp.partial").exists()


def test_data_pkl_byte_identical_to_torch_save(tool, tmp_path):
    """The pickle is what torch.save itself writes for the same state dict, byte for byte: views
    sharing a storage, a transposed bf16 tensor, a float8 tensor (_rebuild_tensor_v3), a parameter,
    bytes, an argparse.Namespace, ints."""
    t = torch.arange(10, dtype=torch.float32)
    ref = collections.OrderedDict(
        a=t, b=t[2:5], c=torch.ones(2, 3, dtype=torch.bfloat16).t(), f8=torch.zeros(2, dtype=torch.float8_e4m3fn),
        p=torch.nn.Parameter(torch.zeros(2, 2, dtype=torch.float16)), n=3, big=-(2**40), bs=b"\x00\xff",
        ns=argparse.Namespace(x=1, y="z"))
    torch.save(ref, tmp_path / "ref.pt")
    spec = {"storages": [{"key": "0", "dtype": "F32", "numel": 10}, {"key": "1", "dtype": "BF16", "numel": 6},
                         {"key": "2", "dtype": "F8_E4M3", "numel": 2}, {"key": "3", "dtype": "F16", "numel": 4}],
            "root": {"t": "odict", "v": [
                ["a", tensor("0", [10], [1])], ["b", tensor("0", [3], [1], offset=2)], ["c", tensor("1", [3, 2], [1, 3])],
                ["f8", tensor("2", [2], [1])], ["p", tensor("3", [2, 2], [2, 1], param=True, requires_grad=True)],
                ["n", 3], ["big", -(2**40)], ["bs", {"t": "bytes", "hex": "00ff"}],
                ["ns", {"t": "ns", "v": [["x", 1], ["y", "z"]]}]]}}
    r, out = write(tool, tmp_path, spec, name="mine.pt")
    assert r.returncode == 0, r.stderr
    with zipfile.ZipFile(tmp_path / "ref.pt") as a, zipfile.ZipFile(out) as b:
        assert a.read("ref/data.pkl") == b.read("mine/data.pkl")
        for rec in ("byteorder", "version", ".format_version", ".storage_alignment"):
            assert a.read(f"ref/{rec}") == b.read(f"mine/{rec}")


def test_sink_fills_one_storage_from_pieces_in_any_order(tool, tmp_path):
    """TorchFileSink: a flat buffer storage filled by three pieces written back to front (CRC by
    crc32_combine), and one whole storage; a storage left incomplete is refused."""
    spec = {"storages": [{"key": "0", "dtype": "F32", "numel": 100}, {"key": "1", "dtype": "BF16", "numel": 8}],
            "root": {"t": "dict", "v": [["buf", tensor("0", [100], [1])], ["w", tensor("1", [2, 4], [4, 1])],
                                        ["view", tensor("0", [10, 3], [3, 1], offset=50)]]},
            "pieces": [{"storage": 0, "first": 0, "count": 37}, {"storage": 0, "first": 37, "count": 40},
                       {"storage": 0, "first": 77, "count": 23}, {"storage": 1, "first": 0, "count": 8}],
            "slab": 6}
    r, out = write(tool, tmp_path, spec)
    assert r.returncode == 0, r.stderr
    check_zip(out, zip64=False)
    check_value(spec, spec["root"], torch.load(out, weights_only=True))
    spec["pieces"] = spec["pieces"][1:]
    r, out = write(tool, tmp_path, spec, name="short.pt")
    assert r.returncode == 3 and "incomplete" in r.stderr, r.stderr
    assert list(tmp_path.glob("short.pt*")) == []


def random_spec(seed):
    """A random nested state dict: containers, scalars of every kind, tensors of random dtype,
    shape, strides and offsets over shared storages."""
    rng = np.random.default_rng(seed)
    names = list(DTYPES)
    storages = []
    for k in range(int(rng.integers(1, 5))):
        storages.append({"key": str(k), "dtype": names[int(rng.integers(len(names)))], "numel": int(rng.integers(1, 200))})

    def rand_tensor():
        k = int(rng.integers(len(storages)))
        numel = storages[k]["numel"]
        ndim = int(rng.integers(0, 4))
        size = [int(rng.integers(0, 5)) for _ in range(ndim)]
        stride = [int(rng.integers(0, 6)) for _ in range(ndim)]
        span = sum((s - 1) * st for s, st in zip(size, stride) if s > 0)
        if any(s == 0 for s in size):
            span = 0
        if span >= numel:
            size, stride, span = [1], [1], 0
        offset = int(rng.integers(0, numel - span))
        return tensor(str(k), size, stride, offset=offset, requires_grad=bool(rng.integers(2)) and
                      storages[k]["dtype"] in ("F32", "F64", "F16", "BF16"), param=bool(rng.integers(4) == 0))

    def rand_value(depth):
        kind = int(rng.integers(0, 12 if depth < 4 else 8))
        if kind == 0:
            return None
        if kind == 1:
            return bool(rng.integers(2))
        if kind == 2:
            return int(rng.integers(-(2**62), 2**62)) >> int(rng.integers(0, 62))
        if kind == 3:
            return float(rng.standard_normal() * 10.0 ** int(rng.integers(-300, 300)))
        if kind == 4:
            return "".join(chr(int(c)) for c in rng.integers(32, 0x2FFF, size=int(rng.integers(0, 8))))
        if kind == 5:
            return {"t": "bytes", "hex": bytes(rng.integers(0, 256, size=int(rng.integers(0, 9)), dtype=np.uint8)).hex()}
        if kind in (6, 7):
            return rand_tensor()
        n = int(rng.integers(0, 6))
        if kind == 8:
            return {"t": "list", "v": [rand_value(depth + 1) for _ in range(n)]}
        if kind == 9:
            return {"t": "tuple", "v": [rand_value(depth + 1) for _ in range(n)]}
        keys = list(dict.fromkeys(f"k{int(rng.integers(100))}" for _ in range(n)))
        t = ["dict", "odict", "ns"][kind - 10] if kind < 12 else "dict"
        return {"t": t, "v": [[k, rand_value(depth + 1)] for k in keys]}

    root = {"t": "dict", "v": [[f"entry{i}", rand_value(0)] for i in range(8)]}
    return {"storages": storages, "root": root, "slab": int(rng.integers(1, 64)), "force_zip64": bool(rng.integers(2))}


def test_random_trees_round_trip_through_torch_load(tool, tmp_path):
    for seed in range(25):
        spec = random_spec(seed)
        r, out = write(tool, tmp_path, spec, name=f"r{seed}.pt")
        assert r.returncode == 0, (seed, r.stderr)
        REFS.clear()
        check_value(spec, spec["root"], torch.load(out, weights_only=True))
        check_zip(out, zip64=spec["force_zip64"])
