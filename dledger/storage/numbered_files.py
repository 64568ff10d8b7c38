"""Files named by a 20-digit number in one directory, written in place, fsynced in batches.

The plumbing the CommitLog's segments (``dledger/storage/segments.py``) and the broker's derived
files (``broker/store/consume_queue.py``, ``broker/store/index_file.py``, ``broker/store/index_service.py``)
share::

    directory/
      00000000000000000000         a file's name is its number -- a start position, a first
      00000000000000004096         queue offset, a sequence number -- 20 digits, zero-padded
      .00000000000000008192.tmp    one being created (``IndexFile.create``); never read

* ``numbered_files`` lists them in order; ``pread_full`` / ``pwrite_all`` read or write
  all the bytes asked for at an offset, looping over short reads and writes.
* ``unlink_file`` closes and deletes one; ``delete_files_before`` the oldest of a run whose
  numbers all lie before a number (never the last file).
* ``PendingSync``: which files were written or truncated, and whether the directory's
  entries changed (a file created or deleted), since the last fsync. The owner marks
  changes under its own lock; ``take`` collects them with descriptors of their own, so
  the fsyncs run outside the lock while appends go on, and a failed sync puts back what
  it covered.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from common.durable_file import fsync_directory

__all__ = ["NumberedFile", "PendingSync", "SyncBatch", "close_quietly", "delete_files_before",
           "number_name", "numbered_files", "own_descriptor", "pread_full", "pwrite_all", "unlink_file"]

_NUMBERED = re.compile(r"^\d{20}$")

F = TypeVar("F")


def number_name(number: int) -> str:
    """The file name of ``number``: 20 digits, zero-padded."""
    return f"{number:020d}"


def numbered_files(directory: Path) -> list[tuple[int, Path]]:
    """(number, path) of every file of ``directory`` named by a number, in order; others are
    ignored. Raises OSError."""
    directory = Path(directory)
    return sorted((int(p.name), p) for p in directory.iterdir() if _NUMBERED.match(p.name))


def pread_full(fd: int, size: int, offset: int) -> bytes:
    """``size`` bytes at ``offset``, or fewer where the file ends first. Raises OSError."""
    data = os.pread(fd, size, offset)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, offset + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def pwrite_all(fd: int, data: bytes, offset: int, *, restore_length: int | None = None) -> int:
    """Write all of ``data`` at ``offset``; return the offset after it.

    On failure (OSError, or anything raised meanwhile) the file is cut back to
    ``restore_length`` when one is given, so that no partial write stays visible.
    """
    view = memoryview(data)
    try:
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    except BaseException:
        if restore_length is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, restore_length)
        raise
    return offset


def close_quietly(fds: Iterable[int]) -> None:
    """Close every descriptor, ignoring errors (cleanup paths)."""
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class NumberedFile(Protocol):
    """What ``unlink_file`` and ``delete_files_before`` need of a file of a run: its
    descriptor (-1 when closed), its path, and the numbers it spans, [start, end)."""

    fd: int
    path: Path
    start: int
    end: int


NF = TypeVar("NF", bound=NumberedFile)


def own_descriptor(f: NumberedFile) -> int:
    """A descriptor of ``f``'s file of its own (for ``PendingSync.take``): a dup of ``f``'s
    open one, else the file opened read-only. Raises OSError."""
    return os.dup(f.fd) if f.fd >= 0 else os.open(f.path, os.O_RDONLY)


def unlink_file(f: NF, pending: PendingSync[NF]) -> None:
    """Close and delete ``f``; the directory is synced at the next flush (``pending``)."""
    pending.deleted(f)
    if f.fd >= 0:
        os.close(f.fd)
        f.fd = -1
    f.path.unlink(missing_ok=True)


def delete_files_before(files: list[NF], number: int, pending: PendingSync[NF]) -> list[int]:
    """Delete the files of the run ``files`` (oldest first) whose numbers all lie before
    ``number``, never the last one; they leave ``files``. Returns their starts, oldest first."""
    deleted = []
    while len(files) > 1 and files[0].end <= number:
        f = files.pop(0)
        unlink_file(f, pending)
        deleted.append(f.start)
    return deleted


@dataclass(slots=True)
class SyncBatch(Generic[F]):
    """What one ``PendingSync.take`` collected: the files and a descriptor of their own each."""

    directory: Path
    files: list[F]
    fds: list[int]
    entries_changed: bool

    def sync(self) -> None:
        """fsync every file, then the directory if its entries changed; closes the
        descriptors. Raises OSError. Any thread, without the owner's lock."""
        try:
            for fd in self.fds:
                os.fsync(fd)
        finally:
            close_quietly(self.fds)
        if self.entries_changed:
            fsync_directory(self.directory)


class PendingSync(Generic[F]):
    """Changes to the files of ``directory`` not yet fsynced.

    Not thread-safe: the owner calls every method under its own lock (``SyncBatch.sync``
    runs outside it).
    """

    def __init__(self, directory: Path) -> None:
        self._dir = Path(directory)
        self._files: set[F] = set()
        self._entries_changed = False

    def __bool__(self) -> bool:
        return bool(self._files) or self._entries_changed

    def wrote(self, f: F) -> None:
        """``f`` was written or truncated."""
        self._files.add(f)

    def entries_changed(self) -> None:
        """A file was created, renamed or deleted in the directory."""
        self._entries_changed = True

    def deleted(self, f: F) -> None:
        """``f`` was deleted: nothing of it to sync, but the directory's entries changed."""
        self._files.discard(f)
        self._entries_changed = True

    def clear(self) -> None:
        """Forget everything pending (the caller made it durable itself)."""
        self._files.clear()
        self._entries_changed = False

    def take(self, open_fd: Callable[[F], int]) -> SyncBatch[F]:
        """Everything pending, each file with a descriptor of its own (``open_fd``, e.g.
        ``os.dup`` of the owner's); nothing stays pending. Raises OSError from ``open_fd``
        (nothing is then taken)."""
        files, fds = list(self._files), []
        try:
            for f in files:
                fds.append(open_fd(f))
        except BaseException:
            close_quietly(fds)
            raise
        batch = SyncBatch(self._dir, files, fds, self._entries_changed)
        self.clear()
        return batch

    def sync(self, batch: SyncBatch[F], lock: AbstractContextManager[object],
             still_held: Collection[F]) -> None:
        """``batch.sync()`` outside the owner's ``lock``; if it fails, the files of the batch
        still in ``still_held`` are pending again (under ``lock``) and the error is raised."""
        try:
            batch.sync()
        except BaseException:
            with lock:
                self.put_back(batch, still_held)
            raise

    def put_back(self, batch: SyncBatch[F], still_held: Collection[F]) -> None:
        """After ``batch.sync`` failed: its files that still exist are pending again."""
        self._files.update(f for f in batch.files if f in still_held)
        self._entries_changed = self._entries_changed or batch.entries_changed
