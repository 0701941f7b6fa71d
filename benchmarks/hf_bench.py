#!/usr/bin/env python3
"""Benchmark of `ckpt from-hf` and `ckpt to-hf` on a >= 2 GB LLaMA model against, in the same run:
a plain copy of the same bytes (`cp -r` of the HF directory) and the Python stack doing the same
conversion (safetensors.torch load_file + save_file). Wall time, CPU time (user + sys) and peak RSS
(/usr/bin/time, i.e. getrusage of the child) of every command; medians over --reps rounds; commands
rotate inside a round. Ratios to cp: of the medians ("vs cp"), and the median of each round's ratio
to the cp of the same round ("paired"; the VM's state drifts between rounds). Also measured in the
run: SHA-256 speed of one thread, and from it the CPU floor of from-hf on 2 cores.

  .venv/bin/python benchmarks/hf_bench.py --ckpt build/ckpt [--layers 22] [--reps 3] [--dir /tmp/hf_bench] [--fsync]

Model: TinyLlama-1.1B-shaped (hidden 2048, intermediate 5632, 32 heads, 4 KV heads, vocab 32000,
untied), random bf16 weights, `--layers 22` = 1.10e9 parameters = 2.2 GB in one model.safetensors.
State: page cache warm (every input was written or read just before), memory 'hot' (--hot-gib GiB
touched and freed right before each timed command, see ../shared/LIMITS.md), no fsync anywhere
unless --fsync (then ckpt fsyncs and cp/python are followed by `sync`). Also measured: to-hf from the same
model resharded to tp=2 pp=3 dp=2 (streams from 12 shard files), and with --small-layers a second,
smaller model so peak memory can be compared across model sizes.
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

# torch is imported where a model is generated, not here: io_modes_bench imports timed() from this
# module, and a harness holding torch measured its idle-state children slower (docs/BENCHMARKS.md).


def llama_config(layers: int, vocab: int = 32000):
    """The HF config.json of the TinyLlama-shaped model (make_model's)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": 2048,
            "intermediate_size": 5632, "num_hidden_layers": layers, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
            "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1,
            "eos_token_id": 2}


def make_model(d: pathlib.Path, layers: int, seed: int = 0, vocab: int = 32000):
    import torch
    from safetensors.torch import save_file
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(llama_config(layers, vocab), indent=2))
    g = torch.Generator().manual_seed(seed)
    h, f, q, kv, v = 2048, 5632, 32 * 64, 4 * 64, vocab
    ts = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(layers):
        p = f"model.layers.{i}."
        ts.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                   p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f)})
    tensors = {k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in ts.items()}
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    return sum(t.numel() * 2 for t in tensors.values())


def timed(cmd, sync=False, stdout=None):
    """Wall seconds, peak RSS (MiB) and CPU seconds (user + sys) of `cmd`, measured by /usr/bin/time
    (getrusage of its child; a child forked from this large Python process would inherit its RSS
    high-water mark). `stdout`: an open file for the command's output (default: discarded)."""
    rep = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"hf_bench_time_{os.getpid()}.txt"
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%e %M %U %S", "-o", str(rep), *map(str, cmd)], stdout=stdout or subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if sync:
        os.sync()
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed: {p.stderr}")
    fields = rep.read_text().split()
    rep.unlink()
    return dt, int(fields[-3]) / 1024.0, float(fields[-2]) + float(fields[-1])  # seconds (incl. sync), MiB, CPU s


def sha256_rate(path: pathlib.Path, nbytes: int = 512 << 20):
    """Bytes/s of one thread hashing with SHA-256 (hashlib: OpenSSL, as ckpt) over page-cached data."""
    import hashlib
    with open(path, "rb") as f:
        data = f.read(nbytes)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        hashlib.sha256(data).digest()
        best = max(best, len(data) / (time.perf_counter() - t0))
    return best


def warm_memory(gib: float):
    """'hot' state (docs LIMITS.md): touch and free `gib` GiB right before a timed command, so the
    VM's free memory is backed by the host and new page-cache pages are not first-touch slow."""
    if gib <= 0:
        return
    import numpy as np
    a = np.ones(int(gib * (1 << 30)) // 8, dtype=np.float64)
    del a


def dir_bytes(d: pathlib.Path):
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--dir", default="/tmp/hf_bench")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--small-layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fsync", action="store_true")
    ap.add_argument("--hot-gib", type=float, default=6.0, help="GiB touched and freed before each timed command (0: off)")
    ap.add_argument("--max-memory", default="", help="comma list of ckpt --max-memory values to compare, '' = ckpt's default 256M "
                    "(e.g. ',1G' runs both)")
    ap.add_argument("--keep", action="store_true", help="keep the generated models")
    a = ap.parse_args()
    ckpt = str(pathlib.Path(a.ckpt).resolve())
    py = sys.executable
    root = pathlib.Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    fs = [] if a.fsync else ["--no-fsync"]
    results = {}

    def fresh(name):
        p = root / name
        shutil.rmtree(p, ignore_errors=True)
        shutil.rmtree(str(p) + ".partial", ignore_errors=True)
        return p

    sizes = [("large", a.layers)] + ([("small", a.small_layers)] if a.small_layers else [])
    for label, layers in sizes:
        hf = root / f"hf_{label}"
        if not (hf / "model.safetensors").exists():
            t0 = time.perf_counter()
            nbytes = make_model(hf, layers)
            print(f"[{label}] generated {nbytes / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s", flush=True)
        model_bytes = dir_bytes(hf)
        native = root / f"native_{label}"
        if not (native / "manifest.json").exists():
            fresh(f"native_{label}")
            subprocess.run([ckpt, "from-hf", hf, native, "--no-fsync"], check=True, capture_output=True)
        resh = root / f"resh_{label}"
        if label == "large" and not (resh / "manifest.json").exists():
            fresh(f"resh_{label}")
            subprocess.run([ckpt, "reshard", native, resh, "--tp", "2", "--pp", str(min(3, layers)), "--dp", "2", "--no-verify", "--threads", "2"],
                           check=True, capture_output=True)
        py_conv = ("from safetensors.torch import load_file, save_file; import sys, os; "
                   "save_file(load_file(sys.argv[1]), sys.argv[2], metadata={'format': 'pt'})"
                   + ("; fd = os.open(sys.argv[2], os.O_RDONLY); os.fsync(fd)" if a.fsync else ""))
        cmds = {"cp -r (plain copy)": lambda: timed(["cp", "-r", hf, fresh("out_cp")], sync=a.fsync)}
        for mm in a.max_memory.split(","):
            mflag = ["--max-memory", mm] if mm else []
            tag = f" [{mm}]" if mm else ""
            cmds["ckpt from-hf" + tag] = lambda mflag=mflag: timed(
                [ckpt, "from-hf", hf, fresh("out_from"), "--threads", str(a.threads), *fs, *mflag])
            cmds["ckpt to-hf" + tag] = lambda mflag=mflag: timed(
                [ckpt, "to-hf", native, fresh("out_to"), "--threads", str(a.threads), *fs, *mflag])
            if label == "large":
                cmds["ckpt to-hf from tp2 pp3 dp2" + tag] = lambda mflag=mflag: timed(
                    [ckpt, "to-hf", resh, fresh("out_to_resh"), "--threads", str(a.threads), *fs, *mflag])
        cmds["python load_file+save_file"] = lambda: timed([py, "-c", py_conv, hf / "model.safetensors",
                                                            fresh("out_py").with_suffix(".safetensors")])
        runs = {k: [] for k in cmds}
        names = list(cmds)
        for r in range(a.reps):
            for k in names[r % len(names):] + names[:r % len(names)]:
                warm_memory(a.hot_gib)
                runs[k].append(cmds[k]())
                for n in ("out_cp", "out_from", "out_to", "out_to_resh"):
                    shutil.rmtree(root / n, ignore_errors=True)
                (root / "out_py.safetensors").unlink(missing_ok=True)
        res = {}
        cp_k = "cp -r (plain copy)"
        cp_t = statistics.median(t for t, _, _ in runs[cp_k])
        sha = sha256_rate(hf / "model.safetensors")
        # from-hf must hash every byte (SHA-256) and copy it: on 2 cores it can at best split the
        # hashing and a cp-like copy evenly, i.e. take (bytes / sha_rate + cp_cpu) / 2.
        cp_cpu = statistics.median(c for _, _, c in runs[cp_k])
        floor = (model_bytes / sha + cp_cpu) / 2
        print(f"\n[{label}] model {model_bytes / 1e9:.2f} GB ({layers} layers), {a.reps} rounds, page cache warm, "
              f"{'fsync' if a.fsync else 'no fsync'}, threads {a.threads}, hot {a.hot_gib} GiB, "
              f"ckpt --max-memory {a.max_memory or 'default (256M)'}")
        print(f"SHA-256 one thread: {sha / 1e9:.2f} GB/s; from-hf CPU floor on 2 cores (hash all + copy like cp, split evenly): "
              f"{floor:.2f} s = {cp_t / floor:.2f}x of cp")
        print(f"{'command':34s} {'median s':>9s} {'GB/s':>6s} {'vs cp':>6s} {'paired':>7s} {'CPU s':>6s} {'peak RSS MiB':>13s}")
        for k in names:
            t = statistics.median(x for x, _, _ in runs[k])
            rss = max(m for _, m, _ in runs[k])
            cpu = statistics.median(c for _, _, c in runs[k])
            # Paired: each round's cp time over this command's time in the same round.
            paired = statistics.median(c[0] / x[0] for c, x in zip(runs[cp_k], runs[k]))
            res[k] = {"seconds": t, "all_seconds": [x for x, _, _ in runs[k]], "gb_per_s": model_bytes / 1e9 / t,
                      "ratio_vs_cp": cp_t / t, "paired_ratio_vs_cp": paired, "cpu_seconds": cpu, "peak_rss_mib": rss}
            print(f"{k:34s} {t:9.2f} {model_bytes / 1e9 / t:6.2f} {cp_t / t:6.2f} {paired:7.2f} {cpu:6.2f} {rss:13.0f}")
        results[label] = {"model_bytes": model_bytes, "layers": layers, "sha256_gb_per_s": sha / 1e9,
                          "from_hf_floor_seconds": floor, "commands": res}
    print(json.dumps(results, indent=1))
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
