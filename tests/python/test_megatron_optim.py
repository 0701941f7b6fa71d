"""Megatron-LM legacy optimizer state (model_optim_rng.pt 'optimizer', non-distributed optimizer)
against megatron-core 0.16.1 itself.

Fixtures (tests/python/mcore_optim_fixtures.py, cached under $CKPT_BINARY_DIR/fixtures/
mcore_optim): mcore_fixtures.py's GPTModel (local spec) for tp=2 fp32 and pp=2 (uneven 2 + 4) bf16,
with the param groups of megatron-core's real _get_param_groups, two torch AdamW steps and the
state_dict megatron-core's FP32Optimizer / Float16OptimizerWithFloat16Params return (their
constructors need CUDA, so the wrapping is reproduced; see the fixture module), plus each rank's
param_groups.json: megatron-core's names of each group's parameters in order.
  * import: `ckpt reshard` of each fixture into a native store (read with h5py); the canonical
    exp_avg / exp_avg_sq / fp32_param, packed back per rank by megatron_reference's independent
    numpy packing, equal the fixture's own tensors for the ids megatron-core gave them (vocab
    padding rows excepted); the Adam step lands in the metadata.
  * export: that native store -> `export-megatron --format torch` at the fixture's layout ->
    torch.load(weights_only=True): model entries in megatron-core's order, the param groups'
    ids, and every moment / master / step equal the fixture's; round trip export -> import ->
    `ckpt diff` identical including the optimizer tensors.
  * bad input: state for an unknown id, a moment of the wrong shape, a missing exp_avg_sq, a
    group with a parameter too many -> named errors.
"""
import argparse
import json
import pathlib
import shutil
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import mcore_fixtures as mf  # noqa: E402
import mcore_optim_fixtures as mof  # noqa: E402
import megatron_reference as ref  # noqa: E402
from llama_shapes import hf_llama_shapes  # noqa: E402

CFG = {"vocab_size": mf.VOCAB, "hidden_size": mf.HIDDEN, "intermediate_size": mf.FFN,
       "num_hidden_layers": mf.LAYERS, "num_attention_heads": mf.HEADS, "num_key_value_heads": mf.GROUPS,
       "head_dim": mf.HIDDEN // mf.HEADS, "tie_word_embeddings": False}
KINDS = ("exp_avg", "exp_avg_sq")


def layout(name):
    tp, pp, bf16 = mof.LAYOUTS[name]
    per = [mf.FIRST_STAGE_LAYERS, mf.LAYERS - mf.FIRST_STAGE_LAYERS] if pp > 1 else None
    return tp, pp, bf16, per


def rank_files(d, tp, pp):
    for p in range(pp):
        for r in range(tp):
            yield ref.rank_dir(r, p, pp), mf._rank_file(pathlib.Path(d), r, p, pp)


def fixture_by_name(f, kind):
    """{mcore name: tensor} of the fixture rank file `f` for `kind` (exp_avg, exp_avg_sq, fp32),
    the ids named by megatron-core's param_groups.json (torch numbers them 0.. over the groups)."""
    ck = torch.load(f, weights_only=False)
    groups = json.loads((f.parent / "param_groups.json").read_text())
    opt = ck["optimizer"]
    adam = opt["optimizer"] if "optimizer" in opt else opt
    names = [n for g in groups for n in g]
    assert [i for g in adam["param_groups"] for i in g["params"]] == list(range(len(names)))
    if kind == "fp32":  # masters of the bf16 params, in group order; an fp32 param is its own master
        out = {}
        for grp, masters in zip(groups, opt["fp32_from_fp16_params"]):
            half = [n for n in grp if ck["model"][n].dtype != torch.float32]
            assert len(half) == len(masters)
            out.update(dict(zip(half, masters)))
            out.update({n: ck["model"][n] for n in grp if n not in half})
        return out
    return {names[i]: adam["state"][i][kind] for i in range(len(names))}


def real_rows(tp, pp, per):
    """Per rank: mcore name -> mask of the rows that are not vocab padding (numpy packing of ones)."""
    ones = {t: np.ones(s, np.float32) for t, s in ref_shapes().items()}
    return ref.megatron_shards(CFG, ones, tp, pp, per, mf.DIVISOR, te_norms=False)


def ref_shapes():
    H, K, hd, h, i, v = mf.HEADS, mf.GROUPS, mf.HIDDEN // mf.HEADS, mf.HIDDEN, mf.FFN, mf.VOCAB
    return hf_llama_shapes(h, i, v, mf.LAYERS, q_dim=H * hd, kv_dim=K * hd)


@pytest.fixture(scope="module", params=list(mof.LAYOUTS))
def imported(request, tmp_path_factory, ckpt_bin):
    """(fixture name, fixture dir, native store of its import, {canonical name: array})."""
    import subprocess
    from native_h5py import read_native
    name = request.param
    fx = mof.fixture(name)
    native = tmp_path_factory.mktemp("native") / "store"
    subprocess.run([ckpt_bin, "reshard", str(fx), str(native), "--tp", "1", "--pp", "1", "--dp", "1"],
                   check=True, capture_output=True)
    man, got, _ = read_native(native, skip=lambda n: not n.startswith("optimizer."))
    return name, fx, native, man, got


def test_import_moments_equal_megatron_core(imported):
    name, fx, _, man, got = imported
    tp, pp, bf16, per = layout(name)
    kinds = KINDS + (("fp32_param",) if bf16 else ())
    assert {n.split(".")[1] for n in got} == set(kinds)
    masks = real_rows(tp, pp, per)
    for kind in kinds:
        canonical = {n[len(f"optimizer.{kind}."):]: a for n, a in got.items() if n.startswith(f"optimizer.{kind}.")}
        assert set(canonical) == set(ref_shapes())
        packed = ref.megatron_shards(CFG, canonical, tp, pp, per, mf.DIVISOR, te_norms=False)
        for rank, f in rank_files(fx, tp, pp):
            want = fixture_by_name(f, "fp32" if kind == "fp32_param" else kind)
            assert set(want) == set(packed[rank]), rank
            for n, t in want.items():
                w = np.where(masks[rank][n] != 0, t.float().numpy(), 0)
                np.testing.assert_array_equal(packed[rank][n], w, err_msg=f"{kind} {rank} {n}")
    mg = man["megatron"]
    assert mg["optimizer_step"] == mof.STEPS and "optimizer_not_imported" not in mg
    assert mg["adam"]["weight_decay"] == pytest.approx(mof.WEIGHT_DECAY) and mg["adam"]["beta2"] == pytest.approx(0.95)


def export(run_ckpt, store, dst, name):
    tp, pp, bf16, per = layout(name)
    args = ["export-megatron", store, dst, "--format", "torch", "--tp", tp, "--pp", pp, "--local-norms",
            "--iteration", mf.ITERATION]
    if per:
        args += ["--pp-layers", ",".join(map(str, per))]
    run_ckpt(*args)


def test_export_equals_megatron_core_fixture(imported, run_ckpt, tmp_path):
    name, fx, native, _, _ = imported
    tp, pp, bf16, per = layout(name)
    export(run_ckpt, native, tmp_path / "mg", name)
    masks = real_rows(tp, pp, per)
    torch.serialization.add_safe_globals([argparse.Namespace])
    for (rank, f), (_, g) in zip(rank_files(fx, tp, pp), rank_files(tmp_path / "mg", tp, pp)):
        want = torch.load(f, weights_only=False)
        got = torch.load(g, weights_only=True)
        tensors = lambda ck: [k for k, v in ck["model"].items() if torch.is_tensor(v)]  # noqa: E731
        assert tensors(got) == tensors(want), rank  # megatron-core's named_parameters order
        wo, go = want["optimizer"], got["optimizer"]
        assert ("fp32_from_fp16_params" in go) == bf16
        wa, ga = (wo["optimizer"], go["optimizer"]) if bf16 else (wo, go)
        assert [g_["params"] for g_ in ga["param_groups"]] == [g_["params"] for g_ in wa["param_groups"]]
        assert [g_["wd_mult"] for g_ in ga["param_groups"]] == [g_["wd_mult"] for g_ in wa["param_groups"]]
        names = [n for grp in json.loads((f.parent / "param_groups.json").read_text()) for n in grp]
        for i, n in enumerate(names):
            m = torch.from_numpy(masks[rank][n] != 0)
            for kind in KINDS:
                assert torch.equal(ga["state"][i][kind], torch.where(m, wa["state"][i][kind], 0)), f"{rank} {n} {kind}"
            assert ga["state"][i]["step"].item() == mof.STEPS and ga["state"][i]["step"].dim() == 0
        if bf16:
            for gm, wm, grp in zip(go["fp32_from_fp16_params"], wo["fp32_from_fp16_params"], ga["param_groups"]):
                half = [names[i] for i in grp["params"] if want["model"][names[i]].dtype != torch.float32]
                assert len(gm) == len(wm) == len(half)
                for t, w, n in zip(gm, wm, half):
                    assert torch.equal(t, torch.where(torch.from_numpy(masks[rank][n] != 0), w, 0)), n


def test_round_trip_diff_identical(imported, run_ckpt, tmp_path):
    name, _, native, _, _ = imported
    export(run_ckpt, native, tmp_path / "mg", name)
    p = run_ckpt("diff", native, tmp_path / "mg", "--json", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    assert rep.get("identical", rep.get("equal")) is True, rep


# ---- bad input -------------------------------------------------------------------------------

def broken(tmp_path, edit):
    d = tmp_path / "fx"
    shutil.copytree(mof.fixture("optim_tp2"), d)
    f = mf._rank_file(d, 1, 0, 1)
    ck = torch.load(f, weights_only=False)
    edit(ck["optimizer"])
    torch.save(ck, f)
    return d


@pytest.mark.parametrize("edit,code,word", [
    (lambda o: o["state"].__setitem__(999, o["state"][0]), "MegatronOptimizerUnknownParam", "999"),
    (lambda o: o["state"][3].__setitem__("exp_avg", torch.zeros(2, 2)), "ShapeMismatch", "exp_avg"),
    (lambda o: o["state"][5].pop("exp_avg_sq"), "MegatronOptimizerMissingMoment", "exp_avg_sq"),
    (lambda o: o["state"].pop(7), "MegatronOptimizerMissingMoment", "7"),
    (lambda o: o["param_groups"][1]["params"].append(999), "MegatronOptimizerParams", "param_groups[1]"),
    (lambda o: o["state"][2].__setitem__("step", torch.tensor(5.0)), "MegatronOptimizerStep", "step 5"),
])
def test_bad_optimizer_state_named_error(edit, code, word, run_ckpt, tmp_path):
    d = broken(tmp_path, edit)
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0 and code in p.stderr and word in p.stderr and "mp_rank_01" in p.stderr, p.stderr


# ---- torch_dist export -----------------------------------------------------------------------

def test_torch_dist_export_moments_equal_numpy_packing(imported, run_ckpt, tmp_path):
    """export-megatron --format torch_dist --tp 2 of the imported store: torch's own DCP reader
    (dcp_to_torch_save) assembles optimizer.state.<kind>.<key> equal to the independent numpy
    packing of the canonical moments (layers stacked, norms under their TE names as megatron-core
    keys them in torch_dist), and common.pt carries the step as common_step."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    name, _, native, _, got = imported
    out = tmp_path / "dist"
    run_ckpt("export-megatron", native, out, "--format", "torch_dist", "--tp", "2", "--megatron-version", "0.16")
    dcp_to_torch_save(str(out), str(tmp_path / "g.pt"))
    g = torch.load(tmp_path / "g.pt", weights_only=False)
    for kind in KINDS:
        canonical = {n[len(f"optimizer.{kind}."):]: a for n, a in got.items() if n.startswith(f"optimizer.{kind}.")}
        want = ref.megatron_shards(CFG, canonical, 1, 1, None, mf.DIVISOR, te_norms=True)["mp_rank_00"]
        seen = 0
        for key, arr in want.items():
            st = f"optimizer.state.{kind}."
            if key.startswith("decoder.layers."):
                i, rest = key[len("decoder.layers."):].split(".", 1)
                t = g[st + "decoder.layers." + rest][int(i)].numpy()
            else:
                t = g[st + key].numpy()
            if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
                t, arr = t[: mf.VOCAB], arr[: mf.VOCAB]
            np.testing.assert_array_equal(t, arr, err_msg=f"{kind} {key}")
            seen += 1
        assert seen == 3 + 6 * mf.LAYERS
    common = torch.load(out / "common.pt", weights_only=False)
    assert common["optimizer"]["state"]["common_step"] == mof.STEPS


def test_distributed_optimizer_state_reported_not_imported(run_ckpt, tmp_path):
    """DistributedOptimizer.state_dict() keeps no per-parameter 'state' in model_optim_rng.pt (the
    moments are in distrib_optim.pt): the weights import, the metadata says why the state did not."""
    from native_h5py import read_native
    d = tmp_path / "fx"
    shutil.copytree(mof.fixture("optim_tp2"), d)
    for _, f in rank_files(d, 2, 1):
        ck = torch.load(f, weights_only=False)
        del ck["optimizer"]["state"]
        torch.save(ck, f)
    run_ckpt("reshard", d, tmp_path / "native", "--tp", 1, "--pp", 1, "--dp", 1)
    man, got, _ = read_native(tmp_path / "native", skip=lambda n: not n.startswith("optimizer."))
    assert got == {} and "distrib_optim.pt" in man["megatron"]["optimizer_not_imported"]
