"""reshard's source check (reshard/source_verify.h) as `--json` reports it: computed from the copy's
own direct reads (CopyVerify, "copy") with --io direct, and with --io auto from a source out of the
page cache; by the child process ("process") from a warm one; "none" with --no-verify. The check's
failures (a flipped bit named, nothing committed) are in test_reshard_cli.py, in both io modes."""
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import page_cache  # noqa: E402
from test_reshard_cli import CFG_GQA, make_store, model  # noqa: E402,F401  (make_store: a fixture)


def test_direct_reshard_checks_src_from_the_copys_reads(make_store, run_ckpt, tmp_path):
    """--io direct: SRC's digests come from the copy's reads (how "copy"), every piece's bytes counted
    once, either from the copy or re-read."""
    src = make_store(CFG_GQA, model(CFG_GQA))
    total = sum(p["bytes"] for p in json.loads((src / "manifest.json").read_text())["pieces"])
    j = json.loads(run_ckpt("reshard", src, tmp_path / "d", "--tp", 1, "--pp", 2, "--dp", 1, "--io", "direct", "--json").stdout)
    sc = j["source_check"]
    assert sc["how"] == "copy" and sc["bytes_from_copy"] + sc["bytes_reread"] == total, sc
    assert sc["bytes_from_copy"] > total // 2, sc
    j = json.loads(run_ckpt("reshard", src, tmp_path / "n", "--tp", 1, "--pp", 2, "--dp", 1, "--no-verify", "--json").stdout)
    assert j["source_check"] == {"how": "none"}, j["source_check"]


def test_auto_reads_a_cold_source_direct_and_a_warm_one_mapped(make_store, run_ckpt, tmp_path):
    """--io auto: a source out of the page cache is copied with direct reads and checked from them
    (how "copy"); one in the page cache is mapped and checked by the child process. Same bytes."""
    src = make_store(CFG_GQA, model(CFG_GQA))
    outs = {}
    for state in ("cold", "warm"):
        page_cache.evict(src)
        if state == "warm":
            page_cache.read_through(src)
        outs[state] = tmp_path / state
        j = json.loads(run_ckpt("reshard", src, outs[state], "--tp", 1, "--pp", 2, "--dp", 1, "--json").stdout)
        assert j["source_check"]["how"] == ("copy" if state == "cold" else "process"), (state, j["source_check"])
        assert (j["memory"]["read_ahead"] > 0) == (state == "cold"), (state, j["memory"])
    pieces = {k: json.loads((v / "manifest.json").read_text())["pieces"] for k, v in outs.items()}
    assert pieces["cold"] == pieces["warm"]


def test_profile_conversion_keeps_the_child_check(make_store, run_ckpt, tmp_path):
    """A reshard through the profile views computes its pieces rather than copying file ranges: the
    check stays in the child process (overlapping the copy), even with direct reads, and still holds."""
    src = make_store(CFG_GQA, model(CFG_GQA))
    j = json.loads(run_ckpt("reshard", src, tmp_path / "p", "--tp", 1, "--pp", 2, "--dp", 1, "--profile", "megatron-mcore", "--io", "direct",
                            "--json").stdout)
    assert j["source_check"] == {"how": "process"}, j["source_check"]

