"""`ckpt export-megatron` against the independent numpy reference (megatron_reference.py).

Random tiny LLaMA models (GQA, vocab not divisible by tp, tied/untied, biases, uneven pipeline
splits) are written as HF safetensors + config.json with numpy/safetensors; ckpt exports them (from
the HF dir directly, and through `ckpt from-hf` into the native store when that command exists);
every tensor of every rank must equal the reference bit for bit.
"""
import json
import os
import pathlib
import subprocess
import sys
import zlib

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import megatron_reference as ref  # noqa: E402


def write_hf(d: pathlib.Path, cfg: dict, tensors: dict):
    d.mkdir(parents=True)
    full = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64}
    full.update(cfg)
    full["torch_dtype"] = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16"}[
        next(iter(tensors.values())).dtype]
    (d / "config.json").write_text(json.dumps(full))
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return full


def compare_dirs(out: pathlib.Path, expected: dict):
    got_dirs = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert got_dirs == sorted(expected), f"rank dirs {got_dirs} != {sorted(expected)}"
    for rd, tensors in expected.items():
        got = load_file(str(out / rd / "model.safetensors"))
        assert sorted(got) == sorted(tensors), f"{rd}: names differ: {sorted(set(got) ^ set(tensors))}"
        for name, want in tensors.items():
            g = got[name]
            assert g.dtype == want.dtype, f"{rd}/{name}: dtype {g.dtype} != {want.dtype}"
            assert g.shape == want.shape, f"{rd}/{name}: shape {g.shape} != {want.shape}"
            assert g.tobytes() == want.tobytes(), f"{rd}/{name}: values differ (max abs {np.abs(g - want).max()})"


def has_command(ckpt_bin, name):
    p = subprocess.run([ckpt_bin, name, "--help"], capture_output=True, text=True)
    return p.returncode == 0


CASES = [
    # name, config, tp, pp, pp_layers, divisor, dtype, local_norms
    ("gqa_tp2_vocab37", dict(vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=4), 2, 1, None, 8, np.float32, False),
    ("gqa8x2_tied_pp3_uneven", dict(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
                                    num_attention_heads=8, num_key_value_heads=2, head_dim=2,
                                    tie_word_embeddings=True), 2, 3, [1, 2, 1], 4, np.float32, False),
    ("mha_tp4_bias_tied_pp2_empty_vocab_ranks", dict(vocab_size=33, hidden_size=8, intermediate_size=8,
                                                     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
                                                     head_dim=2, tie_word_embeddings=True, attention_bias=True,
                                                     mlp_bias=True), 4, 2, None, 128, np.float32, False),
    ("f16_local_norms_pp2", dict(vocab_size=40, hidden_size=12, intermediate_size=20, num_hidden_layers=3,
                                 num_attention_heads=6, num_key_value_heads=3, head_dim=2), 1, 2, [2, 1], 8,
     np.float16, True),
    ("tied_pp1_no_output_layer", dict(vocab_size=19, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                                      tie_word_embeddings=True), 1, 1, None, 16, np.float32, False),
]


def random_case(seed):
    rng = np.random.default_rng(seed)
    K = int(rng.choice([1, 2, 4]))
    H = K * int(rng.choice([1, 2, 3]))
    tp = int(rng.choice([t for t in (1, 2, 4) if K % t == 0]))
    L = int(rng.integers(1, 5))
    pp = int(rng.integers(1, L + 1))
    cut = sorted(rng.choice(np.arange(1, L), size=pp - 1, replace=False).tolist()) if pp > 1 else []
    split = [b - a for a, b in zip([0] + cut, cut + [L])]
    cfg = dict(vocab_size=int(rng.integers(5, 70)), hidden_size=int(rng.choice([4, 8, 12])),
               intermediate_size=tp * int(rng.integers(1, 5)), num_hidden_layers=L, num_attention_heads=H,
               num_key_value_heads=K, head_dim=2 * int(rng.integers(1, 3)),
               tie_word_embeddings=bool(rng.integers(0, 2)), attention_bias=bool(rng.integers(0, 2)))
    return (f"random{seed}", cfg, tp, pp, split, int(rng.choice([1, 3, 8, 128])), np.float32, False)


@pytest.mark.parametrize("case", CASES + [random_case(s) for s in range(4)], ids=lambda c: c[0])
def test_export_matches_reference(case, tmp_path, run_ckpt, ckpt_bin):
    name, cfg, tp, pp, split, divisor, dtype, local = case
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    tensors = ref.make_hf_model(cfg, rng, dtype)
    full_cfg = write_hf(tmp_path / "hf", cfg, tensors)
    expected = ref.megatron_shards(full_cfg, tensors, tp, pp, split, divisor, te_norms=not local)
    args = ["--tp", tp, "--pp", pp, "--vocab-divisor", divisor]
    if split:
        args += ["--pp-layers", ",".join(map(str, split))]
    if local:
        args += ["--local-norms"]
    sources = [tmp_path / "hf"]
    if has_command(ckpt_bin, "from-hf"):
        run_ckpt("from-hf", tmp_path / "hf", tmp_path / "store")
        sources.append(tmp_path / "store")
    for i, src in enumerate(sources):
        out = tmp_path / f"megatron{i}"
        run_ckpt("export-megatron", src, out, *args)
        assert not (tmp_path / f"megatron{i}.partial").exists()
        compare_dirs(out, expected)
        a = json.loads((out / "megatron_args.json").read_text())
        assert a["tp"] == tp and a["pp"] == pp
        assert a["num_layers"] == cfg["num_hidden_layers"]
        assert a["num_query_groups"] == cfg["num_key_value_heads"]
        assert a["kv_channels"] == cfg["head_dim"]
        assert a["padded_vocab_size"] == ref.padded_vocab(cfg["vocab_size"], tp, divisor)
        assert a["swiglu"] is True
        assert a["untie_embeddings_and_output_weights"] == (not cfg.get("tie_word_embeddings", False))
        assert a["layers_per_stage"] == ref.layers_per_stage(cfg["num_hidden_layers"], pp, split)


def test_reference_packing_by_hand():
    """The reference itself on a case small enough to write out: H=4, K=2, hd=1, in=1, tp=2."""
    cfg = dict(vocab_size=3, hidden_size=1, intermediate_size=2, num_hidden_layers=1, num_attention_heads=4,
               num_key_value_heads=2, head_dim=1)
    col = lambda *v: np.array(v, dtype=np.float32).reshape(-1, 1)  # noqa: E731
    hf = {"model.embed_tokens.weight": col(1, 2, 3), "model.norm.weight": np.ones(1, np.float32),
          "lm_head.weight": col(4, 5, 6),
          "model.layers.0.input_layernorm.weight": np.ones(1, np.float32),
          "model.layers.0.post_attention_layernorm.weight": np.ones(1, np.float32),
          "model.layers.0.self_attn.q_proj.weight": col(10, 11, 12, 13),
          "model.layers.0.self_attn.k_proj.weight": col(20, 21),
          "model.layers.0.self_attn.v_proj.weight": col(30, 31),
          "model.layers.0.self_attn.o_proj.weight": np.array([[40, 41, 42, 43]], np.float32),
          "model.layers.0.mlp.gate_proj.weight": col(50, 51),
          "model.layers.0.mlp.up_proj.weight": col(60, 61),
          "model.layers.0.mlp.down_proj.weight": np.array([[70, 71]], np.float32)}
    s = ref.megatron_shards(cfg, hf, tp=2, pp=1, divisor=1)
    r0, r1 = s["mp_rank_00"], s["mp_rank_01"]
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert r0[qkv].ravel().tolist() == [10, 11, 20, 30]
    assert r1[qkv].ravel().tolist() == [12, 13, 21, 31]
    assert r0["decoder.layers.0.mlp.linear_fc1.weight"].ravel().tolist() == [50, 60]
    assert r1["decoder.layers.0.mlp.linear_fc1.weight"].ravel().tolist() == [51, 61]
    assert r1["decoder.layers.0.self_attention.linear_proj.weight"].ravel().tolist() == [42, 43]
    assert r1["decoder.layers.0.mlp.linear_fc2.weight"].ravel().tolist() == [71]
    # vocab 3 at tp=2, divisor 1 -> padded 4: rank 1 = [3, 0]
    assert r1["embedding.word_embeddings.weight"].ravel().tolist() == [3, 0]
    assert r1["output_layer.weight"].ravel().tolist() == [6, 0]


def test_refusals(tmp_path, run_ckpt):
    cfg = dict(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=2)
    write_hf(tmp_path / "hf", cfg, ref.make_hf_model(cfg, np.random.default_rng(0)))
    # tp=4 > K=2: Megatron cannot hold KV heads replicated.
    p = run_ckpt("export-megatron", tmp_path / "hf", tmp_path / "o1", "--tp", 4, check=False)
    assert p.returncode == 5, p.stderr
    assert "num_key_value_heads=2" in p.stderr and "tp=4" in p.stderr
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o1.partial").exists()
    # tp=3 does not divide the heads.
    p = run_ckpt("export-megatron", tmp_path / "hf", tmp_path / "o2", "--tp", 3, check=False)
    assert p.returncode == 2 and "num_attention_heads=4" in p.stderr, p.stderr
    # more stages than layers; uneven split that does not sum up.
    p = run_ckpt("export-megatron", tmp_path / "hf", tmp_path / "o3", "--pp", 3, check=False)
    assert p.returncode == 2 and "pp=3" in p.stderr, p.stderr
    p = run_ckpt("export-megatron", tmp_path / "hf", tmp_path / "o4", "--pp", 2, "--pp-layers", "2,1", check=False)
    assert p.returncode == 2, p.stderr
    # existing destination is never touched.
    (tmp_path / "o5").mkdir()
    p = run_ckpt("export-megatron", tmp_path / "hf", tmp_path / "o5", check=False)
    assert p.returncode == 2 and "exists" in p.stderr, p.stderr
    # missing tensor: named in the error, nothing written.
    t = ref.make_hf_model(cfg, np.random.default_rng(0))
    del t["model.layers.1.mlp.up_proj.weight"]
    write_hf(tmp_path / "hf2", cfg, t)
    p = run_ckpt("export-megatron", tmp_path / "hf2", tmp_path / "o6", check=False)
    assert p.returncode == 4 and "model.layers.1.mlp.up_proj.weight" in p.stderr, p.stderr
    assert not (tmp_path / "o6").exists() and not (tmp_path / "o6.partial").exists()


def write_reference_megatron_dir(d: pathlib.Path, cfg: dict, shards: dict, tp, pp, split, divisor):
    """A Megatron-layout directory built by the numpy reference alone (no ckpt involved)."""
    d.mkdir(parents=True)
    for rd, tensors in shards.items():
        (d / rd).mkdir()
        save_file(tensors, str(d / rd / "model.safetensors"), metadata={"format": "pt"})
    args = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
            "num_layers": cfg["num_hidden_layers"], "layers_per_stage": ref.layers_per_stage(cfg["num_hidden_layers"], pp, split),
            "hidden_size": cfg["hidden_size"], "ffn_hidden_size": cfg["intermediate_size"],
            "num_attention_heads": cfg["num_attention_heads"], "num_query_groups": cfg["num_key_value_heads"],
            "kv_channels": cfg["head_dim"], "vocab_size": cfg["vocab_size"],
            "padded_vocab_size": ref.padded_vocab(cfg["vocab_size"], tp, divisor),
            "make_vocab_size_divisible_by": divisor, "swiglu": True,
            "untie_embeddings_and_output_weights": not cfg.get("tie_word_embeddings", False)}
    (d / "megatron_args.json").write_text(json.dumps(args))


@pytest.mark.parametrize("case", CASES + [random_case(s) for s in range(4, 8)], ids=lambda c: c[0])
def test_megatron_layout_consumed(case, tmp_path, run_ckpt):
    """The planner reads the packed layout back: a Megatron dir built by numpy alone, seen through
    ckpt in global view, equals the HF tensors (QKV unpacked per query group, [gate_r; up_r] split,
    vocab padding dropped); resharding it into the native store gives the same global view."""
    name, cfg, tp, pp, split, divisor, dtype, local = case
    rng = np.random.default_rng(zlib.crc32(name.encode()) + 1)
    tensors = ref.make_hf_model(cfg, rng, dtype)
    full_cfg = write_hf(tmp_path / "hf", cfg, tensors)
    shards = ref.megatron_shards(full_cfg, tensors, tp, pp, split, divisor, te_norms=not local)
    mg = tmp_path / "mg"
    write_reference_megatron_dir(mg, full_cfg, shards, tp, pp, split, divisor)
    p = run_ckpt("diff", mg, tmp_path / "hf", "--json", check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    j = json.loads(p.stdout)
    assert sorted(t["name"] for t in j["tensors"]) == sorted(tensors)
    assert all(t["status"] == "identical" for t in j["tensors"])
    run_ckpt("reshard", mg, tmp_path / "native", "--tp", 1, "--pp", 1, "--dp", 1)
    assert run_ckpt("diff", tmp_path / "native", tmp_path / "hf", check=False).returncode == 0
    # A swapped pair of query groups is caught (the packing is really read, not assumed).
    if cfg["num_key_value_heads"] >= 2 and tp == 1:
        rd = next(iter(shards))
        bad = {k: v.copy() for k, v in shards[rd].items()}
        qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
        g = bad[qkv].shape[0] // cfg["num_key_value_heads"]
        bad[qkv][:g], bad[qkv][g:2 * g] = shards[rd][qkv][g:2 * g], shards[rd][qkv][:g]
        shards2 = dict(shards)
        shards2[rd] = bad
        write_reference_megatron_dir(tmp_path / "mg2", full_cfg, shards2, tp, pp, split, divisor)
        p = run_ckpt("diff", tmp_path / "mg2", tmp_path / "hf", check=False)
        assert p.returncode == 1 and "q_proj" in p.stdout, p.stdout


def test_megatron_dir_refusals(tmp_path, run_ckpt):
    cfg = dict(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=2)
    t = ref.make_hf_model(cfg, np.random.default_rng(0))
    full = write_hf(tmp_path / "hf", cfg, t)
    shards = ref.megatron_shards(full, t, 2, 1, None, 8)
    # A rank tensor of the wrong shape is named with its file.
    bad = {k: dict(v) for k, v in shards.items()}
    bad["mp_rank_01"]["decoder.layers.1.mlp.linear_fc1.weight"] = np.zeros((3, 8), np.float32)
    write_reference_megatron_dir(tmp_path / "mg", full, bad, 2, 1, None, 8)
    p = run_ckpt("diff", tmp_path / "mg", tmp_path / "hf", check=False)
    assert p.returncode == 3 and "mp_rank_01" in p.stderr and "linear_fc1" in p.stderr, p.stderr
    p = run_ckpt("reshard", tmp_path / "mg", tmp_path / "out", "--tp", 1, "--pp", 1, "--dp", 1, check=False)
    assert p.returncode == 3 and not (tmp_path / "out").exists()
    # A missing rank file and bad args are named.
    write_reference_megatron_dir(tmp_path / "mg2", full, shards, 2, 1, None, 8)
    (tmp_path / "mg2" / "mp_rank_01" / "model.safetensors").unlink()
    p = run_ckpt("diff", tmp_path / "mg2", tmp_path / "hf", check=False)
    assert p.returncode == 4 and "mp_rank_01" in p.stderr, p.stderr
    write_reference_megatron_dir(tmp_path / "mg3", full, shards, 2, 1, None, 8)
    a = json.loads((tmp_path / "mg3" / "megatron_args.json").read_text())
    a["num_layers"] = -1
    (tmp_path / "mg3" / "megatron_args.json").write_text(json.dumps(a))
    p = run_ckpt("diff", tmp_path / "mg3", tmp_path / "hf", check=False)
    assert p.returncode == 3 and "num_layers" in p.stderr, p.stderr
