"""The placement of an MoE checkpoint under a general layout (a list of pipelines, each stage with its layers, tp, ep,
etp; docs/RESHARD.md "General (heterogeneous) layouts", docs/MOE.md "General layouts"), restated for the tests from
those rules on top of moe_reference (Megatron-Core's symmetric rules), independently of ckpt's code:
  * ranks: stage index slowest, then pipeline, then TP rank (for s = 0, 1, ...: for every pipeline having a stage s:
    its tp ranks);
  * stage s of pipeline p holds what the symmetric layout "its view" gives its ranks: tp, ep, etp of the stage, the
    pipeline's layer split, and dp = the number of pipelines when every pipeline has the same stages (layers, tp,
    ep, etp), where the view's DP rank d is pipeline d; otherwise dp = 1 (the stage's experts over its own tp ranks);
  * ZeRO-1 (uniform pipelines only): the view's flat buffers (moe_reference.holdings with zero 1);
  * a stored piece lies inside one holding of its rank (a sub-box or sub-range of it), every element stored once.
The layout is the JSON dict of `ckpt reshard --layout FILE`: {"pipelines": [{"stages": [{"layers", "tp", "ep", "etp",
"device"}]}], "zero"}.
"""
import moe_reference
import numpy as np


def _stage_key(st):
    return st["layers"], st["tp"], st.get("ep", 1), st.get("etp", st["tp"])


def uniform(glay):
    """Every pipeline has the same stages (layers, tp, ep, etp)."""
    first = [_stage_key(st) for st in glay["pipelines"][0]["stages"]]
    return all([_stage_key(st) for st in pl["stages"]] == first for pl in glay["pipelines"])


def world_rank(glay, stage, pipeline, tp_rank):
    pls = glay["pipelines"]
    r = sum(pl["stages"][s]["tp"] for s in range(stage) for pl in pls if s < len(pl["stages"]))
    r += sum(pl["stages"][stage]["tp"] for pl in pls[:pipeline] if stage < len(pl["stages"]))
    return r + tp_rank


def world_size(glay):
    return sum(st["tp"] for pl in glay["pipelines"] for st in pl["stages"])


def view(glay, p, s):
    """The symmetric layout (moe_reference's dict) placing stage s of pipeline p."""
    stages, P = glay["pipelines"][p]["stages"], len(glay["pipelines"])
    st = stages[s]
    return dict(tp=st["tp"], dp=P if uniform(glay) else 1, ep=st.get("ep", 1), etp=st.get("etp", st["tp"]),
                split=[x["layers"] for x in stages], zero=glay.get("zero", 0))


def general_holdings(cfg, tensors, glay):
    """Every (world rank, tensor name, box, a, b) a rank of the general layout `glay` holds (see the module's doc)."""
    u = uniform(glay)
    out = []
    for p in ([0] if u else range(len(glay["pipelines"]))):
        for s in range(len(glay["pipelines"][p]["stages"])):
            lay = view(glay, p, s)
            tp, n = lay["tp"], lay["tp"] * lay["dp"]
            for rank, name, box, a, b in moe_reference.holdings(cfg, tensors, lay):
                if rank // n != s:  # the view places the other stages at this stage's tp: not theirs
                    continue
                r = rank % n
                out.append((world_rank(glay, s, r // tp if u else p, r % tp), name, box, a, b))
    return out


def _elements(shape, box, a, b):
    """The row-major indices into the whole tensor of elements [a, b) of `box` ((offset, extent))."""
    idx = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
    return idx[tuple(slice(o, o + e) for o, e in zip(*box))].reshape(-1)[a:b]


def check_pieces(man, cfg, glay):
    """Every stored piece of the manifest lies inside one holding of its file's rank (general_holdings: under a general
    layout a piece may be a sub-box of a holding, e.g. of a rank holding every expert while another pipeline holds
    a few; docs/RESHARD.md "Overlap cells"), and every element of every tensor is stored exactly once. Returns the
    pieces checked."""
    shapes = {t["name"]: tuple(t["shape"]) for t in man["tensors"]}
    held = {}  # (rank, tensor) -> boolean masks over the whole tensor, one per holding
    for rank, name, box, a, b in general_holdings(cfg, list(shapes.items()), glay):
        mask = np.zeros(int(np.prod(shapes[name], dtype=np.int64)), bool)
        mask[_elements(shapes[name], box, a, b)] = True
        held.setdefault((rank, name), []).append(mask)
    count = {n: np.zeros(int(np.prod(s, dtype=np.int64)), np.int32) for n, s in shapes.items()}
    for p in man["pieces"]:
        name, box = p["tensor"], (p["region"]["offset"], p["region"]["extent"])
        a, b = p["region"].get("flat", [0, int(np.prod(box[1], dtype=np.int64))])
        rank = int(p["file"].split("/r")[-1].split(".")[0])  # shards/rNNNNN.h5
        idx = _elements(shapes[name], box, a, b)
        assert any(m[idx].all() for m in held.get((rank, name), [])), (name, rank, box, (a, b), glay)
        count[name][idx] += 1
    for n, c in count.items():
        assert c.min() == 1 and c.max() == 1, f"{n}: elements stored {c.min()}..{c.max()} times ({glay})"
    return len(man["pieces"])
