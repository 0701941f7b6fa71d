"""export-megatron --dist-opt and --megatron-version against megatron-core 0.19.2's own files
(fixtures/megatron_core_019): the store imported from the dp_reshardable fixture, exported as Megatron's
distributed optimizer (tp 2, --dp 2, --ddp-bucket-size 2048: 4 buckets per TP rank, one padded), gives
bucket tensors (torch_dist dp_reshardable, read by torch's own DCP loader) and world buffers (legacy
distrib_optim.pt, read by torch.load) whose every parameter slice, placed by the layout restated in
numpy (test_megatron_019_distopt._layout), equals megatron-core's get_parameter_state_dp_zero() oracle;
the alignment gaps and vocabulary padding are zeros; the ShardedObjects (param groups with the step,
per_bucket_numel(_unpadded)) and common state are what megatron-core 0.19 writes; the reimport of each
export equals the store byte for byte; 0.18 and older write common.pt, which megatron-core 0.16.1's
load_common_state_dict reads; fully_reshardable's per-parameter tensors equal megatron-core's own (one
bucket); hostile requests are named errors with nothing written.
That megatron-core 0.19.2 itself loads these exports and its next step equals the fixture's is
fixtures/megatron_core_019/check_resume.py (Python 3.12 only, run by hand: README.md there).
"""
import io
import json
import pathlib

import numpy as np
import pytest
import torch

from test_megatron_019 import FIX, LAYERS, TP_SAVED, VOCAB, _diff_equal, _oracle
from test_megatron_019_distopt import _dcp_buckets, _layout, _registration_order

SRC = "distopt_dp_reshardable"
DIST_OPT = ["--tp", 2, "--dist-opt", "--dp", 2, "--ddp-bucket-size", 2048, "--local-norms"]


@pytest.fixture(scope="module")
def store(tmp_path_factory, ckpt_bin):
    """The dp_reshardable fixture imported into ckpt's store (tp 1): weights, masters, moments, step."""
    import subprocess
    d = tmp_path_factory.mktemp("store") / "native"
    subprocess.run([ckpt_bin, "reshard", str(FIX / SRC), str(d), "--tp", "1", "--pp", "1",
                    "--dp", "1"], check=True, capture_output=True)
    return d


def _export(run_ckpt, store, out, fmt, *extra):
    run_ckpt("export-megatron", store, out, "--format", fmt, *DIST_OPT, *extra)
    return out


def _vocab_rows(pname, r, n_rows):
    """Rows of TP rank r's shard of the embedding / output layer that are real vocabulary (< 200)."""
    if pname in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return max(0, min(n_rows, VOCAB - r * n_rows))
    return None


def _check_buffers(get, sizes, r):
    """Every parameter slice of TP rank r's buffers (get(bucket, state) -> 1-D array; `sizes`: the
    numpy layout's bucket sizes) equals megatron-core's oracle; the rest (alignment gaps, vocabulary
    padding rows) is zero. Returns the number of slices compared."""
    order = _registration_order(TP_SAVED)
    where, want_sizes = _layout(order, 2048, 2)
    assert sizes == want_sizes
    oracle, _ = _oracle(SRC, r)
    covered = {b: np.zeros(n, bool) for b, n in enumerate(sizes)}
    compared = 0
    for pname, n in order.items():
        b, off = where[pname]
        covered[b][off:off + n] = True
        for k in ("param", "exp_avg", "exp_avg_sq"):
            mine = get(b, k)[off:off + n].reshape(oracle[pname][k].shape)
            want = oracle[pname][k]
            keep = _vocab_rows(pname, r, mine.shape[0])
            if keep is not None:
                assert not mine[keep:].any(), f"tp{r} {pname} {k}: vocabulary padding rows not zero"
                mine, want = mine[:keep], want[:keep]
            np.testing.assert_array_equal(mine, want, err_msg=f"tp{r} {pname} {k}")
            compared += 1
    for b, mask in covered.items():
        for k in ("param", "exp_avg", "exp_avg_sq"):
            assert not get(b, k)[~mask].any(), f"tp{r} bucket {b} {k}: alignment gaps not zero"
    return compared


def _bytes_item(d, fqn):
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(str(d)).read_metadata()
    (info,) = [v for k, v in md.storage_data.items() if k.fqn == fqn]
    with open(d / info.relative_path, "rb") as f:
        f.seek(info.offset)
        return torch.load(io.BytesIO(f.read(info.length)), weights_only=False)


def test_torch_dist_dp_reshardable_buckets_equal_megatron_core(run_ckpt, store, tmp_path):
    d = _export(run_ckpt, store, tmp_path / "td", "torch_dist")
    compared = 0
    for r in range(TP_SAVED):
        bk = _dcp_buckets(d, r)
        sizes = [bk[(b, "param")].shape[0] for b in range(len({b for b, _ in bk}))]
        compared += _check_buffers(lambda b, k: bk[(b, k)], sizes, r)
        # the ShardedObjects megatron-core 0.19 writes beside the buckets
        (groups,) = _bytes_item(d, f"optimizer.distributed.dp_group_idx_{r}.optimizer/shard_0_1")
        g0, g1 = groups["param_groups"]
        assert (g0["wd_mult"], g1["wd_mult"]) == (1.0, 0.0) and "params" not in g0
        assert g0["step"] == g1["step"] == _oracle(SRC, r)[1] == 2
        assert (g0["lr"], g0["min_lr"], g0["max_lr"], g0["betas"], g0["weight_decay"]) == (1e-3, 1e-3, 1e-3, (0.9, 0.95), 0.1)
        (numel,) = _bytes_item(d, f"optimizer.distributed.dp_group_idx_{r}.per_bucket_numel/shard_0_1")
        (unpadded,) = _bytes_item(d, f"optimizer.distributed.dp_group_idx_{r}.per_bucket_numel_unpadded/shard_0_1")
        assert numel == [{(torch.float32, torch.float32): [2048, 2176, 2048, 3072]}]
        assert unpadded == [{(torch.float32, torch.float32): sizes}]
    assert compared == 2 * 3 * (3 + 6 * LAYERS)
    # 0.19: the common state is the ShardedObject common_state, no common.pt
    assert not (d / "common.pt").exists()
    assert json.loads((d / "metadata.json").read_text()) == {"sharded_backend": "torch_dist", "sharded_backend_version": 1}
    (common,) = _bytes_item(d, "common_state/shard_0_1")
    assert common["content_metadata"]["distrib_optim_sharding_type"] == "dp_reshardable"
    assert common["optimizer"] == {"param_state_sharding_type": "dp_reshardable"}
    a = common["args"]
    assert (a.use_distributed_optimizer, a.data_parallel_size, a.ddp_bucket_size, a.overlap_grad_reduce, a.world_size) == \
        (True, 2, 2048, True, 4)


def test_legacy_distrib_optim_equals_megatron_core(run_ckpt, store, tmp_path):
    d = _export(run_ckpt, store, tmp_path / "lg", "torch", "--iteration", 10)
    compared = 0
    for r in range(TP_SAVED):
        rank = d / "iter_0000010" / f"mp_rank_{r:02d}"
        world = torch.load(rank / "distrib_optim.pt", weights_only=False)
        assert world["buckets_coalesced"] is True and list(world) == ["buckets_coalesced", 0]
        ((key, bufs),) = world[0].items()
        assert key == (torch.float32, torch.float32)
        assert list(bufs) == ["param", "exp_avg", "exp_avg_sq", "numel_unpadded"]
        _, sizes = _layout(_registration_order(TP_SAVED), 2048, 2)
        assert bufs["numel_unpadded"] == sum(sizes) == bufs["param"].numel()
        start = np.cumsum([0] + sizes)
        compared += _check_buffers(lambda b, k: bufs[k].numpy()[start[b]:start[b + 1]], sizes, r)
        m = torch.load(rank / "model_optim_rng.pt", weights_only=False)
        (g0, g1) = m["optimizer"]["optimizer"]["param_groups"]
        assert set(m["optimizer"]) == {"optimizer"} and g0["step"] == g1["step"] == 2.0
        assert m["args"].use_distributed_optimizer and m["args"].data_parallel_size == 2
    assert compared == 2 * 3 * (3 + 6 * LAYERS)


def _dcp_tensors(d, prefix):
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(str(d)).read_metadata()
    sd = {k: torch.empty(tuple(v.size)) for k, v in md.state_dict_metadata.items()
          if k.startswith(prefix) and hasattr(v, "size")}
    dcp.load(sd, storage_reader=dcp.FileSystemReader(str(d)), no_dist=True)
    return {k: v.numpy() for k, v in sd.items()}


def test_fully_reshardable_equals_megatron_core(run_ckpt, tmp_path_factory, tmp_path, ckpt_bin):
    """--dist-opt-sharding fully_reshardable of the store imported from megatron-core's own
    fully_reshardable fixture (one bucket, the case megatron-core writes correctly): every
    optimizer.state.{param,exp_avg,exp_avg_sq}.<key> tensor, read by torch's DCP loader, equals the
    fixture's (vocabulary padding rows: zeros in ckpt's), the param groups with the step sit in the
    common state with the sharding type, and the reimport equals the store."""
    import subprocess
    name = "distopt_fully_reshardable"
    store = tmp_path / "store"
    subprocess.run([ckpt_bin, "reshard", str(FIX / name), str(store), "--tp", "1", "--pp", "1", "--dp", "1"], check=True,
                   capture_output=True)
    d = tmp_path / "fr"
    run_ckpt("export-megatron", store, d, "--format", "torch_dist", "--tp", 2, "--dist-opt", "--dp", 2,
             "--dist-opt-sharding", "fully_reshardable", "--local-norms")
    want = _dcp_tensors(FIX / name / "iter_0000010", "optimizer.state.")
    got = _dcp_tensors(d, "optimizer.state.")
    assert sorted(got) == sorted(want) and len(got) == 3 * 9
    for k, w in want.items():
        g = got[k]
        assert g.shape == w.shape, k
        if k.endswith("embedding.word_embeddings.weight") or k.endswith("output_layer.weight"):
            assert not g[VOCAB:].any(), k
            g, w = g[:VOCAB], w[:VOCAB]
        np.testing.assert_array_equal(g, w, err_msg=k)
    (common,) = _bytes_item(d, "common_state/shard_0_1")
    assert common["optimizer"]["param_state_sharding_type"] == "fully_reshardable"
    assert common["content_metadata"]["distrib_optim_sharding_type"] == "fully_reshardable"
    assert [g["step"] for g in common["optimizer"]["optimizer"]["param_groups"]] == [2.0, 2.0]
    assert not any(k.startswith("optimizer.distributed.") for k in _dcp_tensors(d, "optimizer.distributed."))
    run_ckpt("reshard", d, tmp_path / "back", "--tp", 1, "--pp", 1, "--dp", 1)
    _diff_equal(run_ckpt, tmp_path / "back", store)


@pytest.mark.parametrize("fmt,extra", [("torch_dist", []), ("torch_dist", ["--megatron-version", "0.18"]),
                                       ("torch", ["--iteration", 10]),
                                       # pp 2 (stage 1: one bucket, S2), uneven split
                                       ("torch_dist", ["--pp", 2, "--pp-layers", "1,3"]),
                                       ("torch", ["--pp", 2, "--pp-layers", "3,1", "--iteration", 10])])
def test_export_reimports_equal_to_the_store(fmt, extra, run_ckpt, store, tmp_path):
    """The export read back by ckpt (its distributed optimizer's buckets included) is the store,
    byte for byte (the vocabulary padding written as zeros is not part of the canonical tensors)."""
    d = _export(run_ckpt, store, tmp_path / "out", fmt, *extra)
    info = json.loads(run_ckpt("inspect", "--json", d).stdout)
    assert "not_imported" not in info, info.get("not_imported")
    run_ckpt("reshard", d, tmp_path / "back", "--tp", 1, "--pp", 1, "--dp", 1)
    _diff_equal(run_ckpt, tmp_path / "back", store)
    man = json.loads(next((tmp_path / "back").rglob("manifest.json")).read_text())
    mg = man["metadata"]["megatron"] if "metadata" in man else man["megatron"]
    assert mg["optimizer_step"] == 2


def test_megatron_version_018_writes_common_pt_that_megatron_core_reads(run_ckpt, store, tmp_path):
    """--megatron-version 0.18: common.pt and the metadata.json with common_backend; megatron-core's
    own load_common_state_dict (0.16.1 in this venv) reads it."""
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict
    d = _export(run_ckpt, store, tmp_path / "v18", "torch_dist", "--megatron-version", "0.18")
    assert json.loads((d / "metadata.json").read_text()) == {
        "sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch", "common_backend_version": 1}
    import torch.distributed.checkpoint as dcp
    md = dcp.FileSystemReader(str(d)).read_metadata()
    assert not any(k.startswith("common_state") for k in md.state_dict_metadata)
    common = load_common_state_dict(str(d))
    assert common["iteration"] == 10 and common["content_metadata"]["distrib_optim_sharding_type"] == "dp_reshardable"
    assert common["args"].num_layers == LAYERS and common["args"].ddp_bucket_size == 2048


@pytest.mark.parametrize("case,code", [
    ("no_optimizer", "DistOptNoOptimizerState"),
    ("one_moment", "MegatronOneMomentExport"),  # exp_avg only: a one-moment (Lion) state, not written
    ("sq_only", "MegatronOptimizerMissingMoment"),  # exp_avg_sq without exp_avg
    ("no_step", "DistOptNoStep"),
    ("te_names", "DistOptNeedsLocalSpec"),
    ("safetensors", "DistOptNeedsMegatronFormat"),
    ("legacy_fully_reshardable", "UnsupportedDistOptim"),
    ("dp_without_dist_opt", "need --dist-opt"),
    ("version_with_legacy", "applies to --format torch_dist"),
])
def test_dist_opt_hostile_requests_are_named(case, code, run_ckpt, store, tmp_path):
    from native_h5py import read_native
    from safetensors.numpy import save_file
    src = store
    args = ["--format", "torch_dist", *DIST_OPT]
    if case in ("no_optimizer", "one_moment", "sq_only", "no_step"):
        man, got, _ = read_native(store)
        cfg = (man["metadata"] if "metadata" in man else man)["model_config"]
        keep = {k: v for k, v in got.items() if not k.startswith("optimizer.")}
        if case == "one_moment":
            keep.update({k: v for k, v in got.items() if k.startswith("optimizer.exp_avg.")})
        if case == "sq_only":
            keep.update({k: v for k, v in got.items() if k.startswith("optimizer.exp_avg_sq.")})
        if case == "no_step":
            keep.update({k: v for k, v in got.items() if k.startswith("optimizer.")})
        src = tmp_path / "hf"
        src.mkdir()
        save_file({k: np.ascontiguousarray(v) for k, v in keep.items()}, str(src / "model.safetensors"))
        (src / "config.json").write_text(json.dumps(cfg))
    if case == "te_names":  # legacy files name the norms per spec; torch_dist always writes the local spec's keys
        args.remove("--local-norms")
        args[1] = "torch"
    if case == "safetensors":
        args[1] = "safetensors"
    if case == "dp_without_dist_opt":
        args.remove("--dist-opt")
    if case == "version_with_legacy":
        args[1] = "torch"
        args += ["--megatron-version", "0.18"]
    if case == "legacy_fully_reshardable":  # a torch_dist form only
        args[1] = "torch"
        args += ["--dist-opt-sharding", "fully_reshardable"]
    p = run_ckpt("export-megatron", src, tmp_path / "out", *args, check=False)
    assert p.returncode != 0 and code in p.stderr and "internal error" not in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def test_megatron_version_out_of_range_is_named_in_python(store, tmp_path):
    """The CLI refuses the value by its flag check; the Python API reaches the job's named error."""
    import ckpt
    with pytest.raises(Exception) as e:
        ckpt.export_megatron(store, tmp_path / "out", tp=2, format="torch_dist", megatron_version="0.15")
    assert "UnsupportedMegatronVersion" in str(e.value) and "internal error" not in str(e.value), str(e.value)
    assert not (tmp_path / "out").exists()


# --- megatron-core 0.16.1 (this venv) resumes from the exports: the DistributedOptimizer on CPU ---

CHECK = FIX / "check_resume.py"
PARAM_ULPS = 2  # the fixture's two steps, one ulp each at most


def _check_resume(form, export, tmp_path):
    """fixtures/megatron_core_019/check_resume.py under this venv's megatron-core 0.16.1 (4 CPU
    processes, gloo, the shims of cpu_shims.py): the export loaded into megatron-core's own
    DistributedOptimizer (tp 2 x dp 2) and one more step, against megatron-core training the
    fixture's two steps and the third without stopping (make_fixtures.py's seeds). The fixture's two
    steps were taken on another machine, whose CPU may round Adam's update differently (FMA or not: one
    float32 ulp a step): each element of the masters and weights may differ from this machine's
    uninterrupted run by PARAM_ULPS ulps of its value, the moments (independent of the parameters:
    seeded gradients) not at all. -> (rc, report)."""
    import subprocess
    import sys
    out = tmp_path / f"check_{form}.json"
    p = subprocess.run([sys.executable, str(CHECK), "-", str(export), "--form", form, "--uninterrupted",
                        "--param-ulps", str(PARAM_ULPS), "--json", str(out),
                        "--status", str(tmp_path / f"check_{form}.status")], capture_output=True, text=True, timeout=900)
    return p, (json.loads(out.read_text()) if out.exists() else None)


@pytest.mark.parametrize("form", ["dp_reshardable", "fully_reshardable", "legacy"])
def test_megatron_core_016_resumes_from_export_as_if_never_stopped(form, run_ckpt, store, tmp_path, ckpt_bin):
    import subprocess
    src = store
    if form == "fully_reshardable":  # megatron-core's one-bucket case (README.md there)
        src = tmp_path / "store_fr"
        subprocess.run([ckpt_bin, "reshard", str(FIX / "distopt_fully_reshardable"), str(src), "--tp", "1", "--pp", "1",
                        "--dp", "1"], check=True, capture_output=True)
    args = {"dp_reshardable": ["--format", "torch_dist", "--ddp-bucket-size", 2048, "--megatron-version", "0.16"],
            "fully_reshardable": ["--format", "torch_dist", "--dist-opt-sharding", "fully_reshardable", "--megatron-version", "0.16"],
            "legacy": ["--format", "torch", "--ddp-bucket-size", 2048, "--iteration", 10]}[form]
    d = tmp_path / "export"
    run_ckpt("export-megatron", src, d, "--tp", 2, "--dist-opt", "--dp", 2, "--local-norms", *args)
    p, rep = _check_resume(form, d, tmp_path)
    assert p.returncode == 0 and rep, p.stdout[-3000:] + p.stderr[-3000:]
    assert rep["megatron_core"].startswith("0.16") and len(rep["ranks"]) == TP_SAVED
    for r in rep["ranks"]:
        assert r["tensors"] == 3 + 6 * LAYERS
        after, before = r["uninterrupted_vs_export_max_abs_diff"], r["uninterrupted_vs_export_before_step_max_abs_diff"]
        assert after["exp_avg"] == after["exp_avg_sq"] == before["exp_avg"] == before["exp_avg_sq"] == 0.0, r
        assert r["uninterrupted_vs_export_max_ulps"]["param"] <= PARAM_ULPS, r
        assert r["uninterrupted_vs_export_max_ulps"]["weight"] <= PARAM_ULPS, r
        assert r["step_uninterrupted"] == [3] and r["step_export"] == [2, 3]


def test_resume_check_fails_on_one_changed_moment(run_ckpt, store, tmp_path):
    """The check above can fail: one exp_avg_sq element of one legacy distrib_optim.pt changed by 0.1 %."""
    d = tmp_path / "export"
    run_ckpt("export-megatron", store, d, "--format", "torch", "--tp", 2, "--dist-opt", "--dp", 2, "--ddp-bucket-size", 2048,
             "--local-norms", "--iteration", 10)
    f = d / "iter_0000010" / "mp_rank_01" / "distrib_optim.pt"
    o = torch.load(f, weights_only=False)
    ((_, bufs),) = o[0].items()
    bufs["exp_avg_sq"][5000] *= 1.001
    torch.save(o, f)
    p, rep = _check_resume("legacy", d, tmp_path)
    assert p.returncode == 1 and rep, p.stdout[-3000:] + p.stderr[-3000:]
    diffs = {r["tp_rank"]: r["uninterrupted_vs_export_max_abs_diff"] for r in rep["ranks"]}
    assert diffs[0]["exp_avg_sq"] == 0.0 and 0 < diffs[1]["param"] < 1e-6 and diffs[1]["exp_avg_sq"] > 0, diffs


@pytest.mark.parametrize("fmt", ["torch_dist", "torch"])
def test_bf16_weights_keep_the_fp32_masters(fmt, run_ckpt, store, tmp_path):
    """--dtype bf16: the weights are written in bf16, the buffers (masters, moments) in fp32, keyed
    (torch.bfloat16, torch.float32); read back, the masters are the store's fp32 weights bit for bit
    (torch_dist: the import takes the masters as the weights; legacy: as optimizer.fp32_param.*)."""
    from native_h5py import read_native
    extra = ["--iteration", 10] if fmt == "torch" else []
    d = _export(run_ckpt, store, tmp_path / "out", fmt, "--dtype", "bf16", *extra)
    if fmt == "torch":
        world = torch.load(d / "iter_0000010" / "mp_rank_00" / "distrib_optim.pt", weights_only=False)
        assert list(world[0]) == [(torch.bfloat16, torch.float32)]
        assert torch.load(d / "iter_0000010" / "mp_rank_00" / "model_optim_rng.pt",
                          weights_only=False)["model"]["decoder.final_layernorm.weight"].dtype == torch.bfloat16
    else:
        import torch.distributed.checkpoint as dcp
        md = dcp.FileSystemReader(str(d)).read_metadata().state_dict_metadata
        assert md["decoder.final_layernorm.weight"].properties.dtype == torch.bfloat16
        keys = [k for k in md if k.startswith("optimizer.distributed.dp_group_idx_0.gbuf_idx_0.")]
        assert keys and all("dtype_(torch.bfloat16, torch.float32)" in k and md[k].properties.dtype == torch.float32
                            for k in keys)
    run_ckpt("reshard", d, tmp_path / "back", "--tp", 1, "--pp", 1, "--dp", 1)
    _, want, _ = read_native(store)
    _, got, _ = read_native(tmp_path / "back")
    for name, w in want.items():
        if name.startswith("optimizer."):
            np.testing.assert_array_equal(got[name], w, err_msg=name)
        else:
            master = got[name] if fmt == "torch_dist" else got["optimizer.fp32_param." + name]
            assert master.dtype == w.dtype == np.float32, name
            np.testing.assert_array_equal(master, w, err_msg=name)
