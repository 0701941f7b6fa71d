"""Expert parallelism in layouts (issue 37, docs/MOE.md "Layouts"), checked without ckpt's code:
random MoE layouts A and B (tp, uneven pp, dp, ep, etp, zero) of transformers' tiny Qwen3-MoE and Mixtral
(fixtures/moe): HF -> A -> B -> A (weights), and with Adam state (store_write_tool from numpy) src -> A -> B -> A
with ZeRO-1 drawn together with ep/etp, every piece checked against tests/python/moe_reference.py.
- B read by the independent h5py reader (scripts/native_h5py.py) equals the numpy stack of
  save_pretrained's per-expert tensors, every element held by exactly one stored piece;
- every stored piece of an expert tensor is the box its file's rank must hold by Megatron-Core's
  expert rank order, restated here (stage-local rank r = dp_rank * tp + tp_rank, expert TP rank
  r % etp, expert-parallel rank (r // etp) % ep);
- A -> B -> A gives A's pieces again, byte for byte (same regions, same digests).
Impossible layouts are refused by name before anything is written.
"""
import json
import pathlib
import random

import numpy as np
import pytest
from moe_reference import fixture_tensors
from native_h5py import read_native

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOE = ROOT / "fixtures" / "moe"


def _reference(family):
    """({canonical name: numpy array} of the fixture, the experts stacked as the store holds them; expert count)."""
    return fixture_tensors(MOE / family / "legacy")


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _random_layout(rng, layers, experts, width):
    tp = rng.choice([1, 2, 4])
    dp = rng.choice([1, 2, 4])
    pp = rng.choice([p for p in (1, 2, 3) if p <= layers])
    cuts = sorted(rng.sample(range(1, layers), pp - 1))
    split = [b - a for a, b in zip([0] + cuts, cuts + [layers])]
    ep = rng.choice([d for d in _divisors(tp * dp) if experts % d == 0])
    etp = rng.choice([d for d in _divisors(tp * dp // ep) if width % d == 0])
    lay = dict(tp=tp, pp=pp, dp=dp, ep=ep, etp=etp, split=split)
    lay["zero"] = rng.choice([0, 1])
    return lay


def _flags(lay):
    return ["--tp", lay["tp"], "--pp", lay["pp"], "--dp", lay["dp"], "--pp-layers", ",".join(map(str, lay["split"])),
            "--zero", lay["zero"], "--ep", lay["ep"], "--etp", lay["etp"]]


def _expected_box(lay, world_rank, shape, fdim):
    """The box world rank `world_rank` holds of a stacked expert tensor (F in dimension fdim)."""
    tp, dp, ep, etp = lay["tp"], lay["dp"], lay["ep"], lay["etp"]
    r = world_rank % (tp * dp)  # rank = (pp_rank * dp + dp_rank) * tp + tp_rank
    er, xr = r % etp, (r // etp) % ep
    off, ext = [0] * len(shape), list(shape)
    off[0], ext[0] = xr * shape[0] // ep, shape[0] // ep
    off[fdim], ext[fdim] = er * shape[fdim] // etp, shape[fdim] // etp
    return off, ext


def _check_pieces(man, lay):
    shapes = {t["name"]: t["shape"] for t in man["tensors"]}
    held = {n: np.zeros(s, np.int32) for n, s in shapes.items() if not n.startswith("optimizer.")}
    for p in man["pieces"]:
        name, off, ext = p["tensor"], p["region"]["offset"], p["region"]["extent"]
        if name not in held:
            continue
        box = tuple(slice(o, o + e) for o, e in zip(off, ext))
        held[name][box] += 1
        if ".mlp.experts." in name:
            rank = int(pathlib.Path(p["file"]).stem[1:])  # shards/rNNNNN.h5
            fdim = 2 if "down_proj" in name else 1
            assert [off, ext] == list(_expected_box(lay, rank, shapes[name], fdim)), (name, rank, off, ext, lay)
    for n, h in held.items():
        assert h.min() == 1 and h.max() == 1, f"{n}: elements held {h.min()}..{h.max()} times ({lay})"


def _pieces(man):
    return sorted((p["tensor"], json.dumps(p["region"], sort_keys=True), p["digest"]) for p in man["pieces"])


@pytest.mark.parametrize("family,seed", [("qwen3_moe", s) for s in (1, 2, 3, 6, 7)] + [("mixtral", s) for s in (4, 5, 8)])
def test_random_expert_layouts_against_numpy(run_ckpt, tmp_path, family, seed):
    rng = random.Random(seed)
    ref, experts = _reference(family)
    cfg = json.loads((MOE / family / "legacy" / "config.json").read_text())
    layers, width = cfg["num_hidden_layers"], cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    run_ckpt("from-hf", MOE / family / "legacy", tmp_path / "hf", "--no-fsync")
    a, b = _random_layout(rng, layers, experts, width), _random_layout(rng, layers, experts, width)
    run_ckpt("reshard", tmp_path / "hf", tmp_path / "A", *_flags(a))
    run_ckpt("reshard", tmp_path / "A", tmp_path / "B", *_flags(b))
    run_ckpt("reshard", tmp_path / "B", tmp_path / "A2", *_flags(a))
    man_b, got, _ = read_native(tmp_path / "B")
    assert sorted(got) == sorted(ref)
    for k, v in ref.items():
        assert np.array_equal(got[k], v), (k, a, b)
    _check_pieces(man_b, b)
    man_a = json.loads((tmp_path / "A" / "manifest.json").read_text())
    _check_pieces(man_a, a)
    assert _pieces(man_a) == _pieces(json.loads((tmp_path / "A2" / "manifest.json").read_text())), (a, b)


def _random_zero_layouts(rng, layers, experts, width):
    """Two random layouts, at least one of them ZeRO-1 with expert parallelism (ep or etp > 1)."""
    while True:
        a, b = _random_layout(rng, layers, experts, width), _random_layout(rng, layers, experts, width)
        if any(x["zero"] and x["ep"] * x["etp"] > 1 for x in (a, b)):
            return a, b


@pytest.mark.parametrize("family,seed", [("qwen3_moe", s) for s in (11, 12, 13, 14)] + [("mixtral", s) for s in (15, 16, 17)])
def test_random_expert_layouts_with_zero1_adam_state(tool, run_ckpt, tmp_path, family, seed):
    """Weights + Adam state (written by store_write_tool from numpy) through random layouts A -> B -> A, ZeRO-1 drawn
    with ep/etp: B read by h5py equals the numpy tensors; every stored piece of A and B lies in what its rank holds
    by Megatron-Core's rules restated in moe_reference (expert boxes, the dense flat buffers over dp and the expert
    ones over the expert data-parallel group, 128 * group padding, even split), every element stored once; A again
    byte for byte."""
    import megatron_reference as ref
    import moe_reference
    rng = random.Random(seed)
    cfg = json.loads((MOE / family / "legacy" / "config.json").read_text())
    ref_t, experts = _reference(family)
    tensors = ref.with_optimizer_state(ref_t, np.random.default_rng(seed))
    ref.write_native_store(tool("store_write_tool"), tmp_path / "spec", tmp_path / "src", cfg, tensors)
    layers, width = cfg["num_hidden_layers"], cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    a, b = _random_zero_layouts(rng, layers, experts, width)
    run_ckpt("reshard", tmp_path / "src", tmp_path / "A", *_flags(a))
    run_ckpt("reshard", tmp_path / "A", tmp_path / "B", *_flags(b))
    run_ckpt("reshard", tmp_path / "B", tmp_path / "A2", *_flags(a))
    man_b, got, _ = read_native(tmp_path / "B")
    assert sorted(got) == sorted(tensors)
    for k, v in tensors.items():
        assert np.array_equal(got[k], v), (k, a, b)
    assert moe_reference.check_pieces(man_b, cfg, b)
    man_a = json.loads((tmp_path / "A" / "manifest.json").read_text())
    assert moe_reference.check_pieces(man_a, cfg, a)
    assert _pieces(man_a) == _pieces(json.loads((tmp_path / "A2" / "manifest.json").read_text())), (a, b)


@pytest.mark.parametrize("flags,code,needle", [
    (["--tp", "2", "--pp", "1", "--dp", "1", "--ep", "4"], "BadLayout", "does not divide"),
    (["--tp", "1", "--pp", "1", "--dp", "3", "--ep", "3"], "LayoutRefused", "experts"),
    (["--tp", "1", "--pp", "1", "--dp", "16", "--ep", "1", "--etp", "16", "--zero", "0"], "LayoutRefused", "width"),
])
def test_impossible_expert_layouts_are_refused(run_ckpt, tmp_path, flags, code, needle):
    run_ckpt("from-hf", MOE / "qwen3_moe" / "legacy", tmp_path / "s", "--no-fsync")  # 8 experts of width 24
    p = run_ckpt("reshard", tmp_path / "s", tmp_path / "o", *flags, check=False)
    assert p.returncode != 0 and f"[{code}]" in p.stderr and needle in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["layout", "pipeline"])  # per stage: test_moe_general_layouts.py
def test_expert_parallelism_for_a_whole_layout_of_pipelines_is_refused(run_ckpt, tmp_path, where):
    cfg = json.loads((MOE / "qwen3_moe" / "legacy" / "config.json").read_text())
    run_ckpt("from-hf", MOE / "qwen3_moe" / "legacy", tmp_path / "s", "--no-fsync")
    lay = tmp_path / "general.json"
    pipe = {"micro_batch": 1, "stages": [{"layers": cfg["num_hidden_layers"], "tp": 2, "device": "A"}]}
    j = {"pipelines": [dict(pipe, etp=1) if where == "pipeline" else pipe, pipe], "zero": 0}
    lay.write_text(json.dumps(dict(j, ep=2) if where == "layout" else j))
    p = run_ckpt("reshard", tmp_path / "s", tmp_path / "o", "--layout", lay, check=False)
    assert p.returncode != 0 and "[LayoutUnsupported]" in p.stderr and "give ep and etp per stage" in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


def test_expert_parallelism_of_a_dense_model_is_refused(run_ckpt, tmp_path):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    transformers.LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(tmp_path / "dense")
    run_ckpt("from-hf", tmp_path / "dense", tmp_path / "s", "--no-fsync")
    p = run_ckpt("reshard", tmp_path / "s", tmp_path / "o", "--tp", "1", "--pp", "1", "--dp", "2", "--ep", "2", check=False)
    assert p.returncode != 0 and "[LayoutRefused]" in p.stderr and "dense model" in p.stderr, p.stderr


def test_inspect_shows_experts_and_bytes_per_expert_rank(run_ckpt, tmp_path):
    run_ckpt("from-hf", MOE / "qwen3_moe" / "legacy", tmp_path / "s", "--tp", "1", "--pp", "1", "--dp", "4", "--ep", "4",
             "--no-fsync")
    text = run_ckpt("inspect", tmp_path / "s").stdout
    ref, _ = _reference("qwen3_moe")
    expert_bytes = sum(v.nbytes for k, v in ref.items() if ".mlp.experts." in k)  # computed from transformers' file
    assert "ep=4 etp=1" in text, text
    line = next(ln for ln in text.splitlines() if ln.startswith("experts:"))
    assert "3 stacked tensors" in line and f"{expert_bytes / 4 / 1024:.2f} KiB per expert rank" in line, line
    lay = json.loads(run_ckpt("inspect", tmp_path / "s", "--json").stdout)["layout"]
    assert (lay["ep"], lay["etp"]) == (4, 1)


@pytest.mark.parametrize("flags", [
    ("--tp", "1", "--pp", "1", "--dp", "4", "--ep", "2", "--zero", "1"),                                  # edp 2
    ("--tp", "2", "--pp", "2", "--dp", "2", "--ep", "2", "--etp", "1", "--pp-layers", "1,2", "--zero", "1"),  # edp 2
    ("--tp", "2", "--pp", "1", "--dp", "2", "--ep", "1", "--etp", "1", "--zero", "1"),                     # edp 4
])
def test_zero1_shards_expert_state_over_the_expert_data_parallel_group(tool, run_ckpt, tmp_path, flags):
    """Adam state of an MoE store (written by store_write_tool from numpy) resharded to ZeRO-1 with expert
    parallelism: h5py reads back every optimizer tensor exactly; each expert optimizer element is held once, by a
    rank whose expert box it is (the box restated in _expected_box), and the ranks of one box's group share it."""
    import megatron_reference as ref
    ref_t, _ = _reference("qwen3_moe")
    tensors = ref.with_optimizer_state(ref_t, np.random.default_rng(0))
    cfg = json.loads((MOE / "qwen3_moe" / "legacy" / "config.json").read_text())
    ref.write_native_store(tool("store_write_tool"), tmp_path / "spec", tmp_path / "src", cfg, tensors)
    run_ckpt("reshard", tmp_path / "src", tmp_path / "z", *flags)
    man, got, _ = read_native(tmp_path / "z")
    for k, v in tensors.items():
        assert np.array_equal(got[k], v), k
    f = dict(zip(flags[::2], flags[1::2]))
    lay = dict(tp=int(f["--tp"]), dp=int(f["--dp"]), ep=int(f["--ep"]), etp=int(f.get("--etp", f["--tp"])))
    shapes = {t["name"]: t["shape"] for t in man["tensors"]}
    held, holders = {}, {}
    for p in man["pieces"]:
        name = p["tensor"]
        if not (name.startswith("optimizer.") and ".mlp.experts." in name):
            continue
        off, ext, rank = p["region"]["offset"], p["region"]["extent"], int(pathlib.Path(p["file"]).stem[1:])
        fdim = 2 if "down_proj" in name else 1
        assert [off, ext] == list(_expected_box(lay, rank, shapes[name], fdim)), (name, rank)
        a, b = p["region"].get("flat", [0, int(np.prod(ext))])
        h = held.setdefault((name, tuple(off)), np.zeros(int(np.prod(ext)), np.int32))
        h[a:b] += 1
        holders.setdefault((name.split(".")[1], name.split(".")[4], tuple(off)), set()).add(rank)  # kind, layer, box
    assert held and all(h.min() == 1 and h.max() == 1 for h in held.values())
    edp = lay["tp"] * lay["dp"] // (lay["ep"] * lay["etp"])
    assert max(len(r) for r in holders.values()) == edp  # sharded over the whole expert data-parallel group
