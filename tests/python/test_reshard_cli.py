"""`ckpt reshard` and `ckpt diff` end to end, checked against numpy and h5py (not against ckpt).

 * every shard file of a resharded native store holds exactly the pieces the numpy layout
   reference (megatron_reference.native_rank_pieces) assigns to that rank, with the values numpy
   slices from the global tensors (TP/PP/DP, ZeRO-1 flat shards, GQA with replicated KV heads,
   tied embeddings, vocab padding);
 * --dry-run prints the plan with totals and writes nothing; --layout FILE; --compress zstd[:L]
   (read back by h5py + hdf5plugin); --threads / --max-memory do not change a single output byte;
   impossible layouts are refused before anything is written; a corrupt or missing source piece
   is named and nothing is committed; a progress bar is drawn on a terminal only (reshard, verify,
   to-hf, from-hf, export-megatron), each redraw erasing the rest of the line;
 * `ckpt diff` native vs native and native vs HF dir: exit 0 equal / 1 differ, --atol/--rtol,
   --json figures equal to numpy's.
"""
import hashlib
import json
import os
import pathlib
import pty
import select
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import megatron_reference as ref  # noqa: E402

BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 64}

CFG_GQA = dict(BASE, vocab_size=37, hidden_size=16, intermediate_size=24, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, head_dim=4, torch_dtype="float16")
CFG_TIED = dict(BASE, vocab_size=29, hidden_size=8, intermediate_size=16, num_hidden_layers=4,
                num_attention_heads=8, num_key_value_heads=2, head_dim=2, tie_word_embeddings=True,
                attention_bias=True, torch_dtype="float32")


def model(cfg, seed=0, optimizer=True):
    rng = np.random.default_rng(seed)
    dt = np.float16 if cfg["torch_dtype"] == "float16" else np.float32
    t = ref.make_hf_model(cfg, rng, dt)
    return ref.with_optimizer_state(t, rng) if optimizer else t


@pytest.fixture
def make_store(tool, tmp_path):
    n = [0]

    def make(cfg, tensors, layout=None):
        n[0] += 1
        dst = tmp_path / f"src{n[0]}"
        ref.write_native_store(tool("store_write_tool"), tmp_path / f"spec{n[0]}", dst, cfg, tensors, layout)
        return dst
    return make


def tree_digest(d):
    """sha256 of every file under d (relative path -> digest)."""
    d = pathlib.Path(d)
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def layout_args(tp, per_stage, dp, zero):
    return ["--tp", tp, "--pp", len(per_stage), "--pp-layers", ",".join(map(str, per_stage)), "--dp", dp,
            "--zero", zero]


def check_against_reference(dst, cfg, tensors, tp, per_stage, dp, zero, divisor):
    m, got = ref.read_native_pieces(dst)
    want = ref.native_rank_pieces(cfg, [(k, v.shape) for k, v in tensors.items()], tp, per_stage, dp, zero, divisor,
                                  [v.dtype.itemsize for v in tensors.values()])
    got_set = {g[:5] for g in got}
    assert len(got_set) == len(got), "a piece is stored twice"
    missing, extra = want - got_set, got_set - want
    assert not missing and not extra, f"missing {sorted(missing)[:5]} extra {sorted(extra)[:5]}"
    for rank, name, off, ext, flat, data in got:
        expect = ref.global_region(tensors[name], off, ext, flat)
        assert data.dtype == tensors[name].dtype, name
        assert data.reshape(-1).tobytes() == np.ascontiguousarray(expect).reshape(-1).tobytes(), \
            f"{name} {off} {ext} {flat} on rank {rank}"
    lay = m["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["zero"]) == (tp, len(per_stage), dp, zero)
    assert lay["layers_per_stage"] == list(per_stage)
    assert m["model_config"]["num_hidden_layers"] == cfg["num_hidden_layers"]


LAYOUTS = [
    # cfg, tp, layers per stage, dp, zero, vocab divisor
    ("gqa_tp2_pp2_uneven_dp2_zero1", CFG_GQA, 2, [1, 3], 2, 1, 8),
    ("gqa_tp4_kv_replicated", CFG_GQA, 4, [4], 1, 0, 4),
    ("gqa_pp4_dp4_zero1", CFG_GQA, 1, [1, 1, 1, 1], 4, 1, 128),
    ("tied_bias_tp2_pp3_dp2_zero1", CFG_TIED, 2, [2, 1, 1], 2, 1, 3),
    ("tied_tp8_pp2_dp1_zero1", CFG_TIED, 8, [3, 1], 1, 1, 1),
]


@pytest.mark.parametrize("case", LAYOUTS, ids=lambda c: c[0])
def test_shards_match_numpy_reference(case, make_store, run_ckpt, tmp_path):
    _, cfg, tp, per, dp, zero, divisor = case
    tensors = model(cfg, seed=len(per) * 10 + tp)
    src = make_store(cfg, tensors, layout={"tp": 1, "pp": 1, "dp": 1, "zero": 0,
                                           "layers_per_stage": [cfg["num_hidden_layers"]], "vocab_divisor": divisor})
    before = tree_digest(src)
    dst = tmp_path / "dst"
    run_ckpt("reshard", src, dst, *layout_args(tp, per, dp, zero))
    check_against_reference(dst, cfg, tensors, tp, per, dp, zero, divisor)
    # ... and back to one rank: every tensor whole again, equal to numpy's.
    back = tmp_path / "back"
    run_ckpt("reshard", dst, back, "--tp", 1, "--pp", 1, "--dp", 1, "--zero", 0)
    check_against_reference(back, cfg, tensors, 1, [cfg["num_hidden_layers"]], 1, 0, divisor)
    assert tree_digest(src) == before, "SRC was modified"


def test_layout_file_with_micro_batches(make_store, run_ckpt, tmp_path):
    tensors = model(CFG_GQA)
    src = make_store(CFG_GQA, tensors)
    lf = tmp_path / "layout.json"
    lf.write_text(json.dumps({"tp": 2, "pp": 3, "dp": 2, "zero": 1, "layers_per_stage": [1, 2, 1],
                              "micro_batch": [3, 1], "vocab_divisor": 16}))
    dst = tmp_path / "dst"
    run_ckpt("reshard", src, dst, "--layout", lf)
    check_against_reference(dst, CFG_GQA, tensors, 2, [1, 2, 1], 2, 1, 16)
    m = json.loads((dst / "manifest.json").read_text())
    assert m["layout"]["micro_batch"] == [3, 1]
    # --layout excludes the layout flags.
    p = run_ckpt("reshard", src, tmp_path / "x", "--layout", lf, "--tp", 2, check=False)
    assert p.returncode == 2 and "--layout" in p.stderr
    # A bad layout file is named.
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"tp": 2, "pp": 2, "layers_per_stage": [4, 0]}))
    p = run_ckpt("reshard", src, tmp_path / "y", "--layout", bad, check=False)
    assert p.returncode == 2 and "stage" in p.stderr, p.stderr
    assert not (tmp_path / "y").exists() and not (tmp_path / "y.partial").exists()


def test_dry_run_prints_plan_and_writes_nothing(make_store, run_ckpt, tmp_path):
    tensors = model(CFG_GQA)
    src = make_store(CFG_GQA, tensors)
    dst = tmp_path / "dst"
    args = layout_args(2, [1, 3], 2, 1)
    p = run_ckpt("reshard", src, dst, *args, "--dry-run")
    assert not dst.exists() and not (tmp_path / "dst.partial").exists()
    out = p.stdout
    assert "read" in out and "write" in out and "peak buffer" in out and "shards/r00000.h5" in out, out
    j = json.loads(run_ckpt("reshard", src, dst, *args, "--dry-run", "--json").stdout)
    assert not dst.exists()
    want = ref.native_rank_pieces(CFG_GQA, [(k, v.shape) for k, v in tensors.items()], 2, [1, 3], 2, 1, 128,
                                  [v.dtype.itemsize for v in tensors.values()])
    nbytes = {k: v.dtype.itemsize for k, v in tensors.items()}

    def count(p):
        _, name, off, ext, flat = p
        return (flat[1] - flat[0]) if flat else int(np.prod(ext, dtype=np.int64))
    total = sum(count(p) * nbytes[p[1]] for p in want)
    assert j["bytes_written"] == total
    assert j["bytes_read"] == total  # the source holds whole tensors: every byte written is read once
    assert j["source_bytes"] == sum(v.nbytes for v in tensors.values())
    assert j["peak_buffer"] > 0
    per_file = {}
    for p in want:
        per_file[p[0]] = per_file.get(p[0], 0) + count(p) * nbytes[p[1]]
    assert {f["rank"]: f["bytes_written"] for f in j["files"]} == per_file
    assert all(f["file"] == f"shards/r{f['rank']:05d}.h5" for f in j["files"])
    # The real run writes what the plan said.
    run_ckpt("reshard", src, dst, *args)
    m = json.loads((dst / "manifest.json").read_text())
    assert sum(p["bytes"] for p in m["pieces"]) == total


def test_threads_and_memory_do_not_change_output(make_store, run_ckpt, tmp_path):
    cfg = dict(CFG_GQA, hidden_size=64, intermediate_size=96, vocab_size=301)
    tensors = model(cfg)
    src = make_store(cfg, tensors)
    args = layout_args(2, [3, 1], 2, 1)
    runs = [("t1", ["--threads", 1]), ("t2", ["--threads", 2]), ("t4_small", ["--threads", 4, "--max-memory", "1M"]),
            ("t3_tiny", ["--threads", 3, "--max-memory", "64K"])]
    digests = []
    for name, extra in runs:
        run_ckpt("reshard", src, tmp_path / name, *args, *extra)
        digests.append(tree_digest(tmp_path / name))
        m, pieces = ref.read_native_pieces(tmp_path / name)
    for d in digests[1:]:
        assert d == digests[0], "output bytes depend on --threads / --max-memory"
    check_against_reference(tmp_path / "t1", cfg, tensors, 2, [3, 1], 2, 1, 128)


def test_compress_zstd(make_store, run_ckpt, tmp_path):
    tensors = model(CFG_GQA)
    src = make_store(CFG_GQA, tensors)
    for spec, level in (("zstd", 1), ("zstd:7", 7)):
        dst = tmp_path / spec.replace(":", "_")
        run_ckpt("reshard", src, dst, "--tp", 2, "--pp", 2, "--dp", 1, "--compress", spec)
        m = json.loads((dst / "manifest.json").read_text())
        assert {p["codec"] for p in m["pieces"]} == {"zstd"}
        assert {p.get("codec_level") for p in m["pieces"]} == {level}
        import h5py
        with h5py.File(dst / m["pieces"][0]["file"], "r") as f:
            ds = f[m["pieces"][0]["dataset"]]
            assert 32015 in ds._filters or "32015" in ds._filters or any("zstd" in str(k).lower() for k in ds._filters), \
                ds._filters
        check_against_reference(dst, CFG_GQA, tensors, 2, [2, 2], 1, 0, 128)  # h5py + hdf5plugin decode
        assert run_ckpt("diff", src, dst).returncode == 0
    for bad in ("zstd:0", "zstd:23", "lz4", "zstd:x"):
        p = run_ckpt("reshard", src, tmp_path / "bad", "--tp", 2, "--pp", 1, "--dp", 1, "--compress", bad, check=False)
        assert p.returncode == 2, (bad, p.stderr)
        assert not (tmp_path / "bad").exists() and not (tmp_path / "bad.partial").exists()


@pytest.mark.parametrize("args,needle", [
    (["--tp", 3, "--pp", 1, "--dp", 1], "num_attention_heads=4"),
    (["--tp", 1, "--pp", 5, "--dp", 1], "pp=5"),
    (["--tp", 1, "--pp", 3, "--pp-layers", "2,0,2", "--dp", 1], "stage 1"),
    (["--tp", 1, "--pp", 2, "--pp-layers", "1,1", "--dp", 1], "sums to 2"),
    (["--tp", 1, "--pp", 1, "--dp", 0], "dp"),
    (["--tp", 8, "--pp", 1, "--dp", 1], "tp=8"),
])
def test_impossible_layouts_refused_before_writing(args, needle, make_store, run_ckpt, tmp_path):
    src = make_store(CFG_GQA, model(CFG_GQA))
    before = tree_digest(src)
    dst = tmp_path / "dst"
    p = run_ckpt("reshard", src, dst, *args, check=False)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr, p.stderr
    assert not dst.exists() and not (tmp_path / "dst.partial").exists()
    assert tree_digest(src) == before


def test_existing_destination_untouched(make_store, run_ckpt, tmp_path):
    src = make_store(CFG_GQA, model(CFG_GQA))
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "keep").write_text("x")
    p = run_ckpt("reshard", src, dst, "--tp", 2, "--pp", 1, "--dp", 1, check=False)
    assert p.returncode != 0 and "exist" in p.stderr, p.stderr
    assert (dst / "keep").read_text() == "x" and sorted(os.listdir(dst)) == ["keep"]


def _dataset_offset(path, dataset):
    import h5py
    with h5py.File(path, "r") as f:
        return f[dataset].id.get_offset()


@pytest.mark.parametrize("io", ["auto", "direct"])  # direct: checked from the copy's own reads (CopyVerify)
def test_corrupt_source_piece_named_nothing_committed(io, make_store, run_ckpt, tmp_path):
    tensors = model(CFG_GQA)
    src = make_store(CFG_GQA, tensors)
    mid = tmp_path / "mid"
    run_ckpt("reshard", src, mid, "--tp", 2, "--pp", 2, "--dp", 1)
    m = json.loads((mid / "manifest.json").read_text())
    victim = next(p for p in m["pieces"] if p["tensor"] == "optimizer.exp_avg.model.layers.3.mlp.up_proj.weight")
    path = mid / victim["file"]
    off = _dataset_offset(path, victim["dataset"])
    raw = bytearray(path.read_bytes())
    raw[off + 5] ^= 0x40
    path.write_bytes(bytes(raw))
    before = tree_digest(mid)
    dst = tmp_path / "dst"
    p = run_ckpt("reshard", mid, dst, "--tp", 1, "--pp", 1, "--dp", 1, "--io", io, check=False)
    assert p.returncode != 0
    assert "optimizer.exp_avg.model.layers.3.mlp.up_proj.weight" in p.stderr, p.stderr
    assert "nothing was committed" in p.stderr, p.stderr
    assert not dst.exists() and not (tmp_path / "dst.partial").exists()
    assert tree_digest(mid) == before
    # A missing shard file is named before anything is written.
    (mid / victim["file"]).unlink()
    p = run_ckpt("reshard", mid, dst, "--tp", 1, "--pp", 1, "--dp", 1, check=False)
    assert p.returncode != 0 and victim["file"].split("/")[-1] in p.stderr, p.stderr
    assert not dst.exists() and not (tmp_path / "dst.partial").exists()


def stderr_on_a_terminal(ckpt_bin, *args):
    """Runs ckpt with stderr on a pseudo-terminal; returns (exit code, what it wrote there)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([ckpt_bin, *map(str, args)], stdout=subprocess.PIPE, stderr=slave, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        r, _, _ = select.select([master], [], [], 60)
        if not r:
            break
        try:
            b = os.read(master, 4096)
        except OSError:
            break
        if not b:
            break
        chunks.append(b)
    proc.wait(timeout=60)
    os.close(master)
    return proc.returncode, b"".join(chunks).decode(errors="replace")


def assert_progress_lines(err, label):
    """A bar reaching 100%; every redraw ("\r" + text) erases to the end of the line ("\x1b[K"), so
    a shorter text leaves nothing of a longer one; the last one ends the line."""
    assert label + " [" in err and "100%" in err, err
    redraws = err.replace("\r\n", "\n").split("\r")[1:]  # the terminal turns "\n" into "\r\n"
    assert redraws, err
    for seg in redraws:
        assert seg.split("\n")[0].endswith("\x1b[K"), repr(seg)
    assert redraws[-1].endswith("\x1b[K\n"), repr(redraws[-1])


def test_progress_bar_only_on_a_terminal(make_store, ckpt_bin, run_ckpt, tmp_path):
    src = make_store(CFG_GQA, model(CFG_GQA))
    rc, err = stderr_on_a_terminal(ckpt_bin, "reshard", src, tmp_path / "tty", "--tp", "2", "--pp", "2", "--dp", "1")
    assert rc == 0, err
    assert_progress_lines(err, "reshard")
    p = run_ckpt("reshard", src, tmp_path / "notty", "--tp", 2, "--pp", 2, "--dp", 1)
    assert "reshard [" not in p.stderr
    # The other long commands draw the same bar: verify, to-hf, from-hf, export-megatron.
    for label, args in [("verify", ["verify", tmp_path / "tty"]),
                        ("to-hf", ["to-hf", tmp_path / "tty", tmp_path / "hf"]),
                        ("from-hf", ["from-hf", tmp_path / "hf", tmp_path / "back"]),
                        ("export-megatron", ["export-megatron", tmp_path / "tty", tmp_path / "meg", "--tp", "2"])]:
        rc, err = stderr_on_a_terminal(ckpt_bin, *args)
        assert rc == 0, err
        assert_progress_lines(err, label)
    assert "verify [" not in run_ckpt("verify", tmp_path / "tty").stderr


# ---------------------------------------------------------------------------------------------
# ckpt diff


def test_diff_native_vs_native(make_store, run_ckpt, tmp_path):
    tensors = model(CFG_GQA)
    a = make_store(CFG_GQA, tensors)
    b = tmp_path / "b"
    run_ckpt("reshard", a, b, *layout_args(2, [2, 2], 2, 1))
    p = run_ckpt("diff", a, b, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    j = json.loads(run_ckpt("diff", a, b, "--json").stdout)
    assert all(t["status"] == "identical" for t in j["tensors"]) and len(j["tensors"]) == len(tensors)

    # Perturb two tensors by known amounts; compare the reported figures with numpy's.
    t2 = dict(tensors)
    name1, name2 = "model.layers.1.self_attn.k_proj.weight", "optimizer.exp_avg_sq.model.norm.weight"
    t2[name1] = (tensors[name1].astype(np.float32) + 0.25).astype(np.float16)
    t2[name2] = tensors[name2] * np.float32(1.001)
    c = make_store(CFG_GQA, t2)
    c2 = tmp_path / "c2"
    run_ckpt("reshard", c, c2, *layout_args(4, [1, 1, 2], 1, 0))
    p = run_ckpt("diff", b, c2, "--json", check=False)
    assert p.returncode == 1, p.stderr
    j = {t["name"]: t for t in json.loads(p.stdout)["tensors"]}
    assert {n for n, t in j.items() if t["status"] != "identical"} == {name1, name2}
    for n in (name1, name2):
        x, y = tensors[n].astype(np.float64), t2[n].astype(np.float64)
        assert j[n]["max_abs"] == pytest.approx(np.abs(x - y).max(), rel=1e-12)
        nz = y != 0
        assert j[n]["max_rel"] == pytest.approx((np.abs(x - y)[nz] / np.abs(y[nz])).max(), rel=1e-9)
        assert j[n]["not_close"] == int((~np.isclose(x, y, rtol=0, atol=0)).sum())
    # Tolerances: numpy.isclose semantics, |a - b| <= atol + rtol * |b|.
    atol = float(np.abs(tensors[name1].astype(np.float64) - t2[name1].astype(np.float64)).max())
    assert run_ckpt("diff", b, c2, "--atol", atol * 1.01, "--rtol", 0.002, check=False).returncode == 0
    assert run_ckpt("diff", b, c2, "--atol", atol * 0.5, check=False).returncode == 1
    assert run_ckpt("diff", b, c2, "--rtol", 0.002, check=False).returncode == 1
    t4 = dict(tensors)
    t4[name2] = t2[name2]
    c4 = make_store(CFG_GQA, t4)  # differs only by a relative 1e-3
    assert run_ckpt("diff", b, c4, "--rtol", 0.0011, check=False).returncode == 0
    assert run_ckpt("diff", b, c4, "--rtol", 0.0005, check=False).returncode == 1
    p = run_ckpt("diff", b, c4, "--rtol", 0.0011, "--json")
    j = {t["name"]: t for t in json.loads(p.stdout)["tensors"]}
    assert j[name2]["status"] == "close" and j[name2]["not_close"] == 0
    # Missing tensor and shape mismatch.
    t3 = {k: v for k, v in tensors.items() if k != "model.norm.weight"}
    d = make_store(CFG_GQA, t3)
    p = run_ckpt("diff", a, d, "--json", check=False)
    assert p.returncode == 1
    j = {t["name"]: t for t in json.loads(p.stdout)["tensors"]}
    assert j["model.norm.weight"]["status"] == "only_in_a", j["model.norm.weight"]
    p = run_ckpt("diff", d, a, check=False)
    assert p.returncode == 1 and "model.norm.weight" in p.stdout


def test_diff_native_vs_hf_dir(make_store, run_ckpt, tmp_path):
    cfg = CFG_TIED
    weights = model(cfg, optimizer=False)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(cfg))
    save_file(weights, str(hf / "model.safetensors"), metadata={"format": "pt"})
    full = ref.with_optimizer_state(weights, np.random.default_rng(3))
    a = make_store(cfg, full)
    b = tmp_path / "b"
    run_ckpt("reshard", a, b, *layout_args(2, [1, 3], 2, 1))
    # Same weights, but the native checkpoint also has optimizer state: extra tensors differ.
    p = run_ckpt("diff", b, hf, "--json", check=False)
    assert p.returncode == 1
    j = json.loads(p.stdout)
    kinds = {t["name"]: t["status"] for t in j["tensors"]}
    assert all(kinds[n] == "identical" for n in weights)
    assert all(kinds[n] == "only_in_a" for n in full if n.startswith("optimizer."))
    # Weights only: equal, both directions.
    w = make_store(cfg, weights)
    w2 = tmp_path / "w2"
    run_ckpt("reshard", w, w2, *layout_args(8, [2, 2], 1, 0))
    assert run_ckpt("diff", w2, hf, check=False).returncode == 0
    assert run_ckpt("diff", hf, w2, check=False).returncode == 0
    # A changed HF value is found in global view.
    w3 = dict(weights)
    w3["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"].copy()
    w3["model.embed_tokens.weight"][28, 7] += 1.0
    hf2 = tmp_path / "hf2"
    hf2.mkdir()
    (hf2 / "config.json").write_text(json.dumps(cfg))
    save_file(w3, str(hf2 / "model.safetensors"), metadata={"format": "pt"})
    p = run_ckpt("diff", w2, hf2, "--json", check=False)
    assert p.returncode == 1
    t = next(t for t in json.loads(p.stdout)["tensors"] if t["name"] == "model.embed_tokens.weight")
    assert t["not_close"] == 1 and t["max_abs_index"] == 28 * cfg["hidden_size"] + 7
    assert t["max_abs"] == pytest.approx(1.0, abs=1e-6)
