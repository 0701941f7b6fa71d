"""`ckpt train` on an MoE model imported from HF (issue 38, one process; several: test_trainer_moe_pipeline.py).

transformers makes a tiny Qwen3-MoE (a dense layer between MoE ones, q/k norms), a Qwen2-MoE (shared
expert and its gate, q/k/v biases) and a Mixtral with seeded random weights and saves them as released checkpoints are (`save_pretrained`, one tensor
per expert); `ckpt from-hf` imports them; `ckpt train --init` trains N steps from those weights.
Oracle: transformers + torch.optim.AdamW (the documented defaults, test_trainer_vs_torch.py's
schedule) from the same HF weights on the same batches (the token stream of the same seed, as
trainer_dump writes it), loss = cross-entropy + router_aux_loss_coef * aux_loss
(output_router_logits): every step's loss within 1e-5 relative. The step-N checkpoint holds the
store's canonical MoE tensors (the same names and shapes `from-hf` wrote), `ckpt to-hf` of it loads
in transformers, and its weights are torch's after N steps within a tenth of lr (float32 Adam noise,
as the dense test bounds it). A resume from the step-2 checkpoint repeats steps 3..N bit for bit;
the step line reports the router's load. MoE layers under tp > 1 are refused by name (pipeline stages and
DP: test_trainer_moe_pipeline.py).
"""
import json
import subprocess

import numpy as np
import pytest
import torch

from test_trainer_moe_vs_torch import _canonical, _loss
from test_trainer_vs_torch import ADAMW, MAX_GRAD_NORM, _exe, _lr_at

STEPS, LR, WARMUP, SEED, B, T = 4, 2e-3, 2, 5, 2, 16
MODELS = {
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=48, moe_intermediate_size=24, num_hidden_layers=3, mlp_only_layers=[1],
                       decoder_sparse_step=1, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=40,
                       num_hidden_layers=2, mlp_only_layers=[], decoder_sparse_step=1, num_experts=4,
                       num_experts_per_tok=2, norm_topk_prob=False)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM",
                dict(intermediate_size=40, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2)),
}


def _ckpt(*args, check=True):
    p = subprocess.run([_exe("ckpt"), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def _make_hf(d, name):
    import transformers
    cfg_cls, model_cls, kw = MODELS[name]
    cfg = getattr(transformers, cfg_cls)(vocab_size=264, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                         head_dim=8, rms_norm_eps=1e-5, max_position_embeddings=64,
                                         tie_word_embeddings=False, router_aux_loss_coef=0.05,
                                         output_router_logits=True, bos_token_id=256, eos_token_id=257, **kw)
    torch.manual_seed(3)
    m = getattr(transformers, model_cls)(cfg).float()
    with torch.no_grad():
        for k, p in m.named_parameters():
            if p.dim() == 1:
                p.add_(torch.rand_like(p) - 0.5)  # norms off 1
            elif "gate.weight" in k:
                p.normal_(0, 0.3)  # routing far from ties
    m.save_pretrained(d / "hf")
    return json.loads((d / "hf" / "config.json").read_text())


def _batches(d):
    """The token stream `ckpt train --seed SEED` reads, as trainer_dump writes it."""
    out = d / "dump"
    out.mkdir()
    subprocess.run([_exe("trainer_dump"), str(d / "hf" / "config.json"), str(out), "--seed", str(SEED), "--batch",
                    str(B), "--seq", str(T), "--steps", str(STEPS), "--f64", "1"], check=True, timeout=300)
    idx = json.loads((out / "index.json").read_text())
    return [(torch.tensor(b["tokens"]).view(B, T), torch.tensor(b["targets"])) for b in idx["batches"]]


def _torch_run(d, cls, batches, V):
    import transformers
    m = getattr(transformers, cls).from_pretrained(d / "hf", torch_dtype=torch.float32, attn_implementation="eager")
    m.eval()
    params = dict(m.named_parameters())
    nd = [k for k in params if "norm" in k or k.endswith(".bias")]
    opt = torch.optim.AdamW([{"params": [p for k, p in params.items() if k not in nd], "weight_decay": ADAMW["weight_decay"]},
                             {"params": [params[k] for k in nd], "weight_decay": 0.0}],
                            lr=LR, betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"], foreach=False)
    losses = []
    for s, (tok, tgt) in enumerate(batches):
        opt.zero_grad()
        _, lo = _loss(m, tok, tgt, V)
        lo.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), MAX_GRAD_NORM)
        for gp in opt.param_groups:
            gp["lr"] = _lr_at(s, LR, WARMUP, STEPS)
        opt.step()
        losses.append(float(lo.detach()))
    final = {}
    for k, p in params.items():
        final.update(_canonical(k, p.detach()))
    return losses, final


@pytest.mark.parametrize("name", sorted(MODELS))
def test_train_from_hf_moe_import_equals_torch(tmp_path, name):
    cfg = _make_hf(tmp_path, name)
    _ckpt("from-hf", tmp_path / "hf", tmp_path / "store", "--no-fsync")
    run = tmp_path / "run"
    common = ["--config", tmp_path / "hf" / "config.json", "--steps", STEPS, "--seed", SEED, "--micro-batch", B,
              "--seq-len", T, "--lr", LR, "--warmup", WARMUP, "--threads", 1, "--sync-save"]
    p = _ckpt("train", *common, "--init", tmp_path / "store", "--out", run, "--save-every", 2)
    assert "router max/mean" in p.stdout, p.stdout
    log = [json.loads(x) for x in (run / "train_log.jsonl").read_text().splitlines() if x.strip()]
    ours = [r["loss"] for r in log if "loss" in r]
    assert len(ours) == STEPS and all(r["router_load"] >= 1 for r in log if "loss" in r), log
    # Resumed from step 2 in a new launch: the same steps 3..N, bit for bit.
    _ckpt("train", *common, "--resume", run / "step-00000002", "--out", tmp_path / "run_b")
    log_b = [json.loads(x) for x in (tmp_path / "run_b" / "train_log.jsonl").read_text().splitlines() if x.strip()]
    assert [r["loss"] for r in log_b if "loss" in r] == ours[2:]
    losses, final = _torch_run(tmp_path, MODELS[name][1], _batches(tmp_path), cfg["vocab_size"])
    print(f"{name}: losses ours {ours}, torch {losses}")
    np.testing.assert_allclose(ours, losses, rtol=1e-5)
    # The step-N checkpoint: the store's MoE tensors, as from-hf wrote them.
    step = run / f"step-{STEPS:08d}"
    names = lambda p: {t["name"]: t["shape"] for t in json.loads(_ckpt("inspect", p, "--json").stdout)["tensors"]
                       if not t["name"].startswith("optimizer.")}
    assert names(step) == names(tmp_path / "store")
    assert any(k.endswith("mlp.experts.gate_proj.weight") for k in names(step))
    _ckpt("to-hf", step, tmp_path / "out_hf", "--no-fsync")
    import transformers
    m = getattr(transformers, MODELS[name][1]).from_pretrained(tmp_path / "out_hf", torch_dtype=torch.float32)
    got = {}
    for k, v in m.state_dict().items():
        if "rotary_emb" not in k:
            got.update(_canonical(k, v))
    assert set(got) == set(final)
    worst = max(float((got[k] - final[k]).abs().max()) for k in final)
    print(f"{name}: |ckpt - torch| after {STEPS} steps {worst:.2e} (lr {LR})")
    assert worst < 0.1 * LR
