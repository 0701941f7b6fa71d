"""The reconfiguration matrix: training goes on with the same losses when
the cluster changes under it.

Each transition A -> B: 20 steps uninterrupted on layout A with a checkpoint at step 10 (shared by
the transitions from A), then a new launch (mpirun, or one process) on layout B resumes A's step-10
checkpoint to step 20. Oracle: the uninterrupted run on A. Steps 11-20 of the resumed run within
1e-5 relative of the uninterrupted run's losses (train_log.jsonl); `ckpt diff --rtol 1e-5 --atol
5e-6` of the two step-20 checkpoints equal (trainer_runs.py says why that atol); the resumed
run's step-20 checkpoint shows layout B in `ckpt inspect --json`, one shard file per rank.

Layouts (a 6-layer model, 12 sequences of 8 tokens per step on every layout, at most 6 ranks):
symmetric ones from the flags, and general ones (pipelines of stages, each stage with its layers,
tp and device type) from layout files, with a cluster file (--cluster) naming the device type of
every rank when the stages name one. `mesh_a` and `flex_b` are the README's main job (scripts/demo.sh,
fixtures/demo/layout_a_flagscale.json = layout_a.json, layout_b.json) on this test's smaller model.
"""
import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from mpi_ranks import MPIRUN, SKIP_REASON  # noqa: E402
from trainer_runs import STEPS, Gen, Runs, Sym, ckpt, step_dir  # noqa: E402

pytestmark = pytest.mark.skipif(MPIRUN is None, reason=SKIP_REASON)
FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "demo"


def st(layers, tp=1, device=None):
    return dict(layers=layers, tp=tp, **({"device": device} if device else {}))


def demo_layout(name, grad_accum, file=None):
    j = json.loads((FIXTURES / name).read_text())
    return Gen(j["pipelines"], j.get("zero", 0), grad_accum, file=file)


LAYOUTS = {
    # symmetric (flags)
    "one": Sym(1, ["--micro-batch", 12]),
    "tp2": Sym(2, ["--tp", 2, "--micro-batch", 6, "--grad-accum", 2]),
    "tp4": Sym(4, ["--tp", 4, "--micro-batch", 12]),
    "pp123": Sym(3, ["--pp", 3, "--pp-layers", "1,2,3", "--micro-batch", 3, "--grad-accum", 4]),
    "pp321": Sym(3, ["--pp", 3, "--pp-layers", "3,2,1", "--micro-batch", 4, "--grad-accum", 3]),
    "dp321": Sym(3, ["--dp", 3, "--micro-batches", "3,2,1", "--grad-accum", 2]),
    "dp2z1": Sym(2, ["--dp", 2, "--zero", 1, "--micro-batch", 3, "--grad-accum", 2]),
    "dp3z0": Sym(3, ["--dp", 3, "--zero", 0, "--micro-batches", "1,1,2", "--grad-accum", 3]),
    "pp2dp2": Sym(4, ["--pp", 2, "--pp-layers", "3,3", "--dp", 2, "--micro-batch", 3, "--grad-accum", 2]),
    # FlagScale-style meshes (6 ranks): 2 pipelines x [2 layers tp1 on hbm-large | 4 layers tp2 on
    # fast], micro-batches 4 and 2, ZeRO-1 (the pipelines hold the same parameters). Trained from
    # the FlagScale-style file (hetero_process_meshes...), checked against its general form.
    "mesh_a": demo_layout("layout_a.json", 2, file=FIXTURES / "layout_a_flagscale.json"),
    # FlashFlex-style (5 ranks): the hbm-large ranks replaced by vendor-c, fewer ranks; the two
    # pipelines split the layers differently ([2 tp2 | 4 tp1] and [4 tp1 | 2 tp1]), replicated state.
    "flex_b": demo_layout("layout_b.json", 2),
    # mesh_a with the stages' tp swapped (tp2 first, on fast; then tp1 on hbm-large).
    "mesh_a_tp21": Gen([{"micro_batch": m, "stages": [st(2, 2, "fast"), st(4, 1, "hbm-large")]} for m in (4, 2)],
                       zero=1, grad_accum=2),
    # mesh_a, optimizer state replicated over the pipelines (ZeRO-0).
    "mesh_a_z0": Gen(demo_layout("layout_a.json", 2).pipelines, zero=0, grad_accum=2),
    # mesh_a with the hbm-large type removed: 4 ranks of one type, uneven stages.
    "fast4": Gen([{"micro_batch": 3, "stages": [st(2, 1, "fast"), st(4, 1, "fast")]}] * 2, zero=1, grad_accum=2),
    # mesh_a with a third type added: pipeline 1's second stage on vendor-c at tp1 (5 ranks).
    "mesh_a_plus_c": Gen([{"micro_batch": 4, "stages": [st(2, 1, "hbm-large"), st(4, 2, "fast")]},
                          {"micro_batch": 2, "stages": [st(2, 1, "hbm-large"), st(4, 1, "vendor-c")]}],
                         zero=0, grad_accum=2),
    # 3 device types as data-parallel replicas (micro-batches 3, 2, 1) / as pipeline stages [1,2,3].
    "dp_3types": Gen([{"micro_batch": m, "stages": [st(6, 1, d)]}
                      for m, d in ((3, "vendor-c"), (2, "hbm-large"), (1, "fast"))], zero=0, grad_accum=2),
    "pp_3types": Gen([{"micro_batch": 3, "stages": [st(1, 1, "vendor-c"), st(2, 1, "hbm-large"), st(3, 1, "fast")]}],
                     zero=0, grad_accum=4),
    # two pipelines without device names but different splits and tp (4 ranks).
    "flex_plain": Gen([{"micro_batch": 2, "stages": [st(1, 2), st(5, 1)]},
                       {"micro_batch": 4, "stages": [st(6, 1)]}], zero=0, grad_accum=2),
}

# (A, B, what the transition stands for). Symmetric pairs (absorbed from test_trainer_parallel_cli).
SYMMETRIC_PAIRS = [
    ("pp123", "tp2", "pipeline -> tensor parallel"),
    ("dp321", "dp2z1", "hetero micro-batches -> ZeRO-1"),
    ("tp4", "one", "tp4 -> one process"),
    ("pp123", "pp321", "uneven pipeline reversed"),
    ("dp2z1", "dp3z0", "ZeRO-1 -> replicated state, more ranks"),
]
# Pairs with a general (heterogeneous) layout on at least one side.
HETERO_PAIRS = [
    ("pp2dp2", "flex_b", "symmetric -> asymmetric pipelines"),
    ("flex_b", "pp2dp2", "asymmetric -> symmetric pipelines"),
    ("mesh_a", "flex_b", "the README's main job: a type replaced, fewer ranks, ZeRO-1 -> replicated"),
    ("mesh_a", "fast4", "a device type removed (6 -> 4 ranks)"),
    ("mesh_a", "mesh_a_plus_c", "a device type added"),
    ("mesh_a", "mesh_a_tp21", "per-stage tp changed"),
    ("mesh_a", "mesh_a_z0", "ZeRO-1 -> replicated state"),
    ("dp_3types", "pp_3types", "hetero DP -> hetero PP"),
    ("flex_b", "one", "asymmetric -> one process"),
    ("one", "flex_plain", "one process -> asymmetric pipelines without device types"),
]
PAIRS = SYMMETRIC_PAIRS + HETERO_PAIRS


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("reconfig_runs"), LAYOUTS)


def expected_layout(name):
    """The layout inspect --json must show for `name` (the keys that describe it)."""
    spec = LAYOUTS[name]
    if isinstance(spec, Gen):
        return {"pipelines": spec.pipelines, "zero": spec.zero}
    f = [str(x) for x in spec.flags]

    def flag(k, d):
        return int(f[f.index(k) + 1]) if k in f else d
    tp, pp, dp = flag("--tp", 1), flag("--pp", 1), flag("--dp", 1)
    per = [int(x) for x in f[f.index("--pp-layers") + 1].split(",")] if "--pp-layers" in f else [6 // pp] * pp
    mbs = [int(x) for x in f[f.index("--micro-batches") + 1].split(",")] if "--micro-batches" in f \
        else [flag("--micro-batch", 1)] * dp
    return {"tp": tp, "pp": pp, "dp": dp, "zero": flag("--zero", 0), "layers_per_stage": per, "micro_batch": mbs}


def assert_inspect_shows(ckpt_dir, name, step):
    j = json.loads(ckpt("inspect", "--json", ckpt_dir).stdout)
    assert j["step"] == step
    want = expected_layout(name)
    got = {k: j["layout"].get(k) for k in want}
    assert got == want, f"inspect of {ckpt_dir} shows {j['layout']}, expected {want}"
    assert j["totals"]["files"] == LAYOUTS[name].n, f"every rank writes its own shard file: {j['totals']}"


@pytest.mark.parametrize("a,b,what", PAIRS, ids=[f"{a}-to-{b}" for a, b, _ in PAIRS])
def test_resume_on_another_layout(runs, a, b, what):
    res, worst, max_abs = runs.check_resume(a, b)
    assert_inspect_shows(runs.full(a) / step_dir(STEPS), a, STEPS)
    assert_inspect_shows(res / step_dir(STEPS), b, STEPS)
    print(f"{a} -> {b} ({what}): worst relative loss difference {worst:.3g}, max |w_a - w_b| {max_abs:.3g}")


def test_matrix_covers_every_kind_of_transition():
    """The kinds of cluster change (`checks` below), found on the layouts themselves (not on the names)."""
    def devices(n):
        s = LAYOUTS[n]
        return set(s.rank_devices()) - {""} if isinstance(s, Gen) else set()

    def general(n):
        return isinstance(LAYOUTS[n], Gen)

    def asym(n):
        s = LAYOUTS[n]
        return general(n) and len({json.dumps([(x["layers"], x.get("tp", 1)) for x in p["stages"]])
                                   for p in s.pipelines}) > 1

    def zero(n):
        return LAYOUTS[n].zero if general(n) else int(expected_layout(n)["zero"])

    def stage_tps(n):
        s = LAYOUTS[n]
        return [[x.get("tp", 1) for x in p["stages"]] for p in s.pipelines] if general(n) else None

    def shape(n):
        s = LAYOUTS[n]
        return [[x["layers"] for x in p["stages"]] for p in s.pipelines] if general(n) else None
    pairs = [(a, b) for a, b, _ in PAIRS]
    assert len(pairs) >= 10 and len(set(pairs)) == len(pairs)
    checks = {
        "symmetric -> asymmetric": any(not general(a) and asym(b) for a, b in pairs),
        "asymmetric -> symmetric": any(asym(a) and not general(b) for a, b in pairs),
        "a device type removed, fewer ranks": any(devices(b) < devices(a) and LAYOUTS[b].n < LAYOUTS[a].n
                                                  for a, b in pairs),
        "a device type added": any(devices(a) < devices(b) and devices(a) for a, b in pairs),
        "per-stage tp changed": any(shape(a) and shape(a) == shape(b) and stage_tps(a) != stage_tps(b)
                                    for a, b in pairs),
        "hetero DP -> hetero PP": any(general(a) and len(LAYOUTS[a].pipelines) > 1 and len(devices(a)) > 1 and
                                      general(b) and len(LAYOUTS[b].pipelines) == 1 and len(devices(b)) > 1
                                      for a, b in pairs),
        "-> one process": any(general(a) and LAYOUTS[b].n == 1 for a, b in pairs),
        "ZeRO-1 -> replicated": any(general(a) and zero(a) == 1 and zero(b) == 0 for a, b in pairs),
    }
    missing = [k for k, ok in checks.items() if not ok]
    assert not missing, f"the matrix lacks: {missing}"
