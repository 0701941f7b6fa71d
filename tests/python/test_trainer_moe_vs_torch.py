"""The reference trainer's MoE layers (trainer/model/moe_mlp.h) against transformers + torch.

As test_trainer_vs_torch.py does for LLaMA: tests/tools/trainer_dump runs the trainer (float32,
and its float64 twin) on a tiny MoE config, writes the initial weights as a native checkpoint
through the trainer's save path, the logits / loss / gradients of the step-0 batch and the weights
after 5 AdamW steps. `ckpt to-hf` exports the checkpoint; MixtralForCausalLM, Qwen3MoeForCausalLM
and Qwen2MoeForCausalLM load it (eager attention) and compute, with output_router_logits=True,
loss = cross_entropy + router_aux_loss_coef * aux_loss (transformers' load_balancing_loss_func, no
attention mask: every token counts), torch autograd the gradients, torch.optim.AdamW the steps.

- float32: logits within 1e-5 relative, the loss within 1e-5 relative, each gradient within 1e-4
  of the tensor's largest (as the dense test: float32 round-off of sums over tokens and experts,
  ~1e-6 measured), AdamW losses within 1e-5 relative.
- float64 twin: transformers' float32 casts lifted to float64 (RMSNorm, RoPE cos/sin, eager
  softmax, the router's softmax, the aux loss's float32 accumulators): loss within 1e-10
  relative, gradients within 1e-10 of the tensor's largest, 5 AdamW steps' losses within 1e-10.
The aux coefficient is set well above transformers' 0.001 so that its gradient is a visible part
of the router's (a wrong aux gradient fails the router comparison; checked by the test that drops
it). Configs: Mixtral (every layer MoE, top-2 of 4, weights renormalized), Qwen3-MoE (q/k norms, a
dense layer from mlp_only_layers, top-2 of 6 without norm_topk_prob), Qwen2-MoE (q/k/v biases, a
shared expert with its sigmoid gate, norm_topk_prob).
"""
import inspect
import json
import subprocess

import numpy as np
import pytest
import torch

from test_trainer_vs_torch import ADAMW, MAX_GRAD_NORM, PEAK_LR, STEPS, _batch, _exe, _load, _lr_at, _rel
from test_trainer_vs_torch import _patch_float64 as _patch_dense_float64

BASE = dict(vocab_size=264, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            rms_norm_eps=1e-5, max_position_embeddings=64, tie_word_embeddings=False, hidden_act="silu",
            torch_dtype="float32", bos_token_id=256, eos_token_id=257, router_aux_loss_coef=0.05,
            output_router_logits=True, attention_bias=False, rope_theta=10000.0)
CONFIGS = {
    "mixtral": dict(model_type="mixtral", architectures=["MixtralForCausalLM"], intermediate_size=40,
                    num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2),
    "qwen3_moe": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], intermediate_size=48,
                      moe_intermediate_size=24, num_hidden_layers=3, mlp_only_layers=[1], decoder_sparse_step=1,
                      num_experts=6, num_experts_per_tok=2, norm_topk_prob=False),
    "qwen2_moe": dict(model_type="qwen2_moe", architectures=["Qwen2MoeForCausalLM"], intermediate_size=48,
                      moe_intermediate_size=16, shared_expert_intermediate_size=40, num_hidden_layers=2,
                      mlp_only_layers=[], decoder_sparse_step=1, num_experts=4, num_experts_per_tok=2,
                      norm_topk_prob=True, qkv_bias=True),
}
DUMP_ARGS = ["--seed", "13", "--batch", "2", "--seq", "24", "--steps", str(STEPS), "--lr", str(PEAK_LR),
             "--warmup", "2", "--total", "8"]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def run(request, tmp_path_factory):
    name = request.param
    d = tmp_path_factory.mktemp(name)
    cfg = dict(BASE, **CONFIGS[name])
    (d / "config.json").write_text(json.dumps(cfg))
    r = {"name": name, "cfg": cfg, "hf": d / "hf"}
    for key, extra in (("f32", []), ("f64", ["--f64", "1"])):
        (d / key).mkdir()
        subprocess.run([_exe("trainer_dump"), str(d / "config.json"), str(d / key), *DUMP_ARGS, *extra],
                       check=True, timeout=300)
        idx = json.loads((d / key / "index.json").read_text())
        r[key] = {"idx": idx, "init": _load(d / key, idx, "init", "init.bin"),
                  "grads": _load(d / key, idx, "grads", "grads.bin"), "final": _load(d / key, idx, "final", "final.bin"),
                  "logits": torch.from_numpy(np.fromfile(d / key / "logits.bin", dtype="<f8" if key == "f64" else "<f4"))}
    subprocess.run([_exe("ckpt"), "to-hf", str(d / "f32" / "run" / "step-00000000"), str(r["hf"]), "--no-fsync"],
                   check=True, timeout=300, capture_output=True)
    return r


def _module(name):
    import importlib
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def _patch_float64(monkeypatch, name):
    """Lifts transformers' float32 casts to the model's dtype (the float64 reference)."""
    ml = _module(name)
    prefix = {"mixtral": "Mixtral", "qwen3_moe": "Qwen3Moe", "qwen2_moe": "Qwen2Moe"}[name]

    def router_forward(self, h):  # transformers' router without its .float() / dtype=torch.float
        h = h.reshape(-1, self.hidden_dim)
        logits = torch.nn.functional.linear(h, self.weight)
        top, idx = torch.topk(torch.nn.functional.softmax(logits, dim=-1), self.top_k, dim=-1)
        if getattr(self, "norm_topk_prob", True):  # Mixtral's router always renormalizes
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, top, idx

    # transformers' own load_balancing_loss_func with its float32 accumulators in float64.
    src = inspect.getsource(ml.load_balancing_loss_func).replace("torch.float32", "torch.float64")
    src = src.replace(".float()", ".double()")
    ns = dict(ml.__dict__)
    exec(compile(src, ml.__file__, "exec"), ns)
    _patch_dense_float64(monkeypatch, ml, prefix)  # RMSNorm, rotary embedding, eager attention as for LLaMA
    monkeypatch.setattr(getattr(ml, prefix + "TopKRouter"), "forward", router_forward)
    monkeypatch.setattr(ml, "load_balancing_loss_func", ns["load_balancing_loss_func"])


def _hf_model(r, dtype):
    import transformers
    cls = getattr(transformers, r["cfg"]["architectures"][0])
    m = cls.from_pretrained(r["hf"], torch_dtype=torch.float32, attn_implementation="eager",
                            experts_implementation="eager").to(dtype)  # the per-expert loop (float64 too)
    m.eval()
    assert m.config.output_router_logits
    return m


def _canonical(hf_name, tensor):
    """HF in-memory parameter -> {canonical name: tensor} (the fused gate_up_proj split in two)."""
    n = hf_name.replace(".block_sparse_moe.", ".mlp.").replace(".mlp.shared_expert.", ".mlp.shared_experts.")
    if n.endswith("experts.gate_up_proj"):
        g, u = tensor.chunk(2, dim=1)
        return {n[:-len("gate_up_proj")] + "gate_proj.weight": g, n[:-len("gate_up_proj")] + "up_proj.weight": u}
    if n.endswith("experts.down_proj"):
        return {n + ".weight": tensor}
    return {n: tensor}


def _loss(model, tok, tgt, V):
    out = model(input_ids=tok, output_router_logits=True)
    ce = torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), tgt)
    return out.logits.reshape(-1, V), ce + model.config.router_aux_loss_coef * out.aux_loss


def _forward_backward(model, idx, V):
    tok, tgt = _batch(idx, 0)
    logits, loss = _loss(model, tok, tgt, V)
    model.zero_grad()
    loss.backward()
    grads = {}
    for k, p in model.named_parameters():
        grads.update(_canonical(k, p.grad))
    return logits.detach(), float(loss.detach()), grads


def _torch_steps(model, idx, V):
    params = dict(model.named_parameters())
    no_decay = [p for k, p in params.items() if "norm" in k or k.endswith(".bias")]
    decay = [p for k, p in params.items() if not ("norm" in k or k.endswith(".bias"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=PEAK_LR, betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"], foreach=False)
    losses, norms = [], []
    for s in range(STEPS):
        tk, tg = _batch(idx, s)
        opt.zero_grad()
        _, lo = _loss(model, tk, tg, V)
        lo.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)))
        for gp in opt.param_groups:
            gp["lr"] = _lr_at(s, PEAK_LR, 2, 8)
        opt.step()
        losses.append(float(lo.detach()))
    final = {}
    for k, p in params.items():
        final.update(_canonical(k, p.detach().double()))
    return losses, norms, final


def test_export_loads_as_the_trainer_state(run):
    """`ckpt to-hf` of the trainer's MoE checkpoint is the dumped initial state in transformers."""
    m = _hf_model(run, torch.float32)
    sd = {}
    for k, v in m.state_dict().items():
        if "rotary_emb" not in k:
            sd.update(_canonical(k, v))
    init = run["f32"]["init"]
    assert set(sd) == set(init)
    for k, v in init.items():
        assert torch.equal(sd[k], v), k
    assert any(k.endswith("mlp.experts.gate_proj.weight") for k in init)


def test_logits_loss_grads_float32(run):
    V = run["cfg"]["vocab_size"]
    d = run["f32"]
    logits, loss, grads = _forward_backward(_hf_model(run, torch.float32), d["idx"], V)
    assert _rel(d["logits"].reshape(-1, V), logits) < 1e-5
    assert abs(d["idx"]["loss"] - loss) / loss < 1e-5, (d["idx"]["loss"], loss)
    worst = 0.0
    for k, g in d["grads"].items():
        r = _rel(g, grads[k])
        worst = max(worst, r)
        assert r < 1e-4, f"{k}: relative gradient error {r:.3e}"
    print(f"{run['name']}: float32 loss {loss:.8f}, worst gradient error {worst:.2e} of the tensor's largest")


def test_float64_twin(run, monkeypatch):
    _patch_float64(monkeypatch, run["name"])
    V = run["cfg"]["vocab_size"]
    d = run["f64"]
    logits, loss, grads = _forward_backward(_hf_model(run, torch.float64), d["idx"], V)
    assert _rel(d["logits"].reshape(-1, V), logits) < 1e-10
    assert abs(d["idx"]["loss"] - loss) / loss < 1e-10, (d["idx"]["loss"], loss)
    worst = 0.0
    for k, g in d["grads"].items():
        r = _rel(g, grads[k])
        worst = max(worst, r)
        assert r < 1e-10, f"{k}: relative gradient error {r:.3e}"
    losses, norms, final = _torch_steps(_hf_model(run, torch.float64), d["idx"], V)
    np.testing.assert_allclose([s["loss"] for s in d["idx"]["steps"]], losses, rtol=1e-10)
    np.testing.assert_allclose([s["grad_norm"] for s in d["idx"]["steps"]], norms, rtol=1e-10)
    wp = max(float((d["final"][k] - p).abs().max()) for k, p in final.items())
    print(f"{run['name']}: float64 twin, worst gradient error {worst:.2e}, parameters after {STEPS} steps {wp:.2e}")
    assert wp < 1e-9


def test_aux_loss_reaches_the_router(run, monkeypatch):
    """Without its aux term, transformers' router gradient differs from ours by far more than the
    float64 tolerance: the comparison above sees the aux gradient."""
    _patch_float64(monkeypatch, run["name"])
    V = run["cfg"]["vocab_size"]
    d = run["f64"]
    m = _hf_model(run, torch.float64)
    tok, tgt = _batch(d["idx"], 0)
    out = m(input_ids=tok, output_router_logits=True)
    torch.nn.functional.cross_entropy(out.logits.reshape(-1, V), tgt).backward()
    routers = [k for k, _ in m.named_parameters() if k.endswith("mlp.gate.weight")]
    assert routers
    params = dict(m.named_parameters())
    assert max(_rel(d["grads"][k], params[k].grad) for k in routers) > 1e-6


def test_adamw_steps_float32(run):
    V = run["cfg"]["vocab_size"]
    d = run["f32"]
    losses, norms, _ = _torch_steps(_hf_model(run, torch.float32), d["idx"], V)
    steps = d["idx"]["steps"]
    np.testing.assert_allclose([s["grad_norm"] for s in steps], norms, rtol=1e-4)
    np.testing.assert_allclose([s["loss"] for s in steps], losses, rtol=1e-5)


def test_grad_accum_has_an_aux_loss_per_micro_batch(tmp_path, monkeypatch):
    """--grad-accum 2 (float64 twin, Mixtral): each micro-batch's loss has its own aux term and
    the step's loss is their mean, as transformers' gradient accumulation of equal micro-batches:
    the step-0 gradients within 1e-10 of torch doing exactly that (one aux over both micro-batches
    would differ)."""
    cfg = dict(BASE, **CONFIGS["mixtral"])
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    subprocess.run([_exe("trainer_dump"), str(tmp_path / "config.json"), str(tmp_path), *DUMP_ARGS, "--grad-accum", "2",
                    "--f64", "1"], check=True, timeout=300)
    idx = json.loads((tmp_path / "index.json").read_text())
    grads = _load(tmp_path, idx, "grads", "grads.bin")
    init = _load(tmp_path, idx, "init", "init.bin")
    _patch_float64(monkeypatch, "mixtral")
    import transformers
    hc = transformers.AutoConfig.from_pretrained(tmp_path)
    hc._attn_implementation, hc._experts_implementation = "eager", "eager"
    m = transformers.MixtralForCausalLM(hc).double().eval()
    V, (B, T) = cfg["vocab_size"], (2, 24)
    with torch.no_grad():
        for k, p in m.named_parameters():
            n = k.replace(".block_sparse_moe.", ".mlp.")
            if n.endswith("experts.gate_up_proj"):
                base = n[:-len("gate_up_proj")]
                p.copy_(torch.cat([init[base + "gate_proj.weight"], init[base + "up_proj.weight"]], dim=1))
            else:
                p.copy_(init[n + (".weight" if n.endswith("experts.down_proj") else "")])
    tok, tgt = _batch(idx, 0)

    def torch_grads(micro):
        m.zero_grad()
        sum(_loss(m, tok[a * micro:(a + 1) * micro], tgt[a * micro * T:(a + 1) * micro * T], V)[1]
            for a in range(2 * B // micro)).backward()
        out = {}
        for k, p in m.named_parameters():
            out.update(_canonical(k, p.grad * micro / (2 * B)))
        return out

    theirs, joint = torch_grads(B), torch_grads(2 * B)
    worst = max(_rel(g, theirs[k]) for k, g in grads.items())
    print(f"grad-accum 2: worst gradient error {worst:.2e}")
    assert worst < 1e-10
    assert max(_rel(grads[k], joint[k]) for k in grads if k.endswith("mlp.gate.weight")) > 1e-6
