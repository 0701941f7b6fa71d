"""DeepSpeed ZeRO checkpoints read by ckpt (converters/deepspeed/), against DeepSpeed's own outputs.

The fixtures (fixtures/deepspeed/, README.md there) were written by DeepSpeed 0.19.8 itself: ZeRO
stages 1/2/3 x world 2/3 x fp32/bf16 of a tiny transformers LLaMA, each with DeepSpeed's
`zero_to_fp32` weights, `ds_to_universal`'s optimizer state (oracle.npz) and transformers' logits.
Each case is copied with its config.json beside `latest` (where the HF Trainer saves it):
  * `ckpt to-hf` gives exactly zero_to_fp32's tensors (read by the safetensors library), and
    transformers' logits of the export equal logits.npy;
  * `ckpt reshard` into a native store (read with h5py): every weight, exp_avg and exp_avg_sq equals
    oracle.npz element for element, the step equals DeepSpeed's; reshard to tp2 and back gives the
    same bytes; `ckpt inspect --json` names the kind, stage and world;
  * hostile files (a missing rank file, a partition count that disagrees, a padding larger than the
    partition, an unknown pickled class): named errors, nonzero exit, nothing written.
"""
import json
import pathlib
import shutil
import struct
import sys
import zipfile

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures" / "deepspeed"
sys.path.insert(0, str(ROOT / "scripts"))
from native_h5py import read_native  # noqa: E402
from zip_damage import assert_refused, flip_in_entry  # noqa: E402

CASES = sorted(p.name for p in FIX.iterdir() if (p / "case.json").exists())


def case_json(name):
    return json.loads((FIX / name / "case.json").read_text())


def copy_case(name, dst):
    """The fixture's ckpt/ with its model config.json beside `latest`, as the HF Trainer saves it."""
    shutil.copytree(FIX / name / "ckpt", dst)
    (dst / "config.json").write_text(json.dumps(case_json(name)["config"]))
    return dst


def step_dir(d):
    return d / (d / "latest").read_text().strip()


@pytest.fixture(scope="module", params=CASES)
def case(request, tmp_path_factory, ckpt_bin):
    """(name, copied checkpoint dir, native store of its import)."""
    import subprocess
    name = request.param
    base = tmp_path_factory.mktemp(name)
    d = copy_case(name, base / "ckpt")
    native = base / "native"
    subprocess.run([ckpt_bin, "reshard", str(d), str(native), "--tp", "1", "--pp", "1", "--dp", "1"],
                   check=True, capture_output=True)
    return name, d, native


def test_fixture_set_is_complete():
    assert len(CASES) == 13  # the 12 below, and zero2_w2_fp32_fusedadam (DeepSpeed's FusedAdam: an int step)
    assert [n for n in CASES if case_json(n).get("optimizer") == "FusedAdam"] == ["zero2_w2_fp32_fusedadam"]
    assert {(c["stage"], c["world"], c["dtype"]) for c in map(case_json, CASES)} == {
        (s, w, t) for s in (1, 2, 3) for w in (2, 3) for t in ("fp32", "bf16")}


def test_to_hf_equals_zero_to_fp32_and_logits(case, run_ckpt, tmp_path):
    from safetensors.numpy import load_file
    name, d, _ = case
    run_ckpt("to-hf", d, tmp_path / "hf")
    got = {}
    for f in sorted((tmp_path / "hf").glob("*.safetensors")):
        got.update(load_file(f))
    want = load_file(FIX / name / "zero_to_fp32.safetensors")
    assert set(got) == set(want)
    for k, w in want.items():
        assert got[k].dtype == w.dtype == np.float32, k
        np.testing.assert_array_equal(got[k], w, err_msg=k)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "hf"), torch_dtype=torch.float32).eval()
    tokens = np.load(FIX / name / "tokens.npy")
    with torch.no_grad():
        logits = m(torch.from_numpy(tokens)).logits.numpy()
    ref = np.load(FIX / name / "logits.npy")
    assert logits.shape == ref.shape
    assert float(np.abs(logits - ref).max() / np.abs(ref).max()) < 1e-5


def test_imported_state_equals_deepspeed_oracle(case):
    name, _, native = case
    man, got, _ = read_native(native)
    oracle = np.load(FIX / name / "oracle.npz")
    params = {k.rsplit("/", 1)[0] for k in oracle.files}
    assert len(params) == 21
    kinds = {"fp32": "", "exp_avg": "optimizer.exp_avg.", "exp_avg_sq": "optimizer.exp_avg_sq."}
    assert set(got) == {pre + p for pre in kinds.values() for p in params}
    for p in sorted(params):
        for kind, pre in kinds.items():
            want = oracle[f"{p}/{kind}"]  # ds_to_universal keeps stage 3's tensors flat
            assert got[pre + p].dtype == np.float32 and got[pre + p].size == want.size, (p, kind)
            np.testing.assert_array_equal(got[pre + p].reshape(-1), want.reshape(-1), err_msg=f"{p} {kind}")
        if f"{p}/step" in oracle.files:  # stages 1-2 (stage 3's universal checkpoint has no step file)
            assert man["deepspeed"]["optimizer_step"] == int(oracle[f"{p}/step"])
    assert man["deepspeed"]["optimizer_step"] == 2
    c = case_json(name)
    assert man["adam"]["lr"] == pytest.approx(c["ds_config"]["optimizer"]["params"]["lr"])
    assert man["adam"]["beta2"] == pytest.approx(0.95)


def test_reshard_tp2_and_back_is_byte_identical(case, run_ckpt, tmp_path):
    _, _, native = case
    run_ckpt("reshard", native, tmp_path / "tp2", "--tp", 2, "--pp", 1, "--dp", 1)
    run_ckpt("reshard", tmp_path / "tp2", tmp_path / "back", "--tp", 1, "--pp", 1, "--dp", 1)
    _, a, _ = read_native(native)
    _, b, _ = read_native(tmp_path / "back")
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k
    assert run_ckpt("diff", native, tmp_path / "back").returncode == 0


def test_inspect_names_kind_stage_world(case, run_ckpt):
    name, d, _ = case
    c = case_json(name)
    info = json.loads(run_ckpt("inspect", "--json", d).stdout)
    assert info["format"] == "DeepSpeed ZeRO torch files"
    assert f"ZeRO stage {c['stage']}" in info["detected"] and f"{c['world']} data-parallel ranks" in info["detected"]
    assert c["dtype"] in info["detected"]
    assert info["model_config"]["num_key_value_heads"] == 2
    text = run_ckpt("inspect", step_dir(d)).stdout  # the step dir itself opens too
    assert f"ZeRO stage {c['stage']}" in text


# --- hostile files -------------------------------------------------------------------------------

def rewrite_pickle(path, edit):
    """Rewrites the torch zip `path` with data.pkl replaced by edit(bytes) (stored entries)."""
    with zipfile.ZipFile(path) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, data in entries:
            if n.endswith("/data.pkl"):
                new = edit(data)
                assert new != data, "the edit changed nothing"
                data = new
            z.writestr(n, data)


def refused(run_ckpt, d, tmp_path, code, *needles):
    p = run_ckpt("to-hf", d, tmp_path / "out", check=False)
    assert p.returncode not in (0,) and p.returncode < 128, (p.returncode, p.stderr)  # named error, not a crash
    assert f"[{code}]" in p.stderr, p.stderr
    for n in needles:
        assert n in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()
    return p


def test_missing_rank_file_is_named(run_ckpt, tmp_path):
    d = copy_case("zero2_w3_fp32", tmp_path / "ckpt")
    f = step_dir(d) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    f.unlink()
    refused(run_ckpt, d, tmp_path, "DeepSpeedMissingRank", f.name)


def test_partition_count_disagreeing_with_files_is_named(run_ckpt, tmp_path):
    d = copy_case("zero1_w3_bf16", tmp_path / "ckpt")
    (step_dir(d) / "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt").unlink()  # 2 files, partition_count 3
    refused(run_ckpt, d, tmp_path, "DeepSpeedPartitionCount", "partition_count is 3", "2 optimizer rank files")


def test_partition_count_field_edited_is_named(run_ckpt, tmp_path):
    d = copy_case("zero3_w3_fp32", tmp_path / "ckpt")
    f = step_dir(d) / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    key = b"partition_count"

    def edit(pkl):  # 'partition_count' BINPUT n BININT1 3 -> BININT1 4
        at = pkl.index(key) + len(key)
        assert pkl[at:at + 1] == b"q" and pkl[at + 2:at + 4] == b"K\x03"
        return pkl[:at + 2] + b"K\x04" + pkl[at + 4:]
    rewrite_pickle(f, edit)
    refused(run_ckpt, d, tmp_path, "DeepSpeedPartitionCount", f.name)


def test_padding_larger_than_partition_is_named(run_ckpt, tmp_path):
    d = copy_case("zero2_w3_fp32", tmp_path / "ckpt")
    f = step_dir(d) / "zero_pp_rank_2_mp_rank_00_optim_states.pt"  # the rank that holds the padding
    key = b"group_paddings"

    def edit(pkl):  # 'group_paddings' BINPUT n EMPTY_LIST BINPUT m BININT1 p APPEND -> BININT 10**6
        at = pkl.index(key) + len(key)
        assert pkl[at:at + 1] == b"q" and pkl[at + 2:at + 3] == b"]" and pkl[at + 3:at + 4] == b"q"
        v = at + 5
        assert pkl[v:v + 1] == b"K" and pkl[v + 2:v + 3] == b"a"
        return pkl[:v] + b"J" + struct.pack("<i", 10**6) + pkl[v + 2:]
    rewrite_pickle(f, edit)
    refused(run_ckpt, d, tmp_path, "DeepSpeedPadding", "1000000", f.name)


def test_unknown_pickled_class_is_refused_naming_it(run_ckpt, tmp_path):
    d = copy_case("zero1_w2_fp32", tmp_path / "ckpt")
    f = step_dir(d) / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    rewrite_pickle(f, lambda p: p.replace(b"deepspeed.runtime.fp16.loss_scaler\nLossScaler",
                                          b"deepspeed.runtime.fp16.loss_scaler\nEvilScaler"))
    refused(run_ckpt, d, tmp_path, "ForbiddenGlobal", "deepspeed.runtime.fp16.loss_scaler.EvilScaler")


def test_plain_class_with_non_plain_field_is_refused(run_ckpt, tmp_path):
    """LossScaler's BUILD state with a list where a scalar belongs: only plain fields are accepted."""
    d = copy_case("zero1_w2_fp32", tmp_path / "ckpt")
    f = step_dir(d) / "zero_pp_rank_0_mp_rank_00_optim_states.pt"

    def edit(pkl):  # 'cur_scale' BINPUT n BINFLOAT 1.0 -> EMPTY_LIST (9 bytes -> 1 byte)
        key = b"cur_scale"
        at = pkl.index(key) + len(key)
        assert pkl[at + 2:at + 3] == b"G"
        return pkl[:at + 2] + b"]" + pkl[at + 11:]
    rewrite_pickle(f, edit)
    refused(run_ckpt, d, tmp_path, "PickleBadReduce", "deepspeed.runtime.fp16.loss_scaler.LossScaler", "plain fields")


def test_without_config_json_weights_export_and_layouts_ask_for_it(run_ckpt, tmp_path):
    """No config.json beside `latest` (DeepSpeed alone saves none): inspect and to-hf (the weights,
    as zero_to_fp32) work; a reshard, which needs the model's config, is refused by name."""
    from safetensors.numpy import load_file
    d = tmp_path / "ckpt"
    shutil.copytree(FIX / "zero2_w2_bf16" / "ckpt", d)
    info = json.loads(run_ckpt("inspect", "--json", d).stdout)
    assert len(info["tensors"]) == 63 and "ZeRO stage 2" in info["detected"]
    run_ckpt("to-hf", d, tmp_path / "hf")
    got, want = load_file(tmp_path / "hf" / "model.safetensors"), load_file(FIX / "zero2_w2_bf16" / "zero_to_fp32.safetensors")
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    p = run_ckpt("reshard", d, tmp_path / "native", "--tp", 2, "--pp", 1, "--dp", 1, check=False)
    assert 0 < p.returncode < 128 and "[" in p.stderr and "config" in p.stderr.lower(), p.stderr
    assert not (tmp_path / "native").exists()


def test_damaged_rank_file_is_caught_by_verify_to_hf_and_reshard(run_ckpt, tmp_path):
    d = copy_case("zero3_w2_fp32", tmp_path / "ckpt")
    assert run_ckpt("verify", d).returncode == 0
    f = step_dir(d) / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    entry = flip_in_entry(f, 0, f.stat().st_size,
                          lambda infos: next(i for i in infos if "/data/" in i.filename and i.file_size > 1024))
    p = run_ckpt("verify", d, check=False)
    assert f.name in p.stdout + p.stderr, p.stdout + p.stderr  # the rank file named, besides the entry
    assert_refused(run_ckpt, d, entry, tmp_path)
