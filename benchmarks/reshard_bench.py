#!/usr/bin/env python3
"""Resharding benchmark (a command, not a timed test; docs/BENCHMARKS.md "Resharding engine"):

  * a >= 4 GB native checkpoint with optimizer state (bf16 weights + fp32 master weights + Adam
    exp_avg/exp_avg_sq) of a synthetic 8-layer LLaMA, layout tp=4 pp=2 dp=2 zero=1, written by
    `reshard_bench make-source`;
  * `ckpt reshard` to tp=2 pp=3 [2,3,3] dp=2 zero=1 with --max-memory 256M: wall time and peak
    RSS, 1 vs 2 threads, 1 vs 2 MPI ranks, with and without the SRC re-hash (--no-verify);
  * a plain copy of the same source bytes (copy + fsync of every shard file) in the same run, in
    the same page-cache state;
  * the same reshard done the way Megatron's converters do it (torch.load every rank file,
    torch.cat to global tensors, chunk for the new layout, torch.save): time and peak RSS. Its
    input is torch files with the same tensors, shapes and dtypes (written untimed);
  * planning time for an 80-layer 70B-shaped model, tp=8 pp=8 -> tp=4 pp=16.

Page-cache state: SRC is read once before every timed run ("warm"); every writer fsyncs its
output; outputs are deleted between runs. Prints one JSON object (and a table on stderr).
Usage: reshard_bench.py [--build DIR] [--dir DIR] [--layers 8] [--skip-torch] [--skip-mpi]
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tree(pid):
    out = [pid]
    try:
        for c in open(f"/proc/{pid}/task/{pid}/children").read().split():
            out += _tree(int(c))
    except OSError:
        pass
    return out


def _rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_timed(cmd, env=None, tree=None):
    """Runs cmd; returns (seconds, peak RSS MiB of the largest process in its tree, stdout). When
    `tree` is a dict, also samples /proc every 20 ms and stores the peak of the summed RSS of the
    whole process tree in tree["peak_tree_rss_mib"]."""
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    peak = 0
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG if tree is not None else 0)
        if pid:
            break
        peak = max(peak, sum(_rss_kib(x) for x in _tree(p.pid)))
        time.sleep(0.02)
    dt = time.monotonic() - t0
    if tree is not None:
        tree["peak_tree_rss_mib"] = peak / 1024.0
    out, err = p.stdout.read().decode(), p.stderr.read().decode()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {rc}\n{out}\n{err}")
    return dt, ru.ru_maxrss / 1024.0, out


def warm(d):
    for p in sorted(pathlib.Path(d).rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(64 << 20):
                    pass


def tree_bytes(d):
    return sum(p.stat().st_size for p in pathlib.Path(d).rglob("*") if p.is_file())


def rm(d):
    shutil.rmtree(d, ignore_errors=True)
    subprocess.run(["sync"])


def plain_copy(src, dst):
    """Copy every file of src (64 MiB reads and writes, like any streaming copier) + fsync."""
    t0 = time.monotonic()
    for p in sorted(pathlib.Path(src).rglob("*")):
        q = pathlib.Path(dst) / p.relative_to(src)
        if p.is_dir():
            q.mkdir(parents=True, exist_ok=True)
            continue
        q.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "rb") as fi, open(q, "wb") as fo:
            while True:
                b = fi.read(64 << 20)
                if not b:
                    break
                fo.write(b)
            fo.flush()
            os.fsync(fo.fileno())
    return time.monotonic() - t0


TORCH_SCRIPT = r'''
import json, os, sys, time, pathlib, resource
import torch
mode, cfgfile, d = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
c = json.load(open(cfgfile))
L, h, I, H, K, V = c["layers"], c["hidden"], c["inter"], c["heads"], c["kv"], c["vocab"]
hd = h // H

def params():
    """(name, shape, tp split dim or None, vocab) in tensor-list order."""
    out = [("model.embed_tokens.weight", (V, h), 0, True)]
    for i in range(L):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,), None, False),
                (p + "self_attn.q_proj.weight", (H * hd, h), 0, False),
                (p + "self_attn.k_proj.weight", (K * hd, h), 0, False),
                (p + "self_attn.v_proj.weight", (K * hd, h), 0, False),
                (p + "self_attn.o_proj.weight", (h, H * hd), 1, False),
                (p + "post_attention_layernorm.weight", (h,), None, False),
                (p + "mlp.gate_proj.weight", (I, h), 0, False),
                (p + "mlp.up_proj.weight", (I, h), 0, False),
                (p + "mlp.down_proj.weight", (h, I), 1, False)]
    out += [("model.norm.weight", (h,), None, False), ("lm_head.weight", (V, h), 0, True)]
    return out

def stage_of(name, per):
    if ".layers." in name:
        i = int(name.split(".")[2])
        s = 0
        while i >= per[s]:
            i -= per[s]; s += 1
        return s
    return 0 if "embed" in name else len(per) - 1

def padded(tp):
    m = 128 * tp
    return -(-V // m) * m

def local_shape(shape, dim, vocab, tp):
    s = list(shape)
    if dim is not None:
        s[dim] = (padded(tp) if vocab else s[dim]) // tp
    return s

def save(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f)
        f.flush(); os.fsync(f.fileno())

KINDS = ("fp32_param", "exp_avg", "exp_avg_sq")

def layout_files(tp, per, dp):
    return [(t, s) for s in range(len(per)) for t in range(tp)]

if mode == "make":  # untimed: the source in Megatron-style torch files, tp=4 pp=2 dp=2
    tp, per, dp = c["src_tp"], c["src_per"], c["dp"]
    g = torch.Generator().manual_seed(0)
    d.mkdir(parents=True, exist_ok=True)
    for t, s in layout_files(tp, per, dp):
        model = {}
        flat = {k: [] for k in KINDS}
        for name, shape, dim, vocab in params():
            if stage_of(name, per) != s:
                continue
            ls = local_shape(shape, dim, vocab, tp)
            model[name] = (torch.randn(ls, generator=g) * 0.02).to(torch.bfloat16)
            for k in KINDS:
                flat[k].append(torch.randn(ls, generator=g).reshape(-1))
        save({"model": model, "iteration": 100}, d / f"mp_rank_{t:02d}_{s:03d}_model_optim_rng.pt")
        for k in KINDS:
            buf = torch.cat(flat[k]); n = buf.numel(); pad = (-n) % (128 * dp)
            buf = torch.cat([buf, torch.zeros(pad)])
            for r, part in enumerate(buf.chunk(dp)):
                flat_k = part.clone()
                save(flat_k, d / f"mp_rank_{t:02d}_{s:03d}_dp{r}_{k}.pt")
        del model, flat
    sys.exit(0)

# mode == "reshard": the way Megatron's converters do it: load every rank, cat, chunk, save.
t0 = time.monotonic()
tp, per, dp = c["src_tp"], c["src_per"], c["dp"]
ntp, nper = c["dst_tp"], c["dst_per"]
out = pathlib.Path(sys.argv[4]); out.mkdir(parents=True)
models, flats = {}, {}
for t, s in layout_files(tp, per, dp):
    models[(t, s)] = torch.load(d / f"mp_rank_{t:02d}_{s:03d}_model_optim_rng.pt", weights_only=True)["model"]
    for k in KINDS:
        flats[(t, s, k)] = torch.cat([torch.load(d / f"mp_rank_{t:02d}_{s:03d}_dp{r}_{k}.pt", weights_only=True)
                                      for r in range(dp)])
# Global tensors: model weights, then each optimizer kind unflattened and concatenated over TP.
glob = {}
for name, shape, dim, vocab in params():
    s = stage_of(name, per)
    parts = [models[(t, s)][name] for t in range(tp)]
    glob[name] = (torch.cat(parts, dim)[:V] if vocab else torch.cat(parts, dim)) if dim is not None else parts[0]
for t, s in layout_files(tp, per, dp):
    for k in KINDS:
        off = 0
        for name, shape, dim, vocab in params():
            if stage_of(name, per) != s:
                continue
            ls = local_shape(shape, dim, vocab, tp)
            n = 1
            for x in ls: n *= x
            glob.setdefault((k, name), [None] * tp)[t] = flats[(t, s, k)][off:off + n].view(ls)
            off += n
for name, shape, dim, vocab in params():
    for k in KINDS:
        parts = glob[(k, name)]
        glob[(k, name)] = (torch.cat(parts, dim)[:V] if vocab else torch.cat(parts, dim)) if dim is not None else parts[0]
del models, flats
load_s = time.monotonic() - t0
# New layout: chunk, pad the vocab, flatten the optimizer per (stage, tp rank), split over dp, save.
for t, s in layout_files(ntp, nper, dp):
    model = {}
    flat = {k: [] for k in KINDS}
    for name, shape, dim, vocab in params():
        if stage_of(name, nper) != s:
            continue
        def local(x):
            if dim is None:
                return x
            if vocab:
                x = torch.cat([x, torch.zeros((padded(ntp) - V,) + tuple(x.shape[1:]), dtype=x.dtype)])
            return x.chunk(ntp, dim)[t]
        model[name] = local(glob[name]).clone()
        for k in KINDS:
            flat[k].append(local(glob[(k, name)]).reshape(-1))
    save({"model": model, "iteration": 100}, out / f"mp_rank_{t:02d}_{s:03d}_model_optim_rng.pt")
    for k in KINDS:
        buf = torch.cat(flat[k]); pad = (-buf.numel()) % (128 * dp)
        buf = torch.cat([buf, torch.zeros(pad)])
        for r, part in enumerate(buf.chunk(dp)):
            save(part.clone(), out / f"mp_rank_{t:02d}_{s:03d}_dp{r}_{k}.pt")
    del model, flat
print(json.dumps({"load_and_merge_s": load_s, "total_s": time.monotonic() - t0,
                  "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--dir", default="/tmp/ckpt_reshard_bench")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--inter", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--max-memory", default="256M")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-mpi", action="store_true")
    ap.add_argument("--python", default=str(ROOT / ".venv/bin/python"))
    a = ap.parse_args()
    build = pathlib.Path(a.build).resolve()
    subprocess.run(["ninja", "-C", str(build), "ckpt", "reshard_bench"], check=True)  # built on request only
    ckpt, rb = str(build / "ckpt"), str(build / "reshard_bench")
    d = pathlib.Path(a.dir)
    rm(d)
    d.mkdir(parents=True)
    res = {"cache_state": "SRC page cache warm (read once before each timed run); outputs fsync'd and deleted between runs"}
    model = ["--layers", a.layers, "--hidden", a.hidden, "--inter", a.inter, "--heads", a.heads, "--kv", a.kv,
             "--vocab", a.vocab]
    model = list(map(str, model))

    src = d / "src"
    dt, rss, out = run_timed([rb, "make-source", str(src), *model, "--tp", "4", "--pp", "2", "--dp", "2", "--zero", "1"])
    res["source"] = json.loads(out)
    src_bytes = tree_bytes(src)
    res["source"]["bytes_on_disk"] = src_bytes
    log = lambda *x: print(*x, file=sys.stderr, flush=True)  # noqa: E731
    log(f"source: {src_bytes / 2**30:.2f} GiB in {dt:.1f}s")

    dst_per = [2, 3, 3] if a.layers == 8 else [a.layers // 3, a.layers // 3, a.layers - 2 * (a.layers // 3)]
    target = ["--tp", "2", "--pp", "3", "--pp-layers", ",".join(map(str, dst_per)), "--dp", "2", "--zero", "1",
              "--max-memory", a.max_memory]
    dst = d / "dst"

    def copy_run():
        warm(src)
        rm(d / "copy")
        s = plain_copy(src, d / "copy")
        rm(d / "copy")
        return s

    def ckpt_run(extra, mpi=0):
        warm(src)
        rm(dst)
        cmd = [ckpt, "reshard", str(src), str(dst), *target, *extra]
        if mpi:
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader", "-np", str(mpi)] + cmd
        tree = {}
        s, r, _ = run_timed(cmd, tree=tree)
        wb = tree_bytes(dst)
        rm(dst)
        return s, r, wb, tree["peak_tree_rss_mib"]

    runs = {}
    copies = []
    plan = [("threads1", ["--threads", "1"], 0), ("threads2", ["--threads", "2"], 0),
            ("threads2_no_verify", ["--threads", "2", "--no-verify"], 0)]
    if not a.skip_mpi and shutil.which("mpirun"):
        plan += [("mpi2_threads1", ["--threads", "1"], 2), ("mpi2_threads1_no_verify", ["--threads", "1", "--no-verify"], 2)]
    for name, extra, mpi in plan:
        c = copy_run()  # the baseline right before each run, in the same state (the disk is shared)
        copies.append(c)
        s, r, wb, tr = ckpt_run(extra, mpi)
        runs[name] = {"seconds": s, "peak_rss_mib": r, "peak_tree_rss_mib": tr, "bytes_written": wb, "copy_seconds_before": c,
                      "GBps_written": wb / s / 1e9, "vs_copy": c / s}
        log(f"{name}: {s:.2f}s, peak RSS {r:.0f} MiB; copy before it {c:.2f}s -> {c / s:.2f}x")
    copy_s = min(copies)
    res["copy_seconds"] = copies
    res["copy_GBps"] = src_bytes / copy_s / 1e9
    res["runs"] = runs

    if not a.skip_torch:
        cfg = {"layers": a.layers, "hidden": a.hidden, "inter": a.inter, "heads": a.heads, "kv": a.kv,
               "vocab": a.vocab, "src_tp": 4, "src_per": [a.layers // 2, a.layers - a.layers // 2], "dp": 2,
               "dst_tp": 2, "dst_per": dst_per}
        cf = d / "torch_cfg.json"
        cf.write_text(json.dumps(cfg))
        script = d / "torch_reshard.py"
        script.write_text(TORCH_SCRIPT)
        tsrc = d / "torch_src"
        subprocess.run([a.python, str(script), "make", str(cf), str(tsrc)], check=True)
        res["torch_source_bytes"] = tree_bytes(tsrc)
        warm(tsrc)
        s, r, out = run_timed([a.python, str(script), "reshard", str(cf), str(tsrc), str(d / "torch_dst")])
        res["torch"] = {"seconds": s, "peak_rss_mib": r, "detail": json.loads(out.strip().splitlines()[-1]),
                        "bytes_written": tree_bytes(d / "torch_dst")}
        rm(d / "torch_dst")
        rm(tsrc)
        c = copy_run()
        res["torch"]["copy_seconds_before"] = c
        best = min(runs["threads1"]["seconds"], runs["threads2"]["seconds"])
        res["torch"]["ckpt_speedup"] = s / best
        res["torch"]["ckpt_memory_fraction"] = max(runs["threads1"]["peak_rss_mib"],
                                                   runs["threads2"]["peak_rss_mib"]) / r
        log(f"torch: {s:.2f}s, peak RSS {r:.0f} MiB")

    for extra in ([], ["--optimizer", "--dp", "2", "--zero", "1"]):
        _, _, out = run_timed([rb, "plan", *extra])
        res.setdefault("plan_70b", []).append(json.loads(out))
    log(json.dumps(res["plan_70b"]))
    rm(src)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
