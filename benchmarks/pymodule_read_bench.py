#!/usr/bin/env python3
"""Reading every tensor of a LLaMA checkpoint from Python: the ckpt module against h5py and
safetensors' own loaders, on the same model, in the same run (docs/BENCHMARKS.md "Python module").

The model (random fp32 weights, LLaMA-shaped, about --size-gb) is written once under --dir as a
HuggingFace directory by the safetensors library (shards of ~512 MB + index) and imported into a
native store with `ckpt.from_hf`. Then each reader runs in a subprocess of its own, so its time
and peak RSS are its alone:
  ckpt-native        ckpt.open(native store); read(name) of every tensor
  ckpt-hf            ckpt.open(HF directory); read(name) of every tensor
  h5py-native        h5py: every piece's dataset of the native store (the manifest's list), [()]
  st-safe_open       safetensors.safe_open(shard, "np").get_tensor(name) of every tensor
  st-load_file       safetensors.numpy.load_file(shard) of every shard (a shard's dict at a time)
Each keeps one tensor (load_file: one shard) alive at a time. Every reader runs once untimed
first (page cache warm for all: the figures are of reading from memory, not the disk; dropping
the cache needs root), then --repeat timed runs: the median time and the largest peak RSS are
reported, with the RSS after imports (before reading) so the reading's own share is visible.

    PYTHONPATH=build/python .venv/bin/python benchmarks/pymodule_read_bench.py --size-gb 2 --dir /tmp/pyread
    ... --size-gb 0.1 --repeat 1           # a quick proof that it runs
    ... --json out.json                    # also write the figures as JSON

Needs the ckpt module (build target ckpt_python), numpy, safetensors, h5py.
"""
import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

READERS = ["ckpt-native", "ckpt-hf", "h5py-native", "st-safe_open", "st-load_file"]


def llama_config(size_gb: float) -> dict:
    """A LLaMA config of about size_gb of fp32 weights (hidden 1024..4096, vocab 32000)."""
    hidden = 1024 if size_gb <= 0.5 else 2048 if size_gb <= 4 else 4096
    inter, vocab = hidden * 11 // 4, 32000
    per_layer = 4 * (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden)
    fixed = 4 * (2 * vocab * hidden + hidden)
    layers = max(1, round((size_gb * 1e9 - fixed) / per_layer))
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048, "vocab_size": vocab,
            "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": hidden // 128, "num_key_value_heads": hidden // 128, "torch_dtype": "float32",
            "tie_word_embeddings": False}


def tensor_shapes(cfg: dict):
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    yield "model.embed_tokens.weight", (v, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for n, s in (("input_layernorm.weight", (h,)), ("post_attention_layernorm.weight", (h,)),
                     ("self_attn.q_proj.weight", (h, h)), ("self_attn.k_proj.weight", (h, h)),
                     ("self_attn.v_proj.weight", (h, h)), ("self_attn.o_proj.weight", (h, h)),
                     ("mlp.gate_proj.weight", (f, h)), ("mlp.up_proj.weight", (f, h)), ("mlp.down_proj.weight", (h, f))):
            yield p + n, s
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def make_model(root: pathlib.Path, size_gb: float):
    """-> (hf dir, native dir), made once (a marker file says they are complete)."""
    import numpy as np
    from safetensors.numpy import save_file
    import ckpt
    hf, native, done = root / "hf", root / "native", root / f"made-{size_gb}"
    if done.exists():
        return hf, native
    for d in (hf, native):
        if d.exists():
            subprocess.run(["rm", "-rf", str(d)], check=True)
    hf.mkdir(parents=True)
    cfg = llama_config(size_gb)
    (hf / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    shard, shard_bytes, weight_map, files, total = {}, 0, {}, [], 0

    def flush():
        nonlocal shard, shard_bytes
        name = f"model-{len(files) + 1:05d}.safetensors"
        save_file(shard, str(hf / name))
        files.append(name)
        weight_map.update({k: name for k in shard})
        shard, shard_bytes = {}, 0

    for name, shape in tensor_shapes(cfg):
        shard[name] = rng.standard_normal(shape, dtype=np.float32)
        shard_bytes += shard[name].nbytes
        total += shard[name].nbytes
        if shard_bytes >= 512 << 20:
            flush()
    if shard:
        flush()
    (hf / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    ckpt.from_hf(hf, native, fsync=False)
    done.write_text("ok")
    return hf, native


def tensor_names(ck):
    """Names of a ckpt.Checkpoint's tensors (a mapping, or a list of names / of objects with .name)."""
    t = ck.tensors
    if isinstance(t, dict):
        return list(t)
    return [x if isinstance(x, str) else x.name for x in t]


def read_all(reader: str, hf: pathlib.Path, native: pathlib.Path) -> tuple:
    """Reads every tensor; -> (tensors, bytes)."""
    n = nbytes = 0
    if reader.startswith("ckpt-"):
        import ckpt
        ck = ckpt.open(native if reader == "ckpt-native" else hf)
        for name in tensor_names(ck):
            a = ck.read(name)
            n, nbytes = n + 1, nbytes + a.nbytes
            del a
    elif reader == "h5py-native":
        import h5py
        man = json.loads((native / "manifest.json").read_text())
        files = {}
        for p in man["pieces"]:
            f = files.get(p["file"]) or files.setdefault(p["file"], h5py.File(native / p["file"], "r"))
            a = f[p["dataset"]][()]
            n, nbytes = n + 1, nbytes + a.nbytes
            del a
        for f in files.values():
            f.close()
    elif reader == "st-safe_open":
        from safetensors import safe_open
        for shard in sorted(hf.glob("*.safetensors")):
            with safe_open(str(shard), "np") as f:
                for k in f.keys():
                    a = f.get_tensor(k)
                    n, nbytes = n + 1, nbytes + a.nbytes
                    del a
    elif reader == "st-load_file":
        from safetensors.numpy import load_file
        for shard in sorted(hf.glob("*.safetensors")):
            d = load_file(str(shard))
            n, nbytes = n + len(d), nbytes + sum(a.nbytes for a in d.values())
            del d
    else:
        raise SystemExit(f"unknown reader {reader}")
    return n, nbytes


def rss_mb() -> float:
    """Peak RSS of this process so far (VmHWM: unlike getrusage's ru_maxrss it is not inherited
    across exec from the forking parent)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child(reader: str, hf: str, native: str):
    # Import what the reader needs before measuring the baseline.
    if reader.startswith("ckpt-"):
        import ckpt  # noqa: F401
    elif reader == "h5py-native":
        import h5py  # noqa: F401
    else:
        import safetensors.numpy  # noqa: F401
    import numpy  # noqa: F401
    base = rss_mb()
    t0 = time.perf_counter()
    n, nbytes = read_all(reader, pathlib.Path(hf), pathlib.Path(native))
    secs = time.perf_counter() - t0
    print(json.dumps({"reader": reader, "seconds": secs, "tensors": n, "bytes": nbytes,
                      "peak_rss_mb": rss_mb(), "rss_after_imports_mb": base}))


def run_child(reader, hf, native):
    p = subprocess.run([sys.executable, __file__, "--child", reader, str(hf), str(native)], capture_output=True,
                       text=True, env=os.environ)
    if p.returncode != 0:
        raise SystemExit(f"{reader} failed ({p.returncode}):\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=2.0)
    ap.add_argument("--dir", default="/tmp/ckpt_pyread_bench")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--readers", default=",".join(READERS))
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--child", nargs=3, metavar=("READER", "HF", "NATIVE"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(*a.child)
    hf, native = make_model(pathlib.Path(a.dir), a.size_gb)
    results = []
    for reader in a.readers.split(","):
        run_child(reader, hf, native)  # warm-up (page cache, lazy loading)
        runs = [run_child(reader, hf, native) for _ in range(max(1, a.repeat))]
        r = dict(runs[0])
        r["seconds"] = statistics.median(x["seconds"] for x in runs)
        r["peak_rss_mb"] = max(x["peak_rss_mb"] for x in runs)
        r["gb_per_s"] = r["bytes"] / r["seconds"] / 1e9
        results.append(r)
    gb = results[0]["bytes"] / 1e9
    print(f"{gb:.2f} GB, {results[0]['tensors']} tensors, median of {a.repeat} warm runs")
    print(f"{'reader':14s} {'seconds':>8s} {'GB/s':>6s} {'peak RSS MB':>12s} {'after imports':>14s}")
    for r in results:
        print(f"{r['reader']:14s} {r['seconds']:8.3f} {r['gb_per_s']:6.2f} {r['peak_rss_mb']:12.0f} {r['rss_after_imports_mb']:14.0f}")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps({"size_gb": a.size_gb, "repeat": a.repeat, "results": results}, indent=2))


if __name__ == "__main__":
    main()
