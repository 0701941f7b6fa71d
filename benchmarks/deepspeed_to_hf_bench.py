#!/usr/bin/env python3
"""Benchmark of `ckpt to-hf` on a >= 2 GB DeepSpeed ZeRO-3 checkpoint against DeepSpeed's own
`zero_to_fp32` (docs/BENCHMARKS.md "DeepSpeed ZeRO-3 to HF"), in the same run (issue 36).

    python3 benchmarks/deepspeed_to_hf_bench.py --ckpt build/ckpt [--data /work/bench-data/ds_zero3_2g]
        [--reps 3] [--max-memory 256M] [--ds-python /work/venv-ds/bin/python] [--json OUT]

Source (made once, untimed, kept in --data): DeepSpeed 0.19.8 itself trains a transformers
LlamaForCausalLM (hidden 2048, FFN 5504, 4 layers, 16 heads, vocab 1024, untied, fp32: 206.6 M
parameters) for ONE step under ZeRO stage 3 on 2 CPU ranks (gloo, torch AdamW, "torch_adam": true,
every parameter partitioned) and saves it: two `zero_pp_rank_R_mp_rank_00_optim_states.pt` files
holding the fp32 masters and both Adam moments (2.48 GB), and the model states files.

Timed commands (each round runs both, the order alternating; medians over --reps rounds; the
page cache is warmed by reading the checkpoint before each round, so both read from memory):
  ckpt to-hf [M]   `ckpt to-hf SRC OUT --max-memory M --no-verify`: the fp32 weights as HF
                   safetensors, memory bounded by M (--max-memory; one row per value given); fsync'd.
  zero_to_fp32     DeepSpeed's `convert_zero_checkpoint_to_fp32_state_dict(SRC, OUT,
                   safe_serialization=True)` in DeepSpeed's Python (the function zero_to_fp32.py
                   runs), then an fsync of its output (ckpt fsyncs its own).
  ... imports only `import deepspeed.utils.zero_to_fp32` alone: the part of zero_to_fp32's time that is
                   Python starting and importing torch + DeepSpeed.
Wall time and peak RSS come from /usr/bin/time (getrusage of the child). The outputs are checked
equal tensor for tensor once (safetensors in DeepSpeed's Python). The machine's load average is
printed before and after each round: other processes share the 2 cores.
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

SHAPE = dict(vocab_size=1024, hidden_size=2048, intermediate_size=5504, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=16, max_position_embeddings=128, tie_word_embeddings=False)

ZERO_TO_FP32 = """
import os, sys
from deepspeed.utils.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
convert_zero_checkpoint_to_fp32_state_dict(sys.argv[1], sys.argv[2], safe_serialization=True)
for dp, _, fs in os.walk(sys.argv[2]):
    for f in fs:
        fd = os.open(os.path.join(dp, f), os.O_RDONLY); os.fsync(fd); os.close(fd)
"""

COMPARE = """
import sys, glob
from safetensors.torch import load_file
def load(d):
    out = {}
    for f in sorted(glob.glob(d + '/*.safetensors')):
        out.update(load_file(f))
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
bad = [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or not a[k].equal(b[k])]
assert not bad, bad[:5]
print(len(a), 'tensors equal')
"""


def gen_worker(out):
    import deepspeed
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
           "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}, "steps_per_print": 1000}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    ids = torch.randint(0, SHAPE["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(torch.distributed.get_rank()))
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
    engine.save_checkpoint(out, tag="global_step1")
    torch.distributed.barrier()


def make_source(data: pathlib.Path, ds_python: str):
    if (data / "latest").exists():
        return
    tmp = data.with_name(data.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    env = dict(os.environ, DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    t = time.perf_counter()
    subprocess.run([ds_python, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29561", __file__,
                    "--gen-worker", str(tmp)], check=True, env=env)
    for f in tmp.glob("*.py"):  # DeepSpeed's copies of zero_to_fp32.py
        f.unlink()
    tmp.rename(data)
    print(f"made {data} with DeepSpeed in {time.perf_counter() - t:.0f} s", flush=True)


def timed(cmd):
    """(wall s, peak RSS MiB) of `cmd` under /usr/bin/time."""
    rep = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"ds_bench_time_{os.getpid()}.txt"
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%e %M", "-o", str(rep), *map(str, cmd)], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr[-2000:]}")
    f = rep.read_text().split()
    rep.unlink()
    return dt, int(f[-1]) / 1024.0


def load_avg():
    return float(open("/proc/loadavg").read().split()[0])


def read_all(d: pathlib.Path):
    for p in d.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(16 << 20):
                    pass


def dir_bytes(d: pathlib.Path):
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--data", default="/work/bench-data/ds_zero3_2g")
    ap.add_argument("--out", default="/work/bench-data/ds_bench_out")
    ap.add_argument("--ds-python", default="/work/venv-ds/bin/python")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-memory", default="256M", help="comma-separated: one ckpt row per value")
    ap.add_argument("--json")
    ap.add_argument("--gen-worker")
    a = ap.parse_args()
    if a.gen_worker:
        return gen_worker(a.gen_worker)
    data, out = pathlib.Path(a.data), pathlib.Path(a.out)
    make_source(data, a.ds_python)
    src_bytes = dir_bytes(data / (data / "latest").read_text().strip())
    print(f"source {data}: {src_bytes / 1e9:.2f} GB; load {load_avg():.2f}", flush=True)
    mems = a.max_memory.split(",")
    cmds = {f"ckpt to-hf [{m}]": [a.ckpt, "to-hf", data, out / "ckpt", "--max-memory", m, "--no-verify"] for m in mems}
    cmds["zero_to_fp32"] = [a.ds_python, "-c", ZERO_TO_FP32, data, out / "ds"]
    cmds["zero_to_fp32 imports only"] = [a.ds_python, "-c", "import deepspeed.utils.zero_to_fp32"]
    runs = {k: [] for k in cmds}
    for r in range(a.reps):
        order = list(cmds) if r % 2 == 0 else list(reversed(cmds))
        for k in order:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            read_all(data)
            before = load_avg()
            wall, rss = timed(cmds[k])
            runs[k].append({"wall_s": round(wall, 2), "peak_rss_mib": round(rss, 1), "load_before": before, "load_after": load_avg()})
            print(f"round {r}: {k}: {wall:.2f} s, peak RSS {rss:.0f} MiB (load {before:.2f} -> {load_avg():.2f})", flush=True)
        if r == 0:  # the two outputs, made once more side by side, are checked equal
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            for k in (list(cmds)[0], "zero_to_fp32"):
                subprocess.run(list(map(str, cmds[k])), check=True, capture_output=True)
            p = subprocess.run([a.ds_python, "-c", COMPARE, str(out / "ckpt"), str(out / "ds")], capture_output=True, text=True)
            print("outputs:", p.stdout.strip() or p.stderr[-1000:], flush=True)
            if p.returncode != 0:
                return 1
    summary = {k: {"wall_s_median": statistics.median(x["wall_s"] for x in v),
                   "peak_rss_mib_median": statistics.median(x["peak_rss_mib"] for x in v), "runs": v} for k, v in runs.items()}
    ck, ds = summary[list(cmds)[0]], summary["zero_to_fp32"]
    summary["speedup"] = round(ds["wall_s_median"] / ck["wall_s_median"], 2)
    summary["rss_ratio"] = round(ds["peak_rss_mib_median"] / ck["peak_rss_mib_median"], 2)
    summary["source_bytes"] = src_bytes
    print(json.dumps({k: v if k not in cmds else {kk: vv for kk, vv in v.items() if kk != "runs"} for k, v in summary.items()}))
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(summary, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
