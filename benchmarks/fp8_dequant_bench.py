#!/usr/bin/env python3
"""Block-FP8 -> bf16 dequantization benchmark (issue 39; docs/BENCHMARKS.md "Dequantizing block FP8").

  * SRC: a DeepSeek-style HF directory (untimed, kept under --dir for reuse): --shards shards of
    four [4096, 16384] F8_E4M3 weights (64 MiB each) plus one ragged [1000, 3000] weight, each
    with its 128 x 128 F32 weight_scale_inv, and a bf16 norm; about 2.1 GB with 8 shards.
  * the reference, DeepSeek-V3's inference/fp8_cast_bf16.py run on CPU (this file with
    --reference SRC DST): per shard, safetensors load_file, each FP8 weight dequantized per tensor
    (weight_dequant's semantics in torch ops: fp8.to(float32) * scale expanded over its block,
    then .to(bfloat16)), save_file, at most two loaded shards cached (its memory management),
    the index rewritten;
  * ckpt to-hf SRC DST --dtype bf16 --threads 2 --max-memory M (default 256M),
  run interleaved (--reps), same page-cache state (SRC read before each run), outputs not fsync'd
  by either. Per run: wall time and, sampled from /proc every 20 ms for the command's process tree,
  peak RssAnon (heap: what each one allocates) and VmHWM (with mapped file pages). Prints one JSON
  object; outputs are compared byte for byte once (ckpt's weights must equal the reference's).
Usage: fp8_dequant_bench.py [--build DIR] [--dir /work/bench-data/fp8_dequant] [--shards 8] [--reps 2]
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


def reference(src: pathlib.Path, dst: pathlib.Path):
    """DeepSeek's fp8_cast_bf16.py, CPU: the same loop with weight_dequant as torch ops."""
    import torch
    from safetensors.torch import load_file, save_file
    torch.set_default_dtype(torch.bfloat16)
    dst.mkdir(parents=True)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    weight_map = index["weight_map"]
    loaded = {}

    def get_tensor(name):
        f = weight_map[name]
        if f not in loaded:
            loaded[f] = load_file(str(src / f), device="cpu")
        return loaded[f][name]

    def weight_dequant(x, s, block=128):
        m, n = x.shape
        full = s.repeat_interleave(block, 0)[:m].repeat_interleave(block, 1)[:, :n]
        return (x.to(torch.float32) * full).to(torch.get_default_dtype())

    for f in sorted(p.name for p in src.glob("*.safetensors")):
        cur = load_file(str(src / f), device="cpu")
        loaded[f] = cur
        new = {}
        for name, w in cur.items():
            if name.endswith("_scale_inv"):
                continue
            if w.element_size() == 1:
                new[name] = weight_dequant(w, get_tensor(f"{name}_scale_inv"))
            else:
                new[name] = w
        save_file(new, str(dst / f))
        while len(loaded) > 2:
            del loaded[next(iter(loaded))]
    index["weight_map"] = {k: v for k, v in weight_map.items() if not k.endswith("_scale_inv")}
    (dst / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def make_src(d: pathlib.Path, shards: int):
    import numpy as np
    import torch
    from safetensors.torch import save_file
    rng = np.random.default_rng(39)
    d.mkdir(parents=True)
    wm = {}

    def fp8(m, n):
        b = np.frombuffer(rng.bytes(m * n), np.uint8).reshape(m, n).copy()
        b[(b & 0x7F) == 0x7F] = 0  # no NaN codes
        return torch.from_numpy(b).view(torch.float8_e4m3fn)

    for s in range(shards):
        f = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        ts = {}
        for k in range(4):
            name = f"model.layers.{s}.mlp.w{k}.weight"
            ts[name] = fp8(4096, 16384)
            ts[name + "_scale_inv"] = torch.from_numpy((rng.random((32, 128)) * 1e-3 + 1e-5).astype(np.float32))
        ts[f"model.layers.{s}.ragged.weight"] = fp8(1000, 3000)
        ts[f"model.layers.{s}.ragged.weight_scale_inv"] = torch.from_numpy((rng.random((8, 24)) * 1e-3).astype(np.float32))
        ts[f"model.layers.{s}.norm.weight"] = torch.ones(4096, dtype=torch.bfloat16)
        save_file(ts, str(d / f), metadata={"format": "pt"})
        wm.update({k: f for k in ts})
    total = sum(p.stat().st_size for p in d.glob("*.safetensors"))
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": wm}))


def status_kib(pid):
    out = {}
    try:
        for line in open(f"/proc/{pid}/status"):
            k = line.split(":")[0]
            if k in ("VmHWM", "RssAnon"):
                out[k] = int(line.split()[1])
    except OSError:
        pass
    return out


def run_sampled(cmd):
    from reshard_bench import _tree
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = {"VmHWM": 0, "RssAnon": 0}
    while True:
        pid, status, _ = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        tot = {"VmHWM": 0, "RssAnon": 0}
        for q in _tree(p.pid):
            for k, v in status_kib(q).items():
                tot[k] += v
        for k in peak:
            peak[k] = max(peak[k], tot[k])
        time.sleep(0.02)
    dt = time.monotonic() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed: {p.stderr.read().decode()}")
    return dt, {k: round(v / 1024, 1) for k, v in peak.items()}


def warm(d):
    for p in d.glob("*.safetensors"):
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


def same_outputs(a: pathlib.Path, b: pathlib.Path):
    from safetensors import safe_open
    import torch
    def names(d):
        if (d / "model.safetensors.index.json").exists():
            return json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
        with safe_open(str(d / "model.safetensors"), "pt") as f:
            return {k: "model.safetensors" for k in f.keys()}
    ia, ib = names(a), names(b)
    if sorted(ia) != sorted(ib):
        return False
    for name in ia:
        with safe_open(str(a / ia[name]), "pt") as fa, safe_open(str(b / ib[name]), "pt") as fb:
            if not torch.equal(fa.get_tensor(name).view(torch.int16), fb.get_tensor(name).view(torch.int16)):
                return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--dir", default="/work/bench-data/fp8_dequant")
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-memory", default="256M")
    ap.add_argument("--reference", nargs=2, metavar=("SRC", "DST"))
    a = ap.parse_args()
    if a.reference:
        return reference(pathlib.Path(a.reference[0]), pathlib.Path(a.reference[1]))
    d = pathlib.Path(a.dir)
    src = d / "src"
    if not src.is_dir():
        make_src(src, a.shards)
    src_bytes = sum(p.stat().st_size for p in src.glob("*.safetensors"))
    cmds = {"reference": [sys.executable, __file__, "--reference", str(src), str(d / "out_ref")],
            "ckpt": [str(pathlib.Path(a.build) / "ckpt"), "to-hf", str(src), str(d / "out_ckpt"), "--dtype", "bf16",
                     "--threads", "2", "--max-memory", a.max_memory, "--no-fsync", "--no-verify"]}
    runs = {k: [] for k in cmds}
    checked = None
    for rep in range(a.reps):
        for name, cmd in cmds.items():
            out = d / ("out_ref" if name == "reference" else "out_ckpt")
            shutil.rmtree(out, ignore_errors=True)
            warm(src)
            dt, mem = run_sampled(cmd)
            runs[name].append({"seconds": round(dt, 2), "peak_rss_anon_mib": mem["RssAnon"], "peak_vmhwm_mib": mem["VmHWM"]})
            print(name, runs[name][-1], file=sys.stderr, flush=True)
        if checked is None:
            checked = same_outputs(d / "out_ref", d / "out_ckpt")
    med = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items()}
    anon = {k: max(r["peak_rss_anon_mib"] for r in v) for k, v in runs.items()}
    hwm = {k: max(r["peak_vmhwm_mib"] for r in v) for k, v in runs.items()}
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "src_gb": round(src_bytes / 1e9, 2), "runs": runs,
                      "speedup": round(med["reference"] / med["ckpt"], 2),
                      "memory_ratio_rss_anon": round(anon["reference"] / max(anon["ckpt"], 0.1), 1),
                      "memory_ratio_vmhwm": round(hwm["reference"] / max(hwm["ckpt"], 0.1), 1),
                      "outputs_equal": checked, "max_memory": a.max_memory}, indent=1))
    for out in ("out_ref", "out_ckpt"):
        shutil.rmtree(d / out, ignore_errors=True)


if __name__ == "__main__":
    main()
