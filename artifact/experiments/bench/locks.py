"""A result file's locks: one writer at a time, and the cells being run claimed.

A result file may be shared by several processes (shards of one grid, or a rerun started while an earlier one
still runs). They coordinate through an exclusive fcntl.flock on the sidecar `<out>.lock` (`locked`), which a
writer holds only while it reads the file and appends one finished cell (milliseconds, never while a cell
runs). A second process therefore WAITS for the lock, saying once which PID holds it; it never refuses. Under
the lock a writer re-reads the file, so a cell that another process finished meanwhile is skipped (before it
runs) or its rows are dropped (if both ran it): every run is in the file once. Processes on the same shard
also split the work: a cell being run is claimed (CellClaims), others run unclaimed cells first and then wait
for the claimed ones, running one only if its claimant died before finishing it.

The lock file stays in place (removing it would let two processes lock different files); flock is released by
the kernel when its holder exits or is killed, so a crash leaves no stale lock. The file itself (its columns,
reading, repair, appending, merging) is results.py's.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from contextlib import contextmanager
from pathlib import Path

from artifact.experiments.bench.grid import Cell


def lock_path(path: Path | str) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".lock")


QUIET_WAIT_S = 2.0  # a wait for the result file's lock is logged after this long


def _try_flock(fd: int, mode: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


@contextmanager
def locked(path: Path | str, shared: bool = False, log=print):
    """Hold `<path>.lock`: exclusive (a writer; its PID is written into the lock file) or shared (a reader).
    Waits while another process holds it, logging the holder's PID once the wait passes QUIET_WAIT_S."""
    lock = lock_path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        if not _try_flock(fd, mode, QUIET_WAIT_S):  # appends take milliseconds: only a longer wait is news
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            log(
                f"waiting for PID {holder}, which is writing {path} (lock file {lock})"
                if holder
                else f"waiting for another process reading {path} (lock file {lock})"
            )
            fcntl.flock(fd, mode)
        if not shared:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield
        finally:
            if not shared:
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # releases the flock


class CellClaims:
    """Which process is running which cell of a result file, so that processes on the same shard split
    the work instead of computing every cell twice. A claim is a POSIX byte-range lock (fcntl.lockf) on
    one byte of the sidecar `<out>.cells.lock`, at an offset hashed from the cell key: the kernel drops
    it when its holder exits or dies, so a crash leaves no stale claim. A claim only saves work; the
    file lock and the re-read before each append keep the file right even without one (a hash collision
    or a claim lost to another close of the file in this process merely lets a cell run twice, and the
    second copy is dropped). Record locks never conflict within one process."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".cells.lock")

    def __enter__(self) -> "CellClaims":
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self.fd)  # releases every claim still held

    @staticmethod
    def _offset(cell: Cell) -> int:
        return int.from_bytes(hashlib.sha1(repr(cell.key).encode()).digest()[:4], "little")

    def take(self, cell: Cell, wait: bool) -> bool:
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB), 1, self._offset(cell))
        except (BlockingIOError, PermissionError):  # held by another process (EAGAIN or EACCES)
            return False
        return True

    def release(self, cell: Cell) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, self._offset(cell))
