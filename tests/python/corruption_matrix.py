"""The corruption matrix (test_corruption_matrix.py, docs/INTEGRITY.md): every source kind ckpt reads x one
mutation (one data byte, one metadata byte, one manifest/config field) x every command that reads it.

A cell's outcome (classify):
  caught        the command failed (non-zero exit, or a ckpt.Error in Python) naming an error code
                (`[Code]` in the CLI's message, the exception class in Python), and left no output
                (neither DST nor DST.partial exists)
  cannot check  the command succeeded, the mutation is in a part of the format that has no checksum,
                and `ckpt verify --json` of the clean checkpoint says so by name in its "note"
                (e.g. "safetensors has no checksums")
  differs       `ckpt diff` against the clean copy reports a difference (exit 1) for a mutation of the
                kind above (a verdict, no error: the format cannot say which side is corrupt)
  not read      `ckpt inspect` succeeded on a data-byte mutation (inspect reads no tensor data), or
                on a compressed dataset's chunk index (inspect reads no chunk)
  n/a           the command does not take this kind (its clean run is refused by name, e.g. a bare
                .safetensors file has no model config to reshard by); not a cell of the test
Anything else fails the test: SILENT (succeeded on a checkable mutation), differs (no named error)
(diff gave a verdict where the format's checks should have named the corrupt side), left output,
unnamed error, crash, timeout.

Run as a script (`python corruption_matrix.py OUT.md`, with CKPT_BIN / PYTHONPATH as for the tests)
it runs every cell and writes the table; the test does the same under CKPT_LONG=1 with
CKPT_MATRIX_TABLE=PATH (docs/INTEGRITY.md: the table between its matrix markers is replaced).
"""
import json
import os
import pathlib
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY_TRAIN = ROOT / "fixtures" / "tiny_llama.json"
TIMEOUT = 60                     # seconds per command: a cell that takes longer is a failure ("timeout")
MEMORY_LIMIT = 4 << 30           # address-space limit of every child: a runaway allocation fails fast

# ---------------------------------------------------------------------------------------------------
# Source kinds: name -> path of the checkpoint under the fixture root (what a user passes to ckpt)
KINDS = {
    "native": "native",                          # ckpt from-hf
    "native-tp2": "native_tp2",                  # ckpt reshard --tp 2
    "native-zstd": "native_zstd",                # ckpt from-hf --compress zstd
    "native-v2": "native_v2",                    # fixtures/v2_store: a genuine v2 store (no manifest checksum)
    "native-v1": "native_v1",                    # fixtures/v1_store: a v1 trainer checkpoint (sha256 digests)
    "profile-paddlenlp": "profile_pd",           # ckpt convert --profile paddlenlp (a CanonicalView)
    "hf-dir": "hf",                              # transformers save_pretrained
    "safetensors-file": "st/model.safetensors",  # a bare .safetensors file (no config)
    "dcp": "dcp",                                # ckpt export-dcp (+ config.json inside)
    "megatron-torch": "megatron_torch",          # ckpt export-megatron --format torch
    "mcore-torch-dist": "mcore_dist",            # ckpt export-megatron --format torch_dist
    "megatron-safetensors": "megatron_st",       # ckpt export-megatron (per-rank safetensors)
    "trainer-run": "run",                        # ckpt train (run dir, follows `latest`)
}

COMMANDS = ["verify", "inspect", "diff", "reshard", "convert", "to-hf", "export-megatron", "export-dcp",
            "train-resume", "py-read", "py-verify"]
WRITERS = {"reshard", "convert", "to-hf", "export-megatron", "export-dcp", "train-resume"}

# (kind, command) pairs the command does not take (checked: the clean run is refused by name).
NOT_APPLICABLE = {("safetensors-file", c) for c in ("reshard", "convert", "export-megatron")}
NOT_APPLICABLE |= {(k, "train-resume") for k in KINDS if k != "trainer-run"}


def train_args(src, out):
    return ["train", "--config", TINY_TRAIN, "--steps", 3, "--out", out, "--resume", src, "--micro-batch", 2,
            "--seq-len", 16, "--threads", 1, "--sync-save", "--seed", 5]


def command_args(cmd, src, clean, dst):
    return {
        "verify": ["verify", src],
        "inspect": ["inspect", src],
        "diff": ["diff", src, clean],
        "reshard": ["reshard", src, dst, "--tp", 2, "--pp", 1, "--dp", 1],
        "convert": ["convert", src, dst, "--profile", "megatron-mcore", "--tp", 1, "--pp", 1, "--dp", 1],
        "to-hf": ["to-hf", src, dst, "--no-fsync"],
        "export-megatron": ["export-megatron", src, dst, "--tp", 1, "--pp", 1],
        "export-dcp": ["export-dcp", src, dst, "--no-fsync"],
        "train-resume": train_args(src, dst),
    }[cmd]


from corruption_mutations import MUTATIONS, OLD_CANNOT, ST_CANNOT  # noqa: E402, F401  (the notes: for the test)


def all_cells():
    """[(kind, mutation id, command)] of every applicable cell, in table order."""
    return [(k, m.id, c) for k in KINDS for m in MUTATIONS[k] for c in COMMANDS if (k, c) not in NOT_APPLICABLE]


def sample_cells(per_pair=3):
    """The default suite's bounded sample: every kind x every mutation x `per_pair` commands, rotating
    over the applicable commands so that consecutive (kind, mutation) pairs take different ones."""
    out, i = [], 0
    for k in KINDS:
        cmds = [c for c in COMMANDS if (k, c) not in NOT_APPLICABLE]
        for m in MUTATIONS[k]:
            picked = [cmds[(i * per_pair + j) % len(cmds)] for j in range(per_pair)]
            out += [(k, m.id, c) for c in cmds if c in picked]
            i += 1
    return out


# ---------------------------------------------------------------------------------------------------
def _limits():
    if os.environ.get("CKPT_SANITIZE", "").upper() in ("ON", "1", "TRUE", "YES"):
        return  # AddressSanitizer reserves terabytes of address space
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


PY_CELL = r"""
import json, sys
import ckpt
p = sys.argv[1]
out = {}
def err(e):
    return {"ok": False, "exc": type(e).__name__, "named": isinstance(e, ckpt.Error) and type(e) is not ckpt.Error,
            "msg": str(e)[:600]}
try:
    with ckpt.open(p) as ck:
        for name in ck.tensors:
            ck.read(name)
    out["py-read"] = {"ok": True}
except Exception as e:
    out["py-read"] = err(e)
try:
    rep = ckpt.verify(p)
    out["py-verify"] = {"ok": bool(rep["ok"]), "note": rep.get("note"),
                        "codes": [f.get("code") for f in rep.get("failures", [])][:4],
                        "msg": "; ".join(str(f.get("message")) for f in rep.get("failures", [])[:2])[:600]}
except Exception as e:
    out["py-verify"] = err(e)
print(json.dumps(out))
"""


@dataclass
class Result:
    rc: int
    out: str
    code: str = None      # the named error ([Code] / exception class / verify failure code)
    argv: list = field(default_factory=list)
    left: list = field(default_factory=list)   # output paths left behind
    seconds: float = 0.0
    note: str = None      # py-verify's note
    stdout: str = ""


CODE_RE = re.compile(r"\[([A-Z][A-Za-z0-9]+)\]")


class Matrix:
    """The fixture kinds under `root` (built once), their mutated copies (made on first use) and the
    cells' results (memoized)."""

    def __init__(self, root: pathlib.Path, ckpt_bin: str):
        self.root, self.bin = pathlib.Path(root), ckpt_bin
        self.clean = self.root / "clean"
        self.notes = {}
        self.results = {}          # (kind, mut id, cmd) -> (outcome, Result, description)
        self._mutated = {}
        self._py = {}
        self._clean_runs = {}
        self._n = 0

    # -- fixtures -------------------------------------------------------------------------------------
    def run(self, *args, check=True, timeout=TIMEOUT, env=None):
        argv = [str(a) for a in args]
        t = time.monotonic()
        try:
            for attempt in range(20):  # ETXTBSY: the binary is being relinked (a shared build tree)
                try:
                    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, preexec_fn=_limits,
                                       env=env)
                    break
                except OSError as e:
                    if e.errno != 26 or attempt == 19:
                        raise
                    time.sleep(1)
            rc, out, stdout = p.returncode, p.stdout + p.stderr, p.stdout
        except subprocess.TimeoutExpired as e:
            rc, out, stdout = "timeout", f"timed out after {timeout} s: {(e.stderr or b'')[-400:]!r}", ""
        if check and rc != 0:
            raise AssertionError(f"{' '.join(argv)} exited {rc}\n{out}")
        return Result(rc, out, argv=argv, seconds=time.monotonic() - t, stdout=stdout)

    def ckpt(self, *args, **kw):
        return self.run(self.bin, *args, **kw)

    def build(self):
        c = self.clean
        c.mkdir(parents=True, exist_ok=True)
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        torch.manual_seed(0)
        cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                          rms_norm_eps=1e-5, tie_word_embeddings=False)
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():
            for prm in model.parameters():
                prm.normal_(0, 0.05)
        model.to(torch.bfloat16).save_pretrained(c / "hf", safe_serialization=True)
        (c / "st").mkdir()
        shutil.copy(c / "hf" / "model.safetensors", c / "st" / "model.safetensors")
        self.ckpt("from-hf", c / "hf", c / "native", "--no-fsync")
        self.ckpt("reshard", c / "native", c / "native_tp2", "--tp", 2, "--pp", 1, "--dp", 1)
        self.ckpt("from-hf", c / "hf", c / "native_zstd", "--compress", "zstd", "--no-fsync")
        self.ckpt("convert", c / "native", c / "profile_pd", "--profile", "paddlenlp")
        shutil.copytree(ROOT / "fixtures" / "v2_store" / "step-00000001", c / "native_v2")
        shutil.copytree(ROOT / "fixtures" / "v1_store" / "step-00000001", c / "native_v1")
        self.ckpt("export-dcp", c / "native", c / "dcp", "--no-fsync")
        shutil.copy(c / "hf" / "config.json", c / "dcp" / "config.json")  # a DCP "with a model config"
        self.ckpt("export-megatron", c / "native", c / "megatron_torch", "--format", "torch", "--tp", 1, "--pp", 1)
        self.ckpt("export-megatron", c / "native", c / "mcore_dist", "--format", "torch_dist", "--tp", 1, "--pp", 1)
        self.ckpt("export-megatron", c / "native", c / "megatron_st", "--tp", 1, "--pp", 1)
        self.ckpt("train", "--config", TINY_TRAIN, "--steps", 2, "--out", c / "run", "--micro-batch", 2,
                  "--seq-len", 16, "--threads", 1, "--sync-save", "--seed", 5)
        for kind, rel in KINDS.items():
            j = json.loads(self.ckpt("verify", c / rel, "--json").stdout)
            assert j["ok"], (kind, j)
            self.notes[kind] = {"checksums": j.get("checksums"), "scheme": j.get("scheme"), "note": j.get("note") or "",
                                "format": j.get("format")}
        return self

    def clean_path(self, kind):
        return self.clean / KINDS[kind]

    def mutated(self, kind, mid):
        """The path of a copy of `kind` with mutation `mid` applied (made once), and what was changed."""
        key = (kind, mid)
        if key not in self._mutated:
            rel = KINDS[kind]
            top = rel.split("/")[0]
            base = self.root / "mut" / kind / mid.replace(".", "_")
            base.mkdir(parents=True)
            src = self.clean / top
            (shutil.copytree(src, base / top) if src.is_dir() else shutil.copy(src, base / top))
            m = next(m for m in MUTATIONS[kind] if m.id == mid)
            what = m.fn(base / rel)
            self._mutated[key] = (base / rel, what)
        return self._mutated[key]

    # -- cells ----------------------------------------------------------------------------------------
    def _dst(self, tag):
        self._n += 1
        d = self.root / "out" / f"{self._n:05d}-{tag}"
        d.parent.mkdir(parents=True, exist_ok=True)
        return d

    def execute(self, kind, cmd, src):
        """Runs one command on `src`; a Result with the named code and any output left behind."""
        if cmd.startswith("py-"):
            key = str(src)
            if key not in self._py:
                env = dict(os.environ)
                r = self.run(sys.executable, "-c", PY_CELL, src, check=False, env=env)
                try:
                    self._py[key] = (r, json.loads(r.stdout.strip().splitlines()[-1]))
                except (ValueError, IndexError):
                    self._py[key] = (r, None)
            r, j = self._py[key]
            if j is None:  # the interpreter died (a crash in the extension) or timed out
                return Result(r.rc if r.rc != 0 else "no output", r.out[-800:], argv=r.argv)
            c = j[cmd]
            res = Result(0 if c["ok"] else 1, c.get("msg", ""), argv=[*r.argv[:2], "<" + cmd + ">", str(src)])
            if not c["ok"]:
                res.code = (c.get("codes") or [None])[0] if cmd == "py-verify" and "exc" not in c else (
                    c["exc"] if c.get("named") else None)
            res.note = c.get("note")
            return res
        dst = self._dst(cmd) if cmd in WRITERS else None
        r = self.ckpt(*command_args(cmd, src, self.clean_path(kind), dst), check=False)
        m = [x for line in r.out.splitlines() if line.startswith("ckpt") for x in CODE_RE.findall(line)]
        r.code = m[0] if m else None
        if dst is not None:
            partial = dst.with_name(dst.name + ".partial")
            r.left = [str(p) for p in (dst, partial) if p.exists()]
            if cmd == "train-resume" and dst.exists():  # a run dir: a checkpoint saved in it is output
                r.left = [str(p) for p in dst.glob("step-*")] + ([str(dst / "latest")] if (dst / "latest").exists() else [])
            shutil.rmtree(dst, ignore_errors=True)
            shutil.rmtree(partial, ignore_errors=True)
        return r

    def clean_run(self, kind, cmd):
        key = (kind, cmd)
        if key not in self._clean_runs:
            self._clean_runs[key] = self.execute(kind, cmd, self.clean_path(kind))
        return self._clean_runs[key]

    def cell(self, kind, mid, cmd):
        """(outcome, Result, what was mutated); outcome as the module docstring says."""
        key = (kind, mid, cmd)
        if key in self.results:
            return self.results[key]
        clean = self.clean_run(kind, cmd)
        if clean.rc != 0:
            out = ("clean run failed", clean, "")
            self.results[key] = out
            return out
        src, what = self.mutated(kind, mid)
        r = self.execute(kind, cmd, src)
        mut = next(m for m in MUTATIONS[kind] if m.id == mid)
        out = (classify(kind, mut, cmd, r, self.notes[kind]["note"], what), r, what)
        self.results[key] = out
        return out


OK_OUTCOMES = {"caught", "cannot check", "differs", "not read"}


def classify(kind, mut, cmd, r: Result, note: str, what: str = "") -> str:
    uncheckable = bool(mut.uncheckable) and mut.uncheckable in (note or "")
    if r.rc == "timeout":
        return "timeout"
    if not isinstance(r.rc, int) or r.rc < 0 or r.rc in (70, 86):
        return f"crash ({r.rc})"
    if r.rc != 0:
        if r.code:
            return "left output" if r.left else "caught"
        if cmd == "diff" and r.rc == 1:
            return "differs" if uncheckable else "differs (no named error)"
        return f"unnamed error (exit {r.rc})"
    if cmd == "inspect" and mut.cls == "data":
        return "not read"
    # A compressed dataset's chunk index: inspect reads no chunk (it shows the stored size HDF5
    # sums from the index); the sizes are checked when the chunks are read (ChunkCorrupt).
    if cmd == "inspect" and "chunk B-tree key" in (what or ""):
        return "not read"
    if uncheckable:
        if cmd == "diff" and mut.cls == "data":
            return "SILENT"  # the bytes differ: a diff that says equal is wrong whatever the format checks
        return "cannot check"
    return "SILENT"


# ---------------------------------------------------------------------------------------------------
SHORT = {"caught": "caught", "cannot check": "cannot check", "differs": "differs", "not read": "not read"}
BEGIN, END = "<!-- corruption-matrix:begin -->", "<!-- corruption-matrix:end -->"


def table(matrix: Matrix) -> str:
    """Markdown: one row per (kind, mutation), one column per command, and the error codes seen."""
    lines = [f"| source kind | mutation | {' | '.join(COMMANDS)} | codes (CLI) |",
             "|" + "---|" * (len(COMMANDS) + 3)]
    counts = {}
    for k in KINDS:
        for m in MUTATIONS[k]:
            row, codes = [], []
            for c in COMMANDS:
                if (k, c) in NOT_APPLICABLE:
                    row.append("n/a")
                    continue
                got = matrix.results.get((k, m.id, c))
                if got is None:
                    row.append("")
                    continue
                o, r, _ = got
                counts[o] = counts.get(o, 0) + 1
                row.append(SHORT.get(o, f"**{o}**"))
                if o in ("caught", "left output") and r.code and r.code not in codes and not c.startswith("py-"):
                    codes.append(r.code)
            lines.append(f"| {k} | {m.id} | {' | '.join(row)} | {', '.join(codes)} |")
    lines.append("")
    lines.append("Totals: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) + ".")
    lines.append("")
    lines.append("Mutations (what each row changed):")
    lines.append("")
    seen = set()
    for (k, mid), (_, what) in sorted(matrix._mutated.items(), key=lambda kv: (list(KINDS).index(kv[0][0]), kv[0][1])):
        if (k, mid) not in seen:
            seen.add((k, mid))
            lines.append(f"- {k} / {mid}: {what}")
    return "\n".join(lines) + "\n"


def failures(matrix: Matrix):
    out = []
    for (k, mid, c), (o, r, what) in matrix.results.items():
        if o not in OK_OUTCOMES:
            out.append(f"{k} / {mid} / {c}: {o}: {' '.join(r.argv)}  [{what}]  -> exit {r.rc}: "
                       f"{(r.out or '').strip().splitlines()[-1:] if r.out else ''}")
    return out


def write_table(matrix: Matrix, path):
    path = pathlib.Path(path)
    t = table(matrix)
    if path.exists() and BEGIN in path.read_text():
        text = path.read_text()
        a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
        path.write_text(text[:a] + "\n" + t + text[b:])
    else:
        path.write_text(t)


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        mx = Matrix(pathlib.Path(d), os.environ.get("CKPT_BIN", str(ROOT / "build" / "ckpt"))).build()
        for cell in all_cells():
            mx.cell(*cell)
        write_table(mx, sys.argv[1] if len(sys.argv) > 1 else "/dev/stdout")
        print("\n".join(failures(mx)), file=sys.stderr)
