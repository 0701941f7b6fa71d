"""Megatron-Core mixture-of-experts checkpoints read and written (issue 37, docs/MOE.md step 3), against
the real megatron-core 0.16.1 files of fixtures/megatron_core_moe (ep2, tp2 x ep2 with etp 1, pp2 uneven
with dense layers and a gated shared expert; legacy per-rank files mp_rank_TT[_PPP][_EEE]):
- `to-hf` of each gives megatron-core's own forward logits in transformers (Mixtral for the all-MoE
  cases, Qwen2-MoE for the shared expert), and every expert / router / shared tensor of the export
  equals the one torch.load reads from megatron-core's rank file (the global expert
  ep_rank * E/ep + j of local expert j);
- hostile files are refused by name: a missing expert, a wrong expert shape, an expert count that
  disagrees with expert_model_parallel_size, routing no HF family has.
"""
import argparse
import json
import pathlib
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

torch.serialization.add_safe_globals([argparse.Namespace])  # Megatron-LM's args, as Megatron-LM registers it

ROOT = pathlib.Path(__file__).resolve().parents[2]
FX = ROOT / "fixtures" / "megatron_core_moe"
VOCAB, E, F, FS = 100, 4, 24, 40
# case -> (HF class, tp, pp, ep, the rank directories in (tp_rank, pp_rank, ep_rank) order)
CASES = {
    "ep2": (transformers.MixtralForCausalLM, 1, 1, 2, {(0, 0, 0): "mp_rank_00_000", (0, 0, 1): "mp_rank_00_001"}),
    "tp2_ep2": (transformers.MixtralForCausalLM, 2, 1, 2, {(0, 0, 0): "mp_rank_00_000", (1, 0, 1): "mp_rank_01_001"}),
    "pp2_shared": (transformers.Qwen2MoeForCausalLM, 1, 2, 1, {(0, 0, 0): "mp_rank_00_000", (0, 1, 0): "mp_rank_00_001"}),
}
ITER = "iter_0000005"


def _rank_models(case, kind="legacy"):
    torch.serialization.add_safe_globals([argparse.Namespace])
    return {k: torch.load(FX / case / kind / ITER / d / "model_optim_rng.pt", weights_only=False)["model"]
            for k, d in CASES[case][4].items()}


def _hf_tensors(d):
    out = {}
    for f in sorted(pathlib.Path(d).glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _logits(cls, d, case):
    m = cls.from_pretrained(str(d), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        return m(torch.from_numpy(np.load(FX / case / "tokens.npy"))).logits.numpy()


def _expected_experts(case):
    """HF per-expert tensors from megatron-core's rank files, by Megatron-Core's rules (local expert j
    of EP rank r is global r * E/ep + j; linear_fc1 = [gate; up]; stages restart layer indices)."""
    cls, tp, pp, ep, dirs = CASES[case]
    models = _rank_models(case)
    mixtral = cls is transformers.MixtralForCausalLM
    out, first_layer = {}, {0: 0, 1: 1}  # pp2_shared: stage 0 holds layer 0, stage 1 layers 1..3
    for (tp_r, pp_r, ep_r), sd in models.items():
        if tp_r != 0 and ep == 1:
            continue
        for k, v in sd.items():
            if ".mlp." not in k or not torch.is_tensor(v):
                continue
            parts = k.split(".")
            layer = int(parts[2]) + (first_layer[pp_r] if pp > 1 else 0)
            pre = f"model.layers.{layer}." + ("block_sparse_moe." if mixtral else "mlp.")
            if ".local_experts." in k:
                g = ep_r * (E // ep) + int(parts[6])
                names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
                if k.endswith("linear_fc1.weight"):
                    out[f"{pre}experts.{g}.{names[0]}.weight"] = v[:F]
                    out[f"{pre}experts.{g}.{names[1]}.weight"] = v[F:]
                elif k.endswith("linear_fc2.weight"):
                    out[f"{pre}experts.{g}.{names[2]}.weight"] = v
            elif k.endswith("mlp.router.weight"):
                out[pre + "gate.weight"] = v
            elif k.endswith("shared_experts.linear_fc1.weight"):
                out[pre + "shared_expert.gate_proj.weight"] = v[:FS]
                out[pre + "shared_expert.up_proj.weight"] = v[FS:]
            elif k.endswith("shared_experts.linear_fc2.weight"):
                out[pre + "shared_expert.down_proj.weight"] = v
            elif k.endswith("shared_experts.gate_weight"):
                out[pre + "shared_expert_gate.weight"] = v
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_legacy_to_hf_gives_megatron_core_logits(case, run_ckpt, tmp_path):
    cls = CASES[case][0]
    run_ckpt("to-hf", FX / case / "legacy", tmp_path / "hf", "--no-fsync")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == [cls.__name__]
    got = _hf_tensors(tmp_path / "hf")
    want = _expected_experts(case)
    assert want and set(want) <= set(got), sorted(set(want) - set(got))[:5]
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    ref = np.load(FX / case / "logits.npy")[:, :, :VOCAB]  # megatron-core's forward over the padded vocab
    out = _logits(cls, tmp_path / "hf", case)
    assert out.shape == ref.shape
    assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5


def _copy(case, tmp_path):
    d = tmp_path / case
    shutil.copytree(FX / case / "legacy", d)
    return d


def _resave(f, edit):
    ck = torch.load(f, weights_only=False)
    edit(ck)
    torch.save(ck, f)


def test_missing_expert_is_named(run_ckpt, tmp_path):
    d = _copy("ep2", tmp_path)
    name = "decoder.layers.2.mlp.experts.local_experts.1.linear_fc2.weight"
    _resave(d / ITER / "mp_rank_00_001/model_optim_rng.pt", lambda ck: ck["model"].pop(name))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0 and "MissingTensor" in p.stderr and name in p.stderr and "mp_rank_00_001" in p.stderr, p.stderr


def test_wrong_expert_shape_is_named(run_ckpt, tmp_path):
    d = _copy("tp2_ep2", tmp_path)
    name = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight"
    _resave(d / ITER / "mp_rank_01_001/model_optim_rng.pt",
            lambda ck: ck["model"].__setitem__(name, ck["model"][name][:-2].clone()))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0 and "ShapeMismatch" in p.stderr and name in p.stderr, p.stderr


def test_expert_count_disagreeing_with_ep_is_named(run_ckpt, tmp_path):
    d = _copy("ep2", tmp_path)

    def extra(ck):
        for k in [k for k in ck["model"] if ".local_experts.1." in k]:
            ck["model"][k.replace(".local_experts.1.", ".local_experts.2.")] = ck["model"][k]
    _resave(d / ITER / "mp_rank_00_000/model_optim_rng.pt", extra)
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0 and "MegatronExpertCountMismatch" in p.stderr and "local_experts.2" in p.stderr, p.stderr


def test_ep_args_disagreeing_with_directories_is_named(run_ckpt, tmp_path):
    d = _copy("ep2", tmp_path)
    _resave(d / ITER / "mp_rank_00_000/model_optim_rng.pt", lambda ck: setattr(ck["args"], "expert_model_parallel_size", 1))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode != 0 and "BadMegatronArgs" in p.stderr and "expert_model_parallel_size" in p.stderr, p.stderr


@pytest.mark.parametrize("key,value", [("moe_router_enable_expert_bias", True), ("moe_router_score_function", "sigmoid"),
                                       ("moe_router_pre_softmax", True)])
def test_routing_without_hf_family_is_refused(key, value, run_ckpt, tmp_path):
    d = _copy("ep2", tmp_path)
    _resave(d / ITER / "mp_rank_00_000/model_optim_rng.pt", lambda ck: setattr(ck["args"], key, value))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode == 5 and "UnsupportedModel" in p.stderr and key in p.stderr, p.stderr


EXPORT_FLAGS = {"ep2": ["--tp", "1", "--ep", "2"], "tp2_ep2": ["--tp", "2", "--ep", "2", "--etp", "1"],
                "pp2_shared": ["--pp", "2", "--pp-layers", "1,3"]}
VOCAB_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight")


def _assert_same_model(want, got, where, tp_rank=0):
    """megatron-core's tensors == ckpt's; the vocab padding rows (megatron-core initialises them, ckpt
    writes zeros: they hold no token) compared on the real vocabulary only (TP rank r holds rows
    [r * n, (r + 1) * n) of the padded vocabulary)."""
    tw = {k for k, v in want.items() if torch.is_tensor(v)}
    assert tw == {k for k, v in got.items() if torch.is_tensor(v)}, where
    for k in tw:
        if k.split("/")[0] in VOCAB_ROWS:
            real = max(0, min(got[k].shape[0], VOCAB - tp_rank * got[k].shape[0]))
            assert torch.equal(want[k][:real], got[k][:real]) and not got[k][real:].any(), (where, k)
        else:
            assert torch.equal(want[k], got[k]), (where, k)


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_of_import_is_megatron_cores_legacy_files(case, run_ckpt, tmp_path):
    run_ckpt("export-megatron", FX / case / "legacy", tmp_path / "out", "--format", "torch", "--iteration", "5",
             "--vocab-divisor", "16", "--local-norms", *EXPORT_FLAGS[case])
    want = FX / case / "legacy" / ITER
    got = tmp_path / "out" / ITER
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in want.iterdir())
    torch.serialization.add_safe_globals([argparse.Namespace])
    for d in sorted(want.iterdir()):
        ck = torch.load(got / d.name / "model_optim_rng.pt", weights_only=True)
        _assert_same_model(torch.load(d / "model_optim_rng.pt", weights_only=False)["model"], ck["model"], d.name,
                           int(d.name.split("_")[2]))
        a = ck["args"]
        assert (a.num_experts, a.moe_router_topk, a.expert_model_parallel_size, a.moe_ffn_hidden_size) == \
            (E, 2, CASES[case][3], F)


def _dcp_tensors(d, tmp):
    """Every tensor of a DCP directory as torch's own reader gives it (and the _extra_state keys)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    out = tmp / (d.name + str(len(list(tmp.glob("*.pt")))) + ".pt")
    dcp_to_torch_save(str(d), str(out))
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_of_import_is_megatron_cores_torch_dist(case, run_ckpt, tmp_path):
    run_ckpt("export-megatron", FX / case / "dist", tmp_path / "out", "--format", "torch_dist", "--megatron-version", "0.16",
             "--vocab-divisor", "16", "--local-norms", *EXPORT_FLAGS[case])
    want = _dcp_tensors(FX / case / "dist" / ITER, tmp_path)
    got = _dcp_tensors(tmp_path / "out", tmp_path)
    _assert_same_model(want, got, case)
    assert {k for k in want if "_extra_state" in k} == {k for k in got if "_extra_state" in k}


@pytest.mark.parametrize("case", sorted(CASES))
def test_torch_dist_and_legacy_read_alike(case, run_ckpt):
    assert run_ckpt("diff", FX / case / "legacy", FX / case / "dist").returncode == 0


def _te_grouped(ck):
    """CONSTRUCTED, not written by megatron-core (TEGroupedMLP needs Transformer Engine, absent here): the
    rank's model under TEGroupedMLP's names as its state_dict has them (experts.py: linear_fc1.weight{j},
    linear_fc2.weight{j}, j local; the same [2F, h] / [h, F] tensors as SequentialMLP's)."""
    ck["args"].moe_grouped_gemm = True
    m = ck["model"]
    for k in [k for k in m if ".mlp.experts.local_experts." in k]:
        head, tail = k.split(".mlp.experts.local_experts.")
        j, rest = tail.split(".", 1)
        v = m.pop(k)
        if rest.endswith(".weight"):
            m[f"{head}.mlp.experts.{rest[:-len('.weight')]}.weight{j}"] = v


def test_te_grouped_names_read_as_sequential(run_ckpt, tmp_path):
    d = _copy("ep2", tmp_path)
    for f in (d / ITER).glob("*/model_optim_rng.pt"):
        _resave(f, _te_grouped)
    assert run_ckpt("diff", d, FX / "ep2" / "legacy").returncode == 0


def test_grouped_mlp_weight1_is_refused(run_ckpt, tmp_path):
    d = _copy("ep2", tmp_path)
    _resave(d / ITER / "mp_rank_00_000/model_optim_rng.pt", lambda ck: setattr(ck["args"], "moe_grouped_gemm", True))
    p = run_ckpt("inspect", d, check=False)
    assert p.returncode == 5 and "UnsupportedModel" in p.stderr and "weight1" in p.stderr, p.stderr


def test_reshard_then_export_is_megatron_cores_files(run_ckpt, tmp_path):
    run_ckpt("reshard", FX / "ep2" / "legacy", tmp_path / "s", "--tp", "2", "--pp", "2", "--pp-layers", "3,1", "--dp", "1",
             "--ep", "2", "--etp", "1")
    run_ckpt("export-megatron", tmp_path / "s", tmp_path / "out", "--format", "torch", "--iteration", "5",
             "--vocab-divisor", "16", "--local-norms", *EXPORT_FLAGS["ep2"])
    for d in sorted((FX / "ep2" / "legacy" / ITER).iterdir()):
        _assert_same_model(torch.load(d / "model_optim_rng.pt", weights_only=False)["model"],
                           torch.load(tmp_path / "out" / ITER / d.name / "model_optim_rng.pt", weights_only=True)["model"], d.name)


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_export_of_a_family_megatron_core_cannot_route_is_refused(family, run_ckpt, tmp_path):
    p = run_ckpt("export-megatron", ROOT / "fixtures" / "moe" / family / "legacy", tmp_path / "out", "--format", "torch",
                 check=False)
    assert p.returncode == 5 and "UnsupportedModel" in p.stderr and family in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def _with_adam(ck):
    """An 'optimizer' entry shaped like megatron-core's FP32Optimizer's (Adam state per parameter, one
    param group with megatron-core's keys); constructed, the fixtures were saved without one."""
    params = [k for k, v in ck["model"].items() if torch.is_tensor(v)]
    ck["optimizer"] = {"state": {i: {"step": torch.tensor(3.0), "exp_avg": torch.full_like(ck["model"][k], 0.5),
                                     "exp_avg_sq": torch.full_like(ck["model"][k], 0.25)} for i, k in enumerate(params)},
                       "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0, "wd_mult": 1.0,
                                         "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False,
                                         "params": list(range(len(params)))}]}


def test_moe_optimizer_state_is_not_imported_weights_are(run_ckpt, tmp_path):
    d = _copy("ep2", tmp_path)
    for f in (d / ITER).glob("*/model_optim_rng.pt"):
        _resave(f, _with_adam)
    info = json.loads(run_ckpt("inspect", d, "--json").stdout)
    assert "mixture-of-experts" in json.dumps(info["not_imported"])
    assert not [t for t in info["tensors"] if t["name"].startswith("optimizer.")]
    assert run_ckpt("diff", d, FX / "ep2" / "legacy").returncode == 0


def test_te_spec_moe_norm_key_in_torch_dist(run_ckpt, tmp_path):
    """CONSTRUCTED (Transformer Engine is not installed): megatron-core's TE spec keeps an MoE layer's
    norm apart (pre_mlp_layernorm = TENorm, no key map), so its torch_dist key is
    decoder.layers.{l}.pre_mlp_layernorm.weight instead of the local spec's mlp.linear_fc1.layer_norm_weight;
    the fixture's tensors re-saved by torch DCP under that key read as the fixture."""
    from torch.distributed.checkpoint.format_utils import torch_save_to_dcp
    src = FX / "ep2" / "dist" / ITER
    sd = _dcp_tensors(src, tmp_path)
    renamed = {k.replace(".mlp.linear_fc1.layer_norm_weight", ".pre_mlp_layernorm.weight"): v for k, v in sd.items()}
    assert renamed.keys() != sd.keys()
    torch.save(renamed, tmp_path / "te.pt")
    out = tmp_path / "te"
    torch_save_to_dcp(str(tmp_path / "te.pt"), str(out))
    for f in ("common.pt", "metadata.json"):
        shutil.copy(src / f, out / f)
    assert run_ckpt("diff", out, FX / "ep2" / "legacy").returncode == 0


def test_torch_dist_export_with_te_norm_key(run_ckpt, tmp_path):
    """Without --local-norms an MoE layer's norm is written under Transformer Engine's spec's key
    (pre_mlp_layernorm.weight, megatron-core's gpt_layer_specs.py: TENorm, no key map); it reads back."""
    run_ckpt("export-megatron", FX / "pp2_shared" / "legacy", tmp_path / "out", "--format", "torch_dist",
             "--megatron-version", "0.16", "--vocab-divisor", "16", *EXPORT_FLAGS["pp2_shared"])
    keys = set(_dcp_tensors(tmp_path / "out", tmp_path))
    assert {"decoder.layers.1.pre_mlp_layernorm.weight", "decoder.layers.0.mlp.linear_fc1.layer_norm_weight"} <= keys
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" not in keys
    assert run_ckpt("diff", tmp_path / "out", FX / "pp2_shared" / "legacy").returncode == 0


@pytest.mark.parametrize("form", ["legacy", "dist"])
def test_damaged_byte_in_an_expert_rank_file_is_caught(run_ckpt, tmp_path, form):
    """One byte flipped in the largest storage of EP rank 1's file (legacy mp_rank_00_001, the rank whose experts
    the reader takes from it) or of a torch_dist item: verify names the zip entry (CRC-32), to-hf and reshard
    refuse and leave nothing."""
    from zip_damage import assert_refused, flip_in_entry
    d = tmp_path / "ep2"
    shutil.copytree(ROOT / "fixtures" / "megatron_core_moe" / "ep2" / form, d)
    assert run_ckpt("verify", d).returncode == 0
    step = d / "iter_0000005"
    if form == "legacy":
        f = step / "mp_rank_00_001" / "model_optim_rng.pt"
        entry = flip_in_entry(f, 0, f.stat().st_size, lambda infos: max((i for i in infos if "/data/" in i.filename),
                                                                         key=lambda i: i.file_size))
    else:
        f = step / "__1_0.distcp"
        data = f.read_bytes()
        start = data.find(b"PK\x03\x04")  # the first torch.save item of the .distcp file
        entry = flip_in_entry(f, start, len(data) - start,
                              lambda infos: max((i for i in infos if "/data/" in i.filename), key=lambda i: i.file_size))
    assert_refused(run_ckpt, d, entry, tmp_path)
