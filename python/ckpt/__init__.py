"""ckpt: open any checkpoint ckpt reads (native store, HuggingFace, Megatron, DCP) and read its
tensors, one rank's shard under any layout, or run the commands (verify, inspect, diff, reshard,
to_hf, from_hf, export_dcp, export_deepspeed, export_megatron, convert, plan) from Python. See docs/PYTHON.md."""
from ._ckpt import *  # noqa: F401,F403
from ._ckpt import Error  # noqa: F401
from .checkpoint import Checkpoint, ShardRegion, TensorInfo, numpy_dtype, open, pack_f4, parse_layout, to_torch, unpack_f4  # noqa: F401,A004
from .commands import (  # noqa: F401  (the commands: commands.py)
    convert, diff, export_dcp, export_deepspeed, export_megatron, from_hf, inspect, plan, reshard, to_hf, verify)
