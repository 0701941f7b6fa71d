"""`ckpt train` checkpoints and resume, through the ckpt binary in separate processes.

- 20 steps straight vs 10 steps + save + a new process resuming from `latest` for 10 more:
  identical losses bit for bit (same thread count), identical final weights and Adam moments
  (read back independently with h5py from the manifest's file/dataset records); the same with
  `--resume PATH` of the step-10 checkpoint into another run dir. The per-step line (loss, lr,
  grad norm, tokens/s, model FLOP/s) matches the JSON lines of train_log.jsonl.
- A run killed with SIGKILL while a checkpoint is being written resumes from the previous complete
  checkpoint, and its resumed losses equal the killed run's logged losses bit for bit.
"""
import json
import os
import pathlib
import signal
import subprocess
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = ROOT / "fixtures" / "tiny_llama.json"


def _ckpt():
    p = os.environ.get("CKPT_BIN") or str(
        pathlib.Path(os.environ.get("CKPT_BINARY_DIR", ROOT / "build-trainer")) / "ckpt")
    if not os.path.exists(p):
        pytest.fail(f"ckpt binary not found at {p}")
    return p


def _train(*args, check=True):
    cmd = [_ckpt(), "train", *[str(a) for a in args]]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def _log(run):
    return [json.loads(l) for l in (run / "train_log.jsonl").read_text().splitlines()]


def _read_ckpt(ckdir):
    import h5py
    man = json.loads((ckdir / "manifest.json").read_text())
    out = {}
    for pc in man["pieces"]:
        with h5py.File(ckdir / pc["file"], "r") as f:
            out[pc["tensor"]] = np.array(f[pc["dataset"]])
    return man, out


COMMON = ["--config", TINY, "--seed", 3, "--micro-batch", 4, "--seq-len", 32, "--threads", 1,
          "--warmup", 5, "--lr", 3e-3]


def test_resume_is_bit_identical(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _train(*COMMON, "--steps", 20, "--out", a)
    _train(*COMMON, "--steps", 10, "--total-steps", 20, "--out", b)
    assert (b / "latest").read_text().strip() == "step-00000010"
    p = _train(*COMMON, "--steps", 20, "--out", b, "--resume", "latest")
    la, lb = _log(a), _log(b)
    assert [r["step"] for r in la] == list(range(1, 21))
    assert [r["step"] for r in lb] == list(range(1, 21))
    assert [r["loss"] for r in la] == [r["loss"] for r in lb]  # bit for bit (17-digit JSON)
    assert [r["lr"] for r in la] == [r["lr"] for r in lb]
    assert la[-1]["loss"] < la[0]["loss"]
    assert "step     11" in p.stdout
    # --resume PATH (a checkpoint dir) into another run dir: the same losses again.
    c = tmp_path / "c"
    _train(*COMMON, "--steps", 20, "--out", c, "--resume", b / "step-00000010")
    assert [r["loss"] for r in _log(c)] == [r["loss"] for r in la[10:]]
    # A line per step with loss, learning rate, grad norm, tokens/s and model FLOP/s, and the
    # same values as JSON lines in the run dir.
    lines = [l for l in p.stdout.splitlines() if l.startswith("step")]
    assert len(lines) == 10
    for line, rec in zip(lines, lb[10:]):
        f = [x.strip() for x in line.split("|")]
        assert f[0].split() == ["step", str(rec["step"])]
        assert float(f[1].split()[1]) == pytest.approx(rec["loss"], abs=1e-6)
        assert float(f[2].split()[1]) == pytest.approx(rec["lr"], rel=1e-4)
        assert float(f[3].split()[1]) == pytest.approx(rec["grad_norm"], abs=1e-4)
        assert f[4].endswith("tok/s") and f[5].endswith("GFLOP/s")
        assert rec["tokens_per_s"] > 0 and rec["flops_per_s"] > 0
        assert float(f[5].split()[0]) == pytest.approx(rec["flops_per_s"] / 1e9, rel=1e-2, abs=1e-3)

    man_a, ta = _read_ckpt(a / "step-00000020")
    man_b, tb = _read_ckpt(b / "step-00000020")
    assert set(ta) == set(tb)
    for k in ta:
        assert np.array_equal(ta[k], tb[k]), k
    # Canonical names, fp32 Adam moments for every parameter, metadata.
    params = [t["name"] for t in man_a["tensors"] if not t["name"].startswith("optimizer.")]
    assert "model.embed_tokens.weight" in params and "lm_head.weight" in params
    for n in params:
        assert f"optimizer.exp_avg.{n}" in ta and f"optimizer.exp_avg_sq.{n}" in ta
        assert ta[f"optimizer.exp_avg_sq.{n}"].dtype == np.float32
        assert np.all(ta[f"optimizer.exp_avg_sq.{n}"] >= 0)
    md = man_a.get("metadata", man_a)
    assert md["trainer"]["step"] == 20
    assert md["model_config"]["hidden_size"] == 64
    assert md["layout"]["tp"] == 1


def test_resume_rejects_a_different_run(tmp_path):
    a = tmp_path / "a"
    _train(*COMMON, "--steps", 2, "--out", a)
    args = [x if x != 3 else 4 for x in COMMON]  # another seed
    p = _train(*args, "--steps", 4, "--out", a, "--resume", "latest", check=False)
    assert p.returncode == 2, p.stderr
    assert "seed" in p.stderr


BIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 264,
    "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 32, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def test_sigkill_while_saving_resumes_from_previous_checkpoint(tmp_path):
    cfg = tmp_path / "big.json"
    cfg.write_text(json.dumps(BIG))
    run = tmp_path / "run"
    args = ["--config", cfg, "--seed", 5, "--micro-batch", 2, "--seq-len", 16, "--threads", 1,
            "--warmup", 2, "--steps", 400, "--save-every", 3]
    proc = subprocess.Popen([_ckpt(), "train", *map(str, args), "--out", str(run)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    killed_at = None
    deadline = time.time() + 120
    try:
        while time.time() < deadline and proc.poll() is None:
            if (run / "latest").exists():
                partial = [d for d in run.glob("*.partial")]
                if partial:
                    proc.send_signal(signal.SIGKILL)
                    killed_at = partial[0].name
                    break
            time.sleep(0.001)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert killed_at is not None, "never caught a checkpoint in flight"
    latest = (run / "latest").read_text().strip()
    assert (run / latest / "manifest.json").exists()
    k = int(latest.split("-")[1])
    assert not (run / killed_at.replace(".partial", "")).exists() or latest == killed_at.replace(".partial", "")
    logged = {r["step"]: r["loss"] for r in _log(run)}
    # Resume from `latest` for 4 more steps in a new process.
    _train(*args[:-4], "--total-steps", 400, "--steps", k + 4, "--out", run,
           "--resume", "latest")
    resumed = [r for r in _log(run) if r["step"] > k][-4:]
    assert [r["step"] for r in resumed] == [k + 1, k + 2, k + 3, k + 4]
    for r in resumed:
        if r["step"] in logged:
            assert r["loss"] == logged[r["step"]], r["step"]
    assert any(r["step"] in logged for r in resumed)
