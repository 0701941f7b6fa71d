#!/usr/bin/env python3
"""check_includes.py [ROOT]

Checks that every `#include "..."` of ckpt's own headers crosses only the folder edges the folders
allow. Each folder (a "room") of formats/ reshard/ converters/ trainer/ cli/ python/ holding C++
files has a README.md with one line

    May include: formats/base, formats/tensor.

naming the other rooms its .h and .cc files may include (a file may always include its own room;
"May include: nothing ..." allows none). The rules:
  - a room with .h/.cc files and no README.md, or a README.md without a "May include:" line: error;
  - a "May include:" line naming a folder that is not a room: error, `README.md:line`;
  - the allowed edges forming a cycle (A may include B, B may include A, directly or through
    others): error, naming each edge of the cycle with the README.md line that allows it;
  - an include of a file of another room not on the list: error, `file:line: room -> room`;
  - an include of a ckpt path that does not exist: error, `file:line: room -> room`, no such file
    (a stale path after a move).
Tests, tools and benchmarks may include anything and are not checked.
Exit status 1 when there is any error, 0 otherwise.
"""
import os
import re
import sys

ROOTS = ["formats", "reshard", "converters", "trainer", "cli", "python"]
INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([^"]+)"', re.M)  # [ \t]: \s would match the newline of a blank line before
ROOM_TOKEN = re.compile(r"[a-z_][a-z0-9_]*(?:/[a-z0-9_]+)*")


def rooms_of(root):
    """{room: [source files]} for every folder under ROOTS (a folder without code is a room too)."""
    rooms = {}
    for top in ROOTS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
            rel = os.path.relpath(dirpath, root)
            rooms[rel] = sorted(f for f in filenames if f.endswith((".h", ".cc")))
    return rooms


def allowed_edges(root, rooms, errors):
    """({room: set of rooms it may include}, {room: "room/README.md:line" of its "May include:"}),
    from each room's README.md."""
    allowed, where = {}, {}
    for room, files in rooms.items():
        allowed[room] = set()
        readme = os.path.join(root, room, "README.md")
        if not os.path.isfile(readme):
            if files:
                errors.append(f"{room}/README.md: missing, but {room}/ holds C++ files ({', '.join(files[:3])}"
                              f"{', ...' if len(files) > 3 else ''}): no include of another room is allowed")
            continue
        lines = [(i + 1, ln) for i, ln in enumerate(open(readme, encoding="utf-8")) if ln.startswith("May include:")]
        if len(lines) != 1:
            errors.append(f"{room}/README.md: expected exactly one 'May include:' line, found {len(lines)}")
            continue
        lineno, line = lines[0]
        where[room] = f"{room}/README.md:{lineno}"
        text = line[len("May include:"):].strip()
        if text.startswith("nothing"):
            continue
        for token in text.rstrip(".").split(","):
            token = token.strip()
            if not ROOM_TOKEN.fullmatch(token) or token not in rooms:
                errors.append(f"{where[room]}: {room} -> '{token}': not a room (a folder under {', '.join(ROOTS)})")
            elif token == room:
                errors.append(f"{where[room]}: lists itself")
            else:
                allowed[room].add(token)
    return allowed, where


def find_cycle(allowed):
    """One cycle of the allowed-edge graph as a list of rooms, or None."""
    state = {}
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(allowed.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                c = visit(m)
                if c:
                    return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(allowed):
        if n not in state:
            c = visit(n)
            if c:
                return c
    return None


def check(root):
    errors = []
    rooms = rooms_of(root)
    allowed, where = allowed_edges(root, rooms, errors)
    cycle = find_cycle(allowed)
    if cycle:
        edges = [f"{a} -> {b} ({where[a]})" for a, b in zip(cycle, cycle[1:])]
        errors.append("the allowed edges form a cycle " + " -> ".join(cycle) + ": " + "; ".join(edges))
    for room, files in sorted(rooms.items()):
        for f in files:
            path = os.path.join(room, f)
            text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
            for m in INCLUDE.finditer(text):
                inc = m.group(1)
                line = text.count("\n", 0, m.start()) + 1
                if os.path.isfile(os.path.join(root, room, inc)):
                    continue  # relative to its own folder (generated or local headers)
                if not inc.split("/")[0] in ROOTS + ["tests"]:
                    continue  # a third-party header in quotes
                target = os.path.dirname(inc)
                if not os.path.isfile(os.path.join(root, inc)):
                    errors.append(f"{path}:{line}: {room} -> {target} (\"{inc}\"): no such file")
                    continue
                if target != room and target not in allowed.get(room, set()):
                    errors.append(f"{path}:{line}: {room} -> {target} (\"{inc}\") is not allowed by {room}/README.md")
    return errors


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    errors = check(root)
    for e in errors:
        print(e)
    if errors:
        print(f"check_includes: {len(errors)} error(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
