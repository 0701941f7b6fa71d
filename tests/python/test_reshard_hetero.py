"""`ckpt reshard` / `diff` / `verify` / `to-hf` / `inspect` with general (heterogeneous) layouts,
through the real CLI, on trainer checkpoints with optimizer state (`ckpt train`, one process).

- Into (a) FlagScale-style meshes (2 pipelines, stage 0 at tp 2 on device A, stage 1 at tp 1 on
  device B, ZeRO-1), (b) FlashFlex-style pipelines (different stage splits and per-stage tp,
  different micro-batches), (c) a tied-embedding model with tp 2 on the first stage and tp 1 on
  the last (2 uniform pipelines, ZeRO-1: flat ranges of overlapping boxes) - and back to the
  source layout: the same manifest and shard files byte for byte as the source; `ckpt diff` equal;
  `ckpt verify` ok.
- `mpirun -np 2 ckpt reshard` into (a): byte-identical to one process.
- `ckpt to-hf` of (b) equals the HF export of the source (both read with safetensors).
- `ckpt inspect --json` lists the pipelines, stages (layers, tp, device) and ranks.
- Bad layouts (ZeRO-1 over non-uniform pipelines, tp not dividing the heads on one stage,
  pipelines covering different layer counts) are refused, naming the stage, nothing written.
"""
import hashlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON, mpirun_cmd  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "fixtures" / "tiny_llama.json"  # 4 layers, 4 heads, 2 KV heads, ffn 176

FLAGSCALE = {"pipelines": [{"micro_batch": 2, "stages": [{"layers": 2, "tp": 2, "device": "A"},
                                                         {"layers": 2, "tp": 1, "device": "B"}]}] * 2, "zero": 1}
FLASHFLEX = {"pipelines": [{"micro_batch": 3, "stages": [{"layers": 1, "tp": 2, "device": "A"},
                                                         {"layers": 3, "tp": 1, "device": "B"}]},
                           {"micro_batch": 1, "stages": [{"layers": 3, "tp": 1, "device": "B"},
                                                         {"layers": 1, "tp": 4, "device": "C"}]}], "zero": 0}
TIED = {"pipelines": [{"micro_batch": 1, "stages": [{"layers": 1, "tp": 2, "device": "A"},
                                                    {"layers": 3, "tp": 1, "device": "B"}]}] * 2, "zero": 1}


def digest(d):
    d = pathlib.Path(d)
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}


def write_json(path, obj):
    path.write_text(json.dumps(obj))
    return path


@pytest.fixture(scope="module")
def sources(ckpt_bin, tmp_path_factory):
    """Trainer checkpoints (2 steps, Adam state) of the tiny model, untied and tied."""
    root = tmp_path_factory.mktemp("hetero_src")
    tied_cfg = json.loads(TINY.read_text())
    tied_cfg["tie_word_embeddings"] = True
    out = {}
    for name, cfg in (("untied", TINY), ("tied", write_json(root / "tied.json", tied_cfg))):
        run = root / name
        subprocess.run([ckpt_bin, "train", "--config", str(cfg), "--steps", "2", "--micro-batch", "2", "--seq-len", "16",
                        "--threads", "1", "--seed", "5", "--out", str(run)], check=True, capture_output=True, text=True)
        ck = run / (run / "latest").read_text().strip()
        out[name] = ck
    return out


def source_layout_file(src, tmp_path):
    lay = json.loads((src / "manifest.json").read_text())["layout"]
    return write_json(tmp_path / "src_layout.json", lay)


@pytest.mark.parametrize("case", ["flagscale", "flashflex", "tied"])
def test_general_layout_and_back_byte_identical(case, sources, run_ckpt, tmp_path):
    src = sources["tied" if case == "tied" else "untied"]
    layout = {"flagscale": FLAGSCALE, "flashflex": FLASHFLEX, "tied": TIED}[case]
    lf = write_json(tmp_path / "general.json", layout)
    mid, back = tmp_path / "mid", tmp_path / "back"
    run_ckpt("reshard", src, mid, "--layout", lf)
    man = json.loads((mid / "manifest.json").read_text())
    assert man["layout"]["pipelines"] == layout["pipelines"]
    world = sum(st["tp"] for pl in layout["pipelines"] for st in pl["stages"])
    assert len(list((mid / "shards").iterdir())) <= world
    run_ckpt("verify", mid)
    d = run_ckpt("diff", src, mid, check=False)
    assert d.returncode == 0, d.stdout + d.stderr
    run_ckpt("reshard", mid, back, "--layout", source_layout_file(src, tmp_path))
    assert (back / "manifest.json").read_bytes() == (src / "manifest.json").read_bytes()
    assert digest(back) == digest(src)
    # inspect --json: the pipelines, each stage's layers, tp, device and ranks (stage slowest,
    # then pipeline, then tp rank).
    j = json.loads(run_ckpt("inspect", mid, "--json").stdout)
    det = j["layout_detail"]
    assert det["form"] == "general" and det["world_size"] == world
    assert [len(p["stages"]) for p in det["pipelines"]] == [len(p["stages"]) for p in layout["pipelines"]]
    ranks, expect = [], {}
    for p, pl in enumerate(det["pipelines"]):
        assert pl["micro_batch"] == layout["pipelines"][p]["micro_batch"]
        first = 0
        for s, st in enumerate(pl["stages"]):
            want = layout["pipelines"][p]["stages"][s]
            assert (st["tp"], st["device"], st["layers"]) == (want["tp"], want["device"], [first, first + want["layers"] - 1])
            first += want["layers"]
            ranks += st["ranks"]
            expect[(s, p)] = st["ranks"]
    assert sorted(ranks) == list(range(world))
    order = [r for key in sorted(expect) for r in expect[key]]  # by (stage, pipeline)
    assert order == list(range(world))
    text = run_ckpt("inspect", mid).stdout
    assert "pipeline 0" in text and "device " + layout["pipelines"][0]["stages"][0]["device"] in text


def test_to_hf_of_general_layout_equals_source_export(sources, run_ckpt, tmp_path):
    from safetensors.numpy import load_file
    src = sources["untied"]
    mid = tmp_path / "mid"
    run_ckpt("reshard", src, mid, "--layout", write_json(tmp_path / "ff.json", FLASHFLEX))
    run_ckpt("to-hf", src, tmp_path / "hf_src", "--no-fsync")
    run_ckpt("to-hf", mid, tmp_path / "hf_mid", "--no-fsync")

    def load(d):
        out = {}
        for f in sorted(d.glob("*.safetensors")):
            out.update(load_file(str(f)))
        return out

    a, b = load(tmp_path / "hf_src"), load(tmp_path / "hf_mid")
    assert a.keys() == b.keys() and len(a) > 0
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert np.array_equal(a[k], b[k]), k


@pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
def test_mpirun_into_general_layout_byte_identical(sources, ckpt_bin, run_ckpt, tmp_path):
    src = sources["untied"]
    lf = write_json(tmp_path / "fs.json", FLAGSCALE)
    one, two = tmp_path / "one", tmp_path / "two"
    run_ckpt("reshard", src, one, "--layout", lf)
    p = subprocess.run(mpirun_cmd(2, ckpt_bin, "reshard", src, two, "--layout", lf), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert digest(two) == digest(one)


BAD = [
    ({"pipelines": [{"stages": [{"layers": 2, "tp": 2}, {"layers": 2, "tp": 1}]},
                    {"stages": [{"layers": 1, "tp": 1}, {"layers": 3, "tp": 1}]}], "zero": 1},
     ["zero=1", "stage 0"]),
    ({"pipelines": [{"stages": [{"layers": 4, "tp": 2}]},
                    {"stages": [{"layers": 1, "tp": 1}, {"layers": 3, "tp": 3}]}], "zero": 0},
     ["pipeline 1 stage 1", "num_attention_heads"]),
    ({"pipelines": [{"stages": [{"layers": 4, "tp": 2}]}, {"stages": [{"layers": 3, "tp": 1}]}], "zero": 0},
     ["pipeline 1 holds 3 layers"]),
]


@pytest.mark.parametrize("bad,needles", BAD)
def test_bad_general_layouts_refused(bad, needles, sources, run_ckpt, tmp_path):
    dst = tmp_path / "dst"
    p = run_ckpt("reshard", sources["untied"], dst, "--layout", write_json(tmp_path / "bad.json", bad), check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr
    assert not dst.exists() and not pathlib.Path(str(dst) + ".partial").exists()
