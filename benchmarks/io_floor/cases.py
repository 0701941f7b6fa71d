"""The sources (made once per shape, untimed) and the timed commands of benchmarks/io_floor_bench.py."""
import json
import pathlib
import shutil
import subprocess

from hf_bench import dir_bytes
from io_modes_bench import PY_STACK, dd_floor, stages

HERE = pathlib.Path(__file__).resolve().parents[1]  # benchmarks/

# Untimed preparation in a child (torch stays out of the timing process).
PREP = r'''
import json, pathlib, shutil, sys
sys.path.insert(0, sys.argv[1])
from io_modes_bench import make_llama, torch_ranks
c = json.loads(sys.argv[2])
hf, ts = pathlib.Path(c["hf"]), pathlib.Path(c["tsrc"])
if not (hf / "model.safetensors").exists():
    make_llama(hf, c["layers"], c["hidden"], c["ffn"], c["heads"], c["kv"], c["vocab"])
if not ts.exists():
    tmp = ts.with_name(ts.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    torch_ranks(hf, tmp, 4, c["per_src"])
    tmp.rename(ts)
'''

BASE_SHAPE = {"hidden": 2560, "ffn": 6912, "heads": 20, "kv": 4, "vocab": 32000}
QUICK_SHAPE = {"layers": 6, "hidden": 256, "ffn": 512, "heads": 4, "kv": 4, "vocab": 1024}
# trainer_bench's model: 1.12 GB of checkpoint (weights + 2 Adam moments, fp32); --quick: 19 MB
TRAINER_ARGS = "--hidden 1024 --layers 8 --seq 32 --micro-batch 1"
QUICK_TRAINER_ARGS = "--hidden 256 --layers 2 --seq 32 --micro-batch 1"
# trainer_bench's save, as rows: name, key of its JSON's "save" (medians of its 3 saves)
TRAINER_ROWS = (("trainer save (write)", "write_s"), ("trainer save (sync blocked)", "sync_blocked_s"),
                ("trainer save (async blocked)", "async_blocked_s"))


class Case:
    """A timed command: argv() builds it (after the last output is removed); derive(row, stdout), when given,
    turns the timed row into the rows recorded instead; space(), when given, the disk bytes its output needs
    (default: 1.1x the source store's)."""

    def __init__(self, name, part, argv, sources, ckpt=False, derive=None, space=None):
        self.name, self.part, self.argv, self.sources, self.ckpt = name, part, argv, sources, ckpt
        self.derive, self.space = derive, space


def shard_files(store: pathlib.Path):
    return sorted((pathlib.Path(store) / "shards").glob("*.h5"))


def dd_copy(store: pathlib.Path, out: pathlib.Path, bs_mib: int):
    """The read + write floor: every data file of store (shards/*.h5) copied by `dd iflag=direct oflag=direct
    conv=fsync`, two dd at a time (xargs -P 2) until all are done. dd reads a short last block with
    iflag=direct and writes it with O_DIRECT turned off (GNU dd), so every copy is the file's size."""
    out.mkdir(parents=True)
    dd = f"dd if=\"$1\" iflag=direct of=\"$0/${{1##*/}}\" oflag=direct conv=fsync bs={bs_mib}M status=none"
    script = f"out=$1; shift; printf '%s\\0' \"$@\" | xargs -0 -P 2 -n 1 sh -c '{dd}' \"$out\""
    return ["bash", "-c", script, "dd_copy", out, *shard_files(store)]


def dd_read(store: pathlib.Path, bs_mib: int):
    """The read floor: every data file of store (shards/*.h5) read by `dd iflag=direct of=/dev/null bs=32M`, two
    dd at a time (xargs -P 2). A job that reads the store cold and writes as many bytes cannot take less than
    this (nor than dd2), whatever it overlaps: dd2 s / dd read s is the most it can reach against dd2."""
    dd = f"dd if=\"$0\" iflag=direct of=/dev/null bs={bs_mib}M status=none"
    return ["bash", "-c", f"printf '%s\\0' \"$@\" | xargs -0 -P 2 -n 1 sh -c '{dd}'", "dd_read", *shard_files(store)]


def trainer_rows(row, text, T):
    """trainer_bench's run as TRAINER_ROWS: each the save's seconds (its JSON's medians), with the run's wall seconds
    (run_s), peak RSS and CPU s; the write row keeps the JSON. T["bytes"]: the checkpoint's bytes, for dd2 trainer."""
    rep = json.loads(text.strip().splitlines()[-1])
    sv = rep["save"]
    T["bytes"] = int(sv["bytes"])
    rows = [dict(row, cmd=name, s=sv[key], run_s=row["s"], bytes_written=T["bytes"]) for name, key in TRAINER_ROWS]
    rows[0]["report"] = rep
    return rows


def make_cases(a, P, out):
    """The commands, in order (reshard's --io entries in --io-modes order; main() rotates them)."""
    ck = a.ckpt
    mm = ["--max-memory", a.max_memory] if a.max_memory else []
    tgt = ["--tp", "2", "--pp", "3", "--pp-layers", ",".join(map(str, P["per_dst"])), "--dp", "1"]
    parts = set(a.parts.split(","))
    cases = []
    if "cp" in parts:
        cases.append(Case("cp src", "cp", lambda: ["cp", "-r", P["src"], out], [P["src"]]))
    if "dd" in parts:
        for w in (1, 2):
            cases.append(Case(f"dd{w}", "dd", lambda w=w: dd_floor(P["src_bytes"], out, streams=w, bs_mib=a.dd_mib), []))
        cases.append(Case("dd copy", "dd", lambda: dd_copy(P["src"], out, a.dd_mib), [P["src"]]))
        cases.append(Case("dd read", "dd", lambda: dd_read(P["src"], a.dd_mib), [P["src"]], space=lambda: 0))
    if "reshard" in parts:
        for io in a.io_modes.split(","):
            name, flag = ("reshard", []) if io == "default" else (f"reshard {io}", ["--io", io])
            cases.append(Case(name, "reshard", lambda flag=flag: [ck, "reshard", P["src"], out, *tgt, *flag, *mm, "--json"],
                              [P["src"]], ckpt=True))
    if "python" in parts:
        cfg = json.dumps({"tp": 4, "per": P["per_src"], "ntp": 2, "nper": P["per_dst"]})
        cases.append(Case("python stack", "python", lambda: [a.python, P["py_stack"], P["tsrc"], out, cfg], [P["tsrc"]]))
    if "convert" in parts:
        cases.append(Case("convert mcore", "convert", lambda: [ck, "convert", P["src"], out, "--profile", "megatron-mcore",
                                                               *tgt, *mm, "--json"], [P["src"]], ckpt=True))
    if "hf" in parts:
        cases += [Case("cp hf", "hf", lambda: ["cp", "-r", P["hf"], out], [P["hf"]]),
                  Case("from-hf", "hf", lambda: [ck, "from-hf", P["hf"], out, *mm, "--json"], [P["hf"]], ckpt=True),
                  Case("to-hf 1", "hf", lambda: [ck, "to-hf", P["one"], out, *mm, "--json"], [P["one"]], ckpt=True),
                  Case("to-hf 2x3x2", "hf", lambda: [ck, "to-hf", P["big"], out, *mm, "--json"], [P["big"]], ckpt=True)]
    if "trainer" in parts:
        T = {}

        def trainer_argv():
            out.mkdir(parents=True)  # trainer_bench makes its run dir, not the parent
            return [a.trainer_bench, *a.trainer_args.split(), "--save-only", "--out", out / "run"]
        # trainer_bench keeps its 6 checkpoints (3 synchronous saves, 3 asynchronous) until it ends; 1.2 GB each until known
        cases += [Case("trainer", "trainer", trainer_argv, [], derive=lambda row, text: trainer_rows(row, text, T),
                       space=lambda: 6.3 * T.get("bytes", 1.2e9)),
                  Case("dd2 trainer", "trainer", lambda: dd_floor(T["bytes"], out, streams=2, bs_mib=a.dd_mib), [])]
    return cases


def ordered(cases, rnd):
    """The cases of one round: the reshard --io entries rotated by the round number."""
    rs = [c for c in cases if c.part == "reshard"]
    if rs:
        k = rnd % len(rs)
        rs = rs[k:] + rs[:k]
    it = iter(rs)
    return [next(it) if c.part == "reshard" else c for c in cases]


def prepare(a, shape):
    """Sources for `shape`, made once and kept in --dir (untimed)."""
    per_src, per_dst = stages(shape["layers"], 2), stages(shape["layers"], 3)
    sd = pathlib.Path(a.dir) / "src_{layers}L_{hidden}h_{ffn}f_{vocab}v".format(**shape)
    sd.mkdir(parents=True, exist_ok=True)
    P = {"hf": sd / "hf", "tsrc": sd / "torch_tp4pp2", "per_src": per_src, "per_dst": per_dst, "py_stack": sd / "py_stack.py"}
    P["py_stack"].write_text(PY_STACK)
    if not (sd / "prepared").exists():
        subprocess.run([a.python, "-c", PREP, str(HERE), json.dumps({**shape, "hf": str(P["hf"]), "tsrc": str(P["tsrc"]),
                                                                      "per_src": per_src})], check=True)
    for key, flags in (("src", ["--tp", "4", "--pp", "2", "--dp", "1"]), ("one", ["--tp", "1", "--pp", "1", "--dp", "1"]),
                       ("big", ["--tp", "2", "--pp", "3", "--dp", "2"])):
        P[key] = sd / f"store_{key}"
        if not (P[key] / "manifest.json").exists():
            shutil.rmtree(P[key], ignore_errors=True)
            subprocess.run([a.ckpt, "from-hf", P["hf"], P[key], *flags, "--no-fsync"], check=True, stdout=subprocess.DEVNULL)
    (sd / "prepared").write_text("ok\n")
    P["src_bytes"], P["hf_bytes"] = dir_bytes(P["src"]), dir_bytes(P["hf"])
    P["src_shard_bytes"] = sum(p.stat().st_size for p in shard_files(P["src"]))
    return P
