"""The reference trainer (trainer/) against PyTorch + transformers, independently.

tests/tools/trainer_dump writes the trainer's initial weights, the logits / loss / gradients of a
fixed batch and the weights after 5 optimizer steps. Here the same weights are loaded into
transformers' LlamaForCausalLM (eager attention, float32), the loss is torch's cross-entropy,
gradients come from torch autograd, and the 5 steps use torch.optim.AdamW (two param groups: no
weight decay on norm weights) + clip_grad_norm_(1.0) + the warm-up/cosine schedule written again
below in Python. Configs: GQA (K < H), tied and untied embeddings.
"""
import json
import math
import os
import pathlib
import subprocess

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]

CONFIGS = {
    "gqa_untied": dict(vocab_size=264, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                       tie_word_embeddings=False),
    "gqa_tied": dict(vocab_size=260, hidden_size=32, intermediate_size=80, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=1, head_dim=12,
                     tie_word_embeddings=True),
    "mha_untied": dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=4, head_dim=16,
                       tie_word_embeddings=False, rope_theta=500000.0),
}


def _dump_tool():
    bdir = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", ROOT / "build-trainer"))
    p = bdir / "trainer_dump"
    if not p.exists():
        pytest.fail(f"trainer_dump not found at {p}: build the tests/tools targets")
    return str(p)


def _config_json(kw):
    c = dict(architectures=["LlamaForCausalLM"], model_type="llama", rms_norm_eps=1e-5,
             rope_theta=10000.0, max_position_embeddings=128, attention_bias=False,
             mlp_bias=False, hidden_act="silu", torch_dtype="float32", bos_token_id=256,
             eos_token_id=257)
    c.update(kw)
    return c


def _load(dirpath, entries, fname):
    raw = np.fromfile(dirpath / fname, dtype="<f4")
    out = {}
    for e in entries:
        n = int(np.prod(e["shape"]))
        out[e["name"]] = torch.from_numpy(raw[e["offset"]:e["offset"] + n].reshape(e["shape"]).copy())
    return out


def _hf_model(cfg):
    from transformers import LlamaConfig, LlamaForCausalLM
    hc = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "torch_dtype")})
    hc._attn_implementation = "eager"
    torch.manual_seed(0)
    m = LlamaForCausalLM(hc).float()
    m.eval()  # no dropout (attention_dropout is 0 anyway)
    return m


def _load_into(model, weights, tied):
    sd = dict(weights)
    if tied:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    assert not missing and not unexpected, (missing, unexpected)
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def _rel(a, b):
    a = a.double()
    b = b.double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def _lr_at(s, peak, warmup, total, min_ratio=0.1):
    # Independent restatement of the documented schedule (docs/TRAINER.md).
    if warmup > 0 and s < warmup:
        return peak * (s + 1) / warmup
    lo = min_ratio * peak
    p = min(1.0, (s - warmup) / max(1, total - warmup))
    return lo + (peak - lo) * 0.5 * (1 + math.cos(math.pi * p))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_trainer_matches_torch(name, tmp_path):
    cfg = _config_json(CONFIGS[name])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    subprocess.run([_dump_tool(), str(tmp_path / "config.json"), str(tmp_path), "--seed", "11",
                    "--batch", "2", "--seq", "24", "--steps", "5", "--lr", "2e-3", "--warmup", "2",
                    "--total", "8"], check=True, timeout=300)
    idx = json.loads((tmp_path / "index.json").read_text())
    tied = cfg["tie_word_embeddings"]
    init = _load(tmp_path, idx["init"], "init.bin")
    grads = _load(tmp_path, idx["grads"], "grads.bin")
    final = _load(tmp_path, idx["final"], "final.bin")
    V = cfg["vocab_size"]

    # Parameter names and shapes are HF's (strict load checks both).
    model = _hf_model(cfg)
    _load_into(model, init, tied)
    expected_names = {k for k in model.state_dict() if "rotary_emb" not in k}
    if tied:
        expected_names.discard("lm_head.weight")
    assert set(init) == expected_names

    # Init statistics: N(0, 0.02) for matrices, ones for norms.
    for k, v in init.items():
        if "norm" in k:
            assert torch.all(v == 1), k
        else:
            assert abs(float(v.std()) - 0.02) < 0.004, (k, float(v.std()))

    # 1. Logits and loss of the fixed batch.
    b0 = idx["batches"][0]
    B, T = idx["options"]["batch"], idx["options"]["seq"]
    tok = torch.tensor(b0["tokens"], dtype=torch.long).view(B, T)
    tgt = torch.tensor(b0["targets"], dtype=torch.long).view(B, T)
    logits_ours = torch.from_numpy(np.fromfile(tmp_path / "logits.bin", dtype="<f4").reshape(B * T, V))
    out = model(input_ids=tok)
    logits = out.logits.reshape(B * T, V)
    assert _rel(logits_ours, logits.detach()) < 1e-5
    loss = torch.nn.functional.cross_entropy(logits, tgt.reshape(-1))
    assert abs(idx["loss"] - float(loss)) / float(loss) < 1e-5

    # 2. Every parameter's gradient (torch autograd).
    model.zero_grad()
    loss.backward()
    named = dict(model.named_parameters())
    for k in init:
        g = named[k].grad
        assert g is not None, k
        r = _rel(grads[k], g)
        assert r < 1e-4, f"{k}: relative gradient error {r:.3e}"

    # 3. Five steps with torch.optim.AdamW + clip_grad_norm_ + the schedule.
    model = _hf_model(cfg)
    _load_into(model, init, tied)
    o = idx["options"]
    params = dict(model.named_parameters())  # tied: embed listed once
    decay = [p for k, p in params.items() if "norm" not in k]
    no_decay = [p for k, p in params.items() if "norm" in k]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=o["lr"], betas=(o["beta1"], o["beta2"]), eps=o["eps"], foreach=False)
    losses = []
    for s in range(o["steps"]):
        bt = idx["batches"][s]
        tk = torch.tensor(bt["tokens"], dtype=torch.long).view(B, T)
        tg = torch.tensor(bt["targets"], dtype=torch.long).view(-1)
        opt.zero_grad()
        lo = torch.nn.functional.cross_entropy(model(input_ids=tk).logits.reshape(B * T, V), tg)
        lo.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o["max_grad_norm"])
        lr = _lr_at(s, o["lr"], o["warmup"], o["total"])
        for gp in opt.param_groups:
            gp["lr"] = lr
        opt.step()
        losses.append(float(lo))
        st = idx["steps"][s]
        assert abs(st["lr"] - lr) <= 1e-12 * lr
        assert abs(st["grad_norm"] - float(norm)) / float(norm) < 1e-4
    ours_losses = [s["loss"] for s in idx["steps"]]
    np.testing.assert_allclose(ours_losses, losses, rtol=1e-5)
    # Adam divides by sqrt(v): for elements whose gradient is near float round-off, the two
    # implementations' last-bit differences in the gradient become visible differences in the
    # update. Bound the worst element by 1% of the largest possible movement (lr per step) and
    # require nearly every element to agree far more tightly.
    worst = 0.0
    bound = 0.01 * o["lr"] * o["steps"]
    for k, p in params.items():
        diff = (final[k].double() - p.detach().double()).abs()
        d = float(diff.max())
        worst = max(worst, d)
        assert d < bound, f"{k}: after 5 steps max abs diff {d:.3e} (bound {bound:.1e})"
        frac = float((diff > 1e-6).double().mean())
        assert frac < 1e-2, f"{k}: {frac:.2%} of elements differ by more than 1e-6"
    print(f"{name}: worst param diff after 5 steps {worst:.3e}")
