"""Page-cache state of test inputs: evict a tree's files from the page cache (fsync, then
posix_fadvise DONTNEED: no root needed), or read them through so they are in it."""
import os
import pathlib


def evict(d):
    for p in pathlib.Path(d).rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def read_through(d):
    for p in pathlib.Path(d).rglob("*"):
        if p.is_file():
            p.read_bytes()
