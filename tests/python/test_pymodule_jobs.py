"""ckpt.inspect, ckpt.export_dcp and ckpt.export_megatron (python/ckpt/commands.py over the jobs of
converters/jobs/inspect_job.h and export_jobs.h), each against an independent reference and the CLI:
  inspect          equals `ckpt inspect --json` parsed, for every kind (native stores of two
                   layouts, a profile store, the v1/v2 fixtures, an HF directory, a .safetensors
                   file, a DCP, Megatron safetensors and torch_dist directories); its tensors agree
                   with the safetensors library's header and with manifest.json read as JSON, its
                   layout_detail with the Megatron rank order written out by hand;
  export_dcp       loads in torch.distributed.checkpoint with every tensor equal to the HF source
                   written by the safetensors library, from a tp=2 pp=2 native store and from a
                   Megatron torch_dist directory; its dict equals the CLI's --json; progress ends at
                   the total;
  export_megatron  per-rank safetensors equal to the numpy reference of Megatron-LM's layout
                   (tests/python/megatron_reference.py) and byte-equal to the CLI's files; its dict
                   equals the CLI's --json;
  errors           bad input raises the ckpt.Error subclass with the kind and code the CLI prints,
                   and leaves nothing at the destination.
Needs PYTHONPATH=<build>/python (ctest sets it) and CKPT_BIN for the CLI comparisons."""
import json
import pathlib
import re
import sys
import warnings

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import megatron_reference as ref  # noqa: E402
from pymodule_helpers import CFG, no_partial, run_cli  # noqa: E402

ckpt = pytest.importorskip("ckpt", reason="the ckpt module: build target ckpt_python, PYTHONPATH=<build>/python")
torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
warnings.filterwarnings("ignore", message="torch.distributed is disabled")



@pytest.fixture(scope="module")
def model():
    return ref.make_hf_model(CFG, np.random.default_rng(29), np.float32)


@pytest.fixture(scope="module")
def kinds(tmp_path_factory, model):
    """{kind: path} of a checkpoint of every kind, all holding `model` (but the v1/v2 fixtures)."""
    d = tmp_path_factory.mktemp("jobs")
    (d / "hf").mkdir()
    save_file(model, str(d / "hf" / "model.safetensors"))
    (d / "hf" / "config.json").write_text(json.dumps(CFG))
    k = {"hf-dir": d / "hf", "safetensors": d / "hf" / "model.safetensors"}
    ckpt.from_hf(k["hf-dir"], d / "native", fsync=False)
    k["native"] = d / "native"
    ckpt.from_hf(k["hf-dir"], d / "tp2pp2", tp=2, pp=2, dp=1, compress="zstd", fsync=False)
    k["native-tp2pp2"] = d / "tp2pp2"
    ckpt.convert(k["native"], d / "paddle", profile="paddlenlp")
    k["profile-store"] = d / "paddle"
    ckpt.export_dcp(k["native"], d / "dcp", fsync=False)
    k["dcp"] = d / "dcp"
    ckpt.export_megatron(k["native"], d / "meg_st", tp=2, pp=2)
    k["megatron-safetensors"] = d / "meg_st"
    ckpt.export_megatron(k["native"], d / "meg_dist", tp=2, pp=1, format="torch_dist")
    k["megatron-torch-dist"] = d / "meg_dist"
    k["v1-fixture"] = ROOT / "fixtures" / "v1_store" / "step-00000001"
    k["v2-fixture"] = ROOT / "fixtures" / "v2_store" / "step-00000001"
    return k


def _dcp_load(out, model, dtype=torch.float32):
    sd = {k: torch.full(v.shape, float("nan"), dtype=dtype) for k, v in model.items()}
    dcp.load(sd, checkpoint_id=str(out))
    return sd


# ---- inspect ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["native", "native-tp2pp2", "profile-store", "v1-fixture", "v2-fixture", "hf-dir",
                                  "safetensors", "dcp", "megatron-safetensors", "megatron-torch-dist"])
def test_inspect_equals_cli_json(kinds, kind):
    path = str(kinds[kind])
    got = ckpt.inspect(path)
    want = json.loads(run_cli("inspect", "--json", path).stdout)
    assert got == want
    assert got["totals"]["tensors"] == len(got["tensors"]) > 0


def test_inspect_tensors_match_independent_readers(kinds, model):
    with safe_open(str(kinds["safetensors"]), "numpy") as f:
        header = {n: (f.get_slice(n).get_dtype(), f.get_slice(n).get_shape()) for n in f.keys()}
    for kind in ("safetensors", "hf-dir"):
        got = ckpt.inspect(kinds[kind])
        assert {t["name"]: (t["dtype"], t["shape"]) for t in got["tensors"]} == header, kind
        assert all(t["pieces"] == 1 for t in got["tensors"])
        assert got["layout_detail"] is None
    man = json.loads((kinds["native-tp2pp2"] / "manifest.json").read_text())
    got = ckpt.inspect(kinds["native-tp2pp2"])
    assert {t["name"]: (t["dtype"], t["shape"]) for t in got["tensors"]} == \
        {t["name"]: (t["dtype"], t["shape"]) for t in man["tensors"]}
    pieces = {}
    for p in man["pieces"]:
        pieces[p["tensor"]] = pieces.get(p["tensor"], 0) + 1
    assert {t["name"]: t["pieces"] for t in got["tensors"]} == pieces
    assert got["totals"]["pieces"] == len(man["pieces"])
    assert sum(t["bytes"] for t in got["tensors"]) == sum(a.nbytes for a in model.values())


def test_inspect_layout_detail_by_hand(kinds):
    """tp=2 pp=2 dp=1 of 4 layers: stage s holds layers [2s, 2s+1] on ranks (s*dp + 0)*tp + t."""
    d = ckpt.inspect(kinds["native-tp2pp2"])["layout_detail"]
    assert d["form"] == "symmetric" and d["world_size"] == 4 and len(d["pipelines"]) == 1
    stages = d["pipelines"][0]["stages"]
    assert [(s["stage"], s["layers"], s["tp"], s["ranks"]) for s in stages] == \
        [(0, [0, 1], 2, [0, 1]), (1, [2, 3], 2, [2, 3])]


def test_inspect_profile_store_as_stored(kinds):
    """A store in a profile is shown in its profile's tensors, not in its canonical view."""
    man = json.loads((kinds["profile-store"] / "manifest.json").read_text())
    got = ckpt.inspect(kinds["profile-store"])
    assert sorted(t["name"] for t in got["tensors"]) == sorted(t["name"] for t in man["tensors"])
    assert got["profile"] == "paddlenlp"
    with ckpt.open(kinds["profile-store"]) as ck:  # the canonical view has other names
        assert sorted(ck.keys()) != sorted(t["name"] for t in man["tensors"])


# ---- export_dcp ------------------------------------------------------------------------------

def test_export_dcp_loads_in_torch(kinds, model, tmp_path):
    calls = []
    out = tmp_path / "dcp"
    res = ckpt.export_dcp(kinds["native-tp2pp2"], out, files=3, source_chunks=True, max_memory="1M", fsync=False,
                          progress=lambda done, total: calls.append((done, total)))
    sd = _dcp_load(out, model)
    assert set(sd) == set(model)
    for k, v in model.items():
        assert np.array_equal(sd[k].numpy(), v), k
    md = dcp.FileSystemReader(str(out)).read_metadata()
    assert res["chunks"] == sum(len(m.chunks) for m in md.state_dict_metadata.values()) > len(model)
    assert sorted(f.name for f in out.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    assert calls and calls[-1][0] == calls[-1][1] == res["bytes"]
    assert all(a[0] <= b[0] for a, b in zip(calls, calls[1:]))
    cli_out = tmp_path / "dcp_cli"
    cli = json.loads(run_cli("export-dcp", kinds["native-tp2pp2"], cli_out, "--files", 3, "--source-chunks",
                             "--max-memory", "1M", "--no-fsync", "--json").stdout)
    assert {**res, "out": None} == {**cli, "out": None}
    assert res["out"] == str(out) and res["source_check"]["how"] == "process"


def test_export_dcp_from_megatron_with_cast(kinds, model, tmp_path):
    out = tmp_path / "dcp_bf16"
    res = ckpt.export_dcp(kinds["megatron-torch-dist"], out, dtype="bf16", verify_source=False)
    assert res["source_check"] == {"how": "none"} and res["tensors"] == len(model)
    sd = _dcp_load(out, model, torch.bfloat16)
    for k, v in model.items():
        assert torch.equal(sd[k], torch.from_numpy(v).to(torch.bfloat16)), k


# ---- export_megatron -------------------------------------------------------------------------

def test_export_megatron_matches_reference_and_cli(kinds, model, tmp_path):
    out, cli_out = tmp_path / "meg", tmp_path / "meg_cli"
    res = ckpt.export_megatron(kinds["native"], out, tp=2, pp=2, pp_layers="1,3", vocab_divisor=8)
    expected = ref.megatron_shards(CFG, model, 2, 2, [1, 3], 8)
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == sorted(expected)
    for rd, tensors in expected.items():
        got = load_file(str(out / rd / "model.safetensors"))
        assert sorted(got) == sorted(tensors), rd
        for name, want in tensors.items():
            assert got[name].dtype == want.dtype and np.array_equal(got[name], want), f"{rd}/{name}"
    cli = json.loads(run_cli("export-megatron", kinds["native"], cli_out, "--tp", 2, "--pp", 2, "--pp-layers", "1,3",
                             "--vocab-divisor", 8, "--json").stdout)
    assert {**res, "out": None} == {**cli, "out": None}
    assert res == {"out": str(out), "format": "safetensors", "tp": 2, "pp": 2, "vpp": 1, "iteration": 0,
                   "dist_opt": False, "dp": 1, "source_check": res["source_check"], "io": res["io"]}
    files = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(cli_out) for p in cli_out.rglob("*") if p.is_file())
    for f in files:
        assert (out / f).read_bytes() == (cli_out / f).read_bytes(), f


def test_export_megatron_torch_reads_back(kinds, model, tmp_path):
    out = tmp_path / "meg_torch"
    res = ckpt.export_megatron(kinds["native"], out, tp=1, pp=2, format="torch", iteration=7)
    assert res["format"] == "torch" and res["iteration"] == 7
    assert (out / "latest_checkpointed_iteration.txt").read_text().strip() == "7"
    with ckpt.open(out) as ck:
        for name, want in model.items():
            assert np.array_equal(ck.read(name), want), name


# ---- errors ----------------------------------------------------------------------------------

CLI_ERROR = re.compile(r"^ckpt: (.+?) \[(\w+)\]", re.M)


def _junk(tmp_path):
    d = tmp_path / "junk"
    d.mkdir(exist_ok=True)
    (d / "x.txt").write_text("x")
    return d


def _existing(tmp_path):
    d = tmp_path / "existing"
    d.mkdir(exist_ok=True)
    (d / "keep").write_text("x")
    return d


def _truncated(tmp_path, kinds):
    f = tmp_path / "bad.safetensors"
    data = kinds["safetensors"].read_bytes()
    f.write_bytes(data[: len(data) // 2])
    return f


# (id, python call (kinds, tmp_path, dst), CLI args (kinds, tmp_path, dst), the ckpt.Error subclass)
ERROR_CASES = [
    ("inspect-missing", lambda k, t, d: ckpt.inspect(t / "nowhere"),
     lambda k, t, d: ["inspect", t / "nowhere"], "NotFoundError"),
    ("inspect-junk", lambda k, t, d: ckpt.inspect(_junk(t)),
     lambda k, t, d: ["inspect", _junk(t)], "UnsupportedError"),
    ("dcp-dtype", lambda k, t, d: ckpt.export_dcp(k["native"], d, dtype="int8"),
     lambda k, t, d: ["export-dcp", k["native"], d, "--dtype", "int8"], "InvalidArgumentError"),
    ("dcp-max-memory", lambda k, t, d: ckpt.export_dcp(k["native"], d, max_memory="lots"),
     lambda k, t, d: ["export-dcp", k["native"], d, "--max-memory", "lots"], "InvalidArgumentError"),
    ("dcp-existing", lambda k, t, d: ckpt.export_dcp(k["native"], _existing(t)),
     lambda k, t, d: ["export-dcp", k["native"], _existing(t)], "InvalidArgumentError"),
    ("dcp-truncated", lambda k, t, d: ckpt.export_dcp(_truncated(t, k), d),
     lambda k, t, d: ["export-dcp", _truncated(t, k), d], "CorruptionError"),
    ("dcp-missing", lambda k, t, d: ckpt.export_dcp(t / "nowhere", d),
     lambda k, t, d: ["export-dcp", t / "nowhere", d], "NotFoundError"),
    ("megatron-tp", lambda k, t, d: ckpt.export_megatron(k["native"], d, tp=3),
     lambda k, t, d: ["export-megatron", k["native"], d, "--tp", 3], "InvalidArgumentError"),
    ("megatron-pp-layers", lambda k, t, d: ckpt.export_megatron(k["native"], d, pp=2, pp_layers=[1, 2]),
     lambda k, t, d: ["export-megatron", k["native"], d, "--pp", 2, "--pp-layers", "1,2"], "InvalidArgumentError"),
    ("megatron-no-config", lambda k, t, d: ckpt.export_megatron(k["dcp"], d),
     lambda k, t, d: ["export-megatron", k["dcp"], d], "NotFoundError"),
]


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c[0])
def test_errors_as_the_cli(kinds, tmp_path, case):
    _, call, cli_args, cls = case
    dst = tmp_path / "out"
    p = run_cli(*cli_args(kinds, tmp_path, tmp_path / "out_cli"), check=False)
    m = CLI_ERROR.search(p.stderr)
    assert p.returncode not in (0, 70) and m, p.stderr
    with pytest.raises(ckpt.Error) as ei:
        call(kinds, tmp_path, dst)
    e = ei.value
    assert type(e).__name__ == cls and (e.kind, e.code) == (m.group(1), m.group(2)), (e.kind, e.code, p.stderr)
    assert no_partial(dst) and no_partial(tmp_path / "out_cli")
    if (tmp_path / "existing").exists():
        assert [f.name for f in (tmp_path / "existing").iterdir()] == ["keep"]


def test_python_only_range_errors(kinds, tmp_path):
    """Values the CLI's own flag checks refuse before any job runs are refused by the jobs too."""
    dst = tmp_path / "out"
    for call, flag in ((lambda: ckpt.export_dcp(kinds["native"], dst, files=0), "--files"),
                       (lambda: ckpt.export_dcp(kinds["native"], dst, threads=0), "--threads"),
                       (lambda: ckpt.export_megatron(kinds["native"], dst, format="xyz"), "--format"),
                       (lambda: ckpt.export_megatron(kinds["native"], dst, pp=0), "--pp"),
                       (lambda: ckpt.export_megatron(kinds["native"], dst, iteration=-1), "--iteration")):
        with pytest.raises(ckpt.InvalidArgumentError, match=flag):
            call()
        assert no_partial(dst)
    opts = {"dtype": "", "files": 1, "source_chunks": False, "threads": 2, "max_memory": "256M", "fsync": True,
            "verify_source": True, "source_profile": "", "bogus": 1}
    with pytest.raises(TypeError, match="unknown option"):
        ckpt._ckpt._export_dcp(str(kinds["native"]), str(dst), opts, None)
    assert no_partial(dst)
