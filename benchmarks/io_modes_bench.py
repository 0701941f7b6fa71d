#!/usr/bin/env python3
"""Streaming at the disk's speed (--io modes, compressed store), every figure in both memory states, each command against baselines
timed in the same run.

Memory states (--states, applied before EVERY timed command):
  hot   --hot-gib GiB touched and freed (the VM's free memory backed by the host), and the
        command's source read once (page cache warm);
  idle  sync, the page cache dropped: `echo 3 > /proc/sys/vm/drop_caches` (needs root); where
        that write is refused, every source file is fsync'd and posix_fadvise(DONTNEED)'d instead
        (only those files leave the cache); then --idle-sleep s of sleep (30), in which the host
        takes back the memory the drop freed (free page reporting). The method used is printed
        ("drop" in the JSON). The drop comes first: memory freed just before a command is still
        backed, so dropping after the sleep timed a cold cache in hot memory (cp -r + sync of the
        3.08 GB source 3.5-4.8 s after a command that had cached it, 8-12 s otherwise).

Parts (--parts, comma list):
  accept  the reference set of commands on a LLaMA-shaped bf16 model (default 20 layers, hidden
          2560, FFN 6912, GQA 20/4, vocab 32000: 3.08 GB; --layers scales it):
            reshard  `ckpt reshard` tp=4 pp=2 -> tp=2 pp=3 (even-ish stages) dp=1, weights only,
                     source check ON (the default), for each --io in --io-modes;
            python   the same reshard the way Megatron / FlagScale converters do it: torch.load of
                     every rank file (mmap=False), torch.cat over tp, re-split for tp=2 and the
                     new stages, torch.save of every new rank file + fsync (rank files written
                     untimed from the same tensors, HF names, no QKV packing: the least work a
                     Python converter can do);
            from-hf  `ckpt from-hf` (one rank);  to-hf 1   `ckpt to-hf` from one rank;
            to-hf 2x3x2  `ckpt to-hf` from tp=2 pp=3 dp=2;
            baselines `cp -r` + sync and `dd bs=4M oflag=direct conv=fsync` (file by file) of the
                     same bytes: the tp=4 pp=2 store (for reshard) and the HF directory (for
                     from-hf / to-hf, same size within 0.1%); `dd16 src`: the disk's write floor,
                     as many bytes as the store written by 16 dd oflag=direct writers at once
                     (zeros, no read): no reshard can write its output faster; `rw16 src`: the
                     disk's read + write floor, every source shard read with `dd iflag=direct`
                     (all at once) while dd16 writes: a reshard reads all and writes all, and
                     this is dd's time for that (no page cache, no CPU work; ckpt, with its reads
                     kept in flight, has run up to 10% under it: the disk's floor, not dd's).
  io      to-hf from tp=2 and from-hf with --io buffered / direct / auto, vs cp -r + sync.
  zstd    compressed store (shuffle+zstd-1) write and read with --threads 1 and 2.
This process imports neither torch nor numpy while it times (hot: numpy, to touch memory): a
parent holding torch timed its idle-state children slower (docs/BENCHMARKS.md).
ckpt fsyncs its outputs (the default). Wall seconds include the final sync; peak RSS and CPU
seconds are the command's (/usr/bin/time). Prints one JSON object per command, then per state a
table of medians and ratios (baseline s / command s: > 1 is faster than the baseline; python /
ckpt for the speed-up; RSS ckpt / python). Reports `uptime` before every round (shared machine).

  sudo .venv/bin/python benchmarks/io_modes_bench.py --ckpt build/ckpt --parts accept --states hot,idle
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from hf_bench import dir_bytes, make_model, timed, warm_memory  # noqa: E402

PY_HELPERS = r'''
def dim_of(n):  # tp split dim of a HF-named tensor; None: replicated
    if n.endswith(("o_proj.weight", "down_proj.weight")): return 1
    if n.endswith(("norm.weight",)): return None
    return 0
def stage_of(n, per):
    if ".layers." not in n: return 0 if "embed" in n else len(per) - 1
    i = int(n.split(".")[2]); s = 0
    while i >= per[s]: i -= per[s]; s += 1
    return s
def local(n, per, s):  # layer index inside stage s
    if ".layers." not in n: return n
    p = n.split("."); p[2] = str(int(p[2]) - sum(per[:s])); return ".".join(p)
def glob_name(n, per, s):
    if ".layers." not in n: return n
    p = n.split("."); p[2] = str(int(p[2]) + sum(per[:s])); return ".".join(p)
'''
PY_STACK = r'''
import json, os, sys, pathlib, torch
src, dst, cfg = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), json.loads(sys.argv[3])
tp, per, ntp, nper = cfg["tp"], cfg["per"], cfg["ntp"], cfg["nper"]
''' + PY_HELPERS + r'''
full = {}
for s in range(len(per)):
    ranks = [torch.load(src / f"mp_rank_{t:02d}_{s:03d}.pt", weights_only=True)["model"] for t in range(tp)]
    for n in ranks[0]:
        d = dim_of(n)
        full[glob_name(n, per, s)] = torch.cat([r[n] for r in ranks], d) if d is not None else ranks[0][n]
    del ranks
dst.mkdir(parents=True)
for s in range(len(nper)):
    for t in range(ntp):
        sd = {local(n, nper, s): (x.chunk(ntp, dim_of(n))[t].clone() if dim_of(n) is not None else x)
              for n, x in full.items() if stage_of(n, nper) == s}
        with open(dst / f"mp_rank_{t:02d}_{s:03d}.pt", "wb") as f:
            torch.save({"model": sd}, f); f.flush(); os.fsync(f.fileno())
'''


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def stages(layers, pp):
    base = [layers // pp] * pp
    for i in range(layers - sum(base)):
        base[pp - 1 - i] += 1
    return base


def make_llama(d: pathlib.Path, layers: int, hidden: int, ffn: int, heads: int, kv: int, vocab: int):
    """bf16 N(0, 0.02) LLaMA in one model.safetensors, tensors generated one at a time."""
    import torch
    from safetensors.torch import save_file
    d.mkdir(parents=True, exist_ok=True)
    hd = hidden // heads
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
           "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
           "head_dim": hd, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 2048,
           "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    g = torch.Generator().manual_seed(0)
    ts = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,), "lm_head.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        ts.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
                   p + "self_attn.q_proj.weight": (heads * hd, hidden), p + "self_attn.k_proj.weight": (kv * hd, hidden),
                   p + "self_attn.v_proj.weight": (kv * hd, hidden), p + "self_attn.o_proj.weight": (hidden, heads * hd),
                   p + "mlp.gate_proj.weight": (ffn, hidden), p + "mlp.up_proj.weight": (ffn, hidden),
                   p + "mlp.down_proj.weight": (hidden, ffn)})
    save_file({k: (torch.randn(s, generator=g) * 0.02).to(torch.bfloat16) for k, s in ts.items()}, d / "model.safetensors",
              metadata={"format": "pt"})


def torch_ranks(hf: pathlib.Path, out: pathlib.Path, tp: int, per):
    """The tp x pp rank files the Python stack starts from (untimed), HF names, layers per stage."""
    import torch
    from safetensors import safe_open
    ns = {}
    exec(PY_HELPERS, ns)  # dim_of, stage_of, local: the same rules as the timed script
    out.mkdir(parents=True)
    with safe_open(hf / "model.safetensors", "pt") as f:
        names = list(f.keys())
        for s in range(len(per)):
            shards = [{} for _ in range(tp)]
            for n in names:
                if ns["stage_of"](n, per) != s:
                    continue
                x, d = f.get_tensor(n), ns["dim_of"](n)
                for t in range(tp):
                    shards[t][ns["local"](n, per, s)] = x.chunk(tp, d)[t].clone() if d is not None else x
            for t in range(tp):
                torch.save({"model": shards[t]}, out / f"mp_rank_{t:02d}_{s:03d}.pt")


class State:
    def __init__(self, a):
        self.a = a
        self.drop = None

    def enter(self, state, sources):
        if state == "hot":
            warm_memory(self.a.hot_gib)
            for d in sources:
                for p in pathlib.Path(d).rglob("*"):
                    if p.is_file():
                        with open(p, "rb") as f:
                            while f.read(64 << 20):
                                pass
            return
        os.sync()
        self.drop = "fadvise"
        if getattr(self.a, "drop_method", "drop_caches") == "drop_caches":  # fadvise: only the sources leave the cache
            try:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
                self.drop = "drop_caches"
            except OSError:
                pass
        if self.drop == "fadvise":
            for d in sources:
                for p in pathlib.Path(d).rglob("*"):
                    if p.is_file():
                        fd = os.open(p, os.O_RDONLY)
                        os.fsync(fd)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
        time.sleep(self.a.idle_sleep)


def dd_copy(src: pathlib.Path, dst: pathlib.Path):
    """dd oflag=direct of every file of src (a shell script: one timed command)."""
    lines = ["set -e"]
    for p in sorted(src.rglob("*")):
        q = dst / p.relative_to(src)
        if p.is_dir():
            lines.append(f"mkdir -p '{q}'")
        elif p.is_file():
            lines.append(f"mkdir -p '{q.parent}'; dd if='{p}' of='{q}' bs=4M oflag=direct conv=fsync status=none")
    return ["bash", "-c", "\n".join(lines)]


def dd_floor(nbytes: int, dst: pathlib.Path, streams: int = 16, bs_mib: int = 4):
    """The disk's write floor for nbytes: `streams` dd oflag=direct writers of zeros at once (no read), in
    requests of bs_mib MiB (each writes ceil(nbytes / streams) rounded up to whole requests)."""
    dst.mkdir(parents=True)
    count = -(-nbytes // (streams * (bs_mib << 20)))
    return ["bash", "-c", f"for i in $(seq {streams}); do dd if=/dev/zero of='{dst}'/$i bs={bs_mib}M count={count} oflag=direct "
            "conv=fsync status=none & done; wait"]


def rw_floor(src: pathlib.Path, dst: pathlib.Path, streams: int = 16):
    """The disk's read + write floor: every file of src read with iflag=direct, all at once, while
    dd_floor writes as many bytes."""
    reads = " ".join(f"dd if='{p}' of=/dev/null bs=4M iflag=direct status=none &" for p in sorted(src.rglob("*")) if p.is_file())
    write = dd_floor(dir_bytes(src), dst, streams)[2]
    return ["bash", "-c", f"{reads} {write}"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", default="build/ckpt")
    ap.add_argument("--python", default=str(pathlib.Path(__file__).resolve().parents[1] / ".venv/bin/python"))
    ap.add_argument("--dir", default="/tmp/io_modes_bench")
    ap.add_argument("--parts", default="accept", help="comma list: accept, io, zstd")
    ap.add_argument("--states", default="hot,idle")
    ap.add_argument("--io-modes", default="auto", help="--io of the accept part's reshard (comma list)")
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--ffn", type=int, default=6912)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--hot-gib", type=float, default=4.0)
    ap.add_argument("--idle-sleep", type=float, default=30.0)
    ap.add_argument("--max-memory", default="256M")
    ap.add_argument("--only", default="", help="comma list of command names to time (e.g. 'cp src,reshard auto,python "
                    "reshard'); default every command of --parts. --reps 0 only prepares the sources")
    a = ap.parse_args()
    root = pathlib.Path(a.dir)
    root.mkdir(parents=True, exist_ok=True)
    ck, parts, states = a.ckpt, set(a.parts.split(",")), a.states.split(",")
    hf = root / "hf"
    if not (hf / "model.safetensors").exists():
        if "accept" in parts:
            make_llama(hf, a.layers, a.hidden, a.ffn, 20, 4, 32000)
        else:
            make_model(hf, a.layers)

    def prep(name, *flags):  # ckpt from-hf hf NAME FLAGS (untimed, once)
        d = root / name
        if not d.exists():
            subprocess.run([ck, "from-hf", hf, d, *flags, "--no-fsync"], check=True, stdout=subprocess.DEVNULL)
        return d

    def fresh(name):
        p = root / name
        if p.exists():
            shutil.rmtree(p)
        return p

    cases = []  # (name, command maker, sources to warm or drop, copies by a tool that does not fsync)
    if "accept" in parts:
        per_src, per_dst = stages(a.layers, 2), stages(a.layers, 3)
        src = prep("tp4pp2", "--tp", "4", "--pp", "2", "--dp", "1")
        one = prep("tp1", "--tp", "1", "--pp", "1", "--dp", "1")
        big = prep("tp2pp3dp2", "--tp", "2", "--pp", "3", "--dp", "2")
        tsrc = root / "torch_tp4pp2"
        if not tsrc.exists():
            torch_ranks(hf, tsrc, 4, per_src)
        cfg = json.dumps({"tp": 4, "per": per_src, "ntp": 2, "nper": per_dst})
        (root / "py_stack.py").write_text(PY_STACK)
        mm = ["--max-memory", a.max_memory]
        cases += [("cp src", lambda: ["cp", "-r", src, fresh("o_cp")], [src], True),
                  ("dd src", lambda: dd_copy(src, fresh("o_dd")), [src], True),
                  ("dd16 src", lambda: dd_floor(dir_bytes(src), fresh("o_dd")), [], True),
                  ("rw16 src", lambda: rw_floor(src, fresh("o_dd")), [src], True)]
        for io in a.io_modes.split(","):
            cases.append((f"reshard {io}", lambda io=io: [ck, "reshard", src, fresh("o_rs"), "--tp", "2", "--pp", "3", "--pp-layers",
                                                          ",".join(map(str, per_dst)), "--dp", "1", "--io", io, *mm], [src], False))
        cases += [("python reshard", lambda: [a.python, root / "py_stack.py", tsrc, fresh("o_py"), cfg], [tsrc], False),
                  ("cp hf", lambda: ["cp", "-r", hf, fresh("o_cp")], [hf], True),
                  ("dd hf", lambda: dd_copy(hf, fresh("o_dd")), [hf], True),
                  ("from-hf", lambda: [ck, "from-hf", hf, fresh("o_imp"), *mm], [hf], False),
                  ("to-hf 1", lambda: [ck, "to-hf", one, fresh("o_exp"), *mm], [one], False),
                  ("to-hf 2x3x2", lambda: [ck, "to-hf", big, fresh("o_exp"), *mm], [big], False)]
    if "io" in parts:
        tp2 = prep("tp2", "--tp", "2", "--pp", "1", "--dp", "1")
        cases.append(("cp hf", lambda: ["cp", "-r", hf, fresh("o_cp")], [hf], True))
        for io in ("buffered", "direct", "auto"):
            cases.append((f"to-hf tp2 {io}", lambda io=io: [ck, "to-hf", tp2, fresh("o_exp"), "--io", io], [tp2], False))
            cases.append((f"from-hf {io}", lambda io=io: [ck, "from-hf", hf, fresh("o_imp"), "--io", io], [hf], False))
    if "zstd" in parts:
        zst = prep("zstd", "--compress", "shuffle+zstd:1")
        for t in (1, 2):
            cases.append((f"zstd write t{t}", lambda t=t: [ck, "from-hf", hf, fresh("o_zw"), "--compress", "shuffle+zstd:1",
                                                           "--threads", str(t)], [hf], False))
            cases.append((f"zstd read t{t}", lambda t=t: [ck, "to-hf", zst, fresh("o_zr"), "--threads", str(t), "--io", "buffered"],
                          [zst], False))
    if a.only:
        keep = set(x.strip() for x in a.only.split(","))
        cases = [c for c in cases if c[0] in keep]
        missing = keep - {c[0] for c in cases}
        if missing:
            sys.exit(f"--only: no command named {sorted(missing)} in --parts {a.parts}")
    st = State(a)
    print(json.dumps({"uptime_before": uptime(), "hf_bytes": dir_bytes(hf), "layers": a.layers, "states": states}), flush=True)
    times = {(s, n): [] for s in states for n, _, _, _ in cases}
    rss = {}
    for rep in range(a.reps):
        for s in states:
            print(json.dumps({"round": rep, "state": s, "uptime": uptime()}), flush=True)
            for name, cmd, sources, sync in cases:
                argv = cmd()  # removes the last run's output first: freeing its page cache is part of the state
                st.enter(s, sources)
                dt, r, cpu = timed(argv, sync=True)  # ckpt and python fsync their files; cp and dd need the sync
                times[(s, name)].append(dt)
                rss[(s, name)] = max(rss.get((s, name), 0), r)
                print(json.dumps({"state": s, "cmd": name, "s": round(dt, 2), "rss_MiB": round(r), "cpu_s": round(cpu, 2),
                                  "drop": st.drop if s == "idle" else None}), flush=True)
    for p in root.glob("o_*"):
        shutil.rmtree(p, ignore_errors=True)
    summarize(times, rss, states)
    print(json.dumps({"uptime_after": uptime()}), flush=True)


def summarize(times, rss, states):
    for s in states:
        med = {n: statistics.median(v) for (st, n), v in times.items() if st == s and v}
        base = {"reshard": ("cp src", "dd src"), "python": ("cp src", "dd src")}
        print(f"\n{s}: command | median s | vs cp | vs dd | peak RSS MiB | extra")
        for n, v in med.items():
            cp, dd = base.get(n.split()[0], ("cp hf", "dd hf"))
            extra = ""
            if n.startswith("reshard") and "python reshard" in med:
                extra = (f"python/ckpt {med['python reshard'] / v:.2f}x, RSS ckpt/python "
                         f"{rss[(s, n)] / max(1, rss[(s, 'python reshard')]):.3f}; 5x python needs <= "
                         f"{med['python reshard'] / 5:.2f} s")
                floor = min((med[b] for b in ("dd src", "dd16 src") if b in med), default=None)
                if floor is not None:
                    extra += f", write floor (best of dd src, dd16 src) {floor:.2f} s"
                if "rw16 src" in med:
                    extra += f", read + write floor (rw16 src) {med['rw16 src']:.2f} s = {med['rw16 src'] / v:.2f}x of ckpt"
            baseline = n.split()[0] in ("cp", "dd", "dd16", "rw16")
            vs = lambda b: f"{med[b] / v:.2f}" if b in med and not baseline else "-"  # noqa: E731
            print(f"{n} | {v:.2f} | {vs(cp)} | {vs(dd)} | {rss[(s, n)]:.0f} | {extra}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
