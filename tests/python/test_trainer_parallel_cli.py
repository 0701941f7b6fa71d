"""`ckpt train` under mpirun, from the command line.

- Resume on another layout: the reconfiguration matrix (symmetric and general layouts, 20 steps,
  checkpoint at 10, a new launch on another layout) is test_trainer_reconfig.py; its helpers and
  tolerances (and why `ckpt diff` needs an atol of 5e-6) are in trainer_runs.py. Here, only the
  8-rank layout (above the matrix's rank budget) resumes one process's checkpoint: steps 11-20
  within 1e-5 relative of the uninterrupted one-process run.
- Checkpoints of parallel runs pass `ckpt verify`, `ckpt inspect --json` shows their layout, and
  one written by 8 ranks (tp2 pp2 dp2 zero-1) resharded offline to one process equals the
  one-process run's checkpoint of the same step.
- Faults: a rank SIGKILLed while writing its shard of step S (CKPT_TEST_KILL_IN_SAVE=R:S) ends the
  job nonzero within the timeout, `latest` names the previous checkpoint, which resumes on another
  layout; a corrupt or missing piece in the resume source stops every rank with the same error
  naming it, before any step.
- Invalid layouts are refused before any work, with a message naming the problem.

Every layout of one test runs the same global batch (12 sequences of 8 tokens per step).
"""
import json
import pathlib
import re
import shutil
import sys

import h5py
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON  # noqa: E402
from trainer_runs import (CONFIG, MID, STEPS, Runs, Sym, assert_losses_close, assert_same_checkpoint,  # noqa: E402
                          ckpt, launch, log, run, step_dir, step_lines, ckpt_path, COMMON)

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)

# name -> layout; every one is 12 sequences per step.
LAYOUTS = {
    "one": Sym(1, ["--micro-batch", 12]),
    "tp2": Sym(2, ["--tp", 2, "--micro-batch", 6, "--grad-accum", 2]),
    "tp4": Sym(4, ["--tp", 4, "--micro-batch", 12]),
    "pp123": Sym(3, ["--pp", 3, "--pp-layers", "1,2,3", "--micro-batch", 3, "--grad-accum", 4]),
    "dp321": Sym(3, ["--dp", 3, "--micro-batches", "3,2,1", "--grad-accum", 2]),
    "dp2z1": Sym(2, ["--dp", 2, "--zero", 1, "--micro-batch", 3, "--grad-accum", 2]),
    "tp2pp2dp2z1": Sym(8, ["--tp", 2, "--pp", 2, "--pp-layers", "2,4", "--dp", 2, "--zero", 1,
                           "--micro-batch", 2, "--grad-accum", 3]),
}
LAYOUT_OF = {  # what inspect --json must show: (tp, pp, dp, zero, layers_per_stage, micro_batch)
    "one": (1, 1, 1, 0, [6], [12]), "tp2": (2, 1, 1, 0, [6], [6]), "tp4": (4, 1, 1, 0, [6], [12]),
    "pp123": (1, 3, 1, 0, [1, 2, 3], [3]), "dp321": (1, 1, 3, 0, [6], [3, 2, 1]),
    "dp2z1": (1, 1, 2, 1, [6], [3, 3]), "tp2pp2dp2z1": (2, 2, 2, 1, [2, 4], [2, 2]),
}


def train_cmd(n, cfg, layout_args, *args, tag=False):
    """`ckpt train` of config `cfg` with the layout flags `layout_args` on n processes."""
    return launch(n, [ckpt_path(), "train", "--config", cfg, *COMMON, *layout_args, *args], tag=tag)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("parallel_runs"), LAYOUTS)


def assert_inspect_shows(ckpt_dir, name, step):
    """inspect --json of a checkpoint of layout `name`: its step, its layout, a shard file per rank."""
    j = json.loads(ckpt("inspect", "--json", ckpt_dir).stdout)
    assert j["step"] == step
    lay = j["layout"]
    got = (lay["tp"], lay["pp"], lay["dp"], lay["zero"], lay["layers_per_stage"], lay["micro_batch"])
    assert got == LAYOUT_OF[name], f"inspect of {ckpt_dir} shows {lay}"
    assert j["totals"]["files"] == LAYOUTS[name].n, f"every rank writes its own shard file: {j['totals']}"


@pytest.mark.parametrize("name", ["tp4", "pp123", "dp321", "dp2z1", "tp2pp2dp2z1"])
def test_checkpoints_verify_and_show_their_layout(runs, name):
    full = runs.full(name)
    for s in (MID, STEPS):
        v = json.loads(ckpt("verify", "--json", full / step_dir(s)).stdout)
        assert v["ok"] and v["structure_ok"] and not v["failures"], v
    assert_inspect_shows(full, name, STEPS)


def test_eight_rank_checkpoint_resharded_to_one_process_equals_one_process_run(runs, tmp_path):
    res = runs.resumed("one", "tp2pp2dp2z1")
    assert len(step_lines(runs.done[res].stdout)) == STEPS - MID, runs.done[res].stdout
    assert_losses_close(log(runs.full("one")), log(res), range(MID + 1, STEPS + 1))
    src = res / step_dir(STEPS)
    assert json.loads(ckpt("inspect", "--json", src).stdout)["layout"]["tp"] == 2
    dst = tmp_path / "one"
    ckpt("reshard", src, dst, "--tp", 1, "--pp", 1, "--dp", 1, "--zero", 0)
    lay = json.loads(ckpt("inspect", "--json", dst).stdout)["layout"]
    assert (lay["tp"], lay["pp"], lay["dp"], lay["zero"]) == (1, 1, 1, 0)
    ckpt("verify", dst)
    assert_same_checkpoint(runs.full("one") / step_dir(STEPS), dst)
    # Also an 8-rank run from scratch at step 10, against the one-process run.
    assert_same_checkpoint(runs.full("one") / step_dir(MID), runs.full("tp2pp2dp2z1") / step_dir(MID))


@pytest.mark.parametrize("name,rank,other", [("dp2z1", 1, "tp2"), ("pp123", 0, "one")])
def test_rank_killed_in_background_save(runs, tmp_path, name, rank, other):
    """Rank `rank` SIGKILLs itself while writing its shard of step 10 (checkpoints every 5)."""
    out = tmp_path / "killed"
    p = runs.train(name, out, "--steps", STEPS, "--save-every", 5,
                   env={"CKPT_TEST_KILL_IN_SAVE": f"{rank}:10"}, check=False)
    assert p.returncode != 0, f"the job survived a killed rank:\n{p.stdout[-2000:]}"
    assert (out / "latest").read_text().strip() == step_dir(5)
    assert (out / step_dir(5) / "manifest.json").exists()
    assert not (out / step_dir(10) / "manifest.json").exists()
    ckpt("verify", out / step_dir(5))
    # Resume the previous complete checkpoint on another layout: the uninterrupted run's losses.
    again = tmp_path / "again"
    runs.train(other, again, "--steps", MID, "--resume", out)  # a run dir: follows `latest`
    assert_losses_close(log(runs.full(name)), log(again), range(6, MID + 1))
    assert_same_checkpoint(runs.full(name) / step_dir(MID), again / step_dir(MID))


def tagged(out):
    """{rank: [lines]} of mpirun --tag-output text ('[job,rank]<stderr>:line')."""
    by_rank = {}
    for line in out.splitlines():
        m = re.match(r"^\[\d+,(\d+)\]<std(?:out|err)>:\s?(.*)$", line)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    return by_rank


def assert_every_rank_stops_with(p, n, needle):
    assert p.returncode != 0, p.stdout[-2000:]
    assert not step_lines(p.stdout), f"steps ran from a damaged source:\n{p.stdout[-2000:]}"
    ranks = tagged(p.stdout + "\n" + p.stderr)
    msgs = {}
    for r in range(n):
        hits = [l for l in ranks.get(r, []) if needle in l and "ckpt" in l]
        assert hits, f"rank {r} did not report {needle!r}: {ranks.get(r)}\n{p.stderr[-3000:]}"
        msgs[r] = hits[0]
    assert len(set(msgs.values())) == 1, f"ranks report different errors: {msgs}"


def damaged_source(runs, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(runs.full("pp123") / step_dir(MID), src)
    man = json.loads((src / "manifest.json").read_text())
    return src, man


def test_corrupt_piece_in_resume_source(runs, tmp_path):
    src, man = damaged_source(runs, tmp_path)
    name = "model.layers.3.mlp.down_proj.weight"
    piece = next(p for p in man["pieces"] if p["tensor"] == name)
    with h5py.File(src / piece["file"], "r") as f:
        off = f[piece["dataset"]].id.get_offset()
    assert off is not None, "expected a contiguous dataset"
    with open(src / piece["file"], "r+b") as fh:
        fh.seek(off + 16)
        b = fh.read(4)
        fh.seek(off + 16)
        fh.write(bytes(x ^ 0x5A for x in b))
    n = LAYOUTS["tp2"].n
    p = run(runs.train_cmd("tp2", "--out", tmp_path / "out", "--steps", STEPS, "--resume", src, tag=True),
            check=False)
    assert_every_rank_stops_with(p, n, name)
    assert not (tmp_path / "out" / step_dir(MID + 1)).exists()


def test_missing_shard_file_in_resume_source(runs, tmp_path):
    src, man = damaged_source(runs, tmp_path)
    gone = sorted({p["file"] for p in man["pieces"]})[-1]
    (src / gone).unlink()
    n = LAYOUTS["dp2z1"].n
    p = run(runs.train_cmd("dp2z1", "--out", tmp_path / "out", "--steps", STEPS, "--resume", src, tag=True),
            check=False)
    assert_every_rank_stops_with(p, n, pathlib.Path(gone).name)


KV2 = dict(CONFIG, num_key_value_heads=2)
INVALID = [  # (id, config, processes, flags, regex the message must match)
    ("world-size", CONFIG, 3, ["--tp", 2], r"(?s)tp\*pp\*dp = 2.*3"),
    ("tp-heads", CONFIG, 3, ["--tp", 3], r"tp=3 does not divide num_attention_heads=4"),
    ("tp-kv-heads", KV2, 4, ["--tp", 4], r"tp=4.*num_key_value_heads=2"),
    ("empty-stage", CONFIG, 3, ["--pp", 3, "--pp-layers", "0,3,3"], r"stage 0 .*0 layers|stage 0 holds no layer"),
    ("micro-batches", CONFIG, 3, ["--dp", 3, "--micro-batches", "1,2"], r"--micro-batches gives 2 .*dp=3"),
]


@pytest.mark.parametrize("case", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_layout_refused_before_any_work(tmp_path, case):
    _, config, n, flags, pattern = case
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    out = tmp_path / "out"
    p = run(train_cmd(n, cfg, flags, "--out", out, "--steps", 2), check=False)
    assert p.returncode != 0, p.stdout
    assert re.search(pattern, p.stderr), f"message does not match {pattern!r}:\n{p.stderr[-2000:]}"
    assert not step_lines(p.stdout), p.stdout
    assert not (out / "train_log.jsonl").exists() and not list(out.glob("step-*"))


def _general(pipelines, zero=0):
    """A general layout (reshard/layout/layout.h): [(micro_batch, [(layers, tp, device), ..]), ..]."""
    return {"pipelines": [{"micro_batch": mb, "stages": [{"layers": n, "tp": t, "device": d} for n, t, d in st]}
                          for mb, st in pipelines], "zero": zero, "num_layers": 6, "vocab_divisor": 128,
            "profile": "reference", "rank_order": "tp-dp-pp"}


# FlashFlex style: pipeline 0 = [2 layers tp 2 | 4 layers tp 1], pipeline 1 = [3 | 3]; 5 ranks;
# 12 sequences per step like LAYOUTS (grad-accum 2 x (4 + 2)).
FLASHFLEX = _general([(4, [(2, 2, "A"), (4, 1, "B")]), (2, [(3, 1, "B"), (3, 1, "C")])])


def test_general_layout_trains_like_one_process(runs, tmp_path):
    """`ckpt train --layout FILE` on a general layout (no checkpoint: the planner's general form
    is another branch's): the first steps' losses equal the one-process run's."""
    lf = tmp_path / "flashflex.json"
    lf.write_text(json.dumps(FLASHFLEX))
    p = run(train_cmd(5, runs.cfg, ["--layout", lf, "--grad-accum", 2], "--steps", 4))
    got = [{"step": int(m.group(1)), "loss": float(m.group(2))}
           for m in (re.search(r"step\s+(\d+) \| loss ([0-9.]+)", l) for l in step_lines(p.stdout)) if m]
    ref = [json.loads(l) for l in (runs.full("one") / "train_log.jsonl").read_text().splitlines()]
    assert_losses_close(ref, got, range(1, 5))


GENERAL_INVALID = [  # (id, config, processes, layout, extra flags, regex the message must match)
    ("stage-tp-heads", CONFIG, 4, _general([(1, [(3, 1, "A"), (3, 1, "B")]), (1, [(3, 3, "C"), (3, 1, "B")])]), [],
     r"pipeline 1 stage 0.*tp=3 does not divide num_attention_heads=4"),
    ("stage-tp-kv-heads", KV2, 5, _general([(1, [(2, 1, "A"), (4, 4, "B")])]), [],
     r"pipeline 0 stage 1: tp=4 does not divide num_key_value_heads=2"),
    ("world-size", CONFIG, 3, FLASHFLEX, [], r"sum of its stages' tp = 5 processes, but 3"),
    ("micro-batches", CONFIG, 5, FLASHFLEX, ["--micro-batches", "1,2,3"], r"gives 3 sizes, but the layout has 2 pipelines"),
]


@pytest.mark.parametrize("case", GENERAL_INVALID, ids=[c[0] for c in GENERAL_INVALID])
def test_invalid_general_layout_refused_before_any_work(tmp_path, case):
    _, config, n, layout, flags, pattern = case
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(config))
    lf = tmp_path / "layout.json"
    lf.write_text(json.dumps(layout))
    p = run(train_cmd(n, cfg, ["--layout", lf, *flags], "--steps", 2), check=False)
    assert p.returncode != 0, p.stdout
    assert re.search(pattern, p.stderr), f"message does not match {pattern!r}:\n{p.stderr[-2000:]}"
    assert not step_lines(p.stdout), p.stdout
