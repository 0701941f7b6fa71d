"""Helpers for the tests that run `ckpt train` on several layouts and compare the runs
(test_trainer_parallel_cli.py, test_trainer_reconfig.py).

A layout spec is either
- Sym(processes, flags): the symmetric form from the command-line flags (--tp/--pp/--dp...), or
- Gen(pipelines, zero, grad_accum): the general form (reshard/layout/layout.h), written to a layout file
  and passed with --layout (or Gen(..., file=F): F passed instead, e.g. a FlagScale-style file
  that must describe the same layout); when its stages name device types, a cluster file with those types in
  rank order (stage slowest, then pipeline, then tp rank) is written too and passed with --cluster.
Every spec of one test runs the same global batch (12 sequences of 8 tokens per step).

Runs(root, specs) makes each run once per module: full(name) = 20 steps with checkpoints every 10;
resumed(a, b) = a new launch on layout b resuming full(a)'s step 10 to step 20. The oracle of a
resumed run is the uninterrupted one: losses of steps 11-20 within LOSS_RTOL relative
(assert_losses_close) and the two step-20 checkpoints equal under `ckpt diff --rtol 1e-5 --atol
5e-6` (assert_same_checkpoint). Why an atol: one process alone, the same global batch split into
other micro-batches (12x1 vs 4x3, 2x6, 1x12), gives step-10 and step-20 weights up to 6e-7, 5e-7
and 1.6e-6 apart (float32 summation order, amplified by Adam on elements whose m/sqrt(v) is
sensitive; always the same few elements, e.g. layers.3.mlp.up_proj), and losses up to 8e-8
relative apart. The parallel layouts measured 2.5e-7 (pp123) to 2.3e-6 (tp2 pp2 dp2 zero-1, the
same up_proj element) against one process.
"""
import json
import os
import pathlib
import re
import subprocess
from dataclasses import dataclass, field

import pytest

from mpi_ranks import mpirun_cmd

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 264,
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 64, "tie_word_embeddings": False,
    "hidden_act": "silu",
}
STEPS, MID = 20, 10
GLOBAL_BATCH = 12
COMMON = ["--seq-len", 8, "--threads", 1, "--seed", 7, "--warmup", 3, "--lr", 3e-3, "--total-steps", STEPS]
LOSS_RTOL, DIFF_RTOL, DIFF_ATOL = 1e-5, 1e-5, 5e-6
TIMEOUT = 300

# Device types of the cluster files the tests write (the memory is far above a tiny model's needs).
DEVICE_TYPES = {
    "hbm-large": {"vendor": "vendor-a", "memory": "80GiB", "peak_flops": 3.1e14, "link_bandwidth": "200GB/s"},
    "fast": {"vendor": "vendor-b", "memory": "24GiB", "peak_flops": 9.9e14, "link_bandwidth": "400GB/s"},
    "vendor-c": {"vendor": "vendor-c", "memory": "32GiB", "peak_flops": 4.5e14, "link_bandwidth": "100GB/s",
                 "dtype": "fp16"},
}


@dataclass
class Sym:
    n: int                   # processes
    flags: list              # --tp/--pp/--dp/--zero/--micro-batch(es)/--grad-accum


@dataclass
class Gen:
    pipelines: list          # [{"micro_batch": m, "stages": [{"layers": l, "tp": t, "device": d}, ..]}, ..]
    zero: int = 0
    grad_accum: int = 1
    extra: list = field(default_factory=list)
    file: str = None         # a layout file to pass instead of writing this one (it must describe the same)

    @property
    def n(self):
        return sum(st.get("tp", 1) for p in self.pipelines for st in p["stages"])

    def layout_json(self):
        return {"pipelines": self.pipelines, "zero": self.zero}

    def rank_devices(self):
        """Device type of every rank, in rank order: stage slowest, then pipeline, then tp rank."""
        out = []
        for s in range(max(len(p["stages"]) for p in self.pipelines)):
            for p in self.pipelines:
                if s < len(p["stages"]):
                    st = p["stages"][s]
                    out += [st.get("device", "")] * st.get("tp", 1)
        return out

    def cluster_json(self):
        devs = self.rank_devices()
        if not any(devs):
            return None
        assert all(devs), f"a layout naming device types must name one for every stage: {self.pipelines}"
        ranks = []
        for d in devs:
            if ranks and ranks[-1]["type"] == d:
                ranks[-1]["count"] += 1
            else:
                ranks.append({"type": d, "count": 1})
        types = [dict(name=d, **DEVICE_TYPES[d]) for d in dict.fromkeys(devs)]
        return {"device_types": types, "ranks": ranks}


def global_batch(spec):
    if isinstance(spec, Gen):
        return spec.grad_accum * sum(p["micro_batch"] for p in spec.pipelines)
    f = [str(x) for x in spec.flags]
    ga = int(f[f.index("--grad-accum") + 1]) if "--grad-accum" in f else 1
    if "--micro-batches" in f:
        return ga * sum(int(x) for x in f[f.index("--micro-batches") + 1].split(","))
    dp = int(f[f.index("--dp") + 1]) if "--dp" in f else 1
    return ga * dp * int(f[f.index("--micro-batch") + 1])


def ckpt_path():
    p = os.environ.get("CKPT_BIN") or str(pathlib.Path(os.environ.get("CKPT_BINARY_DIR", "../../build")) / "ckpt")
    if not os.path.exists(p):
        pytest.fail(f"ckpt binary not found at {p}")
    return os.path.abspath(p)


def step_dir(step):
    return f"step-{step:08d}"


def launch(n, args, tag=False):
    """`args` on n processes: directly for one, else under mpirun (--tag-output when `tag`)."""
    if n == 1:
        return [str(a) for a in args]
    cmd = mpirun_cmd(n, *args)
    return cmd[:1] + ["--tag-output"] + cmd[1:] if tag else cmd


def run(cmd, env=None, check=True):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=TIMEOUT,
                       env=dict(os.environ, **(env or {})))
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def ckpt(*args, check=True):
    return run([ckpt_path(), *args], check=check)


def log(run_dir):
    return [json.loads(l) for l in (pathlib.Path(run_dir) / "train_log.jsonl").read_text().splitlines()]


def step_lines(out):
    return [l for l in out.splitlines() if re.match(r"^(\[\d+,\d+\]<stdout>:)?step\s+\d+", l)]


class Runs:
    """Runs shared by the tests of one module, each made once (see the top of this file)."""

    def __init__(self, root, specs, config=CONFIG):
        self.root = pathlib.Path(root)
        self.specs = specs
        self.cfg = self.root / "config.json"
        self.cfg.write_text(json.dumps(config))
        self.done = {}
        for name, spec in specs.items():
            assert global_batch(spec) == GLOBAL_BATCH, f"layout {name}: {global_batch(spec)} sequences per step"

    def layout_args(self, name):
        """(processes, the layout's train flags), writing its layout and cluster files."""
        spec = self.specs[name]
        if isinstance(spec, Sym):
            return spec.n, list(spec.flags)
        lay = spec.file
        if lay is None:
            lay = self.root / f"layout_{name}.json"
            lay.write_text(json.dumps(spec.layout_json(), indent=1))
        args = ["--layout", lay, "--grad-accum", spec.grad_accum, *spec.extra]
        cl = spec.cluster_json()
        if cl is not None:
            (self.root / f"cluster_{name}.json").write_text(json.dumps(cl, indent=1))
            args += ["--cluster", self.root / f"cluster_{name}.json"]
        return spec.n, args

    def train_cmd(self, name, *args, tag=False):
        n, flags = self.layout_args(name)
        return launch(n, [ckpt_path(), "train", "--config", self.cfg, *COMMON, *flags, *args], tag=tag)

    def train(self, name, out, *args, env=None, check=True):
        return run(self.train_cmd(name, "--out", out, *args), env=env, check=check)

    def full(self, name):
        out = self.root / f"full_{name}"
        if out not in self.done:
            self.done[out] = self.train(name, out, "--steps", STEPS, "--save-every", MID)
        return out

    def resumed(self, a, b):
        out = self.root / f"resume_{a}_to_{b}"
        if out not in self.done:
            src = self.full(a) / step_dir(MID)
            self.done[out] = self.train(b, out, "--steps", STEPS, "--resume", src)
        return out

    def check_resume(self, a, b):
        """a's step-MID checkpoint resumed on b: steps MID+1..STEPS against a's uninterrupted run (which
        must learn), the step-STEPS checkpoints compared by `ckpt diff`. -> (resumed run dir, worst
        relative loss difference, max |w_a - w_b|)."""
        full = self.full(a)
        la = log(full)
        assert [r["step"] for r in la] == list(range(1, STEPS + 1))
        assert la[-1]["loss"] < la[0]["loss"], "the reference run does not learn"
        res = self.resumed(a, b)
        assert len(step_lines(self.done[res].stdout)) == STEPS - MID, self.done[res].stdout
        worst = assert_losses_close(la, log(res), range(MID + 1, STEPS + 1))
        assert (res / "latest").read_text().strip() == step_dir(STEPS)
        return res, worst, assert_same_checkpoint(full / step_dir(STEPS), res / step_dir(STEPS))


def assert_losses_close(ref, got, steps):
    ref = {r["step"]: r["loss"] for r in ref}
    got_steps = [r["step"] for r in got]
    assert got_steps == list(steps), f"logged steps {got_steps}, expected {list(steps)}"
    worst = max(abs(r["loss"] - ref[r["step"]]) / abs(ref[r["step"]]) for r in got)
    bad = [(r["step"], r["loss"], ref[r["step"]]) for r in got
           if abs(r["loss"] - ref[r["step"]]) > LOSS_RTOL * abs(ref[r["step"]])]
    assert not bad, f"losses (step, got, reference) beyond {LOSS_RTOL} relative: {bad}; worst {worst:.3g}"
    return worst


def assert_same_checkpoint(a, b):
    p = ckpt("diff", "--json", "--rtol", DIFF_RTOL, "--atol", DIFF_ATOL, a, b, check=False)
    j = json.loads(p.stdout)
    worst = sorted(((t.get("max_abs", 0), t["name"], t["status"]) for t in j["tensors"]), reverse=True)[:5]
    assert j["equal"] and p.returncode == 0, f"{a} vs {b}: {j['counts']}; largest |a-b|: {worst}"
    assert j["counts"]["only_in_a"] == 0 and j["counts"]["only_in_b"] == 0
    return worst[0][0] if worst else 0.0
