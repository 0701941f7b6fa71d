"""Expert parallelism per stage in general layouts (docs/MOE.md "General layouts"), checked without ckpt's code:
random layouts of 2-3 pipelines (uneven stage splits, per-stage tp, ep and etp, device names; ZeRO-1 drawn where
the pipelines are uniform) of transformers' tiny Qwen3-MoE and Mixtral (fixtures/moe) with Adam state written by
store_write_tool from numpy: src -> A -> B -> A.
- B read by the independent h5py reader (scripts/native_h5py.py) equals the numpy tensors;
- every stored piece of A and B lies inside what its rank holds by the rules restated in
  tests/python/moe_general_reference.py (each stage placed by Megatron-Core's symmetric rules of
  tests/python/moe_reference.py applied to the stage's view), every element stored exactly once;
- A -> B -> A gives A's pieces again, byte for byte.
Symmetric EP -> general EP -> one process, the general form of a symmetric EP layout storing the same pieces, to-hf
of a general-EP store (safetensors' tensors, transformers' logits), inspect, the Python module's layout dicts,
FlagScale meshes and mpirun; impossible layouts refused by name, nothing written.
"""
import json
import pathlib
import random

import moe_reference
import numpy as np
import pytest
from moe_general_reference import check_pieces, general_holdings, uniform, world_size
from moe_reference import fixture_tensors
from native_h5py import read_native

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOE = ROOT / "fixtures" / "moe"
MAX_WORLD = 16  # keeps every case about a second


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _stages(rng, layers, experts, width, view_dp):
    """One pipeline's stages: an uneven split, each stage its tp and an ep x etp dividing its view's tp x view_dp
    ranks (ep dividing the experts, etp their width)."""
    pp = rng.choice([p for p in (1, 2, 3) if p <= layers])
    cuts = sorted(rng.sample(range(1, layers), pp - 1))
    out = []
    for n in (b - a for a, b in zip([0] + cuts, cuts + [layers])):
        tp = rng.choice([1, 2, 2, 4])
        ep = rng.choice([d for d in _divisors(tp * view_dp) if experts % d == 0])
        etp = rng.choice([d for d in _divisors(tp * view_dp // ep) if width % d == 0])
        out.append(dict(layers=n, tp=tp, ep=ep, etp=etp))
    return out


def random_general(rng, layers, experts, width):
    """A random general layout dict with some stage expert parallel and at most MAX_WORLD ranks."""
    while True:
        P = rng.choice([2, 3])
        if rng.random() < 0.5:  # uniform pipelines: a stage's experts over every pipeline's ranks of it
            base = _stages(rng, layers, experts, width, P)
            pls = [[dict(st) for st in base] for _ in range(P)]
        else:
            pls = [_stages(rng, layers, experts, width, 1) for _ in range(P)]
        for stages in pls:
            for st in stages:
                st["device"] = rng.choice("AB")
        g = {"pipelines": [{"micro_batch": rng.choice([1, 2]), "stages": st} for st in pls], "zero": 0}
        if uniform(g):
            g["zero"] = rng.choice([0, 1])
        expert = any(st["ep"] > 1 or st["etp"] != st["tp"] for stages in pls for st in stages)
        if expert and world_size(g) <= MAX_WORLD:
            return g


def _write(path, glay):
    path.write_text(json.dumps(glay))
    return path


def _pieces(man):
    return sorted((p["tensor"], json.dumps(p["region"], sort_keys=True), p["digest"]) for p in man["pieces"])


def _source(tool, tmp_path, family, seed):
    """(src store of the fixture with Adam state, {name: numpy}, config, experts, layers, expert width)."""
    import megatron_reference as ref
    cfg = json.loads((MOE / family / "legacy" / "config.json").read_text())
    ref_t, experts = fixture_tensors(MOE / family / "legacy")
    tensors = ref.with_optimizer_state(ref_t, np.random.default_rng(seed))
    ref.write_native_store(tool("store_write_tool"), tmp_path / "spec", tmp_path / "src", cfg, tensors)
    width = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    return tmp_path / "src", tensors, cfg, experts, cfg["num_hidden_layers"], width


@pytest.mark.parametrize("family,seed", [("qwen3_moe", s) for s in (1, 2, 3, 4)] + [("mixtral", s) for s in (5, 6, 7)])
def test_random_general_expert_layouts_with_adam_state(tool, run_ckpt, tmp_path, family, seed):
    rng = random.Random(seed)
    src, tensors, cfg, experts, layers, width = _source(tool, tmp_path, family, seed)
    a, b = random_general(rng, layers, experts, width), random_general(rng, layers, experts, width)
    fa, fb = _write(tmp_path / "a.json", a), _write(tmp_path / "b.json", b)
    run_ckpt("reshard", src, tmp_path / "A", "--layout", fa)
    run_ckpt("reshard", tmp_path / "A", tmp_path / "B", "--layout", fb)
    run_ckpt("reshard", tmp_path / "B", tmp_path / "A2", "--layout", fa)
    man_b, got, _ = read_native(tmp_path / "B")
    assert sorted(got) == sorted(tensors)
    for k, v in tensors.items():
        assert np.array_equal(got[k], v), (k, a, b)
    assert check_pieces(man_b, cfg, b)
    man_a = json.loads((tmp_path / "A" / "manifest.json").read_text())
    assert check_pieces(man_a, cfg, a)
    assert _pieces(man_a) == _pieces(json.loads((tmp_path / "A2" / "manifest.json").read_text())), (a, b)


# Symmetric EP -> general EP (uniform, per-stage tp/ep/etp, ZeRO-1) -> general EP (non-uniform) -> symmetric EP ->
# one process.
UNIFORM = {"pipelines": [{"micro_batch": 2, "stages": [{"layers": 1, "tp": 2, "ep": 4, "etp": 1, "device": "A"},
                                                       {"layers": 2, "tp": 1, "ep": 2, "device": "B"}]},
                         {"micro_batch": 1, "stages": [{"layers": 1, "tp": 2, "ep": 4, "etp": 1, "device": "A"},
                                                       {"layers": 2, "tp": 1, "ep": 2, "device": "B"}]}], "zero": 1}
# Pipelines that differ (non-uniform): each stage's experts over its own tp ranks. Pipeline 0's device A ranks hold
# 2 of the 8 experts each (ep 4), pipeline 1's device B ranks all 8 at half their width (ep 1, etp = tp 2).
ASYMMETRIC = {"pipelines": [{"micro_batch": 3, "stages": [{"layers": 2, "tp": 4, "ep": 4, "etp": 1, "device": "A"},
                                                          {"layers": 1, "tp": 2, "ep": 2, "etp": 1, "device": "A"}]},
                            {"micro_batch": 1, "stages": [{"layers": 3, "tp": 2, "device": "B"}]}], "zero": 0}


def test_symmetric_to_general_to_one_process(tool, run_ckpt, tmp_path):
    src, tensors, cfg, *_ = _source(tool, tmp_path, "qwen3_moe", 21)
    run_ckpt("reshard", src, tmp_path / "sym", "--tp", "2", "--pp", "1", "--dp", "2", "--ep", "2", "--etp", "1", "--zero", "1")
    run_ckpt("reshard", tmp_path / "sym", tmp_path / "u", "--layout", _write(tmp_path / "u.json", UNIFORM))
    run_ckpt("reshard", tmp_path / "u", tmp_path / "x", "--layout", _write(tmp_path / "x.json", ASYMMETRIC))
    run_ckpt("reshard", tmp_path / "x", tmp_path / "sym2", "--tp", "1", "--pp", "3", "--dp", "4", "--ep", "4", "--zero", "1")
    run_ckpt("reshard", tmp_path / "sym2", tmp_path / "one", "--tp", "1", "--pp", "1", "--dp", "1")
    man, got, _ = read_native(tmp_path / "sym2")
    assert moe_reference.check_pieces(man, cfg, dict(tp=1, dp=4, ep=4, etp=1, split=[1, 1, 1], zero=1))
    for k, v in tensors.items():
        assert np.array_equal(got[k], v), k
    for d, lay in (("u", UNIFORM), ("x", ASYMMETRIC)):
        run_ckpt("verify", tmp_path / d)
        man, got, _ = read_native(tmp_path / d)
        assert check_pieces(man, cfg, lay)
        for k, v in tensors.items():
            assert np.array_equal(got[k], v), (d, k)
    man, got, _ = read_native(tmp_path / "one")
    assert len({p["file"] for p in man["pieces"]}) == 1
    for k, v in tensors.items():
        assert np.array_equal(got[k], v), k
    # inspect (global view): each stage's ep and etp; the tensors whole.
    det = json.loads(run_ckpt("inspect", tmp_path / "x", "--json").stdout)["layout_detail"]
    assert [[(st["tp"], st["ep"], st["etp"]) for st in pl["stages"]] for pl in det["pipelines"]] == [[(4, 4, 1), (2, 2, 1)],
                                                                                                   [(2, 1, 2)]]
    text = run_ckpt("inspect", tmp_path / "x").stdout
    assert "stage 0: layers 0-1, tp 4, ep 4 etp 1, device A" in text and "stage 0: layers 0-2, tp 2, device B" in text, text


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_general_form_of_a_symmetric_ep_layout_stores_the_same_pieces(tool, run_ckpt, tmp_path, family):
    """One definition of the expert rules: pipelines with one tp, ep and etp everywhere (named devices keep the general
    form) give every rank the same pieces, byte for byte, as the symmetric flags (ranks coincide by the rank order)."""
    src, _, cfg, *_ = _source(tool, tmp_path, family, 51)
    split = [1, 2] if cfg["num_hidden_layers"] == 3 else [1, 1]
    run_ckpt("reshard", src, tmp_path / "sym", "--tp", "2", "--pp", "2", "--dp", "2", "--ep", "2", "--etp", "1", "--zero", "1",
             "--pp-layers", ",".join(map(str, split)))
    stages = [{"layers": n, "tp": 2, "ep": 2, "etp": 1, "device": d} for n, d in zip(split, "AB")]
    run_ckpt("reshard", src, tmp_path / "gen", "--layout", _write(tmp_path / "g.json", {"pipelines": [{"stages": stages}] * 2,
                                                                                         "zero": 1}))
    sym, gen = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("sym", "gen"))
    assert "pipelines" in gen["layout"] and "pipelines" not in sym["layout"]

    def pieces(man):
        return sorted((p["file"], p["tensor"], json.dumps(p["region"], sort_keys=True), p["digest"]) for p in man["pieces"])
    assert pieces(gen) == pieces(sym)


@pytest.mark.parametrize("layout", [UNIFORM, ASYMMETRIC], ids=["uniform", "asymmetric"])
def test_to_hf_of_a_general_ep_store_gives_transformers_back(run_ckpt, tmp_path, layout):
    import torch
    import transformers
    from safetensors.numpy import load_file
    run_ckpt("from-hf", MOE / "qwen3_moe" / "legacy", tmp_path / "s", "--no-fsync")
    run_ckpt("reshard", tmp_path / "s", tmp_path / "g", "--layout", _write(tmp_path / "g.json", layout))
    run_ckpt("to-hf", tmp_path / "g", tmp_path / "hf", "--no-fsync")
    got = {}
    for f in sorted((tmp_path / "hf").glob("*.safetensors")):
        got.update(load_file(f))
    want = load_file(MOE / "qwen3_moe" / "legacy" / "model.safetensors")
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), k
    m = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        logits = m(torch.tensor(np.load(MOE / "qwen3_moe" / "tokens.npy"))).logits.numpy()
    np.testing.assert_allclose(logits, np.load(MOE / "qwen3_moe" / "logits.npy"), rtol=1e-6, atol=1e-6)


# One test per named error, through the CLI: nothing is written.
BAD = [
    ({"pipelines": [{"stages": [{"layers": 3, "tp": 2, "ep": 4, "etp": 1, "device": "A"}]},
                    {"stages": [{"layers": 3, "tp": 2, "device": "B"}]}]}, "BadLayout",
     "pipeline 0 stage 0: ep=4 x etp=1 does not divide the 2 ranks holding its experts"),
    ({"pipelines": [{"stages": [{"layers": 3, "tp": 2, "ep": 2, "etp": 1, "device": "A"}]},
                    {"stages": [{"layers": 3, "tp": 2, "device": "B"}]}], "zero": 1}, "BadLayout",
     "zero=1 needs every pipeline to hold the same layers at the same tp, ep and etp"),
    ({"pipelines": [{"stages": [{"layers": 3, "tp": 1, "ep": 3, "device": "A"}]}] * 3}, "LayoutRefused",
     "ep=3 does not divide the 8 experts"),
    ({"pipelines": [{"stages": [{"layers": 1, "tp": 2, "device": "A"}, {"layers": 2, "tp": 1, "ep": 1, "etp": 16}]},
                    {"stages": [{"layers": 1, "tp": 2, "device": "A"}, {"layers": 2, "tp": 1, "ep": 1, "etp": 16}]}]},
     "BadLayout", "pipeline 0 stage 1: ep=1 x etp=16 does not divide the 2 ranks"),
    ({"pipelines": [{"stages": [{"layers": 3, "tp": 4, "ep": 1, "etp": 16, "device": "A"}]}] * 4}, "LayoutRefused",
     "etp=16 does not divide the experts' width 24"),
    ({"pipelines": [{"stages": [{"layers": 3, "tp": 2, "device": "A"}]}], "ep": 2}, "LayoutUnsupported",
     "give ep and etp per stage"),
    ({"pipelines": [{"etp": 1, "stages": [{"layers": 3, "tp": 2, "device": "A"}]}]}, "LayoutUnsupported",
     "give ep and etp per stage"),
]


@pytest.mark.parametrize("layout,code,needle", BAD, ids=["ep-x-etp-over-stage-ranks", "zero1-ep-differs", "ep-experts",
                                                           "etp-over-view-ranks", "etp-width", "layout-ep", "pipeline-etp"])
def test_impossible_general_expert_layouts_are_refused(run_ckpt, tmp_path, layout, code, needle):
    run_ckpt("from-hf", MOE / "qwen3_moe" / "legacy", tmp_path / "s", "--no-fsync")  # 3 layers, 8 experts of width 24
    p = run_ckpt("reshard", tmp_path / "s", tmp_path / "o", "--layout", _write(tmp_path / "bad.json", layout), check=False)
    assert p.returncode != 0 and f"[{code}]" in p.stderr and needle in p.stderr, p.stderr
    assert not (tmp_path / "o").exists()


def test_general_expert_layout_of_a_dense_model_is_refused(run_ckpt, tmp_path):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    transformers.LlamaForCausalLM(cfg).to(torch.float32).save_pretrained(tmp_path / "dense")
    run_ckpt("from-hf", tmp_path / "dense", tmp_path / "s", "--no-fsync")
    lay = {"pipelines": [{"stages": [{"layers": 2, "tp": 2, "ep": 2, "etp": 1, "device": "A"}]}]}
    p = run_ckpt("reshard", tmp_path / "s", tmp_path / "o", "--layout", _write(tmp_path / "l.json", lay), check=False)
    assert p.returncode != 0 and "[LayoutRefused]" in p.stderr and "pipeline 0 stage 0" in p.stderr, p.stderr
    assert "dense model" in p.stderr, p.stderr


def test_python_module_takes_per_stage_ep_in_layout_dicts(tmp_path):
    """ckpt.reshard(layout=dict) into a general EP layout, and state_dict(layout=dict, rank=r): every rank gets exactly
    the tensors moe_general_reference says it holds, each numpy's slice of that rank's box."""
    ckpt = pytest.importorskip("ckpt", reason="the ckpt module: build target ckpt_python, PYTHONPATH=<build>/python")
    hf = MOE / "qwen3_moe" / "legacy"
    cfg = json.loads((hf / "config.json").read_text())
    ref, _ = fixture_tensors(hf)
    ckpt.from_hf(hf, tmp_path / "a", fsync=False)
    res = ckpt.reshard(tmp_path / "a", tmp_path / "b", layout=ASYMMETRIC)
    assert [st.get("ep", 1) for st in res["layout"]["pipelines"][0]["stages"]] == [4, 2], res["layout"]
    man, got, _ = read_native(tmp_path / "b")
    assert check_pieces(man, cfg, ASYMMETRIC)
    for k, v in ref.items():
        assert np.array_equal(got[k], v), k
    held = {}  # rank -> {tensor: box}
    for rank, name, box, _, _ in general_holdings(cfg, [(k, v.shape) for k, v in ref.items()], ASYMMETRIC):
        held.setdefault(rank, {})[name] = box
    experts = "model.layers.1.mlp.experts.down_proj.weight"
    assert sorted(r for r in held if experts in held[r]) == [0, 1, 2, 3, 4, 5]  # pipeline 0 at tp 4, pipeline 1 at tp 2
    with ckpt.open(tmp_path / "a") as c:
        for r in range(world_size(ASYMMETRIC)):
            sd = c.state_dict(layout=ASYMMETRIC, rank=r)
            assert sorted(sd) == sorted(held[r]), r
            for name, (off, ext) in held[r].items():
                want = ref[name][tuple(slice(o, o + e) for o, e in zip(off, ext))]
                assert sd[name].shape == want.shape and np.array_equal(sd[name], want), (r, name, off, ext)


def test_mpirun_reshard_into_a_general_ep_layout_equals_one_process(tool, ckpt_bin, run_ckpt, tmp_path):
    """Under mpirun -np 2 the shard files of a general EP layout (uniform, ZeRO-1) are split among the processes:
    the output is byte for byte the one process's."""
    import hashlib
    import subprocess
    from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd
    if MPIRUN is None:
        pytest.skip(SKIP_REASON)
    src, tensors, cfg, *_ = _source(tool, tmp_path, "mixtral", 31)
    lay = _write(tmp_path / "u.json", {"pipelines": [{"stages": [{"layers": 1, "tp": 2, "ep": 4, "etp": 1, "device": "A"},
                                                                {"layers": 1, "tp": 1, "ep": 2, "device": "B"}]}] * 2,
                                       "zero": 1})
    run_ckpt("reshard", src, tmp_path / "one", "--layout", lay)
    p = subprocess.run(mpirun_cmd(2, ckpt_bin, "reshard", src, tmp_path / "two", "--layout", lay), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr

    def digest(d):
        return {str(f.relative_to(d)): hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.rglob("*")) if f.is_file()}
    assert digest(tmp_path / "two") == digest(tmp_path / "one")
    man, got, _ = read_native(tmp_path / "two")
    for k, v in tensors.items():
        assert np.array_equal(got[k], v), k


def test_flagscale_meshes_with_expert_parallelism(tool, run_ckpt, tmp_path):
    """FlagScale's [tp, cp, ep, dp, pp] meshes with expert_tensor_parallel_size_per_process_mesh: each mesh's stages
    take its ep and etp (FlagScale's ParallelContext), pieces checked against the general layout they name."""
    src, tensors, cfg, *_ = _source(tool, tmp_path, "mixtral", 41)
    fs = {"hetero_process_meshes": [2, 1, 4, 2, 1, 1, 1, 2, 2, 1], "hetero_device_types": ["A", "B"],
          "hetero_pipeline_layer_split": [1, 1], "expert_tensor_parallel_size_per_process_mesh": [1, 1],
          "use_distributed_optimizer": True}
    run_ckpt("reshard", src, tmp_path / "f", "--layout", _write(tmp_path / "fs.json", fs))
    stages = [{"layers": 1, "tp": 2, "ep": 4, "etp": 1, "device": "A"}, {"layers": 1, "tp": 1, "ep": 2, "etp": 1, "device": "B"}]
    want = {"pipelines": [{"stages": stages}] * 2, "zero": 1}
    man, got, _ = read_native(tmp_path / "f")
    assert [pl["stages"] for pl in man["layout"]["pipelines"]] == [stages] * 2
    assert check_pieces(man, cfg, want)
    for k, v in tensors.items():
        assert np.array_equal(got[k], v), k
