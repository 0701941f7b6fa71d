"""The commands of the Python module (python/ckpt/commands.py over python/commands_bind.cc), each
against an independent reference:
  from_hf   a safetensors file written by the safetensors library, read back with h5py
            (scripts/native_h5py.py: manifest + h5py + digests, no ckpt code);
  to_hf     the export loaded by safetensors and by transformers equals the source arrays;
  reshard   equal to the CLI's output (manifests and every dataset's bytes via h5py) and to the
            numpy reference of the layout (tests/python/megatron_reference.py: which box of which
            tensor each rank stores, the data numpy slices of the source);
  convert   equal to the CLI's `ckpt convert` output, bytes via h5py;
  verify    a bit flipped with h5py's dataset offset is reported with its tensor and piece;
  diff      one element changed with numpy is reported for that tensor, with numpy's |a-b|;
  errors    kind / file / tensor on the exception, nothing half-written;
  progress  called with non-decreasing values ending at the total; an exception in it is
            re-raised after the command (docs/PYTHON.md), Ctrl-C the same way.
Needs PYTHONPATH=<build>/python (ctest sets it) and CKPT_BIN for the CLI comparisons."""
import json
import os
import pathlib
import shutil
import sys
import threading
import time

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import megatron_reference as ref  # noqa: E402
from pymodule_helpers import CFG, no_partial, run_cli  # noqa: E402
from native_h5py import read_native  # noqa: E402  (scripts/, put on sys.path by conftest)

ckpt = pytest.importorskip("ckpt", reason="the ckpt module: build target ckpt_python, PYTHONPATH=<build>/python")



def write_hf(d: pathlib.Path, tensors, cfg=CFG):
    d.mkdir(parents=True)
    save_file(tensors, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def model():
    return ref.make_hf_model(CFG, np.random.default_rng(17), np.float32)


@pytest.fixture(scope="module")
def native(tmp_path_factory, model):
    """(hf dir, native store imported by ckpt.from_hf, the from_hf result)."""
    d = tmp_path_factory.mktemp("pymod")
    hf = write_hf(d / "hf", model)
    res = ckpt.from_hf(hf, d / "native", fsync=False)
    return hf, d / "native", res


# ---- from_hf / to_hf -------------------------------------------------------------------------

def test_from_hf_equals_safetensors_source_via_h5py(native, model):
    _, dst, res = native
    man, got, _ = read_native(dst)  # h5py, digests checked against the manifest
    assert sorted(got) == sorted(model)
    for name, arr in model.items():
        assert got[name].dtype == arr.dtype and np.array_equal(got[name], arr), name
    assert res["tensors"] == len(model) and res["bytes"] == sum(a.nbytes for a in model.values())
    assert res["layout"] == "tp=1 pp=1 dp=1" and res["out"] == str(dst) and res["skipped"] == []
    assert man["model_config"]["hidden_size"] == CFG["hidden_size"]


def test_from_hf_with_layout_equals_numpy_reference(tmp_path, native, model):
    hf, _, _ = native
    res = ckpt.from_hf(hf, tmp_path / "tp2", tp=2, pp=2, dp=1, fsync=False)
    assert res["layout"] == "tp=2 pp=2 [2,2] dp=1 zero=0", res
    check_layout(tmp_path / "tp2", model, tp=2, per_stage=[2, 2], dp=1, zero=0)


def test_to_hf_loads_in_safetensors_and_transformers(tmp_path, native, model):
    _, src, _ = native
    out = tmp_path / "out"
    res = ckpt.to_hf(src, out, max_shard_size=4000, fsync=False)
    assert res["tensors"] == len(model) and res["config"] is True and res["skipped"] == []
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) > 1 and (out / "model.safetensors.index.json").exists()
    loaded = {}
    for s in shards:
        loaded.update(load_file(str(s)))
    assert sorted(loaded) == sorted(model)
    for name, arr in model.items():
        assert np.array_equal(loaded[name], arr), name
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = transformers.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    sd = m.state_dict()
    for name, arr in model.items():
        assert torch.equal(sd[name], torch.from_numpy(arr)), name
    # bf16 export: safetensors' own bf16 (torch) equals torch's cast of the source.
    res16 = ckpt.to_hf(src, tmp_path / "bf16", dtype="bf16", fsync=False)
    from safetensors.torch import load_file as load_torch
    t16 = load_torch(str(tmp_path / "bf16" / "model.safetensors"))
    assert res16["bytes"] == res["bytes"] // 2
    for name, arr in model.items():
        assert torch.equal(t16[name], torch.from_numpy(arr).to(torch.bfloat16)), name


# ---- reshard / convert -----------------------------------------------------------------------

def check_layout(dst, model, tp, per_stage, dp, zero):
    """Every stored piece is the numpy slice of the source that the reference layout assigns."""
    m, got = ref.read_native_pieces(dst)
    divisor = m["layout"].get("vocab_divisor", 128)
    order = [(t["name"], tuple(t["shape"])) for t in m["tensors"]]  # the balance depends on the tensor order
    want = ref.native_rank_pieces(CFG, order, tp, per_stage, dp, zero, divisor)
    got_set = {g[:5] for g in got}
    assert got_set == want, f"missing {sorted(want - got_set)[:3]} extra {sorted(got_set - want)[:3]}"
    for rank, name, off, ext, flat, data in got:
        expect = ref.global_region(model[name], off, ext, flat)
        assert data.tobytes() == np.ascontiguousarray(expect).tobytes(), f"{name} {off} {ext} rank {rank}"


def same_store(a: pathlib.Path, b: pathlib.Path):
    """Manifests' tensors and pieces equal, every dataset's bytes equal (h5py)."""
    ma, pa = ref.read_native_pieces(a)
    mb, pb = ref.read_native_pieces(b)
    assert ma["tensors"] == mb["tensors"]
    assert [p for p in ma["pieces"]] == [p for p in mb["pieces"]]
    assert ma["layout"] == mb["layout"]
    for x, y in zip(pa, pb):
        assert x[:5] == y[:5] and x[5].tobytes() == y[5].tobytes(), x[:4]


def test_reshard_equals_cli_and_numpy(tmp_path, native, model):
    _, src, _ = native
    py_dst, cli_dst = tmp_path / "py", tmp_path / "cli"
    dry = ckpt.reshard(src, py_dst, tp=2, pp=2, dp=2, zero=1, dry_run=True)
    assert not py_dst.exists() and dry["layout"]["tp"] == 2 and "dst" not in dry
    res = ckpt.reshard(src, py_dst, tp=2, pp=2, dp=2, zero=1, threads=1, max_memory=1 << 20)
    cli = json.loads(run_cli("reshard", src, cli_dst, "--tp", 2, "--pp", 2, "--dp", 2, "--zero", 1, "--json").stdout)
    same_store(py_dst, cli_dst)
    check_layout(py_dst, model, tp=2, per_stage=[2, 2], dp=2, zero=1)
    # memory and io: each run's own budget (1 MiB here leaves no room for the write pool; the CLI's
    # default does) and its own measured rates.
    volatile = {"dst", "seconds", "plan_seconds", "peak_buffer", "memory", "io"}
    assert {k: v for k, v in res.items() if k not in volatile} == {k: v for k, v in cli.items() if k not in volatile}
    assert res["io"]["mode"] == cli["io"]["mode"] == "auto" and res["io"]["copy_reads"] == cli["io"]["copy_reads"]
    assert res["dst"] == str(py_dst) and res["processes"] == 1
    assert res["memory"]["max_memory"] == 1 << 20 and cli["memory"]["max_memory"] == 256 << 20
    assert res["memory"]["floor"] < cli["memory"]["floor"]  # one thread vs two (the store writer's copy threads)
    assert res["bytes_written"] == sum(f["bytes_written"] for f in res["files"])


def test_reshard_layout_file(tmp_path, native, model):
    _, src, _ = native
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps({"tp": 2, "pp": 2, "dp": 1, "zero": 0, "layers_per_stage": [1, 3]}))
    ckpt.reshard(src, tmp_path / "dst", layout=lay)
    check_layout(tmp_path / "dst", model, tp=2, per_stage=[1, 3], dp=1, zero=0)
    # The same layout as a dict and as a flag string (through a temporary file, removed after).
    ckpt.reshard(src, tmp_path / "dict", layout=json.loads(lay.read_text()))
    same_store(tmp_path / "dst", tmp_path / "dict")
    ckpt.reshard(src, tmp_path / "flags", layout="tp=2 pp=2 dp=1 zero=0 pp_layers=1,3")
    same_store(tmp_path / "dst", tmp_path / "flags")


def test_convert_equals_cli(tmp_path, native):
    _, src, _ = native
    res = ckpt.convert(src, tmp_path / "py", profile="megatron-mcore", tp=2, pp=1, dp=1)
    cli = json.loads(run_cli("convert", src, tmp_path / "cli", "--profile", "megatron-mcore", "--tp", 2, "--pp", 1,
                             "--dp", 1, "--json").stdout)
    same_store(tmp_path / "py", tmp_path / "cli")
    assert res["profile"] == cli["profile"] == "megatron-mcore" and res["from_profile"] == cli["from_profile"]
    assert res["exactness"] == cli["exactness"]
    with pytest.raises(ckpt.InvalidArgumentError, match="profile"):
        ckpt.convert(src, tmp_path / "none")
    assert no_partial(tmp_path / "none")


# ---- verify / diff ---------------------------------------------------------------------------

def test_verify_reports_flipped_bit(tmp_path, native):
    _, src, _ = native
    good = ckpt.verify(src)
    man = json.loads((src / "manifest.json").read_text())
    assert good["ok"] and good["checksums"] and good["pieces"] == len(man["pieces"]) and good["failures"] == []
    assert good["digests"] == ["xxh3-128"] and good["format"] == "ckpt-native v4"
    bad = tmp_path / "bad"
    shutil.copytree(src, bad)
    idx = next(i for i, p in enumerate(man["pieces"]) if p["tensor"] == "model.layers.2.mlp.up_proj.weight")
    victim = man["pieces"][idx]
    import h5py
    with h5py.File(bad / victim["file"], "r") as f:
        off = f[victim["dataset"]].id.get_offset()
    raw = bytearray((bad / victim["file"]).read_bytes())
    raw[off + 7] ^= 0x10
    (bad / victim["file"]).write_bytes(bytes(raw))
    rep = ckpt.verify(bad, threads=1)
    assert not rep["ok"] and len(rep["failures"]) == 1, rep
    f = rep["failures"][0]
    assert f["tensor"] == victim["tensor"] and f["piece"] == idx and f["file"] == victim["file"]
    assert f["dataset"] == victim["dataset"] and f["code"]
    with pytest.raises(ckpt.ChecksumError) as ei:
        ckpt.verify(bad, strict=True)
    assert ei.value.kind == "checksum mismatch" and ei.value.tensor == victim["tensor"]
    assert victim["file"].split("/")[-1] in ei.value.file and "up_proj" in str(ei.value)


def test_verify_safetensors_reads_every_byte(native):
    hf, _, _ = native
    rep = ckpt.verify(hf / "model.safetensors")
    assert rep["ok"] and not rep["checksums"] and "no checksums" in rep["note"]
    assert rep["bytes"] == os.path.getsize(hf / "model.safetensors") - 8 - int.from_bytes(
        (hf / "model.safetensors").read_bytes()[:8], "little")


def test_diff_reports_changed_tensor(tmp_path, native, model):
    hf, src, _ = native
    same = ckpt.diff(src, hf)  # native store against the HF file it came from
    assert same["equal"] and all(t["status"] == "identical" for t in same["tensors"]) and len(same["tensors"]) == len(model)
    changed = {k: v.copy() for k, v in model.items()}
    name = "model.layers.1.self_attn.k_proj.weight"
    changed[name][3, 5] += 0.25
    other = write_hf(tmp_path / "other", changed)
    rep = ckpt.diff(src, other, atol=0.0)
    assert not rep["equal"] and rep["counts"]["different"] == 1 and rep["a"] == str(src)
    t = next(t for t in rep["tensors"] if t["status"] != "identical")
    want = np.abs(model[name].astype(np.float64) - changed[name].astype(np.float64))
    assert t["name"] == name and t["bitwise_differ"] == 1 and t["not_close"] == 1
    assert t["max_abs"] == pytest.approx(want.max()) and t["max_abs_index"] == int(np.argmax(want))
    assert ckpt.diff(src, other, atol=0.3)["equal"]


# ---- errors ----------------------------------------------------------------------------------

def test_errors_carry_kind_file_tensor(tmp_path, native, model):
    hf, src, _ = native
    with pytest.raises(ckpt.NotFoundError) as ei:
        ckpt.verify(tmp_path / "nowhere")
    assert ei.value.kind == "not found" and "nowhere" in str(ei.value)
    assert isinstance(ei.value, LookupError) and isinstance(ei.value, ckpt.Error)
    # A tensor of the wrong shape: named, with expected and found shapes; nothing written.
    bad = {k: v for k, v in model.items()}
    bad["model.layers.0.mlp.down_proj.weight"] = np.zeros((16, 23), np.float32)
    badhf = write_hf(tmp_path / "badhf", bad)
    with pytest.raises(ckpt.Error) as ei:
        ckpt.from_hf(badhf, tmp_path / "out")
    e = ei.value
    assert e.tensor == "model.layers.0.mlp.down_proj.weight" and "23" in e.message and "24" in e.message, e.message
    assert isinstance(e, (ckpt.MismatchError, ckpt.InvalidArgumentError, ckpt.CorruptionError)) and e.code
    assert no_partial(tmp_path / "out")
    # A layout the model refuses (tp=3 does not divide 4 heads): before anything is written.
    with pytest.raises(ckpt.Error) as ei:
        ckpt.reshard(src, tmp_path / "tp3", tp=3, pp=1, dp=1)
    assert "3" in str(ei.value) and no_partial(tmp_path / "tp3")
    with pytest.raises(ckpt.InvalidArgumentError, match="--dtype"):
        ckpt.to_hf(src, tmp_path / "x", dtype="int8")
    with pytest.raises(ckpt.InvalidArgumentError, match="--max-memory"):
        ckpt.reshard(src, tmp_path / "y", tp=2, pp=1, dp=1, max_memory="lots")
    # An existing destination is left as it was.
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "f").write_text("x")
    with pytest.raises(ckpt.Error):
        ckpt.reshard(src, tmp_path / "keep", tp=2, pp=1, dp=1)
    assert os.listdir(tmp_path / "keep") == ["f"]
    with pytest.raises(TypeError):
        ckpt.verify(src, progress=42)
    with pytest.raises(TypeError):
        ckpt.reshard(src, tmp_path / "z", max_memory=1.5)


# ---- progress --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def big_hf(tmp_path_factory):
    """A model of ~6 MB so the commands take several chunks."""
    cfg = dict(CFG, vocab_size=8192, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16)
    t = ref.make_hf_model(cfg, np.random.default_rng(3), np.float32)
    return write_hf(tmp_path_factory.mktemp("big") / "hf", t, cfg), t


def test_progress_increasing_to_total(tmp_path, big_hf):
    hf, t = big_hf
    calls = []
    res = ckpt.from_hf(hf, tmp_path / "n", max_memory="5M", threads=1, fsync=False,
                       progress=lambda d, tot: calls.append((d, tot, threading.get_ident())))
    assert len(calls) >= 2, calls
    dones = [c[0] for c in calls]
    assert dones == sorted(dones) and all(c[1] == calls[-1][1] for c in calls)
    assert calls[-1][0] == calls[-1][1] >= res["bytes"] > 0
    vcalls = []
    rep = ckpt.verify(tmp_path / "n", progress=lambda d, tot: vcalls.append((d, tot)))
    assert rep["ok"] and vcalls and vcalls[-1][0] == vcalls[-1][1] == rep["bytes"]
    assert [c[0] for c in vcalls] == sorted(c[0] for c in vcalls)


def test_progress_exception_reraised_after_command(tmp_path, big_hf):
    hf, t = big_hf
    seen = []

    def cb(done, total):
        seen.append(done)
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        ckpt.from_hf(hf, tmp_path / "n", max_memory="5M", threads=2, fsync=False, progress=cb)
    assert len(seen) == 1  # not called again after raising
    # As documented: the command ran to its end, its output is complete.
    man, got, _ = read_native(tmp_path / "n")
    assert sorted(got) == sorted(t) and all(np.array_equal(got[k], v) for k, v in t.items())
    # An error of the command itself wins over the callback's exception; nothing is written.
    with pytest.raises(ckpt.Error):
        ckpt.from_hf(hf, tmp_path / "n", progress=cb)


def test_gil_released_while_running(tmp_path, big_hf):
    """While a command runs in another thread, this thread keeps running Python: it records
    timestamps strictly inside the commands' own [start, end] intervals (a command holding the
    GIL would leave none there, whatever the build's speed)."""
    hf, _ = big_hf
    errors, spans = [], []

    def work():
        try:
            t_end = time.monotonic() + 0.5
            i = 0
            while i < 3 or time.monotonic() < t_end:
                t0 = time.monotonic()
                ckpt.from_hf(hf, tmp_path / f"n{i}", fsync=False, threads=1)
                spans.append((t0, time.monotonic()))
                shutil.rmtree(tmp_path / f"n{i}")
                i += 1
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=work)
    th.start()
    stamps = []
    while th.is_alive():
        stamps.append(time.monotonic())
        th.join(0.0005)
    assert not errors, errors
    inside = sum(1 for t in stamps if any(a < t < b for a, b in spans))
    busy = sum(b - a for a, b in spans)
    # One stamp per ~0.5 ms of waiting; ask for a tenth of that.
    assert inside > busy / 0.0005 / 10, (inside, busy, len(spans))


# ---- plan ------------------------------------------------------------------------------------

def test_plan_equals_cli_and_naive_flops(tmp_path):
    from test_plan_cli import CLUSTER, CONFIG, naive_step_flops  # the CLI test's cluster and FLOP count
    cl = tmp_path / "cluster.json"
    cl.write_text(json.dumps(CLUSTER))
    res = ckpt.plan(cl, model=CONFIG, global_batch=8, seq_len=32, top=2)
    cli = json.loads(run_cli("plan", "--cluster", cl, "--model", CONFIG, "--global-batch", 8, "--seq-len", 32,
                             "--top", 2, "--json").stdout)
    assert {k: v for k, v in res.items() if k != "seconds"} == {k: v for k, v in cli.items() if k != "seconds"}
    emb = ckpt.plan(cl, model=CONFIG, global_batch=8, seq_len=32, top=2, memory_model="embedded")
    cli = json.loads(run_cli("plan", "--cluster", cl, "--model", CONFIG, "--global-batch", 8, "--seq-len", 32,
                             "--top", 2, "--json", "--memory-model", "embedded").stdout)
    assert emb["memory_model"] == "embedded" and res["memory_model"] == "megatron"
    assert {k: v for k, v in emb.items() if k != "seconds"} == {k: v for k, v in cli.items() if k != "seconds"}
    best = res["best"]
    assert best["feasible"] and best["flops_per_step"] == pytest.approx(
        naive_step_flops(json.loads(pathlib.Path(CONFIG).read_text()), 8, 32), rel=1e-12)
    lay = tmp_path / "layout.json"
    lay.write_text(json.dumps(best["layout"]))
    ev = ckpt.plan(cl, model=CONFIG, global_batch=8, seq_len=32, evaluate=lay, trainer_memory=True)
    assert ev["step_time_s"] == pytest.approx(best["step_time_s"], rel=1e-12)
    assert all(r["trainer_memory_bytes"] > 0 for r in ev["ranks"])
    with pytest.raises(ckpt.InvalidArgumentError, match="global-batch"):
        ckpt.plan(cl, model=CONFIG)
    with pytest.raises(ckpt.Error) as ei:
        ckpt.plan(tmp_path / "no_cluster.json", model=CONFIG, global_batch=8)
    assert "no_cluster.json" in str(ei.value)
