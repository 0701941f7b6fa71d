"""The corruption matrix of issue 32 (test_corruption_matrix.py): every source kind ckpt reads x one
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
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY_TRAIN = ROOT / "fixtures" / "tiny_llama.json"
TIMEOUT = 60                     # seconds per command: a cell that takes longer is a failure ("timeout")
MEMORY_LIMIT = 4 << 30           # address-space limit of every child: a runaway allocation fails fast
HUGE = 1_000_000_000             # num_hidden_layers / num_layers of the config mutations

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


# ---------------------------------------------------------------------------------------------------
# Byte-level helpers

def flip(path, offset, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        assert len(b) == 1, (path, offset)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def set_byte(path, offset, value):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes([value]))


def lowered(v: int) -> int:
    """A smaller value for one byte of a size field (2048 -> 1280 on byte 1, as issue 32's case 2)."""
    return v * 5 // 8


def store_dir(ckdir: pathlib.Path) -> pathlib.Path:
    """The checkpoint a native path names (a run dir follows `latest`)."""
    if (ckdir / "latest").exists():
        return ckdir / (ckdir / "latest").read_text().strip()
    return ckdir


def target_piece(manifest):
    """The piece every command reads: layer 0's k_proj (first piece)."""
    for pc in manifest["pieces"]:
        if "layers.0." in pc["tensor"] and "k_proj" in pc["tensor"]:
            return pc
    raise AssertionError("no layer-0 k_proj piece in the manifest")


def h5_target(ckdir):
    import h5py
    d = store_dir(ckdir)
    man = json.loads((d / "manifest.json").read_text())
    pc = target_piece(man)
    path = d / pc["file"]
    with h5py.File(path, "r") as f:
        ds = f[pc["dataset"]]
        off = ds.id.get_offset()
        if off is not None:
            return path, pc, ("contiguous", off, ds.id.get_storage_size(), ds.ndim)
        info = ds.id.get_chunk_info(0)
        assert ds.id.get_num_chunks() == 1, "the mutation expects one chunk"
        return path, pc, ("chunked", info.byte_offset, info.size, ds.ndim)


def h5_data(ckdir):
    path, pc, (_, off, size, _) = h5_target(ckdir)
    flip(path, off + size // 2)
    return f"{pc['file']} {pc['dataset']} ({pc['tensor']}): data byte {size // 2} of {size} xor 0x01"


def h5_meta(ckdir):
    """Lowers the stored size of the target dataset by one byte of its HDF5 metadata: the size field of
    a contiguous layout message (version 3: 03 01 <address:8> <size:8>), or the chunk size in the key
    of a chunked dataset's v1 B-tree node (<size:4> <filter mask:4> <offsets:8 x (rank+1)> <address:8>)."""
    path, pc, (how, off, size, ndim) = h5_target(ckdir)
    data = path.read_bytes()
    if how == "contiguous":
        pat = struct.pack("<BBQQ", 3, 1, off, size)
        field_at = 2 + 8
        what = "contiguous layout message: storage size"
    else:
        pat = struct.pack("<II", size, 0) + b"\0" * 8 * (ndim + 1) + struct.pack("<Q", off)
        field_at = 0
        what = "chunk B-tree key: chunk size"
    at = data.find(pat)
    assert at >= 0 and data.find(pat, at + 1) < 0, f"{how} record of {pc['dataset']} not found once in {path}"
    b = 1 if (size >> 8) & 0xFF else 0
    old = data[at + field_at + b]
    set_byte(path, at + field_at + b, lowered(old))
    new = size - ((old - lowered(old)) << (8 * b))
    return f"{pc['file']} {pc['dataset']}: {what} {size} -> {new} (one byte)"


def rewrite_manifest(ckdir, edit):
    d = store_dir(ckdir)
    path = d / "manifest.json"
    raw = path.read_text()
    man = json.loads(raw)
    assert json.dumps(man, indent=1, sort_keys=True) == raw, "manifest not in the writer's format"
    what = edit(man)
    path.write_text(json.dumps(man, indent=1, sort_keys=True))
    return "manifest.json: " + what


def manifest_dtype(ckdir):
    def edit(man):
        pc = target_piece(man)
        name = pc["tensor"]
        old = pc["dtype"]
        new = {"BF16": "F16", "F16": "BF16", "F32": "I32"}[old]
        for t in man["tensors"]:
            if t["name"] == name:
                t["dtype"] = new
        for p in man["pieces"]:
            if p["tensor"] == name:
                p["dtype"] = new
        return f"{name} dtype {old} -> {new} (tensor and its pieces)"
    return rewrite_manifest(ckdir, edit)


def manifest_shape(ckdir):
    """Transposes the target tensor's shape (same element count) in the tensor and its pieces."""
    def edit(man):
        pc = target_piece(man)
        name = pc["tensor"]
        for t in man["tensors"]:
            if t["name"] == name:
                old = list(t["shape"])
                t["shape"] = old[::-1]
        for p in man["pieces"]:
            if p["tensor"] == name:
                p["region"]["extent"] = p["region"]["extent"][::-1]
                p["region"]["offset"] = p["region"]["offset"][::-1]
        return f"{name} shape {old} -> {old[::-1]} (tensor and piece regions)"
    return rewrite_manifest(ckdir, edit)


def manifest_codec(ckdir):
    def edit(man):
        pc = target_piece(man)
        old = pc["codec"]
        pc["codec"] = "none" if old != "none" else "zstd"
        pc.pop("codec_level", None)
        return f"piece {pc['dataset']} codec {old} -> {pc['codec']}"
    return rewrite_manifest(ckdir, edit)


def manifest_layers(ckdir):
    def edit(man):
        old = man["model_config"]["num_hidden_layers"]
        man["model_config"]["num_hidden_layers"] = HUGE
        return f"model_config.num_hidden_layers {old} -> {HUGE}"
    return rewrite_manifest(ckdir, edit)


def manifest_peak_lr(ckdir):
    def edit(man):
        old = man["trainer"]["lr_schedule"]["peak_lr"]
        man["trainer"]["lr_schedule"]["peak_lr"] = 1e308
        return f"trainer.lr_schedule.peak_lr {old} -> 1e308"
    return rewrite_manifest(ckdir, edit)


# safetensors ---------------------------------------------------------------------------------------

def st_files(p: pathlib.Path):
    if p.is_file():
        return [p]
    return sorted(p.rglob("*.safetensors"))


def st_header(path):
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    return n, json.loads(b[8:8 + n]), b[8:8 + n]


def st_target(p):
    """(file, tensor name, header) of a layer-0 tensor, the first by data offset (k_proj where present)."""
    for path in st_files(p):
        n, h, _ = st_header(path)
        names = [k for k in h if k != "__metadata__" and ".0." in k]
        if not names:
            continue
        names.sort(key=lambda k: ("k_proj" not in k, h[k]["data_offsets"][0]))
        return path, names[0], n, h
    raise AssertionError(f"no layer-0 tensor in {p}")


def st_data(p):
    path, name, n, h = st_target(p)
    a, b = h[name]["data_offsets"]
    flip(path, 8 + n + (a + b) // 2)
    return f"{path.name} {name}: data byte {(b - a) // 2} of {b - a} xor 0x01"


def _st_value_at(path, name, key):
    """File offset of the value of `key` in tensor `name`'s header entry."""
    n, h, raw = st_header(path)
    at = raw.find(json.dumps(name).encode())
    assert at >= 0
    k = raw.find(f'"{key}"'.encode(), at)
    assert k >= 0
    return 8 + k + len(key) + 2, raw, n


def st_meta(p):
    """One byte of the header JSON: the first digit of the target tensor's shape (JSON stays valid)."""
    path, name, _, _ = st_target(p)
    v, raw, _ = _st_value_at(path, name, "shape")
    i = v
    b = path.read_bytes()
    while not chr(b[i]).isdigit():
        i += 1
    old = chr(b[i])
    new = "1" if old != "1" else "2"
    set_byte(path, i, ord(new))
    return f"{path.name} header: {name} shape's first digit {old} -> {new}"


def st_dtype(p):
    """Relabels the target tensor's dtype in the header, same size (BF16 <-> F16, F32 -> I32)."""
    path, name, _, h = st_target(p)
    old = h[name]["dtype"]
    new = {"BF16": "F16", "F16": "BF16", "F32": "I32"}[old]
    v, raw, _ = _st_value_at(path, name, "dtype")
    b = bytearray(path.read_bytes())
    q = b.index(b'"', v) + 1
    assert bytes(b[q:q + len(old) + 1]) == old.encode() + b'"' and len(old) >= len(new)
    b[q:q + len(old) + 1] = new.encode() + b'"' + b" " * (len(old) - len(new))  # same header length
    path.write_bytes(bytes(b))
    return f"{path.name} header: {name} dtype {old} -> {new}"


def json_field(relpath, key, value):
    def mutate(p):
        path = p / relpath
        cfg = json.loads(path.read_text())
        old = cfg.get(key)
        cfg[key] = value
        path.write_text(json.dumps(cfg, indent=2))
        return f"{relpath}: {key} {old} -> {value}"
    return mutate


# zip (torch files, .distcp items) ---------------------------------------------------------------------

def zip_entries(path):
    """Local file headers of every zip in `path` (a .distcp file is many zips end to end):
    [(header offset, name, data offset, size)]."""
    b = path.read_bytes()
    out, i = [], 0
    while True:
        i = b.find(b"PK\x03\x04", i)
        if i < 0:
            return out
        _, _, _, _, _, _, csz, _, nl, el = struct.unpack("<HHHHHIIIHH", b[i + 4:i + 30])
        name = b[i + 30:i + 30 + nl].decode(errors="replace")
        out.append((i, name, i + 30 + nl + el, csz))
        i += 4


def torch_file(p):
    if p.name.endswith(".pt") or p.is_file():
        return p
    files = sorted(p.rglob("*.distcp")) or sorted(p.rglob("model_optim_rng.pt"))
    assert files, p
    return files[0]


def zip_target(p):
    path = torch_file(p)
    for hdr, name, data, size in zip_entries(path):
        if re.search(r"/data/\d+$", name) and size >= 1024:
            return path, hdr, name, data, size
    raise AssertionError(f"no tensor data entry in {path}")


def zip_data(p):
    path, _, name, data, size = zip_target(p)
    flip(path, data + size // 2)
    return f"{path.name} entry {name} @{data}: data byte {size // 2} of {size} xor 0x01"


def zip_dir_crc(p):
    """One byte of the central directory: the CRC-32 field of the target entry's record."""
    path, hdr, name, data, size = zip_target(p)
    b = path.read_bytes()
    at = b.find(b"PK\x01\x02" , data + size)
    while at >= 0:
        nl = struct.unpack("<H", b[at + 28:at + 30])[0]
        if b[at + 46:at + 46 + nl].decode(errors="replace") == name:
            break
        at = b.find(b"PK\x01\x02", at + 4)
    assert at >= 0, f"central directory record of {name} not found"
    flip(path, at + 16)
    return f"{path.name} central directory record of {name}: CRC-32 field byte 0 xor 0x01"


def zip_pickle(p):
    """One byte in the middle of the file's first data.pkl entry (the pickle naming the tensors)."""
    path = torch_file(p)
    for _, name, data, size in zip_entries(path):
        if name.endswith("/data.pkl") and size > 64:
            flip(path, data + size // 2)
            return f"{path.name} entry {name}: pickle byte {size // 2} of {size} xor 0x01"
    raise AssertionError(f"no data.pkl in {path}")


def dcp_metadata(p):
    path = p / ".metadata"
    n = path.stat().st_size
    flip(path, n // 2)
    return f".metadata (pickle): byte {n // 2} of {n} xor 0x01"


def latest_iteration(p):
    (p / "latest_checkpointed_iteration.txt").write_text("7")
    return "latest_checkpointed_iteration.txt: 0 -> 7"


# ---------------------------------------------------------------------------------------------------
@dataclass
class Mutation:
    id: str              # data | meta[.x] | manifest.x
    fn: object
    uncheckable: str = None   # the token verify's note names when the mutated part has no checksum

    @property
    def cls(self):
        return self.id.split(".")[0]


NATIVE_MUTATIONS = [Mutation("data", h5_data), Mutation("meta", h5_meta), Mutation("manifest.dtype", manifest_dtype),
                    Mutation("manifest.shape", manifest_shape), Mutation("manifest.layers", manifest_layers)]
ST_CANNOT = "safetensors has no checksums"
OLD_CANNOT = "has no manifest checksum"  # v1/v2 manifests: a relabelled dtype, shape, region or codec
OLD_MUTATIONS = [Mutation("data", h5_data), Mutation("meta", h5_meta), Mutation("manifest.dtype", manifest_dtype, OLD_CANNOT),
                 Mutation("manifest.shape", manifest_shape, OLD_CANNOT), Mutation("manifest.layers", manifest_layers)]
MUTATIONS = {
    "native": NATIVE_MUTATIONS,
    "native-tp2": NATIVE_MUTATIONS,
    "native-zstd": NATIVE_MUTATIONS + [Mutation("manifest.codec", manifest_codec)],
    "native-v2": OLD_MUTATIONS,
    "native-v1": OLD_MUTATIONS,
    "profile-paddlenlp": NATIVE_MUTATIONS,
    "trainer-run": [Mutation("data", h5_data), Mutation("meta", h5_meta), Mutation("manifest.dtype", manifest_dtype),
                    Mutation("manifest.peak_lr", manifest_peak_lr)],
    "hf-dir": [Mutation("data", st_data, ST_CANNOT), Mutation("meta", st_meta),
               Mutation("manifest.dtype", st_dtype, ST_CANNOT),
               Mutation("manifest.config", json_field("config.json", "num_hidden_layers", HUGE))],
    "safetensors-file": [Mutation("data", st_data, ST_CANNOT), Mutation("meta", st_meta),
                         Mutation("manifest.dtype", st_dtype, ST_CANNOT)],
    "megatron-safetensors": [Mutation("data", st_data, "safetensors"), Mutation("meta", st_meta),
                             Mutation("manifest.dtype", st_dtype, "safetensors"),
                             Mutation("manifest.args", json_field("megatron_args.json", "num_layers", HUGE))],
    "dcp": [Mutation("data", zip_data), Mutation("meta.zip", zip_dir_crc), Mutation("meta.pickle", dcp_metadata, ".metadata"),
            Mutation("manifest.config", json_field("config.json", "num_hidden_layers", HUGE))],
    "megatron-torch": [Mutation("data", zip_data), Mutation("meta.zip", zip_dir_crc), Mutation("meta.pickle", zip_pickle),
                       Mutation("manifest.latest", latest_iteration, "latest_checkpointed_iteration.txt")],
    "mcore-torch-dist": [Mutation("data", zip_data), Mutation("meta.zip", zip_dir_crc),
                         Mutation("meta.pickle", dcp_metadata, ".metadata"),
                         Mutation("manifest.metadata_json", json_field("metadata.json", "sharded_backend_version", 7),
                                  "metadata.json")],
}


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
