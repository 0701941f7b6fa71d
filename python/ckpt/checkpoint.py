"""ckpt.open() and the Checkpoint object: any checkpoint ckpt reads, in global view.

    import ckpt
    with ckpt.open("run/step-00000100") as ck:          # native store, HF dir or .safetensors,
        ck.kind, len(ck), "lm_head.weight" in ck         # Megatron dirs, PyTorch DCP
        info = ck.tensors["model.embed_tokens.weight"]  # TensorInfo(name, dtype, shape)
        w = ck.read("model.embed_tokens.weight")        # numpy (bf16: ml_dtypes.bfloat16)
        part = ck.read("lm_head.weight", box=(slice(0, 8), slice(None)), dtype="float32")
        t = ck.read_torch("lm_head.weight")             # torch tensor over the same buffer
        mine = ck.state_dict(layout={"tp": 2, "pp": 2}, rank=3)  # exactly rank 3's shards

Every read goes through the C++ engine (box intersection with the stored pieces, dtype casts with
the store's rounding and overflow rules) with the GIL released; nothing is read that the request
does not need. Errors raise ckpt.Error subclasses carrying kind, code, file, tensor and message.
"""
import builtins
import json
import os
from typing import NamedTuple, Optional, Tuple

import numpy as np

from . import _ckpt

_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu")
# F4 (E2M1) is held two values per byte, as torch.float4_e2m1fn_x2 counts it: numpy sees the packed
# bytes (uint8, the last dimension counting pairs); unpack_f4 gives ml_dtypes.float4_e2m1fn values.
_PACKED_DTYPES = {"float4_e2m1fn_x2": "uint8"}
_OPTIMIZER_PREFIX = "optimizer."


def _invalid(message: str, tensor: str = ""):
    """An InvalidArgumentError raised on the Python side, with the attributes the C++ ones carry."""
    e = _ckpt.InvalidArgumentError(message)
    e.kind, e.code, e.file, e.tensor, e.message = "invalid argument", "InvalidArgument", "", tensor, message
    return e


def numpy_dtype(name) -> np.dtype:
    """The numpy dtype of a ckpt dtype name ("bfloat16", "BF16", "bf16", "float32"...), or of a numpy
    dtype / type given as is. bf16 and fp8 come from ml_dtypes."""
    if not isinstance(name, str):
        return np.dtype(name)
    name = _ckpt._dtype_name(name)
    if name in _PACKED_DTYPES:
        return np.dtype(_PACKED_DTYPES[name])
    if name in _ML_DTYPES:
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def _dtype_arg(dtype) -> Optional[str]:
    if dtype is None:
        return None
    if isinstance(dtype, str):
        return _ckpt._dtype_name(dtype)
    try:
        import torch
        if isinstance(dtype, torch.dtype):
            return _ckpt._dtype_name(str(dtype).replace("torch.", ""))
    except ImportError:
        pass
    return _ckpt._dtype_name(np.dtype(dtype).name)


class TensorInfo(NamedTuple):
    """A global tensor: canonical name, dtype (numpy's name: "float32", "bfloat16"...), shape."""
    name: str
    dtype: str
    shape: Tuple[int, ...]

    @property
    def numpy_dtype(self) -> np.dtype:
        return numpy_dtype(self.dtype)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * self.numpy_dtype.itemsize


class ShardRegion(NamedTuple):
    """Where a state_dict entry lies in its global tensor: a box (offset, extent), and for a ZeRO-1
    optimizer shard the flat row-major range [flat[0], flat[1]) of that box (else None)."""
    offset: Tuple[int, ...]
    extent: Tuple[int, ...]
    flat: Optional[Tuple[int, int]]


def _to_box(info: TensorInfo, box):
    """(offset, extent, dims to drop) of a read's box argument."""
    shape = info.shape
    if box is None:
        return [0] * len(shape), list(shape), []
    if (isinstance(box, (tuple, list)) and len(box) == 2 and all(isinstance(x, (tuple, list)) for x in box)):
        return [int(x) for x in box[0]], [int(x) for x in box[1]], []
    if not isinstance(box, tuple):
        box = (box,)
    offset, extent, drop = [], [], []
    for d, s in enumerate(box):
        dim = shape[d] if d < len(shape) else 0
        if isinstance(s, slice):
            if s.step not in (None, 1):
                raise _invalid(f"box of '{info.name}': slice step {s.step} (only 1)", info.name)
            start = 0 if s.start is None else int(s.start)
            stop = dim if s.stop is None else int(s.stop)
            start, stop = (start + dim if start < 0 else start), (stop + dim if stop < 0 else stop)
        elif isinstance(s, (int, np.integer)):
            start = int(s) + dim if s < 0 else int(s)
            stop = start + 1
            drop.append(d)
        else:
            raise _invalid(f"box of '{info.name}': {s!r} is not a slice or an int", info.name)
        offset.append(start)
        extent.append(stop - start)
    for d in range(len(box), len(shape)):
        offset.append(0)
        extent.append(shape[d])
    return offset, extent, drop


def _buffer(shape, np_dt):
    out = np.empty(tuple(max(0, int(e)) for e in shape), dtype=np_dt)
    return out, out.reshape(-1).view(np.uint8)


def to_torch(arr: np.ndarray):
    """A torch tensor over the same memory as `arr` (no copy); bf16 / fp8 through a bit view."""
    import torch
    name = arr.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    if name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
        return torch.from_numpy(arr.view(np.uint8)).view(getattr(torch, name))
    return torch.from_numpy(arr)


def unpack_f4(packed: np.ndarray) -> np.ndarray:
    """F4 bytes (ckpt's and torch's float4_e2m1fn_x2: two E2M1 values per byte, the first in the low
    nibble) as ml_dtypes.float4_e2m1fn values, the last dimension twice as long."""
    import ml_dtypes
    b = np.ascontiguousarray(packed).view(np.uint8)
    out = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*b.shape[:-1], 2 * b.shape[-1]) if b.ndim else b
    return out.view(ml_dtypes.float4_e2m1fn)


def pack_f4(values: np.ndarray) -> np.ndarray:
    """ml_dtypes.float4_e2m1fn values (last dimension even) packed two per byte, the first in the low nibble."""
    v = np.ascontiguousarray(values).view(np.uint8) & 0xF
    if v.ndim == 0 or v.shape[-1] % 2:
        raise _invalid(f"pack_f4: the last dimension must be even, got shape {tuple(v.shape)}")
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


def _finish(arr, framework):
    if framework in (None, "numpy", "np"):
        return arr
    if framework in ("torch", "pt"):
        return to_torch(arr)
    raise _invalid(f"framework {framework!r}: 'numpy' or 'torch'")


def parse_layout(layout) -> dict:
    """A layout as the engine takes it (reshard/layout/layout.h), from a dict ({"tp": 2, "pp": 2, "dp": 1,
    "zero": 1, "pp_layers": [1, 3]}, or any layout JSON: "layers_per_stage", "pipelines", "ep", "etp"...), a
    layout file's path, a JSON string, or the CLI's flags as a string ("tp=2 pp=2 dp=1
    pp_layers=1,3 ep=2 etp=1" or "--tp 2 --pp 2 --pp-layers 1,3 --ep 2")."""
    if isinstance(layout, dict):
        return dict(layout)
    if not isinstance(layout, str):
        raise _invalid(f"layout must be a dict or a string, got {type(layout).__name__}")
    text = layout.strip()
    if text.startswith("{"):
        return json.loads(text)
    if os.path.isfile(text):
        with builtins.open(text) as f:
            return json.load(f)
    words = text.replace("=", " ").split()
    if len(words) % 2:
        raise _invalid(f"layout {layout!r}: expected KEY VALUE pairs like 'tp=2 pp=2 dp=1'")
    out = {}
    for key, value in zip(words[::2], words[1::2]):
        key = key.lstrip("-").replace("-", "_")
        if key in ("pp_layers", "layers_per_stage"):
            out["layers_per_stage"] = [int(x) for x in value.split(",")]
        elif key in ("tp", "pp", "dp", "zero", "ep", "etp", "vocab_divisor"):
            out[key] = int(value)
        elif key == "profile":
            out[key] = value
        else:
            raise _invalid(f"layout {layout!r}: unknown key {key!r} (tp, pp, dp, zero, pp_layers, ep, etp, "
                                             "vocab_divisor, profile)")
    return out


class Checkpoint:
    """An open checkpoint (see the module docstring). Use as a context manager or call close()."""

    def __init__(self, handle):
        self._h = handle
        self.path = handle.path
        self.kind = handle.kind
        self.tensors = {n: TensorInfo(n, d, tuple(s)) for n, d, s in handle.tensors()}
        self.metadata = json.loads(handle.metadata_json())

    # ---- what the checkpoint carries ----
    @property
    def layout(self) -> Optional[dict]:
        return self.metadata.get("layout") if isinstance(self.metadata, dict) else None

    @property
    def profile(self) -> Optional[str]:
        md = self.metadata if isinstance(self.metadata, dict) else {}
        p = md.get("profile")
        if p is None and isinstance(md.get("layout"), dict):
            p = md["layout"].get("profile")
        return p

    @property
    def source_profile(self) -> Optional[str]:
        """The profile the files are stored in: a store in another vendor's profile opens in the
        canonical (reference) view, and says which one it came from here."""
        md = self.metadata if isinstance(self.metadata, dict) else {}
        return md.get("source_profile") or self.profile

    @property
    def model_config(self) -> Optional[dict]:
        return self.metadata.get("model_config") if isinstance(self.metadata, dict) else None

    @property
    def trainer_state(self) -> Optional[dict]:
        return self.metadata.get("trainer") if isinstance(self.metadata, dict) else None

    @property
    def closed(self) -> bool:
        return self._h.closed

    def __contains__(self, name) -> bool:
        return name in self.tensors

    def __len__(self) -> int:
        return len(self.tensors)

    def __iter__(self):
        return iter(self.tensors)

    def keys(self):
        return self.tensors.keys()

    def __getitem__(self, name):
        return self.read(name)

    def __repr__(self):
        return f"<ckpt.Checkpoint {self.kind} '{self.path}' {len(self)} tensors{' closed' if self.closed else ''}>"

    def close(self):
        self._h.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # ---- reads ----
    def read(self, name: str, box=None, dtype=None, framework: str = "numpy", saturate: bool = False):
        """Tensor `name` (or the box of it) as a numpy array (framework="torch": a torch tensor
        over the same buffer). box: (offset, extent), or a slice / int / tuple of them over the
        global shape (step 1; ints drop their dimension as in numpy). dtype: cast to it (the
        engine's casts: round to nearest even; overflow raises CastOverflowError unless saturate)."""
        self._h.require(name)
        info = self.tensors[name]
        offset, extent, drop = _to_box(info, box)
        dt = _dtype_arg(dtype) or info.dtype
        arr, raw = _buffer(extent, numpy_dtype(dt))
        self._h.read_into(name, offset, extent, 0, -1, dt, raw, saturate)
        if drop:
            arr = arr.reshape(tuple(e for d, e in enumerate(extent) if d not in drop))
        return _finish(arr, framework)

    def read_torch(self, name: str, box=None, dtype=None, saturate: bool = False):
        return self.read(name, box=box, dtype=dtype, framework="torch", saturate=saturate)

    def shard_regions(self, layout, rank: int = 0, optimizer: bool = True, profile: Optional[str] = None) -> dict:
        """{name: ShardRegion} of what `rank` holds under `layout` (the engine's plan)."""
        view = self._h.rank_view(json.dumps(parse_layout(layout)), int(rank), profile or "")
        return {n: ShardRegion(tuple(o), tuple(e), None if fe < 0 else (fb, fe))
                for n, _, o, e, fb, fe in view.pieces() if optimizer or not n.startswith(_OPTIMIZER_PREFIX)}

    def state_dict(self, layout=None, rank: int = 0, optimizer: bool = True, dtype=None, profile: Optional[str] = None,
                   framework: str = "numpy", saturate: bool = False) -> dict:
        """{name: array}. Without layout (and profile): every tensor whole, in global view. With a
        layout (dict, file, or flag string: see parse_layout): exactly the regions rank `rank` holds
        under it, as the engine plans them (reshard/planner.h rank_view with the model's sharding
        rules): each a box of its tensor, or under ZeRO-1 a 1-D flat range of the optimizer state.
        optimizer=False leaves out optimizer.* tensors. profile: the regions in that vendor
        profile's view (default: the checkpoint's own)."""
        dt = _dtype_arg(dtype)
        if layout is None and not profile:
            return {n: self.read(n, dtype=dt, framework=framework, saturate=saturate)
                    for n in self.tensors if optimizer or not n.startswith(_OPTIMIZER_PREFIX)}
        lay = parse_layout(layout) if layout is not None else {"tp": 1, "pp": 1, "dp": 1}
        view = self._h.rank_view(json.dumps(lay), int(rank), profile or "")
        out = {}
        for i, (name, tdt, _, extent, fb, fe) in enumerate(view.pieces()):
            if not optimizer and name.startswith(_OPTIMIZER_PREFIX):
                continue
            if name in out:
                raise _ckpt.InternalError(f"rank {rank} holds two regions of '{name}'")
            shape = (fe - fb,) if fe >= 0 else tuple(extent)
            want = dt or tdt
            arr, raw = _buffer(shape, numpy_dtype(want))
            view.read_into(i, want, raw, saturate)
            out[name] = _finish(arr, framework)
        return out


def open(path) -> Checkpoint:  # noqa: A001  (ckpt.open, like io.open)
    """Opens any checkpoint ckpt reads: a native store (checkpoint or run directory), a HuggingFace
    directory or .safetensors file, a Megatron directory (export-megatron safetensors, torch_dist,
    legacy torch), a PyTorch DCP directory. Raises NotFoundError / UnsupportedError /
    CorruptionError naming the path."""
    return Checkpoint(_ckpt._open(os.fspath(path)))
