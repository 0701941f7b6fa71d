"""The corruption matrix (corruption_matrix.py, docs/INTEGRITY.md): every source kind ckpt reads x one mutation
(a data byte, a metadata byte, a manifest/config field) x every command that reads it (verify, inspect,
diff, reshard, convert, to-hf, export-megatron, export-dcp, train --resume, the Python module's read and
verify). Each cell must end in a named error with nothing committed, or in the format's documented
"cannot check" (verify's note names the format), or, for inspect on a data byte, "not read"; a silent
success fails the cell, named by its id (kind-mutation-command).

The default suite runs a bounded, deterministic sample (every kind x every mutation x 3 commands,
rotating); CKPT_LONG=1 runs every cell. CKPT_MATRIX_TABLE=PATH writes the table of the cells run to
PATH (into docs/INTEGRITY.md between its matrix markers: `CKPT_LONG=1 CKPT_MATRIX_TABLE=docs/INTEGRITY.md`).
"""
import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import corruption_matrix as cm  # noqa: E402

pytest.importorskip("h5py")
pytest.importorskip("transformers")

LONG = os.environ.get("CKPT_LONG", "") not in ("", "0")
CELLS = cm.all_cells() if LONG else cm.sample_cells()


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, ckpt_bin):
    mx = cm.Matrix(tmp_path_factory.mktemp("matrix"), ckpt_bin).build()
    yield mx
    out = os.environ.get("CKPT_MATRIX_TABLE")
    if out:
        cm.write_table(mx, out)


def test_kinds_say_what_they_cannot_check(matrix):
    """The documented "cannot check" of each kind: verify --json of the clean checkpoint names the
    format whose bytes have no checksum; the kinds with checks say their scheme."""
    n = matrix.notes
    for k in ("hf-dir", "safetensors-file"):
        assert n[k]["checksums"] is False and cm.ST_CANNOT in n[k]["note"], (k, n[k])
    assert n["megatron-safetensors"]["checksums"] is False and "safetensors" in n["megatron-safetensors"]["note"]
    for k in ("native", "native-tp2", "native-zstd", "profile-paddlenlp", "trainer-run"):
        assert n[k]["checksums"] is True and "digest" in n[k]["scheme"], (k, n[k])
    for k in ("native-v1", "native-v2"):
        assert n[k]["checksums"] is True and cm.OLD_CANNOT in n[k]["note"], (k, n[k])
    for k in ("dcp", "megatron-torch", "mcore-torch-dist"):
        assert n[k]["checksums"] is True and "CRC-32" in n[k]["scheme"], (k, n[k])


@pytest.mark.parametrize("kind,mutation,command", CELLS, ids=[f"{k}-{m}-{c}" for k, m, c in CELLS])
def test_cell(matrix, kind, mutation, command):
    outcome, r, what = matrix.cell(kind, mutation, command)
    assert outcome in cm.OK_OUTCOMES, (
        f"{kind} x {mutation} x {command}: {outcome}\n  mutation: {what}\n  command: {' '.join(r.argv)}\n"
        f"  exit {r.rc}, left {r.left}\n  output (tail): {(r.out or '')[-800:]}")


def test_not_applicable_pairs_are_refused_by_name(matrix):
    """The pairs left out of the matrix: the command refuses the clean kind naming why (train --resume
    is run on the trainer's checkpoint only: the others have another model config)."""
    for kind, cmd in sorted(cm.NOT_APPLICABLE):
        if cmd == "train-resume":
            continue
        r = matrix.clean_run(kind, cmd)
        assert r.rc not in (0, "timeout") and cm.CODE_RE.search(r.out), (kind, cmd, r.rc, r.out)
