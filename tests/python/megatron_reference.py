"""Independent numpy reference of Megatron-LM (mcore GPT, LLaMA settings) per-rank tensors.

Written from /work/shared/FORMATS.md section 3, not from ckpt's C++:
  * linear_qkv packs rows per query group: reshape q to (ng, H/K*hd, in), k and v to (ng, hd, in),
    concatenate on axis 1, reshape to (-1, in); TP splits the packed tensor on dim 0.
  * linear_fc1 = [gate; up]; in legacy per-rank files TP rank r holds [gate_r; up_r].
  * column-parallel (dim 0): linear_qkv, linear_fc1 (+ biases); row-parallel (dim 1): linear_proj,
    linear_fc2 (biases replicated); vocab-parallel (dim 0): word_embeddings, output_layer;
    replicated: norms.
  * vocab padded with zero rows to ceil(V / (d*tp)) * d*tp, d = make-vocab-size-divisible-by.
  * legacy per-rank naming: layer index restarts at 0 in each pipeline stage; the first stage has
    the embedding, the last the final norm and output layer; tied embeddings with PP > 1: the last
    stage keeps a copy of the embedding as its output layer (mcore `output_layer.weight`); tied with
    PP == 1: no output_layer.
  * norm names: Transformer Engine spec (`self_attention.linear_qkv.layer_norm_weight`,
    `mlp.linear_fc1.layer_norm_weight`) or local spec (`input_layernorm.weight`,
    `pre_mlp_layernorm.weight`).
  * directories: mp_rank_{tp:02d} when PP == 1, else mp_rank_{tp:02d}_{pp:03d}.
"""
import numpy as np


def padded_vocab(vocab, tp, divisor):
    m = divisor * tp
    return -(-vocab // m) * m


def layers_per_stage(num_layers, pp, given=None):
    if given:
        assert len(given) == pp and sum(given) == num_layers
        return list(given)
    base, extra = divmod(num_layers, pp)
    return [base + (1 if s < extra else 0) for s in range(pp)]


def rank_dir(tp_rank, pp_rank, pp):
    return f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def _vocab_split(w, tp, divisor):
    v, h = w.shape
    p = padded_vocab(v, tp, divisor)
    full = np.zeros((p, h), dtype=w.dtype)
    full[:v] = w
    return np.split(full, tp, axis=0)


def _pack_qkv(q, k, v, H, K, hd):
    """HF q [H*hd, ...], k/v [K*hd, ...] -> Megatron linear_qkv [(H + 2K)*hd, ...] (per group)."""
    ng = K
    tail = q.shape[1:]
    qg = q.reshape((ng, H // K * hd) + tail)
    kg = k.reshape((ng, hd) + tail)
    vg = v.reshape((ng, hd) + tail)
    return np.concatenate([qg, kg, vg], axis=1).reshape((-1,) + tail)


def megatron_shards(cfg, hf, tp, pp, pp_layers=None, divisor=128, te_norms=True):
    """cfg: HF config dict; hf: name -> numpy array (HF names). Returns {rank_dir: {name: array}}."""
    H = cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", cfg["hidden_size"] // H)
    L = cfg["num_hidden_layers"]
    tied = cfg.get("tie_word_embeddings", False)
    assert K % tp == 0, "Megatron needs tp | num_query_groups"
    per_stage = layers_per_stage(L, pp, pp_layers)
    emb = _vocab_split(hf["model.embed_tokens.weight"], tp, divisor)
    head = None
    if not tied:
        head = _vocab_split(hf["lm_head.weight"], tp, divisor)
    elif pp > 1:
        head = emb

    out = {}
    first = 0
    for s in range(pp):
        layers = range(first, first + per_stage[s])
        first += per_stage[s]
        for r in range(tp):
            d = {}
            if s == 0:
                d["embedding.word_embeddings.weight"] = emb[r]
            for local, i in enumerate(layers):
                p = f"model.layers.{i}."
                m = f"decoder.layers.{local}."
                ln1 = "self_attention.linear_qkv.layer_norm_weight" if te_norms else "input_layernorm.weight"
                ln2 = "mlp.linear_fc1.layer_norm_weight" if te_norms else "pre_mlp_layernorm.weight"
                d[m + ln1] = hf[p + "input_layernorm.weight"]
                d[m + ln2] = hf[p + "post_attention_layernorm.weight"]
                for kind in ("weight", "bias"):
                    a = p + "self_attn.q_proj." + kind
                    if a in hf:
                        qkv = _pack_qkv(hf[a], hf[p + "self_attn.k_proj." + kind], hf[p + "self_attn.v_proj." + kind],
                                        H, K, hd)
                        d[m + "self_attention.linear_qkv." + kind] = np.split(qkv, tp, axis=0)[r]
                    g = p + "mlp.gate_proj." + kind
                    if g in hf:
                        gs = np.split(hf[g], tp, axis=0)
                        us = np.split(hf[p + "mlp.up_proj." + kind], tp, axis=0)
                        d[m + "mlp.linear_fc1." + kind] = np.concatenate([gs[r], us[r]], axis=0)
                d[m + "self_attention.linear_proj.weight"] = np.split(hf[p + "self_attn.o_proj.weight"], tp, axis=1)[r]
                d[m + "mlp.linear_fc2.weight"] = np.split(hf[p + "mlp.down_proj.weight"], tp, axis=1)[r]
                if p + "self_attn.o_proj.bias" in hf:
                    d[m + "self_attention.linear_proj.bias"] = hf[p + "self_attn.o_proj.bias"]
                if p + "mlp.down_proj.bias" in hf:
                    d[m + "mlp.linear_fc2.bias"] = hf[p + "mlp.down_proj.bias"]
            if s == pp - 1:
                d["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
                if head is not None:
                    d["output_layer.weight"] = head[r]
            out[rank_dir(r, s, pp)] = {k: np.ascontiguousarray(v) for k, v in d.items()}
    return out


def make_hf_model(cfg, rng, dtype=np.float32):
    """Random HF-named LLaMA tensors for config dict `cfg`."""
    H = cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", cfg["hidden_size"] // H)
    h, f, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    ab, mb = cfg.get("attention_bias", False), cfg.get("mlp_bias", False)

    def r(*shape):
        return rng.standard_normal(shape).astype(dtype)

    t = {"model.embed_tokens.weight": r(V, h), "model.norm.weight": r(h)}
    if not cfg.get("tie_word_embeddings", False):
        t["lm_head.weight"] = r(V, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = r(h)
        t[p + "post_attention_layernorm.weight"] = r(h)
        t[p + "self_attn.q_proj.weight"] = r(H * hd, h)
        t[p + "self_attn.k_proj.weight"] = r(K * hd, h)
        t[p + "self_attn.v_proj.weight"] = r(K * hd, h)
        t[p + "self_attn.o_proj.weight"] = r(h, H * hd)
        t[p + "mlp.gate_proj.weight"] = r(f, h)
        t[p + "mlp.up_proj.weight"] = r(f, h)
        t[p + "mlp.down_proj.weight"] = r(h, f)
        if ab:
            t[p + "self_attn.q_proj.bias"] = r(H * hd)
            t[p + "self_attn.k_proj.bias"] = r(K * hd)
            t[p + "self_attn.v_proj.bias"] = r(K * hd)
            t[p + "self_attn.o_proj.bias"] = r(h)
        if mb:
            t[p + "mlp.gate_proj.bias"] = r(f)
            t[p + "mlp.up_proj.bias"] = r(f)
            t[p + "mlp.down_proj.bias"] = r(h)
    return t


# ---------------------------------------------------------------------------------------------
# Native-store layout reference (docs/DESIGN.md, docs/RESHARD.md), written independently of the
# C++ planner: which elements of which canonical tensor each rank's shard file stores.
#   * stages: layer i -> stage_of_layer[i]; embedding on stage 0 (and on the last stage too when
#     tied and pp > 1); final norm and lm_head on the last stage.
#   * TP boxes: vocab-parallel rows [min(r*P/tp, V), min((r+1)*P/tp, V)) for embedding and head;
#     norms, o_proj.bias, down_proj.bias replicated; q/gate/up split dim 0; k/v split dim 0 when
#     tp divides K, else rank r holds KV head r // (tp/K); o/down split dim 1.
#   * rank = (pp_rank * dp + dp_rank) * tp + tp_rank.
#   * zero 0: every DP rank holds its TP box of every tensor of its stage. zero 1: optimizer
#     tensors go into one flat buffer per (stage, tp rank, kind = "optimizer.<kind>"): the TP boxes
#     of the stage's tensors of that kind in tensor-list order, concatenated, padded to a multiple
#     of 128*dp, split evenly over the DP ranks.
#   * a box (or flat range of it) held by several ranks is stored once, balanced: holdings cut into
#     segments; single-holder ones to their holder; shared ones largest first (ties: tensor, box,
#     start) to the holder with the fewest bytes so far (ties: lowest rank); adjacent runs merged.
# ---------------------------------------------------------------------------------------------

def layout_stage_of_layer(layers_per_stage):
    return [s for s, n in enumerate(layers_per_stage) for _ in range(n)]


def _layer_of(name):
    parts = name.split(".")
    for i, p in enumerate(parts[:-1]):
        if p == "layers" and i > 0 and parts[i - 1] == "model" and parts[i + 1].isdigit():
            return int(parts[i + 1])
    return -1


def native_tp_boxes(cfg, name, shape, tp, divisor):
    """List of tp (offset, extent) boxes of canonical tensor `name` (optimizer prefix stripped)."""
    H = cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", cfg["hidden_size"] // H)
    whole = (tuple(0 for _ in shape), tuple(shape))

    def rows(dim, b, e):
        off = [0] * len(shape)
        ext = list(shape)
        off[dim] = b
        ext[dim] = e - b
        return (tuple(off), tuple(ext))

    def even(dim):
        n = shape[dim] // tp
        return [rows(dim, r * n, (r + 1) * n) for r in range(tp)]

    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        V = shape[0]
        part = padded_vocab(V, tp, divisor) // tp
        return [rows(0, min(r * part, V), min((r + 1) * part, V)) for r in range(tp)]
    if "layernorm" in name or name == "model.norm.weight" or name.endswith("o_proj.bias") or \
            name.endswith("down_proj.bias"):
        return [whole] * tp
    if ".k_proj." in name or ".v_proj." in name:
        if K % tp == 0:
            return even(0)
        rep = tp // K
        return [rows(0, (r // rep) * hd, (r // rep + 1) * hd) for r in range(tp)]
    if ".q_proj." in name or ".gate_proj." in name or ".up_proj." in name:
        return even(0)
    if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
        return even(1)
    raise ValueError(f"no rule for {name}")


def native_rank_holdings(cfg, tensors, tp, layers_per_stage, dp=1, zero=0, divisor=128):
    """What every rank holds in memory (replicas included): list of (rank, tensor index, box, a, b),
    elements [a, b) of the box in row-major order (ZeRO-1 optimizer shards are partial ranges)."""
    pp = len(layers_per_stage)
    stage_of = layout_stage_of_layer(layers_per_stage)
    tied = cfg.get("tie_word_embeddings", False)
    holdings = []  # (rank, tensor index, box, a, b) in generation order
    info = []
    for ti, (name, shape) in enumerate(tensors):
        base, opt = name, None
        for k in ("optimizer.exp_avg_sq.", "optimizer.exp_avg.", "optimizer.fp32_param."):
            if name.startswith(k):
                base, opt = name[len(k):], k[:-1]
                break
        layer = _layer_of(base)
        if layer >= 0:
            stages = [stage_of[layer]]
        elif base == "model.embed_tokens.weight":
            stages = [0] + ([pp - 1] if tied and pp > 1 else [])
        else:
            stages = [pp - 1]
        boxes = native_tp_boxes(cfg, base, shape, tp, divisor)
        info.append((name, stages, boxes, opt))

    def numel(box):
        return int(np.prod(box[1], dtype=np.int64)) if len(box[1]) else 1

    for ti, (name, stages, boxes, opt) in enumerate(info):
        if zero == 1 and opt:
            continue
        for s in stages:
            for d in range(dp):
                for t in range(tp):
                    if numel(boxes[t]):
                        holdings.append(((s * dp + d) * tp + t, ti, boxes[t], 0, numel(boxes[t])))
    if zero == 1:
        kinds = []
        for name, stages, boxes, opt in info:
            if opt and opt not in kinds:
                kinds.append(opt)
        for s in range(pp):
            for t in range(tp):
                for kind in kinds:
                    segs, total = [], 0
                    for ti, (name, stages, boxes, opt) in enumerate(info):
                        if opt == kind and s in stages:
                            segs.append((ti, total, numel(boxes[t])))
                            total += numel(boxes[t])
                    if total == 0:
                        continue
                    pad = 128 * dp
                    shard = -(-total // pad) * pad // dp
                    for d in range(dp):
                        lo, hi = d * shard, (d + 1) * shard
                        for ti, off, n in segs:
                            a, b = max(lo, off) - off, min(hi, off + n) - off
                            if a < b:
                                holdings.append(((s * dp + d) * tp + t, ti, info[ti][2][t], a, b))
    return holdings


def native_rank_pieces(cfg, tensors, tp, layers_per_stage, dp=1, zero=0, divisor=128, elem_bytes=None):
    """tensors: list of (name, shape) in the checkpoint's tensor order. Returns the set of stored
    pieces as tuples (rank, name, offset, extent, flat) with flat = (begin, end) or None.
    elem_bytes: bytes per element of each tensor (default 4), for the balance."""
    holdings = native_rank_holdings(cfg, tensors, tp, layers_per_stage, dp, zero, divisor)

    def numel(box):
        return int(np.prod(box[1], dtype=np.int64)) if len(box[1]) else 1

    # De-duplicate with balance (bytes per rank).
    itemsize = [np.dtype(np.float32).itemsize if elem_bytes is None else elem_bytes[i] for i in range(len(tensors))]
    segs = []  # [ti, box, a, b, bytes, holders, rank]
    for ti in range(len(tensors)):
        mine = [h for h in holdings if h[1] == ti]
        for box in sorted({h[2] for h in mine}):
            cuts = sorted({x for h in mine if h[2] == box for x in (h[3], h[4])})
            for a, b in zip(cuts, cuts[1:]):
                hold = sorted({h[0] for h in mine if h[2] == box and h[3] <= a and b <= h[4]})
                if hold:
                    segs.append([ti, box, a, b, (b - a) * itemsize[ti], hold, -1])
    load = {}
    for s in segs:
        if len(s[5]) == 1:
            s[6] = s[5][0]
            load[s[6]] = load.get(s[6], 0) + s[4]
    shared = sorted((s for s in segs if len(s[5]) > 1), key=lambda s: -s[4])  # stable
    for s in shared:
        s[6] = min(s[5], key=lambda r: (load.get(r, 0), r))
        load[s[6]] = load.get(s[6], 0) + s[4]
    out = set()
    runs = []
    for s in segs:
        if runs and runs[-1][:3] == [s[6], s[0], s[1]] and runs[-1][4] == s[2]:
            runs[-1][4] = s[3]
        else:
            runs.append([s[6], s[0], s[1], s[2], s[3]])
    for rank, ti, box, a, b in runs:
        flat = None if (a, b) == (0, numel(box)) else (a, b)
        out.add((rank, tensors[ti][0], box[0], box[1], flat))
    return out


def read_native_pieces(ckpt_dir):
    """Reads a native store with h5py: list of (rank, name, offset, extent, flat, numpy bytes)."""
    import json as _json
    import pathlib as _pl
    import h5py
    try:
        import hdf5plugin  # noqa: F401  (zstd filter 32015)
    except ImportError:
        pass
    d = _pl.Path(ckpt_dir)
    m = _json.loads((d / "manifest.json").read_text())
    out = []
    files = {}
    for p in m["pieces"]:
        f = files.get(p["file"]) or files.setdefault(p["file"], h5py.File(d / p["file"], "r"))
        data = f[p["dataset"]][()]
        np_dt = {"F16": np.float16, "F32": np.float32, "F64": np.float64}.get(p.get("dtype"))
        if np_dt is not None and data.dtype != np_dt:  # half floats are stored as 16-bit integers
            data = data.view(np_dt)
        rank = int(p["file"].split("/r")[-1].split(".")[0])
        reg = p["region"]
        flat = tuple(reg["flat"]) if "flat" in reg else None
        out.append((rank, p["tensor"], tuple(reg["offset"]), tuple(reg["extent"]), flat, data))
    for f in files.values():
        f.close()
    return m, out


def global_region(arr, offset, extent, flat):
    sl = tuple(slice(o, o + e) for o, e in zip(offset, extent))
    v = arr[sl] if sl else arr
    return v.reshape(-1)[flat[0]:flat[1]] if flat else v


def write_native_store(tool, workdir, dst, cfg, tensors, layout=None):
    """Writes `tensors` (name -> numpy array, f32/f16) as a native store (one whole piece per
    tensor, one rank) with store_write_tool; metadata carries the HF config (and a layout)."""
    import json as _json
    import pathlib as _pl
    import subprocess as _sp
    workdir = _pl.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
    spec = {"dst": str(dst), "ranks": 1, "metadata": {"model_config": cfg}, "tensors": []}
    if layout is not None:
        spec["metadata"]["layout"] = layout
    for i, (name, a) in enumerate(tensors.items()):
        f = workdir / f"t{i}.bin"
        np.ascontiguousarray(a).tofile(f)
        spec["tensors"].append({"name": name, "dtype": names[a.dtype], "shape": list(a.shape), "data": str(f)})
    (workdir / "spec.json").write_text(_json.dumps(spec))
    _sp.run([tool, str(workdir / "spec.json")], check=True, capture_output=True)


def with_optimizer_state(tensors, rng):
    """Adds optimizer.{fp32_param (when weights are not f32), exp_avg, exp_avg_sq}.<name> (f32)."""
    out = dict(tensors)
    for kind in ("fp32_param", "exp_avg", "exp_avg_sq"):
        for name, a in tensors.items():
            if kind == "fp32_param" and a.dtype == np.float32:
                continue
            out[f"optimizer.{kind}.{name}"] = rng.standard_normal(a.shape).astype(np.float32)
    return out
