"""A write that fails for lack of space ends with a clean error, never a crash.

The file-size limit (RLIMIT_FSIZE, with SIGXFSZ ignored so a write past it fails with EFBIG as a
full disk fails with ENOSPC) makes every writer of ckpt fail part-way: the store shards (plain and
compressed), the HF safetensors files. Each command must exit 4 (I/O error) naming the file,
leave neither the output nor its .partial directory, and not crash: HDF5's exit handler used to
segfault (exit -11) in H5F__close_cb on a file whose close had failed (formats/store/h5/h5_handles.cc).
"""
import resource
import signal
import subprocess

import numpy as np
import pytest

from conftest import check_no_sanitizer_report
from llama_shapes import write_hf_llama  # noqa: E402

LIMIT = 6 << 20  # bytes: every output below is 16-32 MB


def _limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


@pytest.fixture(scope="module")
def sources(tmp_path_factory, ckpt_bin):
    d = tmp_path_factory.mktemp("src")
    h, f, v, n = 256, 512, 4096, 4
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": h, "intermediate_size": f,
           "num_hidden_layers": n, "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": v,
           "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "torch_dtype": "float32", "hidden_act": "silu"}
    hf = d / "hf"
    write_hf_llama(hf, cfg, np.random.default_rng(0))
    native = d / "native"
    subprocess.run([ckpt_bin, "from-hf", str(hf), str(native)], check=True, capture_output=True)
    return hf, native


@pytest.mark.parametrize("cmd", [
    ["from-hf", "{hf}"],
    ["from-hf", "{hf}", "--compress", "shuffle+zstd:1"],
    ["reshard", "{native}", "--tp", "2", "--pp", "1", "--dp", "1"],
    ["to-hf", "{native}"],
])
def test_full_disk_is_a_clean_io_error(cmd, sources, ckpt_bin, tmp_path):
    hf, native = sources
    out = tmp_path / "out"
    args = [a.format(hf=hf, native=native) for a in cmd]
    args.insert(2, str(out))
    p = subprocess.run([ckpt_bin, *args], preexec_fn=_limit, capture_output=True, text=True, timeout=300)
    check_no_sanitizer_report(p)
    assert p.returncode == 4, (p.returncode, p.stderr[-2000:])
    assert "File too large" in p.stderr and str(tmp_path) in p.stderr, p.stderr
    assert not out.exists() and not (tmp_path / "out.partial").exists(), list(tmp_path.iterdir())
