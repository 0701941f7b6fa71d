#!/usr/bin/env python3
"""CPU seconds per thread of one command, for a shared machine where wall time alone misleads.

Runs the command, reads /proc/PID/task/*/stat every 10 ms (the last value seen per thread counts:
a thread that exits loses at most 10 ms), and prints one JSON object: wall s, CPU s of the whole
process (getrusage of the child, exact), cores used (CPU / wall) and CPU s per thread name; the
process's first thread is "main", ckpt's store pools name theirs ckpt-encode / ckpt-hash /
ckpt-decode (formats/base/thread_name.h), other threads keep the command's name ("ckpt") and are
numbered in creation order ("ckpt#1", ...). --sync runs sync(1) after the command, inside the wall time.

  .venv/bin/python benchmarks/thread_cpu.py -- build/ckpt from-hf HF OUT --compress shuffle+zstd:1 --threads 2
"""
import json
import os
import subprocess
import sys
import time


def sample(pid, seen, names):
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for t in tids:
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                line = f.read()
        except OSError:
            continue
        name = line[line.index("(") + 1:line.rindex(")")]
        fields = line[line.rindex(")") + 2:].split()
        tid = int(t)
        seen[tid] = int(fields[11]) + int(fields[12])  # utime + stime (ticks)
        names[tid] = name


def main():
    args = sys.argv[1:]
    sync = "--sync" in args[:args.index("--")] if "--" in args else False
    cmd = args[args.index("--") + 1:] if "--" in args else args
    seen, names = {}, {}
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    while True:
        done, status, ru = os.wait4(p.pid, os.WNOHANG)
        if done == p.pid:
            break
        sample(p.pid, seen, names)
        time.sleep(0.01)
    p.returncode = os.waitstatus_to_exitcode(status)
    if sync:
        os.sync()
    wall = time.perf_counter() - t0
    hz = os.sysconf("SC_CLK_TCK")
    per, unnamed = {}, 0
    for tid in sorted(seen):
        n = "main" if tid == p.pid else names[tid]
        if tid != p.pid and n == names.get(p.pid):
            unnamed += 1
            n = f"{n}#{unnamed}"
        per[n] = round(per.get(n, 0) + seen[tid] / hz, 2)
    cpu = ru.ru_utime + ru.ru_stime
    print(json.dumps({"cmd": " ".join(map(str, cmd)), "rc": p.returncode, "wall_s": round(wall, 3), "cpu_s": round(cpu, 2),
                      "cores": round(cpu / wall, 2), "threads_cpu_s": per, "loadavg": open("/proc/loadavg").read().split()[:3]}))
    return p.returncode or 0


if __name__ == "__main__":
    sys.exit(main())
