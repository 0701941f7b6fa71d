#!/usr/bin/env python3
"""MoE resharding benchmark (issue 37 acceptance; docs/BENCHMARKS.md "MoE resharding"): a command, not a timed test.

Source: a Mixtral-shaped bf16 model (default 10 layers, hidden 1536, 16 experts of width 2048, GQA 12/4, vocab
32000, untied: 3.34 GB), generated as HF safetensors (per-expert names, as save_pretrained writes them), then
  * the ckpt store: `ckpt from-hf --tp 1 --dp 8 --ep 8` (expert parallel 8, 2 experts per rank; untimed);
  * the Python side's rank files (untimed, from the same safetensors): one torch file per rank of the same layout,
    the rank's experts stacked ([E/ep, F/etp, h], canonical names) and the dense tensors once (in rank 0's file
    only: the least a Python converter has to read), each file with the global offsets of its tensors.
Timed, in interleaved rounds (--rounds, the order rotated each round), each command in the same state:
  ckpt    `ckpt reshard` to ep2 tp2 pp2 (etp 1, dp 1, stages 5,5), source check on (the default), fsync'd, --io auto
          (its default; ckpt_direct, ckpt_buffered: --io direct / buffered, in --commands when asked); its --json
          says which way auto wrote (io.writes) and how the source was checked, both kept in the row;
  cp      `cp -r` of the ckpt store + sync: the plain copy of the same bytes;
  python  the Python way: torch.load of every source rank file, each tensor copied into its global tensor
          (one at a time, file freed after use), then for every target rank its boxes sliced, cloned and
          torch.save'd + fsync (experts by Megatron-Core's expert rank order, dense tensors by the TP rule).
State (io_modes_bench.State): 'hot' = --hot-gib GiB touched and freed, the command's source read once (page cache
warm), before every command; 'idle' as io_modes_bench defines it. Wall seconds include the final sync; peak RSS
and CPU seconds by /usr/bin/time (hf_bench.timed). The machine state (load, memory, busiest processes) is printed
before every round. Prints one JSON object per command, then medians and ratios (goals: cp / ckpt >= 0.8,
python / ckpt >= 5, ckpt RSS <= python RSS / 16).

  .venv/bin/python benchmarks/moe_reshard_bench.py --ckpt build/ckpt [--dir /work/bench-data/moe_reshard] [--reuse]
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import types

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from hf_bench import dir_bytes, timed  # noqa: E402
from io_floor_bench import machine_state  # noqa: E402
from io_modes_bench import State  # noqa: E402

# The Python side, run by the venv's python (torch stays out of the timing process).
PY_WAY = r'''
import json, os, sys, pathlib, torch
mode, cfg, src, dst = sys.argv[1], json.loads(sys.argv[2]), pathlib.Path(sys.argv[3]), pathlib.Path(sys.argv[4])

def ranks(lay):
    """(file name, stage, tp rank, ep rank, etp rank, holds dense, holds experts) of every rank of a layout."""
    tp, dp, ep, etp, per = lay["tp"], lay["dp"], lay["ep"], lay["etp"], lay["per"]
    out = []
    for s in range(len(per)):
        for d in range(dp):
            for t in range(tp):
                r = d * tp + t  # stage-local rank; Megatron-Core's expert order: etp, ep, edp
                out.append((f"rank_{s}_{d}_{t}.pt", s, t, (r // etp) % ep, r % etp, d == 0, r // (etp * ep) == 0))
    return out

def stage_of(name, per):
    if name.startswith("model.layers."):
        i = int(name.split(".")[2])
        s = 0
        while i >= per[s]:
            i -= per[s]; s += 1
        return s
    return 0 if "embed_tokens" in name else len(per) - 1

def box(name, shape, lay, t, e, x):
    """Offsets and extents of rank (tp t, ep e, etp x)'s part of a canonical tensor."""
    off, ext = [0] * len(shape), list(shape)
    def split(dim, parts, i):
        ext[dim] = shape[dim] // parts; off[dim] = i * ext[dim]
    if ".mlp.experts." in name:
        split(0, lay["ep"], e); split(2 if "down_proj" in name else 1, lay["etp"], x)
    elif name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")) or name in ("model.embed_tokens.weight", "lm_head.weight"):
        split(0, lay["tp"], t)
    elif name.endswith("o_proj.weight"):
        split(1, lay["tp"], t)
    return off, ext

def part(g, off, ext):
    return g[tuple(slice(o, o + n) for o, n in zip(off, ext))]

def save(obj, path):
    with open(path, "wb") as f:
        torch.save(obj, f); f.flush(); os.fsync(f.fileno())

def write_ranks(glob, lay, out):
    out.mkdir(parents=True)
    for fname, s, t, e, x, dense, experts in ranks(lay):
        model, offsets = {}, {}
        for n, g in glob.items():
            if stage_of(n, lay["per"]) != s or not (experts if ".mlp.experts." in n else dense):
                continue
            off, ext = box(n, g.shape, lay, t, e, x)
            model[n], offsets[n] = part(g, off, ext).clone(), off
        save({"model": model, "offsets": offsets, "shapes": {n: list(glob[n].shape) for n in model}}, out / fname)

if mode == "make":  # untimed: the HF safetensors in canonical names, written as the source layout's rank files
    from safetensors.torch import load_file
    hf, glob, names = load_file(src / "model.safetensors"), {}, {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
    for k in sorted(hf):
        p = k.replace(".block_sparse_moe.", ".mlp.").split(".")
        if len(p) > 6 and p[4] == "experts":
            glob.setdefault(".".join(p[:5] + [names[p[6]], "weight"]), {})[int(p[5])] = hf[k]
        else:
            glob[".".join(p)] = hf[k]
    glob = {n: torch.stack([v[e] for e in sorted(v)]) if isinstance(v, dict) else v for n, v in glob.items()}
    write_ranks(glob, cfg["src"], dst)
    sys.exit(0)

if mode == "check":  # src: the Python way's output, dst: ckpt's, read by h5py (scripts/native_h5py.py): the same tensors
    import numpy as np
    sys.path.insert(0, cfg["scripts"])
    from native_h5py import read_native
    _, ref, _ = read_native(dst)
    seen = set()
    for fname, *_ in ranks(cfg["dst"]):
        sd = torch.load(src / fname, weights_only=True)
        for n, v in sd["model"].items():
            want = part(torch.from_numpy(ref[n].view(np.int16)), sd["offsets"][n], v.shape)
            assert torch.equal(want, v.view(torch.int16)), (fname, n)
            seen.add(n)
    assert seen == set(ref), sorted(set(ref) ^ seen)[:5]
    print(json.dumps({"check": "the Python way's rank files hold ckpt's output", "tensors": len(seen)}))
    sys.exit(0)

glob = {}  # mode == "reshard", timed
for fname, *_ in ranks(cfg["src"]):
    sd = torch.load(src / fname, weights_only=True)
    for n, v in sd["model"].items():
        g = glob.get(n)
        if g is None:
            g = glob[n] = torch.empty(sd["shapes"][n], dtype=v.dtype)
        part(g, sd["offsets"][n], v.shape).copy_(v)
    del sd
write_ranks(glob, cfg["dst"], dst)
'''


def mixtral_config(a):
    return {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_act": "silu", "dtype": "bfloat16",
            "hidden_size": a.hidden, "intermediate_size": a.ffn, "num_attention_heads": a.heads, "num_key_value_heads": a.kv,
            "num_hidden_layers": a.layers, "num_local_experts": a.experts, "num_experts_per_tok": 2, "vocab_size": a.vocab,
            "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 1e6, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2}


def hf_tensors(a):
    """(name, shape) of the HF Mixtral checkpoint, per-expert names."""
    h, hd = a.hidden, a.hidden // a.heads
    out = [("model.embed_tokens.weight", (a.vocab, h))]
    for i in range(a.layers):
        p = f"model.layers.{i}."
        out += [(p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (a.heads * hd, h)), (p + "self_attn.k_proj.weight", (a.kv * hd, h)),
                (p + "self_attn.v_proj.weight", (a.kv * hd, h)), (p + "self_attn.o_proj.weight", (h, a.heads * hd)),
                (p + "block_sparse_moe.gate.weight", (a.experts, h))]
        for e in range(a.experts):
            q = p + f"block_sparse_moe.experts.{e}."
            out += [(q + "w1.weight", (a.ffn, h)), (q + "w2.weight", (h, a.ffn)), (q + "w3.weight", (a.ffn, h))]
    return out + [("model.norm.weight", (h,)), ("lm_head.weight", (a.vocab, h))]


def write_hf(a, d: pathlib.Path):
    """model.safetensors (written here: header + bytes) with normal(0, 0.02) values rounded to bf16, taken from a
    64 Mi-element pool at a moving offset (the content does not change an uncompressed reshard's work)."""
    import numpy as np
    pool = (np.random.default_rng(0).standard_normal(64 << 20, dtype=np.float32) * 0.02).view(np.uint32)
    pool = ((pool + 0x8000) >> 16).astype(np.uint16)  # bf16 (round half up)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    tensors = hf_tensors(a)
    for name, shape in tensors:
        n = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(mixtral_config(a), indent=1))
    with open(d / "model.safetensors", "wb") as f:
        f.write(len(hb).to_bytes(8, "little") + hb)
        at = 0
        for _, shape in tensors:
            n = int(np.prod(shape))
            while n:
                k = min(n, pool.size - at)
                f.write(pool[at:at + k].tobytes())
                n, at = n - k, (at + k + 4099) % (pool.size - 8192)
            f.flush()


def prepare(a, root: pathlib.Path, ckpt: str):
    """The HF model, the ckpt store (ep8) and the Python side's rank files; kept across runs with --reuse."""
    hf, store, ranks = root / "hf", root / "src_ep8", root / "torch_src_ep8"
    src = {"tp": 1, "dp": 8, "ep": 8, "etp": 1, "per": [a.layers]}
    first = a.layers // 2
    dst = {"tp": 2, "dp": 1, "ep": 2, "etp": 1, "per": [first, a.layers - first]}
    cfg = json.dumps({"src": src, "dst": dst, "scripts": str(ROOT / "scripts")})
    if a.reuse and (ranks / "done").exists():
        (root / "py_way.py").write_text(PY_WAY)
        return store, ranks, cfg, dst
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "py_way.py").write_text(PY_WAY)
    write_hf(a, hf)
    subprocess.run([ckpt, "from-hf", hf, store, "--tp", "1", "--pp", "1", "--dp", "8", "--ep", "8", "--etp", "1"],
                   check=True, capture_output=True)
    subprocess.run([a.python, root / "py_way.py", "make", cfg, hf, ranks], check=True)
    shutil.rmtree(hf)
    (ranks / "done").write_text("")
    return store, ranks, cfg, dst


def fresh(p: pathlib.Path):
    shutil.rmtree(p, ignore_errors=True)
    shutil.rmtree(str(p) + ".partial", ignore_errors=True)
    os.sync()
    return p


def summarize(rows, states, src_bytes):
    """Per state: medians of every command, and per ckpt command its ratios (of the medians, and the median of each
    round's ratio) to cp and to the Python way."""
    out = {}
    for st in states:
        med, ratios = {}, {}
        for cmd in dict.fromkeys(r["cmd"] for r in rows):
            rs = [r for r in rows if r["state"] == st and r["cmd"] == cmd]
            med[cmd] = {k: statistics.median(r[k] for r in rs) for k in ("seconds", "peak_rss_mib", "cpu_s")}
        for ck in (c for c in med if c.startswith("ckpt")):
            for base in ("cp", "python"):
                pairs = [(r["seconds"], c["seconds"]) for r in rows for c in rows if r["state"] == c["state"] == st
                         and r["round"] == c["round"] and r["cmd"] == base and c["cmd"] == ck]
                if pairs:
                    ratios[f"{base}/{ck}"] = {"of_medians": med[base]["seconds"] / med[ck]["seconds"],
                                              "paired_median": statistics.median(x / y for x, y in pairs)}
            if "python" in med:
                ratios[f"rss {ck}/python"] = med[ck]["peak_rss_mib"] / med["python"]["peak_rss_mib"]
            med[ck]["GBps"] = src_bytes / med[ck]["seconds"] / 1e9
        out[st] = {"medians": med, "ratios": ratios}
    return out


def run_round(rnd, a, cmds, st, root):
    """One round: every command once per state, the order rotated by the round; returns the rows."""
    names, rows = a.commands.split(","), []
    for state in a.states.split(","):
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            make, source = cmds[name]
            cmd = make()
            st.enter(state, [source])
            with open(root / "cmd_stdout.txt", "w") as out:
                s, rss, cpu = timed(cmd, sync=True, stdout=out)
            row = {"round": rnd, "state": state, "cmd": name, "seconds": s, "peak_rss_mib": rss, "cpu_s": cpu,
                   "loadavg": open("/proc/loadavg").read().split()[:3]}
            if name.startswith("ckpt"):  # its --json: how it wrote (--io auto's choice) and checked the source
                j = json.loads((root / "cmd_stdout.txt").read_text())
                row.update(writes=j["io"]["writes"], source_check=j["source_check"]["how"], bytes_written=j["bytes_written"])
            rows.append(row)
            print(json.dumps(row), flush=True)
            fresh(root / f"o_{name}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=str(ROOT / "build/ckpt"))
    ap.add_argument("--python", default=str(ROOT / ".venv/bin/python"))
    ap.add_argument("--dir", default="/work/bench-data/moe_reshard")
    ap.add_argument("--reuse", action="store_true", help="keep and reuse the sources of an earlier run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="first check (untimed) that the Python way writes what ckpt writes")
    ap.add_argument("--states", default="hot")
    ap.add_argument("--hot-gib", type=float, default=8.0)
    ap.add_argument("--idle-sleep", type=float, default=30.0)
    ap.add_argument("--commands", default="ckpt,cp,python", help="of ckpt (--io auto), ckpt_direct, ckpt_buffered, cp, python")
    ap.add_argument("--max-memory", default="", help="ckpt --max-memory ('' = its default)")
    for k, v in (("layers", 10), ("hidden", 1536), ("ffn", 2048), ("experts", 16), ("heads", 12), ("kv", 4), ("vocab", 32000)):
        ap.add_argument(f"--{k}", type=int, default=v)
    a = ap.parse_args()
    ckpt, root = str(pathlib.Path(a.ckpt).resolve()), pathlib.Path(a.dir)
    store, ranks, cfg, dst = prepare(a, root, ckpt)
    src_bytes = dir_bytes(store)
    print(json.dumps({"source_bytes": src_bytes, "torch_source_bytes": dir_bytes(ranks), "model": vars(a)}), flush=True)
    mm = ["--max-memory", a.max_memory] if a.max_memory else []
    per = ",".join(map(str, dst["per"]))
    cmds = {"cp": (lambda: ["cp", "-r", store, fresh(root / "o_cp")], store),
            "python": (lambda: [a.python, root / "py_way.py", "reshard", cfg, ranks, fresh(root / "o_py")], ranks)}
    for io in ("auto", "direct", "buffered"):  # ckpt = its default (--io auto); ckpt_direct, ckpt_buffered
        cmds["ckpt" if io == "auto" else f"ckpt_{io}"] = (
            lambda io=io: [ckpt, "reshard", store, fresh(root / ("o_ckpt" if io == "auto" else f"o_ckpt_{io}")), "--tp", "2",
                           "--pp", "2", "--pp-layers", per, "--dp", "1", "--ep", "2", "--etp", "1", "--io", io, "--json", *mm], store)
    if a.check:
        cmd = cmds["ckpt"][0]()
        subprocess.run(cmd, check=True, capture_output=True)
        subprocess.run(cmds["python"][0](), check=True)
        print(subprocess.run([a.python, root / "py_way.py", "check", cfg, root / "o_py", cmd[3]], check=True, capture_output=True,
                             text=True).stdout.strip(), flush=True)
        fresh(root / "o_py"), fresh(root / "o_ckpt")
    st = State(types.SimpleNamespace(hot_gib=a.hot_gib, idle_sleep=a.idle_sleep, drop_method="drop_caches"))
    rows = []
    for rnd in range(a.rounds):
        print(json.dumps({"round": rnd, "machine": machine_state(root, brief=rnd > 0)}), flush=True)
        rows += run_round(rnd, a, cmds, st, root)
    if not rows:  # --rounds 0: the sources only
        return
    res = summarize(rows, a.states.split(","), src_bytes)
    print(json.dumps({"summary": res, "machine_after": machine_state(root, brief=True)}, indent=1), flush=True)


if __name__ == "__main__":
    main()
