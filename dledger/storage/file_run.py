"""FileRun: a run of files that each hold a fixed span of numbers, named by the first.

The CommitLog's segments (``dledger/storage/segments.py``: numbers are byte positions) are kept
by one. (ConsumeQueue v2 files hold units of varying message counts, so no fixed span of
queue offsets: ``broker/store/consume_queue_files.py`` keeps them with the same
``dledger/storage/numbered_files.py`` names.)
A file holds the numbers from its name up to the next multiple of
``span``, ``unit`` bytes each, at byte ``(number - start) * unit`` of the file; the
files are contiguous and only the last one grows::

    directory/                        span 4, unit 20
      00000000000000000006   numbers 6..7        only the first may start off a multiple
      00000000000000000008   numbers 8..11       full
      00000000000000000012   numbers 12..13      the last: appended to
                                    ▲ end = 14

Opening checks the names (a multiple of ``span`` except, where allowed, the first; no
gap) and that no file holds more than its span; a failure raises the owner's
``corrupt`` exception naming the file. Files are created empty when the run reaches
them (never preallocated). Durability: ``flush`` fsyncs the files written or truncated
since the last one, and the directory when files were created or deleted
(``PendingSync``).

Thread-safety: the owner takes ``lock`` around every call, except ``flush`` and
``close``, which take it themselves: a flush collects under the lock and fsyncs outside
it, and waits for a flush in progress, so when it returns everything written before
the call is durable; ``close`` and ``wait_flushes`` wait for one too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dledger.storage.disk_guard import OUT_OF_SPACE
from dledger.storage.numbered_files import (
    PendingSync,
    close_quietly,
    delete_files_before,
    number_name,
    numbered_files,
    own_descriptor,
    pread_full,
    pwrite_all,
    unlink_file,
)

__all__ = ["FileRun", "FileRunStore", "RunFile"]


class RunFile:
    """One file of a run: numbers ``start`` up to ``end`` (exclusive), ``length`` bytes."""

    __slots__ = ("end", "fd", "length", "path", "start")

    def __init__(self, start: int, end: int, path: Path, fd: int = -1, length: int = 0) -> None:
        self.start = start
        self.end = end
        self.path = path
        self.fd = fd  # -1 while closed (a run that keeps only its last file open)
        self.length = length


class FileRun:
    """The files of ``directory`` (see the module docstring); the owner keeps the rules of
    what is written in them.

    ``keep_open``: every file keeps a descriptor (reads are frequent), else only the
    last one does and a read of an older file opens it for the call. ``what`` and
    ``span_name`` name a file and the span in error messages ("segment file", "the
    segment size"); ``closed_error`` is the ValueError message after ``close``.
    """

    def __init__(self, directory: Path, span: int, unit: int, *, keep_open: bool,
                 corrupt: type[Exception], what: str, span_name: str, closed_error: str) -> None:
        self.directory = Path(directory)
        self.span = span
        self.unit = unit
        self.lock = threading.Lock()
        self.files: list[RunFile] = []
        self.pending: PendingSync[RunFile] = PendingSync(self.directory)
        self.closed = False
        self._keep_open = keep_open
        self._corrupt = corrupt
        self._what = what
        self._span_name = span_name
        self._closed_error = closed_error
        self._flush_done = threading.Condition(self.lock)
        self._flushing = False
        self._fsync_failed: OSError | None = None  # not for want of space: sticky (``flush``)
        self.directory.mkdir(parents=True, exist_ok=True)

    # -- numbers -----------------------------------------------------------------------
    def end_of(self, start: int) -> int:
        """One past the last number the file named ``start`` may hold."""
        return (start // self.span + 1) * self.span

    @property
    def end(self) -> int:
        """One past the last number written (the last file's length, in units)."""
        last = self.files[-1]
        return last.start + last.length // self.unit

    def index_of(self, number: int) -> int:
        """Which of ``files`` holds ``number`` (the last one for anything past it)."""
        return min(number // self.span - self.files[0].start // self.span, len(self.files) - 1)

    def file_of(self, number: int) -> RunFile:
        return self.files[self.index_of(number)]

    # -- opening -----------------------------------------------------------------------
    @contextmanager
    def closed_on_error(self) -> Iterator[None]:
        """For the owner's constructor: close every descriptor if the block raises."""
        try:
            yield
        except BaseException:
            self.close_fds()
            raise

    def adopt_existing(self, *, aligned_first: bool) -> None:
        """Take the files on disk into ``files`` (checked: names, contiguity, sizes) with
        their lengths; open them (only the last unless ``keep_open``)."""
        for start, path in numbered_files(self.directory):
            if start % self.span and (self.files or aligned_first):
                only = "" if aligned_first else " (only the first may)"
                raise self._corrupt(f"{self._what} {path} does not start at a multiple of "
                                    f"{self._span_name} {self.span}{only}")
            if self.files and start != self.files[-1].end:
                raise self._corrupt(
                    f"{self._what}s in {self.directory} are not contiguous for {self._span_name} "
                    f"{self.span}: {self.files[-1].path.name} is followed by {path.name}")
            self.files.append(RunFile(start, self.end_of(start), path))
        for f in self.files:
            if self._keep_open or f is self.files[-1]:
                f.fd = os.open(f.path, os.O_RDWR)
            f.length = os.fstat(f.fd).st_size if f.fd >= 0 else f.path.stat().st_size
            if f.length > (f.end - f.start) * self.unit:
                raise self._corrupt(f"{self._what} {f.path} has {f.length} bytes, more than "
                                    f"{self._span_name} allows ({(f.end - f.start) * self.unit})")

    def create(self, start: int) -> RunFile:
        """Create the file named ``start``, empty, open, as the new last file."""
        path = self.directory / number_name(start)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        f = RunFile(start, self.end_of(start), path, fd)
        self.pending.entries_changed()
        self.files.append(f)
        return f

    def roll(self) -> RunFile:
        """Create the file after the last one (closing the old one unless ``keep_open``)."""
        old = self.files[-1]
        new = self.create(old.end)
        if not self._keep_open:
            os.close(old.fd)
            old.fd = -1
        return new

    # -- writing -----------------------------------------------------------------------
    def write_at_end(self, f: RunFile, data: bytes | memoryview) -> None:
        """Append ``data`` to ``f``; on failure the file is cut back (nothing counted)."""
        f.length = pwrite_all(f.fd, data, f.length, restore_length=f.length)
        self.pending.wrote(f)

    def set_length(self, f: RunFile, length: int) -> None:
        """Cut or extend (with zeros, sparse) ``f`` to ``length`` bytes; opens it if closed
        (it stays open: the owner is making it the last file or closes it)."""
        if f.fd < 0:
            f.fd = os.open(f.path, os.O_RDWR)
        os.ftruncate(f.fd, length)
        f.length = length
        self.pending.wrote(f)

    def truncate_at(self, number: int) -> RunFile:
        """Drop ``number`` and everything after it: later files are deleted, the file
        holding it is cut there. Returns that file (now the last)."""
        keep = self.index_of(number)
        self.delete_from(keep + 1)
        f = self.files[keep]
        self.set_length(f, (number - f.start) * self.unit)
        return f

    def delete(self, f: RunFile) -> None:
        """Close and unlink ``f`` (the caller takes it out of ``files``)."""
        unlink_file(f, self.pending)

    def delete_from(self, index: int) -> None:
        """Delete ``files[index:]``."""
        for f in self.files[index:]:
            self.delete(f)
        del self.files[index:]

    def delete_before(self, number: int) -> list[int]:
        """Delete the files whose numbers all lie before ``number``, never the last one;
        returns their starts, oldest first."""
        return delete_files_before(self.files, number, self.pending)

    def delete_every_file(self) -> None:
        """Close the files and unlink every numbered file of the directory, listed or not."""
        self.close_fds()
        del self.files[:]
        self.pending.clear()
        for _, path in numbered_files(self.directory):
            path.unlink(missing_ok=True)

    # -- reading -----------------------------------------------------------------------
    def pread(self, f: RunFile, size: int, at: int) -> bytes:
        """Up to ``size`` bytes at byte ``at`` of ``f`` (fewer where it ends)."""
        if f.fd >= 0:
            return pread_full(f.fd, size, at)
        fd = os.open(f.path, os.O_RDONLY)
        try:
            return pread_full(fd, size, at)
        finally:
            os.close(fd)

    # -- durability and closing ----------------------------------------------------------
    def check_open(self) -> None:
        if self.closed:
            raise ValueError(self._closed_error)

    @property
    def dirty(self) -> bool:
        """Something written is not yet known to be durable (lock held)."""
        return bool(self.pending) or self._flushing

    def wait_flushes(self) -> None:
        """Wait until no flush is in progress (lock held)."""
        while self._flushing:
            self._flush_done.wait()

    def flush(self) -> bool:
        """fsync what changed since the last flush; True if anything was synced.

        Raises ValueError after ``close``; OSError if an fsync fails. For want of space
        (ENOSPC, EDQUOT: the disk guard's case) what it covered stays pending and a later
        flush tries again. Any other failure (EIO) is sticky: Linux reports a failed
        writeback once and may drop its pages, so a later fsync could succeed for data that
        never reached the disk -- every later flush raises until the node restarts and
        recovery re-checks each record.
        """
        with self.lock:
            self.wait_flushes()
            self.check_open()
            if self._fsync_failed is not None:
                raise OSError(self._fsync_failed.errno,
                              f"an fsync of a {self._what} failed earlier ({self._fsync_failed}): nothing "
                              "since is taken as durable; restart the node (recovery re-checks every record)")
            if not self.pending:
                return False
            batch = self.pending.take(own_descriptor)
            self._flushing = True
        try:
            self.pending.sync(batch, self.lock, self.files)
        except OSError as e:
            if e.errno not in OUT_OF_SPACE:
                self._fsync_failed = e
            raise
        finally:
            with self.lock:
                self._flushing = False
                self._flush_done.notify_all()
        return True

    def close(self) -> None:
        """Close the files (waits for a flush in progress; does not flush). Idempotent."""
        with self.lock:
            self.wait_flushes()
            if self.closed:
                return
            self.closed = True
            self.close_fds()

    def close_fds(self) -> None:
        close_quietly(f.fd for f in self.files if f.fd >= 0)
        for f in self.files:
            f.fd = -1


class FileRunStore:
    """Base of a store kept in one ``FileRun`` (``self._run``): what passes straight through."""

    _run: FileRun

    @property
    def directory(self) -> Path:
        return self._run.directory

    @property
    def closed(self) -> bool:
        with self._run.lock:
            return self._run.closed

    def flush(self) -> bool:
        """fsync what changed since the last flush; True if anything was synced.

        Raises ValueError after ``close``; OSError if an fsync fails (``FileRun.flush``:
        for want of space it is tried again, any other failure is sticky).
        """
        return self._run.flush()

    def close(self) -> None:
        """Close the files (waits for a flush in progress; does not flush). Idempotent."""
        self._run.close()
