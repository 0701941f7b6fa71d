"""Checkpoint.state_dict(layout=..., rank=r) of the Python module against the numpy layout reference
(megatron_reference.native_rank_holdings: what each rank of a Megatron-style layout holds, written
from the sharding rules of docs/RESHARD.md in numpy, independent of the engine):

 * for every rank of tp2 pp2 (even and uneven stages, GQA, tied embeddings with bias, vocab
   padding, ZeRO-1 flat optimizer shards over dp2), the dict holds exactly that rank's tensors,
   each equal to numpy's slice (or flat range) of the global tensor, from a one-piece store and
   from a store resharded to another layout (regions assembled across pieces);
 * the layout as a dict, a flag string, a JSON string or a file gives the same; optimizer=False
   drops optimizer.*; dtype casts; shard_regions names the reference's boxes;
 * a transformers LlamaForCausalLM filled from ckpt.open(native).state_dict() (global view; the
   canonical names are HF's) gives the same logits as one loaded from the `ckpt to-hf` export;
 * a store converted to PaddleNLP's profile: its canonical view and rank shards equal the numpy
   reference, and state_dict(profile="paddlenlp") equals profile_refs.to_paddlenlp.
"""
import json
import pathlib
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import megatron_reference as ref  # noqa: E402
from pymodule_helpers import import_ckpt, same_bits  # noqa: E402
from test_reshard_cli import CFG_GQA, CFG_TIED, model  # noqa: E402

ckpt = import_ckpt()


def reference_state_dict(cfg, tensors, tp, per_stage, dp, zero, divisor, rank):
    """{name: numpy array} rank `rank` holds, from the numpy reference."""
    names = list(tensors)
    hold = ref.native_rank_holdings(cfg, [(k, v.shape) for k, v in tensors.items()], tp, per_stage, dp, zero, divisor)
    out = {}
    for r, ti, box, a, b in hold:
        if r != rank:
            continue
        arr = tensors[names[ti]]
        numel = int(np.prod(box[1], dtype=np.int64)) if len(box[1]) else 1
        flat = None if (a, b) == (0, numel) else (a, b)
        assert names[ti] not in out, f"the reference lists {names[ti]} twice on rank {rank}"
        out[names[ti]] = (np.ascontiguousarray(ref.global_region(arr, box[0], box[1], flat)), (box, flat))
    return out


@pytest.fixture(scope="module")
def stores(tool, tmp_path_factory):
    d = tmp_path_factory.mktemp("sd")
    out = {}
    for key, cfg, divisor in (("gqa", CFG_GQA, 8), ("tied", CFG_TIED, 4)):
        t = model(cfg, seed=5)
        layout = {"tp": 1, "pp": 1, "dp": 1, "zero": 0, "layers_per_stage": [cfg["num_hidden_layers"]],
                  "vocab_divisor": divisor}
        ref.write_native_store(tool("store_write_tool"), d / f"spec_{key}", d / key, cfg, t, layout)
        out[key] = (d / key, cfg, t, divisor)
    return out


CASES = [
    # store, tp, layers per stage, dp, zero
    ("gqa", 2, [2, 2], 1, 0),
    ("gqa", 2, [1, 3], 2, 1),
    ("tied", 2, [3, 1], 1, 0),
    ("tied", 2, [2, 2], 2, 1),
]


def _check_rank(ck, case, stores, rank, layout):
    key, tp, per, dp, zero = case
    _, cfg, tensors, divisor = stores[key]
    want = reference_state_dict(cfg, tensors, tp, per, dp, zero, divisor, rank)
    got = ck.state_dict(layout=layout, rank=rank)
    assert set(got) == set(want), f"rank {rank}: missing {sorted(set(want) - set(got))[:4]} " \
                                  f"extra {sorted(set(got) - set(want))[:4]}"
    for name, (arr, _) in want.items():
        assert same_bits(got[name], arr), f"{name} on rank {rank}"
    return want


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}_tp{c[1]}_pp{'-'.join(map(str, c[2]))}_dp{c[3]}_z{c[4]}")
def test_every_rank_equals_numpy_reference(case, stores):
    key, tp, per, dp, zero = case
    layout = {"tp": tp, "pp": len(per), "dp": dp, "zero": zero, "pp_layers": per}
    with ckpt.open(stores[key][0]) as ck:
        for rank in range(tp * len(per) * dp):
            want = _check_rank(ck, case, stores, rank, layout)
            regions = ck.shard_regions(layout, rank)
            for name, (_, (box, flat)) in want.items():
                assert regions[name] == ckpt.ShardRegion(tuple(box[0]), tuple(box[1]), flat), name


def test_from_a_resharded_store(stores, run_ckpt, tmp_path):
    """The source holds tp4 pieces (another layout): each rank's regions are assembled across them."""
    src = tmp_path / "tp4"
    run_ckpt("reshard", stores["gqa"][0], src, "--tp", 4, "--pp", 1, "--dp", 1, "--no-verify")
    case = ("gqa", 2, [1, 3], 2, 1)
    with ckpt.open(src) as ck:
        assert ck.layout["tp"] == 4
        for rank in range(8):
            _check_rank(ck, case, stores, rank, "--tp 2 --pp 2 --pp-layers 1,3 --dp 2 --zero 1")


def test_layout_forms_optimizer_and_dtype(stores, tmp_path):
    path, cfg, tensors, divisor = stores["gqa"]
    lay = {"tp": 2, "pp": 2, "dp": 1}
    lf = tmp_path / "layout.json"
    lf.write_text(json.dumps({"tp": 2, "pp": 2, "dp": 1, "layers_per_stage": [2, 2]}))
    with ckpt.open(path) as ck:
        base = ck.state_dict(layout=lay, rank=3)
        for form in ("tp=2 pp=2 dp=1", "--tp 2 --pp 2", json.dumps(lay), str(lf)):
            other = ck.state_dict(layout=form, rank=3)
            assert set(other) == set(base) and all(same_bits(other[k], base[k]) for k in base), form
        no_opt = ck.state_dict(layout=lay, rank=3, optimizer=False)
        assert set(no_opt) == {k for k in base if not k.startswith("optimizer.")} and no_opt
        f32 = ck.state_dict(layout=lay, rank=3, dtype="float32", optimizer=False)
        for k, v in no_opt.items():
            assert same_bits(f32[k], v.astype(np.float32)), k
        tt = ck.state_dict(layout=lay, rank=3, framework="torch")
        assert all(isinstance(v, torch.Tensor) for v in tt.values())
        # No layout: the global view, every tensor whole.
        whole = ck.state_dict()
        assert set(whole) == set(tensors) and all(same_bits(whole[k], tensors[k]) for k in tensors)
        with pytest.raises(ckpt.InvalidArgumentError):
            ck.state_dict(layout=lay, rank=4)
        with pytest.raises(ckpt.InvalidArgumentError, match="tp"):
            ck.state_dict(layout={"tp": 3, "pp": 1}, rank=0)  # 3 does not divide the heads


def test_transformers_logits_equal_to_hf_export(run_ckpt, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    m.save_pretrained(tmp_path / "hf")
    run_ckpt("from-hf", tmp_path / "hf", tmp_path / "native", "--no-fsync")
    run_ckpt("reshard", tmp_path / "native", tmp_path / "tp2pp2", "--tp", 2, "--pp", 2, "--dp", 1, "--no-verify")
    run_ckpt("to-hf", tmp_path / "tp2pp2", tmp_path / "export", "--no-fsync")
    ids = torch.tensor([[1, 5, 9, 33, 77, 100, 2, 64]])
    ref_model = LlamaForCausalLM.from_pretrained(tmp_path / "export").eval()
    with ckpt.open(tmp_path / "tp2pp2") as ck:
        sd = ck.state_dict(optimizer=False, framework="torch")
    ours = LlamaForCausalLM(cfg).eval()
    missing, unexpected = ours.load_state_dict(sd, strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k], (missing, unexpected)
    with torch.no_grad():
        a, b = ours(ids).logits, ref_model(ids).logits
    assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(a, m(ids).logits)


def test_profile_views(tool, run_ckpt, tmp_path):
    """A store converted to PaddleNLP's convention (llama.* names, [in, out] linear weights, bf16)
    opens in the canonical view (HF names and orientation) equal to the HF arrays rounded to bf16,
    and state_dict(layout, rank) of it equals the numpy reference for every rank of tp2 pp2;
    state_dict(profile="paddlenlp") goes through the engine's profile views back to PaddleNLP's
    names and orientation, equal to profile_refs.to_paddlenlp of the same arrays."""
    import profile_refs
    cfg, divisor = dict(CFG_GQA, torch_dtype="float32"), 8
    hf = model(cfg, seed=11, optimizer=False)
    hf_bf16 = {k: v.astype(ml_dtypes.bfloat16).astype(np.float32) for k, v in hf.items()}
    base = tmp_path / "base"
    ref.write_native_store(tool("store_write_tool"), tmp_path / "spec", base, cfg, hf,
                           {"tp": 1, "pp": 1, "dp": 1, "layers_per_stage": [4], "vocab_divisor": divisor})
    run_ckpt("convert", base, tmp_path / "pd", "--profile", "paddlenlp", "--dtype", "bf16")  # asked: paddlenlp keeps fp32
    with ckpt.open(tmp_path / "pd") as ck:
        assert ck.source_profile == "paddlenlp" and ck.profile == "reference"
        assert set(ck.tensors) == set(hf)
        for name, want in hf_bf16.items():
            assert np.array_equal(ck.read(name, dtype="float32"), want), name
        for rank in range(4):
            got = ck.state_dict(layout={"tp": 2, "pp": 2, "vocab_divisor": divisor}, rank=rank, dtype="float32")
            want = reference_state_dict(cfg, hf_bf16, 2, [2, 2], 1, 0, divisor, rank)
            assert set(got) == set(want), rank
            for name, (arr, _) in want.items():
                assert np.array_equal(got[name], arr), f"{name} on rank {rank}"
        pd = ck.state_dict(profile="paddlenlp", dtype="float32")
        want_pd = profile_refs.to_paddlenlp(hf_bf16, cfg)
        assert set(pd) == set(want_pd)
        for name, want in want_pd.items():
            assert np.array_equal(pd[name], want), name
