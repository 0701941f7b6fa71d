"""docs/PYTHON.md is executable: every ```python block runs, in order, as one script (shared
namespace, like a notebook), in a temporary directory where checkpoints/hf holds a small
HuggingFace LLaMA model written by the safetensors library (the doc says so). A block that raises
fails the test naming the block; the doc must show every command and the checkpoint API."""
import contextlib
import io
import json
import shutil
import os
import pathlib
import re
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

HERE = pathlib.Path(__file__).resolve().parent
DOC = HERE.parents[1] / "docs" / "PYTHON.md"
sys.path.insert(0, str(HERE))
import megatron_reference as ref  # noqa: E402

ckpt = pytest.importorskip("ckpt", reason="the ckpt module: build target ckpt_python, PYTHONPATH=<build>/python")

CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5,
       "rope_theta": 10000.0, "max_position_embeddings": 64, "vocab_size": 64, "hidden_size": 32,
       "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
       "head_dim": 8, "torch_dtype": "float32", "tie_word_embeddings": False}


def python_blocks(text: str):
    """[(line number, code)] of the ```python blocks."""
    out = []
    for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        out.append((text.count("\n", 0, m.start()) + 1, m.group(1)))
    return out


def test_doc_blocks_cover_the_api():
    code = "\n".join(c for _, c in python_blocks(DOC.read_text()))
    for name in ("ckpt.open", ".read(", "state_dict(", "from_hf", "verify", "reshard", "convert", "to_hf", "diff",
                 "plan(", "progress=", "except ckpt.", "inspect(", "export_dcp(", "export_megatron("):
        assert name in code, f"docs/PYTHON.md shows no example of {name}"


def test_every_python_block_runs(tmp_path, monkeypatch):
    hf = tmp_path / "checkpoints" / "hf"
    hf.mkdir(parents=True)
    save_file(ref.make_hf_model(CFG, np.random.default_rng(5)), str(hf / "model.safetensors"))
    (hf / "config.json").write_text(json.dumps(CFG))
    shutil.copytree(DOC.parents[1] / "fixtures" / "moe" / "mixtral" / "legacy", tmp_path / "checkpoints" / "mixtral-hf")  # the MoE example's
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "__docs__"}
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 6
    for line, code in blocks:
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"docs/PYTHON.md:{line}", "exec"), ns)  # noqa: S102
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"docs/PYTHON.md block at line {line} raised {type(e).__name__}: {e}\n{code}\noutput:\n{out.getvalue()}")
    # What the examples promise happened.
    assert (tmp_path / "checkpoints" / "export" / "config.json").exists()
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "checkpoints").iterdir())
    assert not (tmp_path / "checkpoints" / "tp3").exists()
