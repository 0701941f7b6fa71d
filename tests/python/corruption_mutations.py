"""The mutations of the corruption matrix (corruption_matrix.py): for each source kind, one data
byte, one metadata byte and one manifest / config field changed in a copy of the clean checkpoint,
located with the independent readers (h5py offsets, zipfile records, the safetensors header).
Each mutation returns a line saying what it changed."""
import json
import pathlib
import re
import struct
from dataclasses import dataclass

HUGE = 1_000_000_000             # num_hidden_layers / num_layers of the config mutations


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
    """A smaller value for one byte of a size field (2048 -> 1280 on byte 1: a shorter size that still parses)."""
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
