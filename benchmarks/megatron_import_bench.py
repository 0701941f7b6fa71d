#!/usr/bin/env python3
"""Benchmark of importing a >= 2 GB Megatron checkpoint (docs/BENCHMARKS.md "Megatron import"): ckpt against the Python stack,
in the same run, for both Megatron formats:

  * legacy `torch` (iter_NNNNNNN/mp_rank_TT_PPP/model_optim_rng.pt, one torch.save zip per rank);
  * megatron-core `torch_dist` (a DCP directory: .metadata, __R_0.distcp, common.pt, metadata.json).

and (--formats torch_dist_optim) with the distributed optimizer:

  * megatron-core `torch_dist` with DistributedOptimizer state (dp_reshardable buckets: fp32 masters,
    exp_avg, exp_avg_sq), written by `ckpt export-megatron --format torch_dist --tp 2 --pp 2 --dist-opt
    --dp 2 --local-norms` (the form tests/python/test_megatron_019_distopt_export.py loads in
    megatron-core) from a store with Adam state: one step of `ckpt train` of the TinyLlama-shaped
    model (fp32) with --optim-layers layers (2: 219 M parameters, a 3.3 GB checkpoint).

Source: a TinyLlama-shaped LLaMA (hidden 2048, FFN 5632, 32 heads / 4 KV heads, GQA, SwiGLU,
untied, vocab 32003 so that the Megatron vocab is padded, random bf16; 22 layers = 2.2 GB; the
generator of benchmarks/hf_bench.py), imported with `ckpt from-hf` and exported with
`ckpt export-megatron --format torch|torch_dist --tp 2 --pp 2` (files the test suite checks against
torch.load / megatron-core). Setup is untimed; the HF and native copies are deleted before timing.

Timed commands (each round runs all of them, rotated; medians over --reps rounds):
  ckpt import        `ckpt reshard MG OUT --tp 2 --pp 2 --dp 1` (the saved layout, native store)
  ckpt reshard       `ckpt reshard MG OUT --tp 1 --pp 2 --dp 1` (a new layout, straight from MG)
  ckpt ... [M]       the same with `--max-memory M` (--low-memory, well below the model)
  python             torch.load(weights_only=True) of every rank file (mmap=False and mmap=True),
                     or for torch_dist torch.distributed.checkpoint's load (FileSystemReader, no_dist)
                     into a state dict of empty tensors built from .metadata; then the same
                     conversion in torch (unpack the per-group QKV and [gate; up] fc1, concatenate
                     the TP shards, drop the vocab padding) and safetensors.torch.save_file of the
                     HF-named result, then fsync (ckpt fsyncs its output too).
  python (optim)     torch_dist_optim: torch.distributed.checkpoint's load (FileSystemReader, no_dist) of
                     EVERY item of .metadata (tensors into empty tensors, bytes items unpickled), then
                     torch.save of the whole state dict and fsync: the I/O floor of megatron-core's own
                     load + save. megatron-core's dist_checkpointing.load itself is not run: it loads
                     into the sharded state dict that the model and the DistributedOptimizer build, so
                     it needs the saved model-parallel layout (tp 2 x pp 2) x dp 2 = 8 gloo processes
                     with the CPU shims (fixtures/megatron_core_019/cpu_shims.py), each building its
                     model shard, grad buffers and optimizer; its torch_dist strategy reads through the
                     same DCP loader, so this child is a lower bound of its time. megatron-core's own load +
                     save is measured by benchmarks/mcore_dist_optim_bench.py.
Wall time, CPU time and peak RSS by /usr/bin/time (getrusage of the child). The Python child also
reports its phases (import torch, load, convert, save) in a JSON line on stdout.
State: page cache warm (the sources are read before each round), memory 'hot' (--hot-gib GiB
touched and freed before each command, ../shared/LIMITS.md), load average sampled before every
command. Prints a table; writes docs/megatron_import_bench.json (--json to change).

  .venv/bin/python benchmarks/megatron_import_bench.py --ckpt build/ckpt [--reps 3] [--dir /work/bench-data/megatron_import]
  .venv/bin/python benchmarks/megatron_import_bench.py --ckpt build/ckpt --formats torch_dist_optim [--reps 1]
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

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


# ---------------------------------------------------------------------------------------------
# The Python stack (run in a child process: `megatron_import_bench.py py-torch|py-dist SRC OUT`).
# ---------------------------------------------------------------------------------------------

def iteration_dir(src: pathlib.Path) -> pathlib.Path:
    tracker = src / "latest_checkpointed_iteration.txt"
    if not tracker.exists():
        return src
    it = tracker.read_text().strip()
    return src / ("release" if it == "release" else f"iter_{int(it):07d}")


def unpack_qkv(w, groups, q_per_group, head_dim):
    """Megatron linear_qkv rows [groups * (q_per_group + 2) * head_dim, ...] -> q, k, v (leading
    dims before the row dim kept: w may be [layers, rows, hidden])."""
    lead, rows, tail = w.shape[:-2], w.shape[-2], w.shape[-1:]
    assert rows == groups * (q_per_group + 2) * head_dim, (w.shape, groups, q_per_group, head_dim)
    g = w.reshape(*lead, groups, q_per_group + 2, head_dim, *tail)
    q = g[..., :q_per_group, :, :].reshape(*lead, groups * q_per_group * head_dim, *tail)
    k = g[..., q_per_group, :, :].reshape(*lead, groups * head_dim, *tail)
    v = g[..., q_per_group + 1, :, :].reshape(*lead, groups * head_dim, *tail)
    return q, k, v


def py_torch(src: str, out: str, mmap: bool):
    t0 = time.perf_counter()
    import argparse as ap
    import torch
    from safetensors.torch import save_file
    torch.serialization.add_safe_globals([ap.Namespace])
    phases = {"import": time.perf_counter() - t0}
    t = time.perf_counter()
    it = iteration_dir(pathlib.Path(src))
    ranks = {}
    args = None
    for d in sorted(it.glob("mp_rank_*")):
        parts = d.name.split("_")  # mp_rank_TT or mp_rank_TT_PPP
        tp_rank, pp_rank = int(parts[2]), int(parts[3]) if len(parts) > 3 else 0
        ck = torch.load(d / "model_optim_rng.pt", map_location="cpu", weights_only=True, mmap=mmap)
        ranks[(tp_rank, pp_rank)] = ck["model"]
        args = ck["args"]
    phases["load"] = time.perf_counter() - t
    t = time.perf_counter()
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    heads, groups, hd, vocab = args.num_attention_heads, args.num_query_groups, args.kv_channels, args.vocab_size
    qpg = heads // groups
    res = {}
    first = 0
    for p in range(pp):
        sh = [ranks[(r, p)] for r in range(tp)]
        n = 1 + max(int(k.split(".")[2]) for k in sh[0] if k.startswith("decoder.layers."))
        te = "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in sh[0]
        for i in range(n):
            m, h = f"decoder.layers.{i}.", f"model.layers.{first + i}."
            qkv = [unpack_qkv(s[m + "self_attention.linear_qkv.weight"], groups // tp, qpg, hd) for s in sh]
            for j, x in enumerate(("q", "k", "v")):
                res[h + f"self_attn.{x}_proj.weight"] = torch.cat([y[j] for y in qkv], 0)
            fc1 = [s[m + "mlp.linear_fc1.weight"].chunk(2, 0) for s in sh]
            res[h + "mlp.gate_proj.weight"] = torch.cat([g for g, _ in fc1], 0)
            res[h + "mlp.up_proj.weight"] = torch.cat([u for _, u in fc1], 0)
            res[h + "self_attn.o_proj.weight"] = torch.cat([s[m + "self_attention.linear_proj.weight"] for s in sh], 1)
            res[h + "mlp.down_proj.weight"] = torch.cat([s[m + "mlp.linear_fc2.weight"] for s in sh], 1)
            ln1 = "self_attention.linear_qkv.layer_norm_weight" if te else "input_layernorm.weight"
            ln2 = "mlp.linear_fc1.layer_norm_weight" if te else "pre_mlp_layernorm.weight"
            res[h + "input_layernorm.weight"] = sh[0][m + ln1].clone()
            res[h + "post_attention_layernorm.weight"] = sh[0][m + ln2].clone()
        first += n
    res["model.embed_tokens.weight"] = torch.cat([ranks[(r, 0)]["embedding.word_embeddings.weight"] for r in range(tp)], 0)[:vocab]
    res["model.norm.weight"] = ranks[(0, pp - 1)]["decoder.final_layernorm.weight"].clone()
    if "output_layer.weight" in ranks[(0, pp - 1)] and args.untie_embeddings_and_output_weights:
        res["lm_head.weight"] = torch.cat([ranks[(r, pp - 1)]["output_layer.weight"] for r in range(tp)], 0)[:vocab]
    res = {k: v.contiguous() for k, v in res.items()}
    phases["convert"] = time.perf_counter() - t
    finish(res, out, phases, save_file)


def py_dist(src: str, out: str):
    t0 = time.perf_counter()
    import argparse as ap
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from safetensors.torch import save_file
    torch.serialization.add_safe_globals([ap.Namespace])
    phases = {"import": time.perf_counter() - t0}
    t = time.perf_counter()
    it = iteration_dir(pathlib.Path(src))
    args = torch.load(it / "common.pt", map_location="cpu", weights_only=True)["args"]
    reader = dcp.FileSystemReader(str(it))
    md = reader.read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
          if isinstance(v, TensorStorageMetadata)}
    dcp.load(sd, storage_reader=reader, no_dist=True)
    phases["load"] = time.perf_counter() - t
    t = time.perf_counter()
    heads, groups, hd, vocab = args.num_attention_heads, args.num_query_groups, args.kv_channels, args.vocab_size
    inter = args.ffn_hidden_size
    L = "decoder.layers."
    q, k, v = unpack_qkv(sd[L + "self_attention.linear_qkv.weight"], groups, heads // groups, hd)
    stacked = {"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v,
               "self_attn.o_proj.weight": sd[L + "self_attention.linear_proj.weight"],
               "mlp.gate_proj.weight": sd[L + "mlp.linear_fc1.weight"][:, :inter],
               "mlp.up_proj.weight": sd[L + "mlp.linear_fc1.weight"][:, inter:],
               "mlp.down_proj.weight": sd[L + "mlp.linear_fc2.weight"],
               "input_layernorm.weight": sd[L + "self_attention.linear_qkv.layer_norm_weight"],
               "post_attention_layernorm.weight": sd[L + "mlp.linear_fc1.layer_norm_weight"]}
    res = {}
    for name, x in stacked.items():
        for i in range(x.shape[0]):
            res[f"model.layers.{i}.{name}"] = x[i].contiguous()
    res["model.embed_tokens.weight"] = sd["embedding.word_embeddings.weight"][:vocab].contiguous()
    res["model.norm.weight"] = sd["decoder.final_layernorm.weight"]
    if "output_layer.weight" in sd:
        res["lm_head.weight"] = sd["output_layer.weight"][:vocab].contiguous()
    phases["convert"] = time.perf_counter() - t
    finish(res, out, phases, save_file)


def py_dist_optim(src: str, out: str):
    """Every item of the torch_dist checkpoint (with the distributed optimizer's buckets) loaded by
    torch's DCP loader, then the whole state dict saved with torch.save (another layout's file)."""
    t0 = time.perf_counter()
    import io
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    phases = {"import": time.perf_counter() - t0}
    t = time.perf_counter()
    reader = dcp.FileSystemReader(str(iteration_dir(pathlib.Path(src))))
    md = reader.read_metadata()
    sd = {k: torch.empty(v.size, dtype=v.properties.dtype) if isinstance(v, TensorStorageMetadata) else io.BytesIO()
          for k, v in md.state_dict_metadata.items()}
    dcp.load(sd, storage_reader=reader, no_dist=True)
    phases["load"] = time.perf_counter() - t
    t = time.perf_counter()
    torch.save(sd, out)
    fd = os.open(out, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    phases["save"] = time.perf_counter() - t
    tensors = [v for v in sd.values() if torch.is_tensor(v)]
    print(json.dumps({"phases": phases, "tensors": len(tensors), "items": len(sd),
                      "bytes": sum(x.numel() * x.element_size() for x in tensors)}))


def finish(res, out, phases, save_file):
    t = time.perf_counter()
    save_file(res, out, metadata={"format": "pt"})
    fd = os.open(out, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    phases["save"] = time.perf_counter() - t
    print(json.dumps({"phases": phases, "tensors": len(res), "bytes": sum(x.numel() * x.element_size() for x in res.values())}))


# ---------------------------------------------------------------------------------------------
# The driver.
# ---------------------------------------------------------------------------------------------

def timed(cmd):
    """(wall s, peak RSS MiB, CPU s, stdout) of `cmd` under /usr/bin/time (getrusage of its child,
    so this large parent's RSS is not inherited into the figure)."""
    rep = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"mg_bench_time_{os.getpid()}.txt"
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%e %M %U %S", "-o", str(rep), *map(str, cmd)],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr[-2000:]}")
    f = rep.read_text().split()
    rep.unlink()
    return dt, int(f[-3]) / 1024.0, float(f[-2]) + float(f[-1]), p.stdout


def load_avg():
    return float(open("/proc/loadavg").read().split()[0])


def mem_available_gib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / (1 << 20)
    return 0.0


def read_all(d: pathlib.Path):
    """Reads every file under d (page cache warm)."""
    for p in d.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(16 << 20):
                    pass


def dir_bytes(d: pathlib.Path):
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def make_dist_optim_source(a, root: pathlib.Path, ckpt: str):
    """torch_dist with the distributed optimizer: one `ckpt train` step (Adam state) of the TinyLlama-
    shaped model with --optim-layers layers, exported with --dist-opt --dp 2 (untimed)."""
    from hf_bench import llama_config
    mg = root / "mg_dist_optim"
    if (mg / "metadata.json").exists():
        return mg
    run = root / "train"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(llama_config(a.optim_layers, a.vocab)))
    t0 = time.perf_counter()
    subprocess.run([ckpt, "train", "--config", run / "config.json", "--steps", "1", "--warmup", "0", "--micro-batch", "1",
                    "--seq-len", "16", "--out", run / "run", "--sync-save"], check=True, capture_output=True)
    subprocess.run([ckpt, "export-megatron", run / "run" / "step-00000001", mg, "--format", "torch_dist", "--tp", "2", "--pp", "2",
                    "--dist-opt", "--dp", "2", "--local-norms"], check=True, capture_output=True)
    shutil.rmtree(run)
    print(f"made {mg} ({dir_bytes(mg) / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    return mg


def make_sources(a, root: pathlib.Path, ckpt: str):
    from hf_bench import make_model
    mg = {"torch": root / "mg_torch", "torch_dist": root / "mg_dist"}
    if all((d / "latest_checkpointed_iteration.txt").exists() or (d / "metadata.json").exists() for d in mg.values()):
        return mg
    hf, native = root / "hf", root / "native"
    for d in (native, *mg.values()):
        shutil.rmtree(d, ignore_errors=True)
    if not (hf / "model.safetensors").exists():
        t0 = time.perf_counter()
        nbytes = make_model(hf, a.layers, vocab=a.vocab)
        print(f"generated HF model {nbytes / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    subprocess.run([ckpt, "from-hf", hf, native, "--no-fsync"], check=True, capture_output=True)
    shutil.rmtree(hf)
    for fmt, d in mg.items():
        # torch_dist as megatron-core <= 0.18 writes it (common.pt), which the venv's 0.16.1 and this script read
        version = ["--megatron-version", "0.16"] if fmt == "torch_dist" else []
        subprocess.run([ckpt, "export-megatron", native, d, "--format", fmt, "--tp", "2", "--pp", "2", *version], check=True,
                       capture_output=True)
    shutil.rmtree(native)
    return mg


def summarize(runs, base_key):
    """Per command: medians, and ratios (Python median / this median; paired per round too)."""
    res = {}
    base = statistics.median(r[0] for r in runs[base_key])
    for k, rs in runs.items():
        t = statistics.median(r[0] for r in rs)
        res[k] = {"seconds": t, "all_seconds": [round(r[0], 3) for r in rs],
                  "cpu_seconds": statistics.median(r[2] for r in rs),
                  "peak_rss_mib": max(r[1] for r in rs), "all_peak_rss_mib": [round(r[1]) for r in rs],
                  "python_over_this": base / t,
                  "paired_python_over_this": statistics.median(b[0] / r[0] for b, r in zip(runs[base_key], rs)),
                  "load_before": [r[3] for r in rs]}
        if rs and rs[0][4]:
            res[k]["python_phases_median"] = {p: statistics.median(r[4][p] for r in rs) for p in rs[0][4]}
    return res


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("py-torch", "py-torch-mmap", "py-dist", "py-dist-optim"):
        kind, src, out = sys.argv[1:4]
        if kind == "py-dist-optim":
            return py_dist_optim(src, out)
        return py_dist(src, out) if kind == "py-dist" else py_torch(src, out, mmap=kind == "py-torch-mmap")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--dir", default="/work/bench-data/megatron_import")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--vocab", type=int, default=32003)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--low-memory", default="128M", help="the --max-memory of the bounded-memory runs")
    ap.add_argument("--hot-gib", type=float, default=4.0)
    ap.add_argument("--compare-ckpt", default="", help="another ckpt binary whose import and reshard run in the same rounds")
    ap.add_argument("--formats", default="torch,torch_dist", help="of torch, torch_dist, torch_dist_optim")
    ap.add_argument("--optim-layers", type=int, default=2, help="torch_dist_optim: the model's layers")
    ap.add_argument("--json", default=str(ROOT / "docs" / "megatron_import_bench.json"))
    ap.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    a = ap.parse_args()
    from hf_bench import warm_memory
    ckpt = str(pathlib.Path(a.ckpt).resolve())
    root = pathlib.Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    fmts = a.formats.split(",")
    mg = make_sources(a, root, ckpt) if set(fmts) & {"torch", "torch_dist"} else {}
    if "torch_dist_optim" in fmts:
        mg["torch_dist_optim"] = make_dist_optim_source(a, root, ckpt)
    me = str(pathlib.Path(__file__).resolve())
    out = root / "out"

    def fresh():
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(str(out) + ".partial", ignore_errors=True)
        out.with_suffix(".safetensors").unlink(missing_ok=True)
        out.with_suffix(".pt").unlink(missing_ok=True)
        return out

    results = {"machine": {"uptime_before": open("/proc/loadavg").read().strip(), "mem_available_gib_before": mem_available_gib(),
                           "nproc": os.cpu_count()},
               "settings": {k: v for k, v in vars(a).items() if k not in ("json",)}, "formats": {}}
    for fmt in fmts:
        src = mg[fmt]
        py_kinds = {"torch": ["py-torch", "py-torch-mmap"], "torch_dist": ["py-dist"], "torch_dist_optim": ["py-dist-optim"]}[fmt]
        cmds = {}
        thr = ["--threads", str(a.threads)]
        cmds["ckpt import (tp2 pp2)"] = lambda: [ckpt, "reshard", src, fresh(), "--tp", "2", "--pp", "2", "--dp", "1", *thr]
        cmds["ckpt reshard -> tp1 pp2"] = lambda: [ckpt, "reshard", src, fresh(), "--tp", "1", "--pp", "2", "--dp", "1", *thr]
        cmds[f"ckpt import [{a.low_memory}]"] = lambda: [ckpt, "reshard", src, fresh(), "--tp", "2", "--pp", "2", "--dp", "1",
                                                         *thr, "--max-memory", a.low_memory]
        cmds[f"ckpt reshard -> tp1 pp2 [{a.low_memory}]"] = lambda: [ckpt, "reshard", src, fresh(), "--tp", "1", "--pp", "2",
                                                                     "--dp", "1", *thr, "--max-memory", a.low_memory]
        if a.compare_ckpt:  # another build (e.g. before a change), in the same rounds
            other = str(pathlib.Path(a.compare_ckpt).resolve())
            cmds["other ckpt import (tp2 pp2)"] = lambda: [other, "reshard", src, fresh(), "--tp", "2", "--pp", "2", "--dp", "1", *thr]
            cmds["other ckpt reshard -> tp1 pp2"] = lambda: [other, "reshard", src, fresh(), "--tp", "1", "--pp", "2", "--dp", "1",
                                                             *thr]
        names = {"py-torch": "python torch.load + convert", "py-torch-mmap": "python torch.load(mmap) + convert",
                 "py-dist": "python dcp.load + convert", "py-dist-optim": "python dcp.load all + torch.save"}
        for kind in py_kinds:
            suffix = ".pt" if kind == "py-dist-optim" else ".safetensors"
            cmds[names[kind]] = lambda kind=kind, suffix=suffix: [sys.executable, me, kind, src, fresh().with_suffix(suffix)]
        runs = {k: [] for k in cmds}
        order = list(cmds)
        src_bytes = dir_bytes(src)
        for r in range(a.reps):
            read_all(src)
            for k in order[r % len(order):] + order[:r % len(order)]:
                warm_memory(a.hot_gib)
                load = load_avg()
                dt, rss, cpu, stdout = timed(cmds[k]())
                phases = json.loads(stdout.strip().splitlines()[-1])["phases"] if k.startswith("python") else None
                runs[k].append((dt, rss, cpu, load, phases))
                print(f"[{fmt} round {r}] {k}: {dt:.2f} s, {rss:.0f} MiB, load {load:.1f}", file=sys.stderr, flush=True)
                fresh()
        base = names[py_kinds[0]]
        res = summarize(runs, base)
        results["formats"][fmt] = {"source_bytes": src_bytes, "source": str(src), "commands": res}
        print(f"\n{fmt}: {src_bytes / 1e9:.2f} GB tp=2 pp=2, {a.reps} rounds, page cache warm, hot {a.hot_gib} GiB, "
              f"threads {a.threads}, ckpt --max-memory default (256M) or [{a.low_memory}]; ratio = {base} / command")
        print(f"{'command':38s} {'median s':>9s} {'ratio':>6s} {'paired':>7s} {'CPU s':>6s} {'peak RSS MiB':>13s}  load")
        for k, v in res.items():
            print(f"{k:38s} {v['seconds']:9.2f} {v['python_over_this']:6.2f} {v['paired_python_over_this']:7.2f} "
                  f"{v['cpu_seconds']:6.2f} {v['peak_rss_mib']:13.0f}  {' '.join(f'{x:.1f}' for x in v['load_before'])}")
            if "python_phases_median" in v:
                print(f"{'':38s} phases: " + ", ".join(f"{p} {s:.2f} s" for p, s in v["python_phases_median"].items()))
    results["machine"]["uptime_after"] = open("/proc/loadavg").read().strip()
    results["machine"]["mem_available_gib_after"] = mem_available_gib()
    pathlib.Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {a.json}")
    fresh()
    if not a.keep:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
