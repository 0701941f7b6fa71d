"""Hostile numbers in metadata are refused before they size memory or work (docs/INTEGRITY.md).

 * A manifest whose model_config says num_hidden_layers = 1e9 (or another config number beyond
   converters/model/llama_config.h's bounds, or products past them): `reshard` and `verify`
   exit 3 with ConfigTooLarge naming the key, the value and the limit, fast and in little memory
   (before: reshard grew to 6.9 GB, verify said OK).
 * A manifest listing 1e6 tensors: JsonTooManyValues before the DOM is built (before: 3 GB).
 * `train --resume` of a checkpoint whose trainer state is out of range (peak_lr 1e308, eps -1,
   beta1 2, step 2^63-1, ...): exit 3, TrainerStateOutOfRange naming the checkpoint and the field,
   no checkpoint written. The same values from the command line: exit 2.
Each child runs under RLIMIT_AS (4 GB) so a binary without the bounds fails instead of taking the
machine; peak RSS is the child's own (os.wait4).
"""
import json
import os
import pathlib
import resource
import shutil
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "fixtures" / "tiny_llama.json"
TRAIN = ["--config", TINY, "--seed", 3, "--micro-batch", 2, "--seq-len", 16, "--threads", 1]
MAX_RSS_MB = 300
MAX_SECONDS = 5


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def run_rss(ckpt_bin, *args, timeout=60):
    """(returncode, stderr, seconds, peak RSS MB) with the child's own rusage (os.wait4)."""
    t0 = time.monotonic()
    p = subprocess.Popen([ckpt_bin, *[str(a) for a in args]], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=_limit_memory)
    deadline = t0 + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid == p.pid:
            break
        if time.monotonic() > deadline:
            p.kill()
            pid, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(0.02)
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    return p.returncode, err, time.monotonic() - t0, ru.ru_maxrss / 1024.0


@pytest.fixture(scope="module")
def trained(tmp_path_factory, ckpt_bin):
    """A run dir with one checkpoint at step 2 (tiny LLaMA)."""
    run = tmp_path_factory.mktemp("bounds") / "run"
    p = subprocess.run([ckpt_bin, "train", *[str(a) for a in TRAIN], "--steps", "2", "--out", str(run)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return run


def hostile_copy(src: pathlib.Path, dst: pathlib.Path, mutate):
    """A copy of checkpoint `src` whose manifest `mutate(m)` changed, kept readable: a v3
    manifest's checksum is dropped and the version set to 2 (v2 manifests carry none)."""
    shutil.copytree(src, dst)
    p = dst / "manifest.json"
    m = json.loads(p.read_text())
    if "manifest_digest" in m:
        del m["manifest_digest"]
        m["version"] = 2
    mutate(m)
    p.write_text(json.dumps(m))
    return dst


def step_dir(run):
    return run / (run / "latest").read_text().strip()


CONFIG_CASES = [
    ("num_hidden_layers", 10**9, "4096"),
    ("num_attention_heads", 1 << 20, "4096"),
    ("hidden_size", 1 << 30, "262144"),
    ("intermediate_size", 1 << 30, "1048576"),
    ("vocab_size", 1 << 40, "16777216"),
]


@pytest.mark.parametrize("key,value,limit", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_config_beyond_bounds_refused_fast_by_every_command(key, value, limit, trained, ckpt_bin, tmp_path):
    def mutate(m):
        m["model_config"][key] = value
        if key == "num_attention_heads":
            m["model_config"]["num_key_value_heads"] = value
    ck = hostile_copy(step_dir(trained), tmp_path / "ck", mutate)
    for args in (["reshard", ck, tmp_path / "out", "--tp", 2, "--pp", 1, "--dp", 1], ["verify", ck]):
        rc, err, secs, rss = run_rss(ckpt_bin, *args)
        assert rc == 3, f"{args[0]}: exit {rc}\n{err}"
        assert "ConfigTooLarge" in err and key in err and str(value) in err and limit in err, err
        assert secs < MAX_SECONDS and rss < MAX_RSS_MB, f"{args[0]}: {secs:.1f} s, {rss:.0f} MB"
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_config_product_beyond_bounds_refused(trained, ckpt_bin, tmp_path):
    # Each number within its own bound; vocab x hidden = 2^42 elements in one tensor is not.
    def mutate(m):
        m["model_config"].update(vocab_size=1 << 24, hidden_size=1 << 18, head_dim=16)
    ck = hostile_copy(step_dir(trained), tmp_path / "ck", mutate)
    rc, err, secs, rss = run_rss(ckpt_bin, "verify", ck)
    assert rc == 3 and "ConfigTooLarge" in err and "vocab_size x hidden_size" in err, err
    assert secs < MAX_SECONDS and rss < MAX_RSS_MB


def test_million_tensor_manifest_refused_before_its_dom(trained, ckpt_bin, tmp_path):
    def mutate(m):
        m["tensors"] += [{"dtype": "F32", "name": f"x.{i}", "shape": [1]} for i in range(1_000_000)]
    ck = hostile_copy(step_dir(trained), tmp_path / "ck", mutate)
    for args in (["verify", ck], ["reshard", ck, tmp_path / "out", "--tp", 2, "--pp", 1, "--dp", 1]):
        rc, err, secs, rss = run_rss(ckpt_bin, *args)
        assert rc == 3, f"{args[0]}: exit {rc}\n{err}"
        assert "JsonTooManyValues" in err and "'tensors'" in err and "262144" in err, err
        assert secs < MAX_SECONDS and rss < MAX_RSS_MB, f"{args[0]}: {secs:.1f} s, {rss:.0f} MB"


def _set(m, path, value):
    d = m["trainer"]
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value


RESUME_CASES = [
    (("lr_schedule", "peak_lr"), 1e308, "lr_schedule.peak_lr"),
    (("lr_schedule", "min_ratio"), 2.0, "lr_schedule.min_ratio"),
    (("lr_schedule", "warmup"), -1, "lr_schedule.warmup"),
    (("adamw", "eps"), -1.0, "adamw.eps"),
    (("adamw", "eps"), 0.0, "adamw.eps"),
    (("adamw", "beta1"), 2.0, "adamw.beta1"),
    (("adamw", "beta2"), 1.0, "adamw.beta2"),
    (("adamw", "weight_decay"), -0.5, "adamw.weight_decay"),
    (("max_grad_norm",), -1.0, "max_grad_norm"),
    (("step",), 2**63 - 1, "step"),
]


@pytest.mark.parametrize("path,value,field", RESUME_CASES, ids=[f"{c[2]}={c[1]}" for c in RESUME_CASES])
def test_resume_refuses_trainer_state_out_of_range(path, value, field, trained, ckpt_bin, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    ck = step_dir(run)
    shutil.rmtree(ck)

    def mutate(m):
        _set(m, path, value)
        if path == ("step",):
            m["trainer"]["data"]["next_step"] = value  # consistent cursor: the range is what fails
    hostile_copy(step_dir(trained), ck, mutate)
    before = sorted(x.name for x in run.iterdir())
    p = subprocess.run([ckpt_bin, "train", *[str(a) for a in TRAIN], "--steps", "4", "--out", str(run),
                        "--resume", "latest", "--sync-save"], capture_output=True, text=True, timeout=300,
                       preexec_fn=_limit_memory)
    assert p.returncode == 3, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert "TrainerStateOutOfRange" in p.stderr and field in p.stderr and str(ck) in p.stderr, p.stderr
    assert sorted(x.name for x in run.iterdir()) == before, "a checkpoint was written"


def test_resume_refuses_a_data_cursor_that_is_not_the_step(trained, ckpt_bin, tmp_path):
    ck = hostile_copy(step_dir(trained), tmp_path / "ck", lambda m: _set(m, ("data", "next_step"), 7))
    p = subprocess.run([ckpt_bin, "train", *[str(a) for a in TRAIN], "--steps", "4", "--resume", str(ck)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 3 and "TrainerStateOutOfRange" in p.stderr and "next_step" in p.stderr, p.stderr


@pytest.mark.parametrize("flag,value", [("--lr", "1e308"), ("--weight-decay", "-1"), ("--clip", "-1")])
def test_out_of_range_flags_are_usage_errors(flag, value, ckpt_bin, tmp_path):
    p = subprocess.run([ckpt_bin, "train", *[str(a) for a in TRAIN], "--steps", "2", "--out", str(tmp_path / "r"),
                        flag, value], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, f"exit {p.returncode}\n{p.stderr}"
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").glob("step-*"))
