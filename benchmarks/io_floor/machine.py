"""The machine's state (date, load, memory, disk, busiest processes), JSON lines, ckpt's memory budget."""
import datetime
import json
import os
import pathlib
import re
import subprocess

from io_modes_bench import uptime


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()


def machine_state(d: pathlib.Path, brief=False):
    """Date, load, memory, the disk under d and the busiest processes, as one dict."""
    mem = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":")
        if k in ("MemTotal", "MemFree", "MemAvailable", "Cached", "Dirty", "Writeback"):
            mem[k + "_MiB"] = int(v.split()[0]) // 1024
    out = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "uptime": uptime(),
           "loadavg": [float(x) for x in open("/proc/loadavg").read().split()[:3]], "mem": mem,
           "busiest": [ln.strip() for ln in _run(["ps", "-eo", "pcpu,etime,comm", "--sort=-pcpu"]).splitlines()[1:5]]}
    if brief:
        return out
    df = _run(["df", "-PT", str(d)]).splitlines()[-1].split()
    disk = {"device": df[0], "fstype": df[1], "size_GiB": int(df[2]) >> 20, "avail_GiB": int(df[4]) >> 20}
    dev = re.sub(r"p?\d+$", "", os.path.basename(df[0])) if re.search(r"[a-z]\d+$", df[0]) else os.path.basename(df[0])
    q = pathlib.Path("/sys/block") / dev / "queue"
    disk.update({f: (q / f).read_text().strip() for f in ("scheduler", "rotational", "max_sectors_kb", "nr_requests")
                 if (q / f).is_file()})
    out.update(disk=disk, nproc=os.cpu_count())
    return out


def say(obj):
    print(json.dumps(obj), flush=True)


def budget_mib(ckpt, max_memory):
    """--max-memory in MiB; '' = ckpt's default, read from `ckpt reshard --help` (256M if not found)."""
    if not max_memory:
        m = re.search(r"--max-memory.*?\(default (\d+[KMG])\)", _run([ckpt, "reshard", "--help"]), re.S)
        max_memory = m.group(1) if m else "256M"
    n, u = int(max_memory[:-1]), max_memory[-1].upper()
    return n * {"K": 1 / 1024, "M": 1, "G": 1024}[u]
