"""megatron-core (this venv's 0.16.1) loading a virtual-pipeline checkpoint, for test_megatron_vpp.py.

Run under torchrun with world size tp * pp (gloo, CPU): builds the interleaved model chunks of
fixtures/megatron_core_019's model (LLaMA-like GPTModel, local spec, 4 layers, hidden 16, GQA 4/2,
SwiGLU ffn 32, RMSNorm, rope, untied, vocab 200 padded to 128 * tp) with vp_stage = c for chunk c,
loads a checkpoint into them and writes the interleaved forward's logits (chunk 0 of every stage,
then chunk 1, ...; hidden states passed by send / recv) on the tokens given:
  legacy DIR: DIR/iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt (the tracker file's iteration),
      torch.load(weights_only=True) (argparse.Namespace allowed, as Megatron-LM registers it),
      chunk c <- load_state_dict(file['model{c}'], strict=True); args must say the vpp;
  dist DIR: dist_checkpointing.load({'model0': chunk0.sharded_state_dict(), ...}, DIR) as
      Megatron-LM's load_checkpoint does, then each chunk's load_state_dict.
CLI: mcore_vpp_load.py (legacy|dist) DIR TOKENS.npy OUT.npy TP PP VPP
"""
import argparse
import pathlib

from mcore_fixtures import _cpu_shims, transformer_config_kwargs  # noqa: E402 (this directory: the script's sys.path[0])

LAYERS, HIDDEN, HEADS, GROUPS, FFN, VOCAB, DIVISOR, SEQ = 4, 16, 4, 2, 32, 200, 128, 16


def _padded_vocab(tp):
    m = DIVISOR * tp
    return ((VOCAB + m - 1) // m) * m


def _build(tp, pp, vpp):
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                 virtual_pipeline_model_parallel_size=vpp)
    torch.manual_seed(99)  # every weight is loaded: the init must not matter
    cfg = TransformerConfig(**transformer_config_kwargs(tp, pp, LAYERS, HIDDEN, HEADS, GROUPS, FFN),
                            virtual_pipeline_model_parallel_size=vpp, params_dtype=torch.float32, bf16=False)
    chunks = []
    for c in range(vpp):
        chunks.append(GPTModel(
            config=cfg, transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=_padded_vocab(tp), max_sequence_length=SEQ * 4,
            pre_process=ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=c),
            post_process=ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=c), parallel_output=False,
            share_embeddings_and_output_weights=False, position_embedding_type="rope", rotary_base=10000,
            vp_stage=c))
    return chunks


def _forward(chunks, tokens):
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    b, s = tokens.shape
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).view(1, 1, s, s)
    out = None
    with torch.no_grad():
        for c, m in enumerate(chunks):
            first = ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=c)
            last = ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=c)
            if not first:
                buf = torch.empty(s, b, HIDDEN)
                dist.recv(buf, src=ps.get_pipeline_model_parallel_prev_rank())
                m.set_input_tensor(buf)
            out = m(tokens, pos, mask)
            if not last:
                dist.send(out.contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())
                out = None
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["legacy", "dist"])
    ap.add_argument("dir")
    ap.add_argument("tokens")
    ap.add_argument("out")
    ap.add_argument("tp", type=int)
    ap.add_argument("pp", type=int)
    ap.add_argument("vpp", type=int)
    a = ap.parse_args()
    import numpy as np
    import torch
    import torch.distributed as dist
    from megatron.core import dist_checkpointing, parallel_state as ps
    dist.init_process_group("gloo")
    _cpu_shims()
    chunks = _build(a.tp, a.pp, a.vpp)
    d = pathlib.Path(a.dir)
    if a.kind == "legacy":
        torch.serialization.add_safe_globals([argparse.Namespace])
        it = int((d / "latest_checkpointed_iteration.txt").read_text().strip())
        tp_r, pp_r = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        sub = f"mp_rank_{tp_r:02d}" + (f"_{pp_r:03d}" if a.pp > 1 else "")
        ck = torch.load(d / f"iter_{it:07d}" / sub / "model_optim_rng.pt", weights_only=True)
        assert "model" not in ck and f"model{a.vpp}" not in ck, sorted(ck)
        assert ck["args"].virtual_pipeline_model_parallel_size == a.vpp, ck["args"]
        for c, m in enumerate(chunks):
            m.load_state_dict(ck[f"model{c}"], strict=True)
            for k, v in m.state_dict().items():
                if torch.is_tensor(v):
                    assert torch.equal(v, ck[f"model{c}"][k]), (c, k)
    else:
        sd = {f"model{c}": m.sharded_state_dict() for c, m in enumerate(chunks)}
        loaded = dist_checkpointing.load(sd, str(d))
        for c, m in enumerate(chunks):
            m.load_state_dict(loaded[f"model{c}"])
    logits = _forward(chunks, torch.from_numpy(np.load(a.tokens)))
    if logits is not None and ps.get_tensor_model_parallel_rank() == 0:
        np.save(a.out, logits.float().numpy())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
