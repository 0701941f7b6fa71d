"""scripts/check_includes.py: the rooms' include rules hold on the repository, and on a copy of its
source folders each kind of violation makes the checker fail naming the file, line and edge, and
undoing the edit makes it pass again.

The copy holds the text files of formats/ reshard/ converters/ trainer/ cli/ python/ (READMEs
included), so the edits never touch the working tree.
"""
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHECKER = ROOT / "scripts" / "check_includes.py"
FOLDERS = ["formats", "reshard", "converters", "trainer", "cli", "python"]


def run_checker(root):
    p = subprocess.run([sys.executable, str(CHECKER), str(root)], capture_output=True, text=True, timeout=120)
    assert not p.stderr, p.stderr
    return p.returncode, p.stdout


def is_text(path):
    data = path.read_bytes()
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.fixture
def tree(tmp_path):
    """A copy of the source folders' text files; the checker passes on it as on the repository."""
    copied = 0
    for top in FOLDERS:
        for src in (ROOT / top).rglob("*"):
            rel = src.relative_to(ROOT)
            if not src.is_file() or any(part.startswith((".", "__")) for part in rel.parts) or not is_text(src):
                continue
            dst = tmp_path / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            copied += 1
    assert copied > 100 and (tmp_path / "formats/base/README.md").is_file()
    assert run_checker(tmp_path) == run_checker(ROOT)
    return tmp_path


def assert_fails_then_passes(tree, edit, undo, expected):
    """`edit` makes the checker fail with a line matching each regex in `expected` (and no other new
    line); after `undo` its output is the untouched copy's again."""
    before = run_checker(tree)
    edit()
    rc, out = run_checker(tree)
    assert rc == 1, out
    new = [ln for ln in out.splitlines() if ln not in before[1].splitlines() and not ln.startswith("check_includes:")]
    for pattern in expected:
        assert any(re.search(pattern, ln) for ln in new), f"no line matches {pattern!r}:\n{out}"
    assert len(new) == len(expected), out
    undo()
    assert run_checker(tree) == before


def edit_file(path, transform):
    """(edit, undo) replacing the text of `path` by transform(text), and back."""
    original = path.read_text(encoding="utf-8")
    return (lambda: path.write_text(transform(original), encoding="utf-8"),
            lambda: path.write_text(original, encoding="utf-8"))


def insert_after_last_include(text, line):
    """`text` with `line` after its last #include, and that line's 1-based number."""
    lines = text.split("\n")
    last = max(i for i, ln in enumerate(lines) if ln.startswith("#include"))
    return "\n".join(lines[:last + 1] + [line] + lines[last + 1:]), last + 2


def test_repository_passes():
    rc, out = run_checker(ROOT)
    assert rc == 0, out
    assert out == ""


def test_forbidden_include_names_file_line_and_edge(tree):
    status = tree / "formats/base/status.h"
    header = sorted(p.name for p in (tree / "trainer").glob("*.h"))[0]
    _, lineno = insert_after_last_include(status.read_text(encoding="utf-8"), "")
    edit, undo = edit_file(status, lambda t: insert_after_last_include(t, f'#include "trainer/{header}"')[0])
    assert_fails_then_passes(tree, edit, undo, [
        rf'^formats/base/status\.h:{lineno}: formats/base -> trainer \("trainer/{re.escape(header)}"\) '
        r"is not allowed by formats/base/README\.md$"])


def test_readme_edge_closing_a_cycle_is_named(tree):
    readme = tree / "formats/base/README.md"
    text = readme.read_text(encoding="utf-8")
    lineno = next(i + 1 for i, ln in enumerate(text.split("\n")) if ln.startswith("May include:"))
    assert "formats/base" in (tree / "trainer/README.md").read_text(encoding="utf-8")
    edit, undo = edit_file(readme, lambda t: re.sub(r"(?m)^May include:.*$", "May include: trainer.", t))
    assert_fails_then_passes(tree, edit, undo, [
        rf"^the allowed edges form a cycle .*: .*formats/base -> trainer \(formats/base/README\.md:{lineno}\)"])


def test_folder_with_code_and_no_readme(tree):
    readme = tree / "formats/digest/README.md"
    text = readme.read_text(encoding="utf-8")
    users = []  # the digest files' includes of other rooms: each becomes a forbidden edge
    for f in sorted((tree / "formats/digest").glob("*.[hc]*")):
        for i, ln in enumerate(f.read_text(encoding="utf-8").split("\n")):
            m = re.match(r'#include "((formats|reshard|converters|trainer|cli)/[^"]+)"', ln)
            if m and not m.group(1).startswith("formats/digest/"):
                users.append(rf"^formats/digest/{re.escape(f.name)}:{i + 1}: formats/digest -> ")
    assert_fails_then_passes(tree, readme.unlink, lambda: readme.write_text(text, encoding="utf-8"), [
        r"^formats/digest/README\.md: missing, but formats/digest/ holds C\+\+ files \(.*\.(h|cc)"] + users)


def test_include_of_a_missing_path(tree):
    target = sorted((tree / "reshard/layout").glob("*.cc"))[0]
    _, lineno = insert_after_last_include(target.read_text(encoding="utf-8"), "")
    edit, undo = edit_file(target, lambda t: insert_after_last_include(t, '#include "formats/base/no_such_header.h"')[0])
    assert_fails_then_passes(tree, edit, undo, [
        rf'^reshard/layout/{re.escape(target.name)}:{lineno}: reshard/layout -> formats/base '
        r'\("formats/base/no_such_header\.h"\): no such file$'])


def test_readme_naming_a_folder_that_is_not_a_room(tree):
    readme = tree / "reshard/layout/README.md"
    text = readme.read_text(encoding="utf-8")
    lineno = next(i + 1 for i, ln in enumerate(text.split("\n")) if ln.startswith("May include:"))
    edit, undo = edit_file(readme, lambda t: re.sub(r"(?m)^(May include: [^.\n]*)", r"\1, formats/nowhere", t))
    assert "nothing" not in next(ln for ln in text.split("\n") if ln.startswith("May include:"))
    assert_fails_then_passes(tree, edit, undo, [
        rf"^reshard/layout/README\.md:{lineno}: reshard/layout -> 'formats/nowhere': not a room"])
