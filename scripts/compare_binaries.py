#!/usr/bin/env python3
"""compare_binaries.py OLD_CKPT NEW_CKPT [--work DIR] [--keep]

Runs the same commands with two `ckpt` binaries on the same inputs and reports every difference:
exit code, stdout (the --json documents with their timing fields removed, or the text), and the
bytes of every file each command wrote. Used to show that a change which should not change
behaviour (a move of files, a refactor) did not: old checkpoints read, verify, reshard and export
byte-identically, and every command's --json is the same.

Inputs: fixtures/v1_store and fixtures/v2_store (stores written by earlier versions), a run written
by OLD's `train` and OLD's reshard of it to an uneven tp2 pp2 dp2 ZeRO-1 layout, a profile store (OLD's `convert --profile`), an HF
directory (OLD's `to-hf`). Exit status 1 when anything differs, 0 otherwise.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TIMING_KEYS = {"seconds", "elapsed_s", "read_s", "write_s", "wall_s", "throughput", "bytes_per_s",
               "mb_per_s", "gb_per_s", "peak_rss", "peak_rss_bytes", "cpu_s", "time_s"}


def scrub(x, old_root, new_root):
    """A JSON value without timing fields, with both work roots replaced by one name."""
    if isinstance(x, dict):
        return {k: scrub(v, old_root, new_root) for k, v in x.items()
                if k not in TIMING_KEYS and not k.endswith(("_seconds", "_s", "_per_s"))}
    if isinstance(x, list):
        return [scrub(v, old_root, new_root) for v in x]
    if isinstance(x, str):
        return x.replace(old_root, "<W>").replace(new_root, "<W>")
    return x


UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


SERIAL_ID = re.compile(rb"[0-9]{40}(PK\x07\x08....)?", re.S)
ZIP_HEADERS = ((re.compile(rb"PK\x01\x02", re.S), 28, 46, 16),  # central directory: name length, name, CRC-32
               (re.compile(rb"PK\x03\x04", re.S), 26, 30, 14))  # local header


def mask_random_ids(b):
    """The bytes with the ids every save draws afresh masked: DCP's save_id (a uuid4) and torch.save's
    archive/.data/serialization_id (40 digits) with its CRC-32 in the data descriptor and the central
    directory, also inside zips embedded in .distcp files."""
    b = UUID.sub(b"u" * 36, b)
    b = SERIAL_ID.sub(lambda m: b"d" * 40 + (b"PK\x07\x08\0\0\0\0" if m.group(1) else b""), b)
    out = bytearray(b)
    for sig, len_at, name_at, crc_at in ZIP_HEADERS:
        for m in sig.finditer(b):
            i = m.start()
            n = int.from_bytes(b[i + len_at:i + len_at + 2], "little")
            if b[i + name_at:i + name_at + n].endswith(b"serialization_id"):
                out[i + crc_at:i + crc_at + 4] = b"\0\0\0\0"
    return bytes(out)


def file_digest(p):
    """sha256 of a file's bytes with the per-save random ids masked (mask_random_ids)."""
    return hashlib.sha256(mask_random_ids(open(p, "rb").read())).hexdigest()


def tree_digest(path):
    """{relative path: file_digest} of every file under path (a file: itself)."""
    out = {}
    if os.path.isfile(path):
        return {".": file_digest(path)}
    for dp, _, fns in os.walk(path):
        for fn in fns:
            p = os.path.join(dp, fn)
            out[os.path.relpath(p, path)] = file_digest(p)
    return out


def run(binary, args, cwd):
    p = subprocess.run([binary] + args, cwd=cwd, capture_output=True, text=True, timeout=900)
    return p.returncode, p.stdout, p.stderr


def normalize_stdout(text, old_root, new_root):
    try:
        return json.dumps(scrub(json.loads(text), old_root, new_root), sort_keys=True, indent=1)
    except ValueError:
        lines = [ln for ln in text.replace(old_root, "<W>").replace(new_root, "<W>").splitlines()
                 if " s " not in ln and "MB/s" not in ln and "GB/s" not in ln and "seconds" not in ln]
        return "\n".join(lines)


def make_inputs(old, inp):
    """Inputs written once by OLD, read by both binaries."""
    cfg = os.path.join(REPO, "fixtures", "tiny_llama.json")
    steps = [
        ["train", "--config", cfg, "--steps", "3", "--out", f"{inp}/run", "--micro-batch", "2", "--seq-len", "16",
         "--sync-save"],
        ["reshard", f"{inp}/run", f"{inp}/hetero", "--tp", "2", "--pp", "2", "--pp-layers", "1,3", "--dp", "2",
         "--zero", "1"],
        ["convert", f"{inp}/run", f"{inp}/profile_store", "--profile", "megatron-mcore"],
        ["to-hf", f"{inp}/run", f"{inp}/hf", "--no-fsync"],
    ]
    for s in steps:
        rc, out, err = run(old, s, inp)
        if rc != 0:
            sys.exit(f"making inputs: {' '.join(s)} failed ({rc}): {err}")
    shutil.copytree(os.path.join(REPO, "fixtures", "v1_store"), f"{inp}/v1_store")
    shutil.copytree(os.path.join(REPO, "fixtures", "v2_store"), f"{inp}/v2_store")


def cases(inp):
    """(name, args with {out} for the output path or None when the command writes nothing)."""
    srcs = {"v1": f"{inp}/v1_store/step-00000001", "v2": f"{inp}/v2_store/step-00000001", "run": f"{inp}/run", "hetero": f"{inp}/hetero",
            "profile": f"{inp}/profile_store", "hf": f"{inp}/hf"}
    out = []
    for k, s in srcs.items():
        out.append((f"inspect-{k}", ["inspect", s, "--json"], None))
        out.append((f"inspect-{k}-text", ["inspect", s], None))
        out.append((f"verify-{k}", ["verify", s, "--json"], None))
        out.append((f"to-hf-{k}", ["to-hf", s, "{out}", "--json", "--no-fsync"], "{out}"))
        out.append((f"reshard-{k}", ["reshard", s, "{out}", "--tp", "1", "--pp", "1", "--dp", "1", "--json"], "{out}"))
        out.append((f"reshard-{k}-dry", ["reshard", s, "{out}", "--tp", "2", "--pp", "2", "--dp", "1", "--dry-run", "--json"], None))
        out.append((f"export-dcp-{k}", ["export-dcp", s, "{out}", "--json", "--no-fsync"], "{out}"))
        out.append((f"diff-{k}-run", ["diff", s, srcs["run"], "--json", "--ignore-dtype"], None))
    out.append(("reshard-run-zstd", ["reshard", srcs["run"], "{out}", "--tp", "1", "--pp", "2", "--dp", "2",
                                     "--zero", "1", "--compress", "zstd", "--json"], "{out}"))
    out.append(("convert-run-profile", ["convert", srcs["run"], "{out}", "--profile", "megatron-mcore", "--json"], "{out}"))
    out.append(("from-hf", ["from-hf", srcs["hf"], "{out}", "--tp", "2", "--pp", "1", "--dp", "1", "--json", "--no-fsync"], "{out}"))
    out.append(("export-megatron", ["export-megatron", srcs["run"], "{out}", "--tp", "2", "--pp", "1"], "{out}"))
    out.append(("export-megatron-dist", ["export-megatron", srcs["run"], "{out}", "--tp", "1", "--format", "torch_dist"], "{out}"))
    out.append(("bad-max-memory", ["reshard", srcs["run"], "{out}", "--tp", "1", "--pp", "1", "--dp", "1", "--max-memory", "12Q"], None))
    out.append(("missing-src", ["inspect", f"{inp}/nothing", "--json"], None))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[2])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--work")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    work = a.work or tempfile.mkdtemp(prefix="ckpt-compare-")
    inp = os.path.join(work, "in")
    os.makedirs(inp, exist_ok=True)
    make_inputs(os.path.abspath(a.old), inp)
    diffs = 0
    for name, args, out_path in cases(inp):
        results = []
        for tag, binary in (("old", a.old), ("new", a.new)):
            root = os.path.join(work, tag)
            os.makedirs(root, exist_ok=True)
            o = os.path.join(root, name)
            rc, so, se = run(os.path.abspath(binary), [x.replace("{out}", o) for x in args], root)
            files = tree_digest(o) if out_path and os.path.exists(o) else {}
            results.append((rc, normalize_stdout(so, os.path.join(work, "old"), os.path.join(work, "new")),
                            se.replace(os.path.join(work, tag), "<W>").strip(), files))
        (r0, s0, e0, f0), (r1, s1, e1, f1) = results
        problems = []
        if r0 != r1:
            problems.append(f"exit {r0} -> {r1}")
        if s0 != s1:
            problems.append("stdout differs:\n--- old\n" + s0[:3000] + "\n--- new\n" + s1[:3000])
        if r0 != 0 and e0 != e1:
            problems.append(f"stderr differs:\n--- old\n{e0[:2000]}\n--- new\n{e1[:2000]}")
        if f0 != f1:
            changed = sorted(k for k in set(f0) | set(f1) if f0.get(k) != f1.get(k))
            problems.append("files differ: " + ", ".join(changed[:20]))
        status = "same" if not problems else "DIFFERENT"
        print(f"{name:28s} exit {r0:3d}  files {len(f0):4d}  {status}")
        for p in problems:
            print("    " + p.replace("\n", "\n    "))
        diffs += bool(problems)
    print(f"{diffs} case(s) differ" if diffs else "every case is the same")
    if not a.keep and not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
