"""DiskGuard: whether this replica's disk can take writes -- one flag for everyone who writes.

A write that fails for want of space (``ENOSPC``, ``EDQUOT``) raises the flag (``note``):
a CommitLog append, a ConsumeQueue unit, an IndexFile page, a checkpoint. While it is up:

    the Raft node      does not stand for election; a leader hands the leadership over
                       (``ReplicatedLog``) and refuses proposals with ``DiskFull`` naming it
    a follower         refuses the entries it cannot store and says so in its answer, so
                       the leader keeps its lease and answers clients ``DiskFull`` naming it
    the apply step     waits where its write failed and tries it again (``wait_for_space``):
                       nothing is skipped, nothing is applied twice
    /status, /metrics  show the flag, why, and the free bytes

The flag goes down only when the file system has ``resume_free_bytes`` free again -- at
most a tenth of its size, so that a disk smaller than ten times the setting resumes too
(``check``, called about once a second by the Raft tick): a disk hovering at its edge
does not flap between leading and refusing. Nothing has to be restarted. A failure
reported after that much is free again (a write that began before space was freed) does
not raise the flag. Free space is what ``statvfs`` gives an unprivileged writer; a quota
(``EDQUOT``) is not measured, so under one the flag may go down while the quota is still
used up, and goes up again at the next write that fails.

Threads: any; ``check`` and ``note`` may race (the flag is one attribute, the reason
is informational).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["OUT_OF_SPACE", "DiskGuard", "is_out_of_space"]

log = logging.getLogger("dledger.disk_guard")

#: errno values meaning "this file system cannot take more bytes".
OUT_OF_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
#: How often a writer waiting for space tries its write again.
RETRY_S = 0.5
#: Less free than this (one entry's room) is a full disk before any write fails: a replica
#: that could not append a single entry must not win an election only to hand it on.
NO_ROOM_BYTES = 64 * 1024

T = TypeVar("T")


def is_out_of_space(error: BaseException) -> bool:
    """True for an OSError saying the file system is full (or the quota is used up)."""
    return isinstance(error, OSError) and error.errno in OUT_OF_SPACE


class DiskGuard:
    """The disk-full flag of the file system holding ``directory`` (module docstring)."""

    def __init__(self, directory: Path, resume_free_bytes: int,
                 free_bytes: Callable[[], int] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """``free_bytes``: how many bytes the file system has free (default: statvfs of
        ``directory``, what an unprivileged writer may use); ``clock``: wall time of
        ``full_since``."""
        self._directory = Path(directory)
        self.resume_free_bytes = resume_free_bytes
        #: how free space and the file system's size are measured (a test may replace them)
        self.measure_free: Callable[[], int] = free_bytes or self._statvfs_free
        self.measure_total: Callable[[], int] = self._statvfs_total
        self._clock = clock
        self._full = False
        self._reason: str | None = None
        self._since: float | None = None
        self._closed = threading.Event()

    @property
    def full(self) -> bool:
        return self._full

    @property
    def reason(self) -> str | None:
        """The write that raised the flag and its error (None while it is down)."""
        return self._reason

    def free_bytes(self) -> int:
        """Free bytes now (0 if the file system cannot be asked)."""
        try:
            return self.measure_free()
        except OSError:
            return 0

    def note(self, what: str, error: BaseException) -> bool:
        """``what`` failed with ``error``: raise the flag if it says the disk is full -- unless
        ``resume_free_bytes`` are free by now (a write that failed before space was freed).

        Returns whether ``error`` is out-of-space (the caller re-raises anything else)."""
        if not is_out_of_space(error):
            return False
        if not self._full and self.free_bytes() < self.resume_threshold():
            self._reason = f"{what}: {error}"
            self._since = self._clock()
            self._full = True
            log.error("the disk of %s is full (%s); %d bytes free. Writes stop here until %d bytes "
                      "are free again", self._directory, self._reason, self.free_bytes(),
                      self.resume_threshold())
        return True

    def resume_threshold(self) -> int:
        """The free bytes that lower the flag: ``resume_free_bytes``, at most a tenth of the
        file system."""
        try:
            return min(self.resume_free_bytes, self.measure_total() // 10)
        except OSError:
            return self.resume_free_bytes

    def check(self) -> bool:
        """Lower the flag if ``resume_threshold()`` bytes are free again, raise it if less than
        ``NO_ROOM_BYTES`` are; returns whether it is up."""
        if not self._full:
            free = self.free_bytes()
            if free < NO_ROOM_BYTES:
                self._reason = f"only {free} bytes free (less than one entry's room)"
                self._since = self._clock()
                self._full = True
                log.error("the disk of %s is full: %s. Writes stop here until %d bytes are free "
                          "again", self._directory, self._reason, self.resume_threshold())
        elif self._full:
            free = self.free_bytes()
            if free >= self.resume_threshold():
                log.warning("the disk of %s has %d bytes free again (it was full since %.0f s: %s); "
                            "writes resume", self._directory, free,
                            self._clock() - (self._since or self._clock()), self._reason)
                self._full, self._reason, self._since = False, None, None
        return self._full

    def status(self) -> dict[str, Any]:
        """``/status``'s ``disk`` fields: free bytes, the flag, why and since when."""
        return {"free_bytes": self.free_bytes(), "full": self._full, "full_reason": self._reason,
                "full_since": self._since, "resume_free_bytes": self.resume_threshold()}

    def wait_for_space(self, what: str, write: Callable[[], T]) -> T:
        """Run ``write`` until it does not fail for want of space, and return its result.

        For a writer that cannot skip its write (the apply step): ``write`` must leave
        nothing half done when it raises, so that calling it again is the same as calling
        it once. Other errors are raised at once; after ``close`` the last out-of-space
        error is raised instead of waiting on.
        """
        while True:
            try:
                return write()
            except OSError as e:
                if not self.note(what, e) or self._closed.is_set():
                    raise
            if self._closed.wait(RETRY_S):
                continue  # one last try, then the error

    def close(self) -> None:
        """Stop waiting in ``wait_for_space`` (the replica is shutting down)."""
        self._closed.set()

    def _statvfs_free(self) -> int:
        st = os.statvfs(self._directory)
        return st.f_bavail * st.f_frsize

    def _statvfs_total(self) -> int:
        st = os.statvfs(self._directory)
        return st.f_blocks * st.f_frsize
