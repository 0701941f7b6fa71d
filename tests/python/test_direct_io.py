"""--io direct|buffered|auto (formats/io/output_file.h) gives the same output bytes, checked by
independent readers:
- from-hf (into tp=2) and reshard (tp=2 -> tp=1) with each mode: every file of the outputs is
  byte-identical across modes (cmp), and h5py (scripts/native_h5py) reads the HF tensors bit for
  bit from each;
- to-hf from the tp=2 checkpoint (row-parallel o_proj / down_proj gathered from the column blocks
  of both ranks as file runs) with each mode: model.safetensors equals byte for byte what the
  safetensors library writes for the same state dict (save_file), and loads with it;
- where the file system refuses O_DIRECT -- at open (EINVAL, for reading and writing) or at the
  first direct write or read (EINVAL), as tmpfs on old kernels, overlayfs and FUSE do -- `--io
  direct` falls back to buffered writes and mapped reads, and the output bytes are the same. The
  refusal is made by an LD_PRELOAD shim (compiled here with cc) that fails open(O_DIRECT), pwrite
  or pread on an O_DIRECT descriptor and logs each refusal;
- the shim also only logs preads on O_DIRECT descriptors: `--io direct` reads the source ranges
  it copies (native store datasets, safetensors data) with O_DIRECT, `--io buffered` and `--io auto`
  never do, even for a source not in the page cache (dropped with posix_fadvise DONTNEED).
"""
import os
import pathlib
import shutil
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file
from native_h5py import read_native  # scripts/: h5py only, no ckpt code
import page_cache
from transformers import LlamaConfig, LlamaForCausalLM

MODES = ("buffered", "direct", "auto")

SHIM_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static void note(const char* what) {
  const char* log = getenv("DIO_SHIM_LOG");
  if (!log) return;
  FILE* f = fopen(log, "a");
  if (f) { fprintf(f, "%s\n", what); fclose(f); }
}
static int refuse(const char* mode) { const char* m = getenv("DIO_SHIM_REFUSE"); return m && strcmp(m, mode) == 0; }

#define OPEN_LIKE(name)                                                        \
  int name(const char* p, int flags, ...) {                                    \
    static int (*real)(const char*, int, ...);                                 \
    if (!real) real = dlsym(RTLD_NEXT, #name);                                 \
    mode_t mode = 0;                                                           \
    if (flags & (O_CREAT | O_TMPFILE)) { va_list a; va_start(a, flags); mode = va_arg(a, mode_t); va_end(a); } \
    if ((flags & O_DIRECT) && refuse("open")) { note("open"); errno = EINVAL; return -1; } \
    return real(p, flags, mode);                                               \
  }
OPEN_LIKE(open)
OPEN_LIKE(open64)

#define PWRITE_LIKE(name)                                                      \
  ssize_t name(int fd, const void* b, size_t n, off_t o) {                     \
    static ssize_t (*real)(int, const void*, size_t, off_t);                   \
    if (!real) real = dlsym(RTLD_NEXT, #name);                                 \
    if (refuse("write") && (fcntl(fd, F_GETFL) & O_DIRECT)) { note("write"); errno = EINVAL; return -1; } \
    if (refuse("log-writes") && (fcntl(fd, F_GETFL) & O_DIRECT)) note("direct-write");                    \
    return real(fd, b, n, o);                                                  \
  }
PWRITE_LIKE(pwrite)
PWRITE_LIKE(pwrite64)

/* Reads on an O_DIRECT descriptor: refused ("read") or only logged ("log-reads"). */
#define PREAD_LIKE(name)                                                       \
  ssize_t name(int fd, void* b, size_t n, off_t o) {                           \
    static ssize_t (*real)(int, void*, size_t, off_t);                         \
    if (!real) real = dlsym(RTLD_NEXT, #name);                                 \
    if ((refuse("read") || refuse("log-reads")) && (fcntl(fd, F_GETFL) & O_DIRECT)) { \
      note(refuse("read") ? "read" : "direct-read");                           \
      if (refuse("read")) { errno = EINVAL; return -1; }                       \
    }                                                                          \
    return real(fd, b, n, o);                                                  \
  }
PREAD_LIKE(pread)
PREAD_LIKE(pread64)
"""


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A bf16 LLaMA with 2 KiB rows in o_proj and 4 KiB rows in down_proj (tp=2 runs of 1 and 2 KiB)."""
    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=301, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=4, head_dim=128, max_position_embeddings=64, rms_norm_eps=1e-5,
                      tie_word_embeddings=False)
    m = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.05)
    d = tmp_path_factory.mktemp("dio") / "hf"
    m.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    return d


def _files(d: pathlib.Path):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _assert_same_files(a: pathlib.Path, b: pathlib.Path):
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between {a.name} and {b.name}"


def _assert_native_holds(native: pathlib.Path, hf_state):
    _, got, _ = read_native(str(native))  # name -> numpy (bf16 as uint16 bits); digests checked
    for name, t in hf_state.items():
        if name.endswith("inv_freq"):
            continue
        assert (got[name] == t.view(torch.uint16).numpy()).all(), name


@pytest.fixture(scope="module")
def imported(hf_dir, ckpt_bin):
    """from-hf --tp 2 with each --io mode, and reshard to tp=1 with each mode."""
    out = {}
    for mode in MODES:
        d = hf_dir.parent / f"tp2_{mode}"
        subprocess.run([ckpt_bin, "from-hf", hf_dir, d, "--tp", "2", "--pp", "1", "--dp", "1", "--io", mode, "--no-fsync"],
                       check=True, capture_output=True)
        out[mode] = d
    return out


def test_from_hf_and_reshard_bytes_equal_in_every_mode(hf_dir, imported, run_ckpt):
    hf_state = load_file(hf_dir / "model.safetensors")
    for mode in MODES:
        _assert_same_files(imported["buffered"], imported[mode])
    _assert_native_holds(imported["direct"], hf_state)
    tp1 = {}
    for mode in MODES:
        tp1[mode] = hf_dir.parent / f"tp1_{mode}"
        run_ckpt("reshard", imported["buffered"], tp1[mode], "--tp", "1", "--pp", "1", "--dp", "1", "--io", mode)
    for mode in MODES:
        _assert_same_files(tp1["buffered"], tp1[mode])
    _assert_native_holds(tp1["direct"], hf_state)


def test_to_hf_from_tp2_equals_safetensors_save_file(hf_dir, imported, run_ckpt, tmp_path):
    state = load_file(hf_dir / "model.safetensors")
    ref = tmp_path / "ref.safetensors"
    save_file({k: v for k, v in state.items() if not k.endswith("inv_freq")}, ref, metadata={"format": "pt"})
    for mode in MODES:
        out = tmp_path / f"hf_{mode}"
        run_ckpt("to-hf", imported["buffered"], out, "--io", mode, "--threads", "2", "--max-memory", "8M")
        assert (out / "model.safetensors").read_bytes() == ref.read_bytes(), mode
        back = load_file(out / "model.safetensors")
        assert all(torch.equal(back[k], state[k]) for k in back)


def test_to_hf_max_memory_cuts_rows_bytes_still_equal(imported, run_ckpt, tmp_path):
    """Chunks that cut o_proj / down_proj rows (tiny --max-memory): the same bytes in each mode."""
    outs = []
    for mode in ("buffered", "direct"):
        outs.append(tmp_path / f"small_{mode}")
        run_ckpt("to-hf", imported["direct"], outs[-1], "--io", mode, "--threads", "1", "--max-memory", "1M", "--no-fsync")
    _assert_same_files(*outs)


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the O_DIRECT-refusing shim")
    d = tmp_path_factory.mktemp("shim")
    (d / "shim.c").write_text(SHIM_C)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", d / "shim.so", d / "shim.c", "-ldl"], check=True)
    return d / "shim.so"


@pytest.mark.parametrize("refuse", ["open", "write", "read"])
def test_direct_falls_back_where_o_direct_is_refused(refuse, shim, hf_dir, imported, run_ckpt, tmp_path):
    log = tmp_path / "refusals.log"
    env = dict(os.environ, LD_PRELOAD=str(shim), DIO_SHIM_REFUSE=refuse, DIO_SHIM_LOG=str(log),
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")
    run_ckpt("from-hf", hf_dir, tmp_path / "tp2", "--tp", "2", "--pp", "1", "--dp", "1", "--io", "direct", "--no-fsync", env=env)
    _assert_same_files(imported["buffered"], tmp_path / "tp2")
    run_ckpt("to-hf", imported["buffered"], tmp_path / "hf", "--io", "direct", env=env)
    ref = tmp_path / "hf_ref"
    run_ckpt("to-hf", imported["buffered"], ref, "--io", "buffered")
    _assert_same_files(ref, tmp_path / "hf")
    refusals = log.read_text().split()
    assert refusals and set(refusals) == {refuse}, refusals  # the shim did refuse, and only that


def test_sources_are_read_direct_as_io_says(shim, hf_dir, imported, run_ckpt, tmp_path):
    """Direct reads happen (logged by the shim, not refused) in direct mode, and in auto mode where the
    source is out of the page cache (mapped reads of a cold source are slower in an idle VM), never in
    buffered mode nor in auto mode from a warm source; the outputs are the same bytes."""
    def direct_reads(tag, mode, *cmd):
        log = tmp_path / f"{tag}.log"
        env = dict(os.environ, LD_PRELOAD=str(shim), DIO_SHIM_REFUSE="log-reads", DIO_SHIM_LOG=str(log),
                   ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")
        run_ckpt(*cmd, "--io", mode, env=env)
        return log.read_text().split().count("direct-read") if log.exists() else 0

    outs = {}
    for mode in ("buffered", "direct", "auto", "auto-warm"):
        page_cache.evict(imported["buffered"])
        if mode == "auto-warm":
            page_cache.read_through(imported["buffered"])
        outs[mode] = tmp_path / f"tp1_{mode}"
        n = direct_reads(f"rs_{mode}", mode.split("-")[0], "reshard", imported["buffered"], outs[mode], "--tp", "1", "--pp", "1",
                         "--dp", "1")
        assert (n > 0) if mode in ("direct", "auto") else (n == 0), (mode, n)
    for mode in ("direct", "auto", "auto-warm"):
        _assert_same_files(outs["buffered"], outs[mode])
    for mode in ("auto", "auto-warm"):
        page_cache.evict(hf_dir)
        if mode == "auto-warm":
            page_cache.read_through(hf_dir)
        n = direct_reads(f"imp_{mode}", "auto", "from-hf", hf_dir, tmp_path / f"imp_{mode}", "--tp", "2", "--pp", "1", "--dp", "1")
        assert (n > 0) == (mode == "auto"), (mode, n)
        _assert_same_files(imported["buffered"], tmp_path / f"imp_{mode}")
    page_cache.evict(hf_dir)
    assert direct_reads("imp", "direct", "from-hf", hf_dir, tmp_path / "imp", "--tp", "2", "--pp", "1", "--dp", "1") > 0
    _assert_same_files(imported["buffered"], tmp_path / "imp")
    assert direct_reads("exp", "direct", "to-hf", imported["buffered"], tmp_path / "hf") > 0
    ref = tmp_path / "hf_ref"
    run_ckpt("to-hf", imported["buffered"], ref, "--io", "buffered")
    _assert_same_files(ref, tmp_path / "hf")
    for mode in ("auto", "auto-warm"):  # to-hf too: a cold source read direct, a warm one mapped
        page_cache.evict(imported["buffered"])
        if mode == "auto-warm":
            page_cache.read_through(imported["buffered"])
        n = direct_reads(f"exp_{mode}", "auto", "to-hf", imported["buffered"], tmp_path / f"exp_{mode}")
        assert (n > 0) == (mode == "auto"), (mode, n)
        _assert_same_files(ref, tmp_path / f"exp_{mode}")


def test_compressed_shards_written_direct_same_bytes(shim, hf_dir, run_ckpt, tmp_path):
    """Compressed shards (shuffle+zstd), whose chunks HDF5 writes through ckpt's file driver
    (formats/store/direct_vfd.h): with --io direct the stored chunks are written with O_DIRECT
    (pwrite on an O_DIRECT descriptor, logged by the shim), with buffered never; the files are the
    same bytes in every mode and where O_DIRECT is refused (at open, at the first write); h5py +
    hdf5plugin read the HF tensors from them."""
    def from_hf(tag, mode, refuse):
        log = tmp_path / f"{tag}.log"
        env = dict(os.environ, LD_PRELOAD=str(shim), DIO_SHIM_REFUSE=refuse, DIO_SHIM_LOG=str(log),
                   ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":verify_asan_link_order=0")
        run_ckpt("from-hf", hf_dir, tmp_path / tag, "--tp", "2", "--pp", "1", "--dp", "1", "--compress", "shuffle+zstd",
                 "--io", mode, "--no-fsync", env=env)
        return log.read_text().split() if log.exists() else []

    assert from_hf("buffered", "buffered", "log-writes") == []
    for mode in ("direct", "auto"):  # auto: ~18 MiB of tensors per shard, above its 16 MiB threshold
        logged = from_hf(mode, mode, "log-writes")
        assert logged and set(logged) == {"direct-write"}, (mode, logged)
    for refuse in ("open", "write"):
        assert set(from_hf(f"refuse_{refuse}", "direct", refuse)) == {refuse}  # refused, and fell back
    for tag in ("auto", "direct", "refuse_open", "refuse_write"):
        _assert_same_files(tmp_path / "buffered", tmp_path / tag)
    _, _, filters = read_native(str(tmp_path / "direct"))
    assert filters, "the shards are not compressed"
    _assert_native_holds(tmp_path / "direct", load_file(hf_dir / "model.safetensors"))
