"""Megatron-Core's placement of an MoE checkpoint restated for the tests (docs/MOE.md "Layouts"; docs/RESHARD.md
"ZeRO-1 layout"), written from those rules, independently of ckpt's planner:
  * dense tensors: the TP boxes of megatron_reference.native_tp_boxes (vocab-parallel embedding and head, q/k/v and
    dense MLP rows, o/down columns, norms replicated); the router, q/k norms, the expert score bias and the shared
    expert gate replicated; rank = (pp_rank * dp + dp_rank) * tp + tp_rank;
  * stacked expert tensors [E, F, h] / [E, h, F]: the stage's tp x dp ranks regrouped as etp x ep x edp: stage-local
    rank r = dp_rank * tp + tp_rank holds experts [ep_rank * E/ep, ...) with ep_rank = (r // etp) % ep and the
    (r % etp)-th of etp even parts of F;
  * ZeRO-1 (Megatron-Core's distributed optimizer): per (stage, TP rank, kind) one flat buffer of the dense
    optimizer tensors' TP boxes in tensor-list order, padded to a multiple of 128 * dp, split evenly over the DP
    ranks; per (stage, expert data-parallel group = the ranks holding the same expert boxes, in stage-local rank
    order, kind) one flat buffer of the expert tensors' boxes, padded to 128 * edp, split evenly over the group.
    Only in an expert-parallel layout (ep > 1 or etp != tp): otherwise the experts are dense tensors of the dense
    buffers, as in Megatron-Core (experts.py: allreduce = not expert_parallel, expert_parallel = ep > 1; its
    DistributedDataParallel puts allreduce params in the dense buffers). ckpt also keeps ep = 1, etp != tp apart,
    where Megatron-Core would not (docs/MOE.md).
"""
import json

import numpy as np
from megatron_reference import layout_stage_of_layer, native_tp_boxes

_KINDS = ("optimizer.exp_avg_sq.", "optimizer.exp_avg.", "optimizer.fp32_param.")
_REPLICATED = ("mlp.gate.weight", "q_norm.weight", "k_norm.weight", "e_score_correction_bias", "shared_expert_gate.weight")


def fixture_tensors(hf_dir):
    """({canonical name: numpy array}, expert count) of an HF MoE directory in the per-expert ("legacy") naming
    (fixtures/moe/<family>/legacy, save_pretrained's files), the experts stacked as the store holds them: Mixtral's
    block_sparse_moe -> mlp, w1/w3/w2 -> gate_proj/up_proj/down_proj, experts.{e}.X [F, h] -> experts.X [E, F, h]."""
    from safetensors.numpy import load_file
    hf = load_file(hf_dir / "model.safetensors")
    cfg = json.loads((hf_dir / "config.json").read_text())
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    out, names = {}, {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    for k, v in hf.items():
        k2 = k.replace(".block_sparse_moe.", ".mlp.")
        parts = k2.split(".")
        if ".mlp.experts." in k2:  # model.layers.L.mlp.experts.E.PROJ.weight
            e, proj = int(parts[5]), names.get(parts[6], parts[6])
            name = ".".join(parts[:5] + [proj, "weight"])
            out.setdefault(name, np.zeros((experts,) + v.shape, v.dtype))[e] = v
        else:
            out[k2] = v
    return out, experts


def split_kind(name):
    """'optimizer.exp_avg.model.x' -> ('model.x', 'optimizer.exp_avg'); a weight -> (name, None)."""
    for k in _KINDS:
        if name.startswith(k):
            return name[len(k):], k[:-1]
    return name, None


def is_expert(base):
    return ".mlp.experts." in base


def boxes(cfg, base, shape, lay):
    """Per stage-local rank r (tp * dp of them) the (offset, extent) box it holds of tensor `base`."""
    tp, dp, ep, etp = lay["tp"], lay["dp"], lay["ep"], lay["etp"]
    cfg = dict(cfg, head_dim=cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])  # Mixtral: null
    out = []
    for r in range(tp * dp):
        if is_expert(base):
            fdim = 2 if "down_proj" in base else 1
            off, ext = [0] * len(shape), list(shape)
            off[0], ext[0] = ((r // etp) % ep) * (shape[0] // ep), shape[0] // ep
            off[fdim], ext[fdim] = (r % etp) * (shape[fdim] // etp), shape[fdim] // etp
            out.append((tuple(off), tuple(ext)))
        elif base.endswith(_REPLICATED):
            out.append((tuple(0 for _ in shape), tuple(shape)))
        else:
            out.append(native_tp_boxes(cfg, base, shape, tp, 128)[r % tp])
    return out


def _stages(base, lay):
    parts = base.split(".")
    if parts[:2] == ["model", "layers"]:
        return [layout_stage_of_layer(lay["split"])[int(parts[2])]]
    return [0] if base == "model.embed_tokens.weight" else [len(lay["split"]) - 1]


def _numel(box):
    return int(np.prod(box[1], dtype=np.int64)) if len(box[1]) else 1


def holdings(cfg, tensors, lay):
    """Every (world rank, tensor name, box, a, b) a rank holds (elements [a, b) of the box, row-major).
    tensors: list of (name, shape) in the store's tensor order; lay: tp, dp, ep, etp, split, zero."""
    tp, dp, n = lay["tp"], lay["dp"], lay["tp"] * lay["dp"]
    info = []  # (name, base, kind, stages, boxes per stage-local rank)
    for name, shape in tensors:
        base, kind = split_kind(name)
        info.append((name, base, kind, _stages(base, lay), boxes(cfg, base, shape, lay)))
    out = []
    for name, base, kind, stages, bx in info:
        if lay["zero"] and kind:
            continue
        out += [(s * n + r, name, bx[r], 0, _numel(bx[r])) for s in stages for r in range(n) if _numel(bx[r])]
    if not lay["zero"]:
        return out
    kinds = list(dict.fromkeys(k for _, _, k, _, _ in info if k))
    ep_layout = lay["ep"] > 1 or lay["etp"] != tp  # else the experts join the dense buffers (see the module's doc)
    for s in range(len(lay["split"])):
        groups = {}  # buffer key -> its members (stage-local ranks, in order)
        for r in range(n):
            groups.setdefault(("dense", r % tp), []).append(r)
            groups.setdefault(("expert", r % lay["etp"], (r // lay["etp"]) % lay["ep"]), []).append(r)
        for key, members in groups.items():
            for kind in kinds:
                segs, total = [], 0
                for name, base, k, stages, bx in info:
                    if k == kind and s in stages and (is_expert(base) and ep_layout) == (key[0] == "expert"):
                        segs.append((name, bx[members[0]], total))
                        total += _numel(bx[members[0]])
                shard = -(-total // (128 * len(members))) * 128
                for d, r in enumerate(members):
                    lo, hi = d * shard, (d + 1) * shard
                    out += [(s * n + r, name, box, max(lo, off) - off, min(hi, off + _numel(box)) - off)
                            for name, box, off in segs if max(lo, off) < min(hi, off + _numel(box))]
    return out


def check_pieces(man, cfg, lay):
    """Every stored piece of the manifest lies inside a holding of its file's rank (same tensor, same box, its flat
    range inside the holding's), and every element of every tensor is stored exactly once. Returns the pieces
    checked."""
    shapes = {t["name"]: t["shape"] for t in man["tensors"]}
    held = {}
    for rank, name, box, a, b in holdings(cfg, [(t["name"], t["shape"]) for t in man["tensors"]], lay):
        held.setdefault((rank, name, tuple(box[0]), tuple(box[1])), []).append((a, b))
    count = {n: np.zeros(int(np.prod(s, dtype=np.int64)), np.int32) for n, s in shapes.items()}
    for p in man["pieces"]:
        name, off, ext = p["tensor"], tuple(p["region"]["offset"]), tuple(p["region"]["extent"])
        a, b = p["region"].get("flat", [0, _numel((off, ext))])
        rank = int(p["file"].split("/r")[-1].split(".")[0])  # shards/rNNNNN.h5
        ranges = held.get((rank, name, off, ext), [])
        assert any(x <= a and b <= y for x, y in ranges), (name, rank, off, ext, (a, b), ranges, lay)
        idx = np.arange(count[name].size).reshape(shapes[name])[tuple(slice(o, o + e) for o, e in zip(off, ext))]
        count[name][idx.reshape(-1)[a:b]] += 1
    for n, c in count.items():
        assert c.min() == 1 and c.max() == 1, f"{n}: elements stored {c.min()}..{c.max()} times ({lay})"
    return len(man["pieces"])
