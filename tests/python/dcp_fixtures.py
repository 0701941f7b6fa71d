"""DCP fixtures written by torch itself (torch.distributed.checkpoint.save), cached under
$CKPT_BINARY_DIR/dcp_fixtures/<FIXTURE_VERSION> and built once under a file lock (parallel ctest
runs share them). Layout of the cache:

  llama_fp32/hf/     save_pretrained of a small random LlamaForCausalLM (GQA, untied, fp32)
  llama_fp32/dcp/    dcp.save(model.state_dict()); config.json sits in the PARENT (llama_fp32/)
  llama_bf16/hf/     the same model in bf16
  llama_bf16/dcp/    its DCP, config.json INSIDE the directory
  sharded/dcp/       2 processes (gloo, CPU DeviceMesh of 2): DTensors sharded Shard(0) / Shard(1)
                     (one uneven), a replicated tensor, a bf16 one, and a non-tensor (bytes) item
  sharded/ref.safetensors  what torch's own dcp.load returns for sharded/dcp, in one process

Run as a script (`python dcp_fixtures.py ROOT`) it builds ROOT; tests call fixture_root().
"""
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURE_VERSION = "v1"
LLAMA = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=8,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False)
TOKENS = [[1, 5, 9, 33, 77, 96, 2, 64]]


def fixture_root() -> pathlib.Path:
    base = pathlib.Path(os.environ.get("CKPT_BINARY_DIR", ROOT / "build")) / "dcp_fixtures"
    base.mkdir(parents=True, exist_ok=True)
    root = base / FIXTURE_VERSION
    with open(base / ".lock", "w") as lk:
        fcntl.flock(lk, fcntl.LOCK_EX)
        if not (root / "DONE").exists():
            tmp = base / f"{FIXTURE_VERSION}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run([sys.executable, __file__, str(tmp)], check=True, timeout=600)
            (tmp / "DONE").write_text("ok\n")
            shutil.rmtree(root, ignore_errors=True)
            os.rename(tmp, root)
    return root


def llama_model(dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    return m.to(dtype)


def _build_llama(root: pathlib.Path, name, dtype, config_in_dir):
    import torch.distributed.checkpoint as dcp
    m = llama_model(dtype)
    d = root / name
    m.save_pretrained(d / "hf")
    dcp.save(m.state_dict(), checkpoint_id=str(d / "dcp"))
    cfg = (d / "hf" / "config.json").read_text()
    (d / "dcp" / "config.json" if config_in_dir else d / "config.json").write_text(cfg)


def sharded_globals():
    """The global tensors the 2-process save shards, and how (placement per tensor)."""
    import torch
    g = torch.Generator().manual_seed(7)
    return {
        "w_rows": (torch.randn(6, 4, generator=g), "shard0"),
        "w_cols_uneven": (torch.randn(5, 7, generator=g), "shard1"),
        "b_rows_bf16": (torch.randn(5, 6, generator=g).to(torch.bfloat16), "shard0"),
        "replicated": (torch.randn(3, generator=g), "replicate"),
        "layers.0.scalar": (torch.tensor(2.5), "replicate"),
    }


def _sharded_worker(rank, out):
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["DCP_FIXTURE_PORT"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    place = {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate()}
    sd = {k: distribute_tensor(t, mesh, [place[p]]) for k, (t, p) in sharded_globals().items()}
    sd["step"] = 11  # a non-tensor: a bytes item
    dcp.save(sd, checkpoint_id=out)
    dist.barrier()
    dist.destroy_process_group()


def _build_sharded(root: pathlib.Path):
    import socket
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.multiprocessing as mp
    from safetensors.torch import save_file
    out = root / "sharded" / "dcp"
    out.parent.mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["DCP_FIXTURE_PORT"] = str(s.getsockname()[1])
    mp.spawn(_sharded_worker, args=(str(out),), nprocs=2, join=True)
    # The reference: torch's DCP load of the same directory into plain tensors (one process).
    ref = {k: torch.zeros_like(t) for k, (t, _) in sharded_globals().items()}
    ref["step"] = 0
    dcp.load(ref, checkpoint_id=str(out))
    assert ref["step"] == 11
    del ref["step"]
    save_file({k: v.contiguous() for k, v in ref.items()}, str(root / "sharded" / "ref.safetensors"))


def build(root: pathlib.Path):
    import warnings
    warnings.filterwarnings("ignore")
    import torch
    root.mkdir(parents=True)
    _build_llama(root, "llama_fp32", torch.float32, config_in_dir=False)
    _build_llama(root, "llama_bf16", torch.bfloat16, config_in_dir=True)
    _build_sharded(root)
    (root / "tokens.json").write_text(json.dumps(TOKENS))


if __name__ == "__main__":
    build(pathlib.Path(sys.argv[1]))
