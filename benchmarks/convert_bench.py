#!/usr/bin/env python3
"""Profile conversion benchmark (a command, not a timed test; docs/BENCHMARKS.md "Profile conversion").

  * a synthetic GQA LLaMA (20 layers, hidden 2048, 16 heads / 4 KV heads, ffn 5632, vocab 32000,
    bf16: about 2.1 GB) written as sharded HF safetensors (untimed), imported with
    `ckpt from-hf --tp 2 --pp 2` (untimed);
  * in the same run, the same page-cache state (SRC read before each run), outputs fsync'd:
      reshard alone          ckpt reshard SRC DST --tp 1 --pp 3 --pp-layers 7,7,6
      convert megatron-mcore ckpt convert ... --profile megatron-mcore  (QKV per group, fused
                             [gate; up] per TP rank, vocab padded to 128 x tp; no cast)
      convert paddlenlp      ckpt convert ... --profile paddlenlp  (every linear weight and
                             lm_head transposed: the transpose-heavy case)
    each with --max-memory (default 512M) and --threads 2: wall time, the ratio to reshard alone
    of the same repetition (the cases run interleaved: reshard, mcore, paddlenlp, reshard, ...),
    and the machine's load average around each run.
  * memory, per process of the command's tree, sampled from /proc/PID/status every 20 ms: peak
    RssAnon (heap, buffers: what --max-memory bounds), peak RssFile (mapped file pages: the
    source windows of file-to-file copies, libraries; the kernel can drop them) and VmHWM (their
    sum's high-water mark as the kernel counts it, also what ru_maxrss reports); the figures of
    the process with the largest VmHWM (the reshard itself; the SRC re-hash child is reported
    apart as `verify_child_*`).
  * --baseline-build DIR adds "convert paddlenlp (baseline)": the same conversion by another
    build's ckpt (e.g. the code before a change), interleaved with the others, so a before/after
    comparison shares the machine's state; --cases picks a subset of the cases by name prefix.
Prints one JSON object (and a table on stderr). The data directory is removed at the end unless
--keep; --reuse takes SRC from an earlier --keep run (same --layers). Usage: convert_bench.py
[--build DIR] [--dir DIR] [--layers 20] [--reps 1] [--max-memory 512M] [--keep] [--reuse]
[--baseline-build DIR] [--cases reshard,paddlenlp,...]
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

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reshard_bench import _tree, run_timed, warm  # noqa: E402  (same timing and page-cache helpers)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def make_hf(d: pathlib.Path, layers: int):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "intermediate_size": 5632,
           "num_hidden_layers": layers, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128,
           "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "hidden_act": "silu"}
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    h, f, kvd = 2048, 5632, 4 * 128
    weight_map = {}

    def shard(name, tensors):
        save_file(tensors, str(d / name))
        weight_map.update({k: name for k in tensors})

    rnd = lambda *s: (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)  # noqa: E731
    shard("model-embed.safetensors", {"model.embed_tokens.weight": rnd(32000, h), "model.norm.weight": rnd(h),
                                      "lm_head.weight": rnd(32000, h)})
    for i in range(layers):
        p = f"model.layers.{i}."
        shard(f"model-{i:03d}.safetensors", {
            p + "input_layernorm.weight": rnd(h), p + "post_attention_layernorm.weight": rnd(h),
            p + "self_attn.q_proj.weight": rnd(h, h), p + "self_attn.k_proj.weight": rnd(kvd, h),
            p + "self_attn.v_proj.weight": rnd(kvd, h), p + "self_attn.o_proj.weight": rnd(h, h),
            p + "mlp.gate_proj.weight": rnd(f, h), p + "mlp.up_proj.weight": rnd(f, h), p + "mlp.down_proj.weight": rnd(h, f)})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _status_kib(pid):
    """{field: KiB} of VmHWM, RssAnon, RssFile, RssShmem of a live process ({} once it is gone)."""
    out = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k = line.split(":")[0]
            if k in ("VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[k] = int(line.split()[1])
    except OSError:
        pass
    return out


def run_sampled(cmd):
    """Runs cmd; (seconds, {pid: peak of each /proc status field in KiB}, pid of cmd, ru_maxrss MiB,
    CPU seconds of the command and its waited-for children). ru_maxrss is not the command's own
    peak: Linux keeps the RSS high-water mark of the forking (Python) process across exec, so it
    is at least this script's RSS (torch imported, the model made) at the fork."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peaks = {}
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        for q in _tree(p.pid):
            cur = peaks.setdefault(q, {})
            for k, v in _status_kib(q).items():
                cur[k] = max(cur.get(k, 0), v)
        time.sleep(0.02)
    dt = time.monotonic() - t0
    err = p.stderr.read().decode()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed\n{err}")
    return dt, peaks, p.pid, ru.ru_maxrss / 1024.0, ru.ru_utime + ru.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--dir", default="/work/bench-data/convert_bench")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--max-memory", default="512M")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--reuse", action="store_true")
    ap.add_argument("--baseline-build", default="")
    ap.add_argument("--cases", default="", help="comma-separated prefixes of case names (default: all)")
    a = ap.parse_args()
    ckpt = str(pathlib.Path(a.build) / "ckpt")
    d = pathlib.Path(a.dir)
    if d.exists() and not a.reuse:
        shutil.rmtree(d)
    try:
        if not (d / "src").is_dir():
            if not (d / "hf").is_dir():
                make_hf(d / "hf", a.layers)
            run_timed([ckpt, "from-hf", str(d / "hf"), str(d / "src"), "--tp", "2", "--pp", "2", "--dp", "1", "--no-fsync"])
            shutil.rmtree(d / "hf")
        if (d / "dst").exists():
            shutil.rmtree(d / "dst")
        src_bytes = sum(p.stat().st_size for p in (d / "src").rglob("*") if p.is_file())
        per = max(1, a.layers // 3)
        layout = ["--tp", "1", "--pp", "3", "--pp-layers", f"{per + (a.layers - 3 * per)},{per},{per}", "--dp", "1",
                  "--threads", "2", "--max-memory", a.max_memory]
        cases = {"reshard": ["reshard"], "convert megatron-mcore": ["convert", "--profile", "megatron-mcore"],
                 "convert paddlenlp": ["convert", "--profile", "paddlenlp"]}
        if a.baseline_build:
            cases["convert paddlenlp (baseline)"] = ["convert", "--profile", "paddlenlp"]
        if a.cases:
            keep = [c.strip() for c in a.cases.split(",") if c.strip()]
            cases = {k: v for k, v in cases.items() if k == "reshard" or any(k.startswith(c) or k.endswith(c) for c in keep)}
        base_ckpt = str(pathlib.Path(a.baseline_build) / "ckpt") if a.baseline_build else ckpt
        runs = {k: [] for k in cases}
        for rep in range(a.reps):
            for name, args in cases.items():
                dst = d / "dst"
                warm(d / "src")
                load0 = os.getloadavg()[0]
                exe = base_ckpt if name.endswith("(baseline)") else ckpt
                cmd = [exe, args[0], str(d / "src"), str(dst), *args[1:], *layout]
                secs, peaks, main_pid, maxrss, cpu = run_sampled(cmd)
                mib = lambda d, k: d.get(k, 0) / 1024.0  # noqa: E731
                own = peaks.get(main_pid, {})
                kids = [v for q, v in peaks.items() if q != main_pid]
                kid = max(kids, key=lambda v: v.get("VmHWM", 0)) if kids else {}
                runs[name].append({"seconds": secs, "cpu_seconds": cpu, "ru_maxrss_mib": maxrss, "vmhwm_mib": mib(own, "VmHWM"),
                                   "rss_anon_mib": mib(own, "RssAnon"), "rss_file_mib": mib(own, "RssFile"),
                                   "rss_shmem_mib": mib(own, "RssShmem"), "verify_child_vmhwm_mib": mib(kid, "VmHWM"),
                                   "verify_child_rss_anon_mib": mib(kid, "RssAnon"),
                                   "verify_child_rss_file_mib": mib(kid, "RssFile"),
                                   "load_before": load0, "load_after": os.getloadavg()[0]})
                shutil.rmtree(dst)
                print(f"rep {rep} {name:30s} {secs:7.2f} s cpu {cpu:6.2f} s anon {runs[name][-1]['rss_anon_mib']:6.0f} file "
                      f"{runs[name][-1]['rss_file_mib']:6.0f} MiB load {load0:.1f}", file=sys.stderr)
        best = {k: min(v, key=lambda r: r["seconds"]) for k, v in runs.items()}
        per_rep = {k: [v[i]["seconds"] / runs["reshard"][i]["seconds"] for i in range(a.reps)] for k, v in runs.items()}
        out = {"source_bytes": src_bytes, "layers": a.layers, "max_memory": a.max_memory, "runs": runs,
               "ratio_to_reshard": {k: best[k]["seconds"] / best["reshard"]["seconds"] for k in best},
               "ratio_per_rep": per_rep, "ratio_median": {k: statistics.median(v) for k, v in per_rep.items()},
               "cpu_ratio_median": {k: statistics.median(v[i]["cpu_seconds"] / runs["reshard"][i]["cpu_seconds"]
                                                         for i in range(a.reps)) for k, v in runs.items()},
               "cpu_seconds_median": {k: statistics.median(r["cpu_seconds"] for r in v) for k, v in runs.items()},
               "seconds_median": {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}}
        print(json.dumps(out, indent=2))
        for k, r in best.items():
            print(f"{k:30s} best {r['seconds']:7.2f} s  x{out['ratio_to_reshard'][k]:.2f} (median of reps "
                  f"x{out['ratio_median'][k]:.2f}, CPU x{out['cpu_ratio_median'][k]:.2f}; medians {out['seconds_median'][k]:.2f} s, "
                  f"CPU {out['cpu_seconds_median'][k]:.2f} s)  peak anon {max(x['rss_anon_mib'] for x in runs[k]):6.0f} MiB  file "
                  f"{max(x['rss_file_mib'] for x in runs[k]):6.0f} MiB  VmHWM {max(x['vmhwm_mib'] for x in runs[k]):6.0f} MiB"
                  f"  load {r['load_before']:.1f}->{r['load_after']:.1f}", file=sys.stderr)
    finally:
        if not a.keep and d.exists():
            shutil.rmtree(d)


if __name__ == "__main__":
    main()
