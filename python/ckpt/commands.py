"""The ckpt commands as functions (the same library calls as the CLI, in this process).

Every function returns a dict with the fields the CLI's ``--json`` prints, raises the ckpt
exceptions (``ckpt.Error`` subclasses carrying ``kind``, ``code``, ``file``, ``tensor``,
``message``) on failure, and runs with the GIL released, so other Python threads keep running.
Outputs are written under a temporary name and renamed when complete: a failed command leaves
nothing that looks like a checkpoint.

``progress``: an optional ``callable(done_bytes, total_bytes)``, called from the command's worker
threads with the GIL held, at most every 0.1 s plus once at the end, with non-decreasing
``done_bytes``. If it raises, it is not called again, the command runs to its end (there is no
cancellation point inside the engine: the output is complete, or absent if the command failed)
and the exception is re-raised when the command returns. An error of the command itself takes
precedence over the callback's exception. Ctrl-C during a command: KeyboardInterrupt when it
returns.

Sizes (``max_memory``, ``max_shard_size``) take an int (bytes) or a string such as ``"256M"``,
``"5GB"``, ``"2GiB"``. Paths take ``str`` or ``os.PathLike``. Error messages name the CLI flag of
an option (``--max-memory`` for ``max_memory``).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import Any, Callable, Dict, Optional, Sequence, Union

from . import _ckpt

Path = Union[str, "os.PathLike[str]"]
Size = Union[int, str]
Progress = Optional[Callable[[int, int], Any]]

__all__ = ["verify", "inspect", "diff", "reshard", "convert", "to_hf", "from_hf", "export_dcp", "export_deepspeed", "export_megatron",
           "plan"]


def _path(p: Path) -> str:
    return os.fspath(p)


def _size(v: Size, name: str) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise TypeError(f"{name}: expected an int (bytes) or a size string like '256M', got {type(v).__name__}")
    return str(v)


def _opt_path(p: Optional[Path]) -> str:
    return "" if p is None else os.fspath(p)


def verify(path: Path, *, threads: int = 2, strict: bool = False, source_profile: Optional[str] = None,
           progress: Progress = None) -> Dict[str, Any]:
    """Checks a checkpoint: a native store's structure and every piece's digest; any other kind
    (safetensors, HF directory, Megatron, DCP) structurally, reading every byte.

    Returns ``{path, format, ok, structure_ok, checksums, pieces, bytes, seconds, failures,
    digests | note}``; each failure is ``{code, piece, tensor, file, dataset?, message}``.
    A path that cannot be opened raises. ``strict=True`` raises the first failure instead of
    returning it (a ``ckpt.ChecksumError`` for a flipped bit). ``source_profile``: the profile the
    checkpoint's tensors are stored in, as ``--source-profile`` (an HF or PaddleNLP directory, a
    .safetensors or .pdparams file; docs/PROFILES.md; None: detected)."""
    return _ckpt._verify(_path(path), {"threads": threads, "strict": strict, "source_profile": source_profile or ""}, progress)


def inspect(path: Path, *, source_profile: Optional[str] = None) -> Dict[str, Any]:
    """Summarizes a checkpoint of any kind as stored (a native store in a profile shows its
    profile's tensors): the dict ``ckpt inspect --json`` prints, ``{path, format, layout,
    layout_detail, profile, step, tensors, totals, integrity, codecs?}``; each tensor is ``{name,
    dtype, shape, pieces, bytes, stored_bytes?}``, ``layout_detail`` describes the layout's
    pipelines and stages (None without a layout), ``integrity`` is ``{scheme, note}``: what
    :func:`verify` checks and what the format cannot check. ``source_profile``: as :func:`verify`'s."""
    return _ckpt._inspect(_path(path), {"source_profile": source_profile or ""})


def diff(a: Path, b: Path, *, atol: float = 0.0, rtol: float = 0.0, ignore_dtype: bool = False,
         max_memory: Size = "256M", verify_source: bool = True, source_profile_a: Optional[str] = None,
         source_profile_b: Optional[str] = None) -> Dict[str, Any]:
    """Compares two checkpoints tensor by tensor in global view (any layouts, any formats).

    Returns ``{a, b, equal, atol, rtol, counts, tensors}``; ``tensors`` lists every tensor as
    ``{name, status, dtype_a, shape_a, dtype_b, shape_b, numel, bitwise_differ, not_close,
    nonfinite_differ, max_abs, max_rel, max_abs_index}`` (fields by status: identical, close,
    different, only_in_a, only_in_b, shape_mismatch, dtype_mismatch). Elements are close when
    ``|a - b| <= atol + rtol * |b|``. Both are checked by their formats' own checks (piece digests,
    zip CRC-32) unless ``verify_source`` is False: a corrupt side raises, with ``source_check``
    saying how each was checked. ``source_profile_a`` / ``_b``: the profile each side is stored in, as
    ``--source-profile`` / ``--b-source-profile`` (None: detected)."""
    opts = {"atol": float(atol), "rtol": float(rtol), "ignore_dtype": ignore_dtype,
            "max_memory": _size(max_memory, "max_memory"), "verify_source": verify_source,
            "source_profile_a": source_profile_a or "", "source_profile_b": source_profile_b or ""}
    return _ckpt._diff(_path(a), _path(b), opts)


@contextlib.contextmanager
def _layout_file(layout):
    """The path of a layout file for the engine: a path as is; a dict (e.g. ckpt.plan()'s
    ["best"]["layout"]), JSON text or flag string (ckpt.parse_layout) through a temporary file."""
    if layout is None or (not isinstance(layout, dict) and os.path.isfile(os.fspath(layout))):
        yield layout
        return
    from .checkpoint import parse_layout
    lay = parse_layout(layout)
    with tempfile.NamedTemporaryFile("w", suffix=".layout.json", delete=False) as f:
        json.dump(lay, f)
    try:
        yield f.name
    finally:
        os.unlink(f.name)


def _reshard_opts(layout, tp, pp, dp, zero, pp_layers, ep, etp, profile, profile_file, saturate, compress, digest,
                  threads, max_memory, io, dry_run, verify_source, convert, source_profile):
    return {"source_profile": source_profile or "", "layout": _opt_path(layout), "tp": tp, "pp": pp, "dp": dp, "zero": zero,
            "pp_layers": pp_layers or "", "ep": ep, "etp": etp,
            "profile": profile or "", "profile_file": _opt_path(profile_file), "saturate": saturate,
            "compress": compress, "digest": digest, "threads": threads,
            "max_memory": _size(max_memory, "max_memory"), "io": io, "dry_run": dry_run,
            "verify_source": verify_source, "convert": convert}


def reshard(src: Path, dst: Path, *, layout: Union[None, Path, dict] = None, tp: int = 0, pp: int = 0, dp: int = 0,
            zero: int = -1, pp_layers: Optional[str] = None, ep: int = 0, etp: int = 0,
            profile: Optional[str] = None,
            profile_file: Optional[Path] = None, saturate: bool = False, compress: str = "none",
            digest: str = "xxh3-128", threads: int = 2, max_memory: Size = "256M", io: str = "auto",
            dry_run: bool = False, verify_source: bool = True, source_profile: Optional[str] = None,
            progress: Progress = None) -> Dict[str, Any]:
    """Re-splits a checkpoint (native store, Megatron-layout, HF or DCP directory with a model
    config) for another TP/PP/DP(ZeRO) layout into a new native store ``dst``; with ``profile``
    it also converts to that profile in the same pass (see :func:`convert`).

    The layout is ``layout=`` (a layout JSON file, a dict such as ``ckpt.plan(...)["best"]["layout"]``,
    JSON text, or a flag string like ``"tp=2 pp=2 dp=1 pp_layers=1,3"``: see ``ckpt.parse_layout``)
    or ``tp``/``pp``/``dp``/``zero``/``pp_layers`` (values left at 0 / -1 / None keep the source's); ``ep``/``etp``:
    expert parallelism of an MoE model as ``--ep``/``--etp`` (docs/MOE.md; 0: not given). ``verify_source=False`` skips re-hashing the
    source before committing. ``dry_run=True`` only plans. ``source_profile``: the profile SRC's tensors are
    stored in, as ``--source-profile`` (an HF or PaddleNLP directory, a .safetensors or .pdparams file;
    docs/PROFILES.md; None: detected); the same keyword on every command that reads a checkpoint.

    Returns the plan summary ``{layout, tensors, pieces, source_bytes, bytes_read, bytes_written,
    peak_buffer, files: [{rank, file, pieces, bytes_read, bytes_written}], plan_seconds, memory}``
    (``memory``: ``{max_memory, floor, read_ahead}`` in bytes, docs/RESHARD.md) plus, when written, ``{dst,
    seconds, processes, source_check}`` (how the source's digests were checked: ``how`` "copy", with
    ``bytes_from_copy`` and ``bytes_reread``, or "process", "inline", "none") and for a profile
    conversion ``{profile, from_profile, exactness}``."""
    with _layout_file(layout) as lay:
        opts = _reshard_opts(lay, tp, pp, dp, zero, pp_layers, ep, etp, profile, profile_file, saturate, compress, digest,
                             threads, max_memory, io, dry_run, verify_source, False, source_profile)
        return _ckpt._reshard(_path(src), _path(dst), opts, progress)


def convert(src: Path, dst: Path, *, profile: Optional[str] = None, profile_file: Optional[Path] = None,
            saturate: bool = False, layout: Union[None, Path, dict] = None, tp: int = 0, pp: int = 0, dp: int = 0,
            zero: int = -1, pp_layers: Optional[str] = None, ep: int = 0, etp: int = 0, compress: str = "none",
            digest: str = "xxh3-128",
            threads: int = 2, max_memory: Size = "256M", io: str = "auto", dry_run: bool = False,
            verify_source: bool = True, source_profile: Optional[str] = None, progress: Progress = None) -> Dict[str, Any]:
    """Converts a checkpoint to another vendor/framework profile (``profile="megatron-mcore"``,
    ``"paddlenlp"``, ``"hf"``, ... or ``profile_file=``), optionally changing its layout in the
    same pass: :func:`reshard` with the profile required. A narrowing cast that overflows raises
    ``ckpt.CastOverflowError`` naming the tensors (nothing written) unless ``saturate=True``.
    Returns :func:`reshard`'s fields with ``exactness`` (the report also stored in the manifest)."""
    with _layout_file(layout) as lay:
        opts = _reshard_opts(lay, tp, pp, dp, zero, pp_layers, ep, etp, profile, profile_file, saturate, compress, digest,
                             threads, max_memory, io, dry_run, verify_source, True, source_profile)
        return _ckpt._reshard(_path(src), _path(dst), opts, progress)


def to_hf(src: Path, out: Path, *, dtype: Optional[str] = None, max_shard_size: Size = "5GB", threads: int = 2,
          max_memory: Size = "256M", io: str = "auto", fsync: bool = True, verify_source: bool = True,
          keep_quantized: bool = False, quantize: Optional[str] = None, source_profile: Optional[str] = None,
          progress: Progress = None) -> Dict[str, Any]:
    """Exports a checkpoint's model weights (any kind, any layout) as a HuggingFace directory
    ``out``: safetensors shards of at most ``max_shard_size``, the index when sharded,
    config.json and tokenizer files carried in the checkpoint. ``dtype``: cast float weights to
    ``"bf16"``, ``"fp16"`` or ``"fp32"`` (None keeps them).

    SRC is checked by its format's own checks before anything is committed, unless
    ``verify_source`` is False.

    A quantized SRC (block / per-tensor FP8, MXFP4; docs/QUANTIZATION.md) is dequantized into
    ``dtype`` (bf16 when None) unless ``keep_quantized``; ``quantize="fp8-block[:RxC]"`` writes the
    linear weights as block-scaled FP8.

    Returns ``{out, tensors, bytes, config, files, skipped, seconds, memory, source_check, quantization}``."""
    opts = {"dtype": dtype or "", "max_shard_size": _size(max_shard_size, "max_shard_size"), "threads": threads,
            "max_memory": _size(max_memory, "max_memory"), "io": io, "fsync": fsync, "verify_source": verify_source,
            "keep_quantized": keep_quantized, "quantize": quantize or "", "source_profile": source_profile or ""}
    return _ckpt._to_hf(_path(src), _path(out), opts, progress)


def from_hf(src: Path, dst: Path, *, dtype: Optional[str] = None, tp: int = 0, pp: int = 0, dp: int = 0,
            zero: int = -1, pp_layers: Optional[str] = None, ep: int = 0, etp: int = 0,
            profile: Optional[str] = None,
            profile_file: Optional[Path] = None, saturate: bool = False, compress: str = "none",
            digest: str = "xxh3-128", threads: int = 2, max_memory: Size = "256M", io: str = "auto",
            fsync: bool = True, source_profile: Optional[str] = None, progress: Progress = None) -> Dict[str, Any]:
    """Imports a HuggingFace LLaMA directory (or .safetensors file with config.json beside it, or a
    DCP directory of an HF state_dict) into a new native store ``dst``, laid out for
    ``tp``/``pp``/``dp`` when given (else tp=pp=dp=1), with expert parallelism ``ep``/``etp`` for an MoE model
    (docs/MOE.md; 0: not given), in ``profile`` when given.

    Returns ``{out, layout, tensors, bytes, side_files, skipped, seconds, memory}`` (+ ``profile``,
    ``exactness`` with a profile)."""
    opts = {"dtype": dtype or "", "tp": tp, "pp": pp, "dp": dp, "zero": zero, "pp_layers": pp_layers or "", "ep": ep, "etp": etp,
            "profile": profile or "", "profile_file": _opt_path(profile_file), "saturate": saturate,
            "compress": compress, "digest": digest, "threads": threads,
            "max_memory": _size(max_memory, "max_memory"), "io": io, "fsync": fsync, "source_profile": source_profile or ""}
    return _ckpt._from_hf(_path(src), _path(dst), opts, progress)


def export_dcp(src: Path, out: Path, *, dtype: Optional[str] = None, files: int = 1, source_chunks: bool = False,
               threads: int = 2, max_memory: Size = "256M", fsync: bool = True, verify_source: bool = True,
               source_profile: Optional[str] = None, progress: Progress = None) -> Dict[str, Any]:
    """Exports a checkpoint's model weights (any kind, any layout) as a torchtitan-style PyTorch
    Distributed Checkpoint ``out`` under the HuggingFace names, which
    ``torch.distributed.checkpoint.load(model.state_dict(), checkpoint_id=out)`` reads: ``files``
    ``__R_0.distcp`` files (tensors balanced by bytes), one chunk per tensor, or with
    ``source_chunks=True`` one per distinct box of the source's pieces. ``dtype``: cast float
    weights to ``"bf16"``, ``"fp16"`` or ``"fp32"`` (None keeps them). Optimizer state and rotary
    inv_freq buffers are left out. SRC is checked by its format's own checks before anything is
    committed, unless ``verify_source`` is False.

    Returns ``{out, tensors, chunks, bytes, files, skipped, source_check}``."""
    opts = {"dtype": dtype or "", "files": files, "source_chunks": source_chunks, "threads": threads,
            "max_memory": _size(max_memory, "max_memory"), "fsync": fsync, "verify_source": verify_source,
            "source_profile": source_profile or ""}
    return _ckpt._export_dcp(_path(src), _path(out), opts, progress)


def export_deepspeed(src: Path, out: Path, *, weights_only: bool = False, int_step: bool = False, step: Optional[int] = None,
                     threads: int = 2, max_memory: Size = "256M", fsync: bool = True, verify_source: bool = True,
                     progress: Progress = None) -> Dict[str, Any]:
    """Writes a checkpoint (any kind) as a DeepSpeed universal checkpoint ``out`` (its ``load_dir``:
    ``latest_universal``, ``global_stepN/zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt``, the model
    states files, ``zero/optimizer_state.pt``) that DeepSpeed resumes from with ``"checkpoint":
    {"load_universal": true}`` at any ZeRO stage and world size, the Adam state included. A source
    without Adam state is refused (DeepSpeedNoOptimizerState) unless ``weights_only``: zero moments
    and step 0, a fresh Adam. ``int_step``: the step as a Python int (DeepSpeed's FusedAdam);
    ``step``: the Adam step to write (None: the source's). docs/DEEPSPEED.md.

    Returns ``{out, tag, params, files, bytes, step, fresh_adam, source_check, memory}``."""
    opts = {"weights_only": weights_only, "int_step": int_step, "step": -1 if step is None else step, "threads": threads,
            "max_memory": _size(max_memory, "max_memory"), "fsync": fsync, "verify_source": verify_source}
    return _ckpt._export_deepspeed(_path(src), _path(out), opts, progress)


def export_megatron(src: Path, dst: Path, *, tp: int = 1, pp: int = 1, pp_layers: Union[None, str, Sequence[int]] = None,
                    vpp: int = 1, format: str = "safetensors", dtype: Optional[str] = None, vocab_divisor: int = 128,  # noqa: A002
                    local_norms: bool = False, iteration: int = 0, dist_opt: bool = False, dp: int = 1,
                    ddp_bucket_size: Optional[int] = None, dist_opt_sharding: str = "dp_reshardable",
                    megatron_version: Optional[str] = None, verify_source: bool = True,
                    source_profile: Optional[str] = None, progress: Progress = None) -> Dict[str, Any]:
    """Writes a checkpoint's model weights (any kind with a model config, in global view) as
    Megatron checkpoints for ``tp`` x ``pp`` ranks in the new directory ``dst``: ``format``
    ``"safetensors"`` (per-rank safetensors + megatron_args.json, which ckpt reads back),
    ``"torch"`` (Megatron-LM's legacy iter_N/mp_rank_*/model_optim_rng.pt, saved as ``iteration``)
    or ``"torch_dist"`` (a Megatron-Core dist_checkpointing directory). ``pp_layers``: layers per
    pipeline stage, a list or ``"1,3"`` (None: even split); ``vpp``: virtual (interleaved) pipeline
    chunks per stage (``"torch"``, ``"torch_dist"``; 1: none); ``vocab_divisor``: make-vocab-size-divisible-by;
    ``local_norms``: local-spec norm names instead of Transformer Engine's; ``dtype``: ``"bf16"``,
    ``"fp16"`` or ``"fp32"`` (None keeps the source's). ``megatron_version`` (torch_dist; None: the newest, 0.19): ``"0.19"``
    writes the common state as the DCP item common_state, ``"0.16"`` .. ``"0.18"`` as common.pt.
    ``dist_opt``: the Adam state as Megatron's distributed optimizer (torch: distrib_optim.pt; torch_dist:
    ``dist_opt_sharding`` ``"dp_reshardable"`` or ``"fully_reshardable"``), its buckets laid out for
    ``dp`` and ``ddp_bucket_size`` (None: one bucket); needs ``local_norms`` (docs/MEGATRON_DIST.md).
    SRC is checked by its format's own checks before anything is committed, unless ``verify_source``
    is False.

    Returns ``{out, format, tp, pp, vpp, iteration, dist_opt, dp, source_check}``."""
    if isinstance(pp_layers, str):
        pp_layers = [int(x) for x in pp_layers.split(",") if x.strip()]
    opts = {"format": format, "tp": tp, "pp": pp, "pp_layers": [int(x) for x in (pp_layers or [])], "vpp": vpp,
            "vocab_divisor": vocab_divisor, "dtype": dtype or "", "local_norms": local_norms, "iteration": iteration,
            "dist_opt": dist_opt, "dp": dp, "ddp_bucket_size": int(ddp_bucket_size or 0),
            "dist_opt_sharding": dist_opt_sharding, "megatron_version": megatron_version or "", "verify_source": verify_source,
            "source_profile": source_profile or ""}
    return _ckpt._export_megatron(_path(src), _path(dst), opts, progress)


def plan(cluster: Path, *, model: Optional[Path] = None, global_batch: int = 0, seq_len: int = 0, top: int = 3,
         evaluate: Optional[Path] = None, calibration: Optional[Path] = None, trainer_memory: bool = False,
         from_checkpoint: Optional[Path] = None, memory_model: str = "megatron") -> Dict[str, Any]:
    """The cost-model planner (``ckpt plan``, docs/PLAN.md) for the cluster file ``cluster``.

    Search (``model`` = a LlamaForCausalLM config.json, ``global_batch`` >= 1): returns ``{best,
    next, seconds, arrangements, evaluated, exhaustive, cross_node_tp, hand_written?,
    predicted_gain?}``; each candidate holds the cost fields (``step_time_s``, ``tokens_per_s``,
    ``stages``, ``pipelines``, ``ranks``, ``feasible``, ``problems``) with ``layout`` (a layout
    JSON object: write it to a file for :func:`reshard`), ``layout_text`` and ``placement``;
    ``next`` ones also ``why_slower``. ``from_checkpoint``: the model, batch and sequence length
    of a trainer checkpoint (result also has ``from``). ``evaluate``: a layout file's predicted
    cost instead (``trainer_memory=True`` adds ``ranks[].trainer_memory_bytes``).
    ``calibration``: the file of ``ckpt plan --calibrate -o FILE``. ``memory_model``: "megatron" (a
    real-precision stack) or "embedded" (``ckpt train``'s own estimate: a plan it accepts)."""
    opts = {"model": _opt_path(model), "global_batch": int(global_batch), "seq_len": int(seq_len), "top": int(top),
            "evaluate": _opt_path(evaluate), "calibration": _opt_path(calibration),
            "trainer_memory": trainer_memory, "from_checkpoint": _opt_path(from_checkpoint), "memory_model": memory_model}
    return _ckpt._plan(_path(cluster), opts)
