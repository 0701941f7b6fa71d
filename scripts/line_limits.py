#!/usr/bin/env python3
"""line_limits.py [--max-function N] [--max-file N] [--max-width N] [--functions-in DIR ...] [ROOT]

Checks the project's size limits and prints every offender:
  - functions longer than --max-function lines (default 90) in the .cc and .h files of the
    production folders (formats/ reshard/ converters/ trainer/ cli/; --functions-in changes them),
    one line each: `file:line name length`;
  - source files longer than --max-file lines (default 450) anywhere in the tree (.cc, .h, .py;
    build*/ and hidden folders skipped): `file lines`;
  - lines wider than --max-width columns (default 150, the ColumnLimit of .clang-format) in the
    .cc, .h and .py files of formats/ reshard/ converters/ trainer/ cli/ python/ tests/
    benchmarks/ scripts/: `file:line width`. Width counts characters (UTF-8 decoded), a tab as one.
Exit status 1 when there is any offender, 0 otherwise.

A function's length counts from the line where its signature starts to the line of its closing
brace. The scan is a brace matcher over the text with comments, string and character literals
removed: a `{` at namespace or class level whose preceding statement has a parameter list and is
not an initializer (`= {`) nor a type body (class/struct/enum/union/namespace/extern "C") opens a
function. Lambdas and local classes count as part of the function they are in. Macros that open
a brace at namespace level are treated like any statement.
"""
import argparse
import os
import re
import sys

PRODUCTION = ["formats", "reshard", "converters", "trainer", "cli"]
WIDTH_CHECKED = PRODUCTION + ["python", "tests", "benchmarks", "scripts"]
SOURCE_EXT = (".cc", ".h", ".py")


def strip_code(text):
    """Replaces comments and string/char literals by spaces, keeping newlines (so line numbers hold)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            # a ' between digits is a digit separator (1'000), not a literal
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


TYPE_BODY = re.compile(r"\b(namespace|class|struct|union|enum)\b|\bextern\s*$")
# What may stand between a function's parameter list and its body.
SPECIFIERS = re.compile(r"^\s*((const|override|final|noexcept|volatile|mutable|&&|&)\s*)*(->.*)?$", re.S)
NAME = re.compile(r"((?:[~\w]+(?:<[^()<>]*>)?::)*(?:operator\W+|~?\w+(?:<[^()<>]*>)?))\s*$")


def functions(path):
    """Yields (start_line, name, length) of every function defined in a C++ file."""
    with open(path, encoding="utf-8", errors="replace") as f:
        code = strip_code(f.read())
    # Preprocessor lines do not open statements.
    code = re.sub(r"(?m)^[ \t]*#.*(\\\n.*)*$", lambda m: re.sub(r"[^\n]", " ", m.group(0)), code)
    stack = []  # per open brace: "container" (namespace/class level) or ("function", start, name)
    stmt_start = 0  # offset where the current statement at container level began
    line_of = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_of[k] = line
        if ch == "\n":
            line += 1
    in_function = 0
    for k, ch in enumerate(code):
        if ch == "{":
            if in_function:
                stack.append("inner")
                continue
            header = code[stmt_start:k]
            stripped = header.strip()
            ctor_init = re.search(r"\)\s*(noexcept\s*)?:(?!:)", stripped) is not None
            after_params = stripped[stripped.rfind(")") + 1:]
            if ctor_init:
                is_function = stripped.endswith((")", "}"))  # else a brace initializer in the init list
            else:
                is_function = "(" in stripped and SPECIFIERS.match(after_params) is not None
            if stripped and not is_function and (ctor_init or re.search(r"[\w>\]]$", stripped)) and \
                    not TYPE_BODY.search(stripped.split("(")[0]):
                stack.append("init")  # `name{...}`: a brace initializer, part of the statement
                continue
            if is_function and not TYPE_BODY.search(stripped.split("(")[0]) and not stripped.endswith("="):
                m = NAME.search(stripped.split("(")[0])
                name = m.group(1) if m else "?"
                first = stmt_start + (len(header) - len(header.lstrip()))
                stack.append(("function", line_of[first], name))
                in_function += 1
            else:
                stack.append("container")
            stmt_start = k + 1
        elif ch == "}":
            top = stack.pop() if stack else "container"
            if top == "init":
                continue
            if isinstance(top, tuple):
                in_function -= 1
                yield top[1], top[2], line_of[k] - top[1] + 1
            if not in_function:
                stmt_start = k + 1
        elif ch == ";" and not in_function:
            stmt_start = k + 1
        elif ch == ":" and not in_function:
            # access specifiers (public:) end a statement; `::` and initializer lists do not
            before = code[stmt_start:k].strip()
            if before in ("public", "private", "protected") and code[k + 1:k + 2] != ":":
                stmt_start = k + 1


def walk(root, folders, exts):
    for folder in folders:
        base = os.path.join(root, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not d.startswith("build"))
            for fn in sorted(filenames):
                if fn.endswith(exts):
                    yield os.path.join(dirpath, fn)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--max-function", type=int, default=90)
    ap.add_argument("--max-file", type=int, default=450)
    ap.add_argument("--max-width", type=int, default=150)
    ap.add_argument("--functions-in", nargs="*", default=PRODUCTION)
    args = ap.parse_args()
    root = os.path.normpath(args.root)
    bad = 0
    for path in walk(root, args.functions_in, (".cc", ".h")):
        for start, name, length in functions(path):
            if length > args.max_function:
                print(f"{os.path.relpath(path, root)}:{start} {name} {length}")
                bad += 1
    top = sorted(d for d in os.listdir(root)
                 if os.path.isdir(os.path.join(root, d)) and not d.startswith(".") and not d.startswith("build"))
    for path in walk(root, top, SOURCE_EXT):
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = sum(1 for _ in f)
        if lines > args.max_file:
            print(f"{os.path.relpath(path, root)} {lines} lines")
            bad += 1
    for path in walk(root, WIDTH_CHECKED, SOURCE_EXT):
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                width = len(line.rstrip("\r\n"))
                if width > args.max_width:
                    print(f"{os.path.relpath(path, root)}:{number} {width}")
                    bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
