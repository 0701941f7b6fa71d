"""Mixture-of-experts models through HF both ways (issue 37, docs/MOE.md), against transformers:
the tiny Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-V3 (MLA) of fixtures/moe (written by transformers' own
save_pretrained, per-expert names, and the same weights under its fused in-memory names)
-> `ckpt from-hf` -> reshard through three tp/pp/dp layouts -> `ckpt to-hf`: every tensor equals
save_pretrained's bit for bit (safetensors reads both), transformers loads the export and gives the
fixture's logits; from-hf straight into a layout likewise. Hostile configs and files are refused
by name; the commands that do not know experts yet say so.
"""
import json
import pathlib
import shutil

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOE = ROOT / "fixtures" / "moe"
FAMILIES = {"mixtral": transformers.MixtralForCausalLM, "qwen2_moe": transformers.Qwen2MoeForCausalLM,
            "qwen3_moe": transformers.Qwen3MoeForCausalLM, "deepseek_v3": transformers.DeepseekV3ForCausalLM}
# tp must divide the heads (4), the KV heads or be a multiple of them (2), every MLP width (24, 40, 48, 56).
# DeepSeek-V3's MLA: q_b_proj / kv_b_proj split by heads, the low-rank down projections replicated.
# Expert parallelism in each (ep x etp divides tp x dp; ep divides the experts, 4 or 8; etp their width).
LAYOUTS = [("--tp", "2", "--pp", "2", "--dp", "1", "--pp-layers", "1,1", "--ep", "2", "--etp", "1"),
           ("--tp", "4", "--pp", "1", "--dp", "2", "--zero", "1", "--ep", "4", "--etp", "2"),
           ("--tp", "1", "--pp", "2", "--dp", "2", "--pp-layers", "1,1", "--ep", "2", "--etp", "1")]


def _layouts(family):
    layers = len(json.loads((MOE / family / "case.json").read_text())["layers"])
    out = []
    for lay in LAYOUTS:  # a 3-layer model splits 1,2
        out.append(tuple("1,2" if a == "1,1" and layers == 3 else a for a in lay))
    return out


def _logits(model_dir, family):
    m = FAMILIES[family].from_pretrained(model_dir).eval()
    with torch.no_grad():
        return m(torch.tensor(np.load(MOE / family / "tokens.npy"))).logits.numpy()


def _assert_same_tensors(out_dir, family):
    got = {}
    for f in sorted(pathlib.Path(out_dir).glob("*.safetensors")):
        got.update(load_file(f))
    want = load_file(MOE / family / "legacy" / "model.safetensors")
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


@pytest.mark.parametrize("naming", ["legacy", "fused"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_from_hf_reshard_to_hf_gives_transformers_back(run_ckpt, tmp_path, family, naming):
    cur = tmp_path / "s0"
    run_ckpt("from-hf", MOE / family / naming, cur, "--no-fsync")
    for i, lay in enumerate(_layouts(family), 1):
        nxt = tmp_path / f"s{i}"
        run_ckpt("reshard", cur, nxt, *lay)
        cur = nxt
    run_ckpt("to-hf", cur, tmp_path / "hf", "--no-fsync")
    _assert_same_tensors(tmp_path / "hf", family)
    np.testing.assert_allclose(_logits(tmp_path / "hf", family), np.load(MOE / family / "logits.npy"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_from_hf_into_a_layout(run_ckpt, tmp_path, family):
    run_ckpt("from-hf", MOE / family / "legacy", tmp_path / "lay", "--tp", "2", "--pp", "2", "--dp", "2", "--zero", "1",
             "--no-fsync")
    inspect = json.loads(run_ckpt("inspect", tmp_path / "lay", "--json").stdout)
    experts = [t for t in inspect["tensors"] if ".mlp.experts." in t["name"]]
    assert experts and all(len(t["shape"]) == 3 for t in experts)
    run_ckpt("to-hf", tmp_path / "lay", tmp_path / "hf", "--no-fsync")
    _assert_same_tensors(tmp_path / "hf", family)


def _copy_with(tmp_path, family, edit_state=None, edit_config=None):
    d = tmp_path / "bad"
    shutil.copytree(MOE / family / "legacy", d)
    if edit_state:
        state = load_file(d / "model.safetensors")
        edit_state(state)
        save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    if edit_config:
        cfg = json.loads((d / "config.json").read_text())
        edit_config(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return d


def _refused(run_ckpt, src, out, code, *needles):
    p = run_ckpt("from-hf", src, out, "--no-fsync", check=False)
    assert p.returncode != 0 and f"[{code}]" in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr
    assert not pathlib.Path(out).exists()


def test_missing_expert_is_named(run_ckpt, tmp_path):
    d = _copy_with(tmp_path, "mixtral", edit_state=lambda s: s.pop("model.layers.1.block_sparse_moe.experts.3.w2.weight"))
    _refused(run_ckpt, d, tmp_path / "o", "MissingTensor", "model.layers.1.block_sparse_moe.experts.3.w2.weight", "expert 3 of 4")


def test_expert_of_the_wrong_shape_is_named(run_ckpt, tmp_path):
    key = "model.layers.0.mlp.experts.2.up_proj.weight"
    d = _copy_with(tmp_path, "qwen2_moe", edit_state=lambda s: s.__setitem__(key, s[key][:-1].clone()))
    _refused(run_ckpt, d, tmp_path / "o", "ShapeMismatch", key)


def test_experts_in_mixed_dtypes_are_named(run_ckpt, tmp_path):
    key = "model.layers.1.mlp.experts.5.gate_proj.weight"
    d = _copy_with(tmp_path, "qwen3_moe", edit_state=lambda s: s.__setitem__(key, s[key].to(torch.bfloat16)))
    _refused(run_ckpt, d, tmp_path / "o", "MixedDtypes", key)


def test_unexpected_expert_is_named(run_ckpt, tmp_path):
    key = "model.layers.1.block_sparse_moe.experts.4.w1.weight"  # a fifth expert of four
    src = "model.layers.1.block_sparse_moe.experts.0.w1.weight"
    d = _copy_with(tmp_path, "mixtral", edit_state=lambda s: s.__setitem__(key, s[src].clone()))
    _refused(run_ckpt, d, tmp_path / "o", "UnexpectedTensor", key)


@pytest.mark.parametrize("family,edit,code,needle", [
    ("qwen3_moe", lambda c: c.__setitem__("num_local_experts", 1 << 40), "ConfigTooLarge", "num_local_experts"),
    ("qwen3_moe", lambda c: c.__setitem__("num_experts_per_tok", 9), "InvalidConfig", "num_experts_per_tok"),
    ("qwen3_moe", lambda c: c.__setitem__("mlp_only_layers", [7]), "InvalidConfig", "mlp_only_layers"),
    ("qwen3_moe", lambda c: c.__setitem__("model_type", "deepseek_v4"), "UnsupportedModel", "deepseek_v4"),
    ("qwen3_moe", lambda c: c.__setitem__("decoder_sparse_step", 0), "InvalidConfig", "decoder_sparse_step"),
    ("deepseek_v3", lambda c: c.__setitem__("first_k_dense_replace", 9), "InvalidConfig", "first_k_dense_replace"),
    ("deepseek_v3", lambda c: c.__setitem__("kv_lora_rank", 1 << 30), "ConfigTooLarge", "kv_lora_rank"),
    ("deepseek_v3", lambda c: c.__setitem__("kv_lora_rank", 12), "ShapeMismatch", "kv_a_proj_with_mqa"),
])
def test_bad_moe_configs_are_named(run_ckpt, tmp_path, family, edit, code, needle):
    d = _copy_with(tmp_path, family, edit_config=edit)
    _refused(run_ckpt, d, tmp_path / "o", code, needle)


def test_commands_without_experts_say_so(run_ckpt, tmp_path):
    run_ckpt("from-hf", MOE / "mixtral" / "legacy", tmp_path / "s", "--no-fsync")
    p = run_ckpt("export-megatron", tmp_path / "s", tmp_path / "m", check=False)
    assert p.returncode != 0 and "[UnsupportedModel]" in p.stderr and "export-megatron" in p.stderr, p.stderr
    cfg = json.loads((MOE / "deepseek_v3" / "legacy" / "config.json").read_text())  # the trainer has no MLA
    cfg["vocab_size"] = 512  # past the byte tokenizer's 258
    (tmp_path / "ds.json").write_text(json.dumps(cfg))
    p = run_ckpt("train", "--config", tmp_path / "ds.json", "--steps", "1", "--out", tmp_path / "t", check=False)
    assert p.returncode != 0 and "[UnsupportedModel]" in p.stderr and "ckpt train" in p.stderr, p.stderr
    p = run_ckpt("reshard", tmp_path / "s", tmp_path / "r", "--tp", "1", "--pp", "1", "--dp", "1", "--profile", "megatron-mcore",
                 check=False)
    assert p.returncode != 0 and "[UnsupportedModel]" in p.stderr, p.stderr


def test_export_dcp_of_expert_parallel_store_loads_in_torch(run_ckpt, tmp_path):
    import torch.distributed.checkpoint as dcp
    run_ckpt("from-hf", MOE / "qwen3_moe" / "legacy", tmp_path / "s", "--tp", "2", "--pp", "2", "--dp", "2", "--ep", "4",
             "--etp", "1", "--pp-layers", "1,2", "--no-fsync")
    run_ckpt("export-dcp", tmp_path / "s", tmp_path / "dcp")
    ref = load_file(MOE / "qwen3_moe" / "legacy" / "model.safetensors")
    sd = {k: torch.empty_like(v) for k, v in ref.items()}
    dcp.load(sd, checkpoint_id=str(tmp_path / "dcp"))  # the per-expert names of transformers' file
    for k, v in ref.items():
        assert torch.equal(sd[k], v), k


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_command_reads_an_moe_hf_directory_in_the_canonical_view(run_ckpt, tmp_path, family):
    # both namings are the same checkpoint in global view
    assert run_ckpt("diff", MOE / family / "legacy", MOE / family / "fused").returncode == 0
    run_ckpt("reshard", MOE / family / "fused", tmp_path / "r", "--tp", "2", "--pp", "1", "--dp", "2", "--ep", "2", "--etp", "1")
    run_ckpt("to-hf", tmp_path / "r", tmp_path / "hf", "--no-fsync")
    _assert_same_tensors(tmp_path / "hf", family)
    run_ckpt("to-hf", MOE / family / "fused", tmp_path / "hf2", "--no-fsync")  # HF -> HF: fused -> per-expert names
    _assert_same_tensors(tmp_path / "hf2", family)
    assert "stacked tensors" in run_ckpt("inspect", MOE / family / "legacy").stdout
