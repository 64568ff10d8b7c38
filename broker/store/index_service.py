"""IndexService: a directory of IndexFiles numbered 0, 1, 2, ...; the last one takes the puts.

::

    index/
      00000000000000000000   full            (1/64 of the geometry)
      00000000000000000001   full            (1/16)
      00000000000000000002   the one being written (1/4; later files whole)

The files' layout is drawn in ``broker/store/index_layout.py``; ``broker/store/index_file.py`` maps
one file. Here: which file a message's keys go to, queries across files newest first,
retention (whole files, by position), rollback to a checkpoint's mark and recovery
after a crash (``truncate_from_position``).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

from broker.store.index_file import IndexFile, IndexFileClosed
from broker.store.index_layout import (
    DEFAULT_INDEX_NUM,
    DEFAULT_SLOT_NUM,
    IndexFileCorrupt,
    IndexHeader,
    check_geometry,
    geometry_of,
    index_file_name,
    index_file_size,
)
from common.durable_file import fsync_directory
from dledger.storage.numbered_files import numbered_files

__all__ = ["IndexService"]

_TEMP = re.compile(r"^\.\d{20}\.tmp$")  # left by an interrupted IndexFile.create


class IndexService:
    """A directory of IndexFiles numbered 0, 1, 2, ...; the last one takes the puts.

    Files are sized for the load (``geometry_of``): file 0 has 1/64 of the service's
    slots and entries, file 1 1/16, file 2 1/4 and every later file the whole, so an
    idle broker holds one ~6.6 MB file (apparent size, defaults) instead of ~420 MB,
    and a busy one reaches full-size files after about 6.6 million keys. A file of the
    full geometry is accepted at any number (written before files were graded).
    Other sizes raise IndexFileCorrupt on open: the index is derived data, so delete
    the directory and rebuild it, or restore the old sizes. The keys of one message never span
    two files: when they do not all fit in the last file, a new one is started
    (the rest of the old one stays unused), so each file begins at a message and
    rebuilding from that message's position reproduces it.

    Thread-safety: one thread puts (the apply step) while any threads query; every
    public method may be called from any thread. Methods raise ValueError after
    ``close``.
    """

    def __init__(self, directory: Path, slot_num: int = DEFAULT_SLOT_NUM,
                 index_num: int = DEFAULT_INDEX_NUM, *, graded: bool = True) -> None:
        """Open (or create, empty) the index in ``directory``; ``graded=False``: every file
        of the full geometry.

        Removes temporary files left by an interrupted ``IndexFile.create``. Raises
        ValueError for a bad geometry, IndexFileCorrupt if the file numbers are not
        contiguous or a file is not of this geometry, OSError.
        """
        check_geometry(slot_num, index_num)
        self._dir = Path(directory)
        self._slot_num = slot_num
        self._index_num = index_num
        self._graded = graded
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._files: list[tuple[int, IndexFile]] = []
        self._dir_dirty = False
        self._closed = False
        self._dir.mkdir(parents=True, exist_ok=True)
        for p in self._dir.iterdir():
            if _TEMP.match(p.name):
                p.unlink(missing_ok=True)
                self._dir_dirty = True
        try:
            for seq, path in numbered_files(self._dir):
                if self._files and seq != self._files[-1][0] + 1:
                    raise IndexFileCorrupt(
                        f"index files in {self._dir} are not numbered contiguously: "
                        f"{index_file_name(self._files[-1][0])} is followed by {path.name}")
                self._files.append((seq, self._open(seq)))
        except BaseException:
            for _, f in self._files:
                f.close()
            raise

    @property
    def directory(self) -> Path:
        return self._dir

    def files(self) -> list[tuple[int, IndexHeader]]:
        """(sequence number, header) of every file, oldest first."""
        with self._lock:
            self._check_open()
            return [(seq, f.header()) for seq, f in self._files]

    def put_keys(self, keys: Iterable[str], position: int, ts_ms: int) -> int:
        """Index one message's keys at its CommitLog ``position`` and store time ``ts_ms``.

        Empty keys are skipped and repeated ones indexed once (in first-seen order).
        All of them go to one file: a new file is created when the last one cannot
        take them all. Returns the number of entries put. Raises ValueError if there
        are more keys than a file holds, or ``position`` < 0; OSError.
        """
        return self.put_messages([(keys, position)], ts_ms)

    def put_messages(self, messages: Iterable[tuple[Iterable[str], int]], ts_ms: int) -> int:
        """``put_keys`` of each (keys, position) of ``messages`` -- a record's, in order --
        under one lock, in one write to the last file when they all fit there. Returns the
        number of entries put. All or nothing: on an error (OSError for a full disk) the
        keys of the messages already put are taken back, so calling it again gives the
        bytes of a call that never failed."""
        messages = list(messages)
        pairs = [(k, position) for keys, position in messages for k in dict.fromkeys(keys) if k]
        with self._lock:
            self._check_open()
            if self._files and self._files[-1][1].put_pairs(pairs, ts_ms):
                return len(pairs)
            mark = (self._files[-1][0], self._files[-1][1].header()) if self._files else None
            try:
                return self._put_each(messages, ts_ms)
            except BaseException:
                self._rollback_locked(mark)
                raise

    def _put_each(self, messages: list[tuple[Iterable[str], int]], ts_ms: int) -> int:
        """``put_messages`` message by message, rolling files (lock held)."""
        put = 0
        for keys, position in messages:
            unique = [k for k in dict.fromkeys(keys) if k]
            if not unique:
                continue
            if len(unique) > self._index_num - 1:
                raise ValueError(f"{len(unique)} keys for one message, more than an index file holds "
                                 f"({self._index_num - 1})")
            if not self._files or not self._files[-1][1].put_many(unique, position, ts_ms):
                f = self._roll()
                while not f.put_many(unique, position, ts_ms):  # a small first file: the next is larger
                    if f.index_num >= self._index_num:
                        raise AssertionError(f"index file {f.path} refused a put it had room for")
                    f = self._roll()
            put += len(unique)
        return put

    def mark(self) -> tuple[int, IndexHeader] | None:
        """Where the index stands: (last file's sequence, its header); None if empty.

        Store it with a checkpoint; ``rollback(mark)`` returns the index to it.
        """
        with self._lock:
            self._check_open()
            return (self._files[-1][0], self._files[-1][1].header()) if self._files else None

    def rollback(self, mark: tuple[int, IndexHeader] | None) -> None:
        """Undo every put made after ``mark`` (a value of ``mark()``), files included."""
        with self._lock:
            self._check_open()
            self._rollback_locked(mark)
            fsync_directory(self._dir)

    def _rollback_locked(self, mark: tuple[int, IndexHeader] | None) -> None:
        keep = -1 if mark is None else mark[0]
        while self._files and self._files[-1][0] > keep:
            _, f = self._files.pop()
            f.close()
            f.path.unlink()
            self._dir_dirty = True
        if mark is not None:
            if not self._files or self._files[-1][0] != keep:
                raise IndexFileCorrupt(f"index file {index_file_name(keep)} is missing")
            self._files[-1][1].rollback_to(mark[1])

    def query(self, key: str, begin_ms: int, end_ms: int, max_results: int) -> list[int]:
        """Positions indexed for ``key`` with a store time in range, newest first.

        Looks through the files newest first, skipping those whose
        [begin_timestamp, end_timestamp] misses [begin_ms, end_ms], and stops at
        ``max_results``. As ``IndexFile.query``: the caller re-checks the real key, and
        a result may have been put with a time up to 999 ms outside the range. A
        store time lower than its file's begin_timestamp (store times going back) may
        be missed. Raises ValueError if ``max_results`` < 1.
        """
        if max_results < 1:
            raise ValueError(f"max_results must be >= 1, not {max_results}")
        with self._lock:
            self._check_open()
            files = [f for _, f in reversed(self._files)]
        out: list[int] = []
        for f in files:
            try:
                h = f.header()
                if h.index_count == 0 or h.end_timestamp < begin_ms or h.begin_timestamp > end_ms:
                    continue
                out.extend(f.query(key, begin_ms, end_ms, max_results - len(out)))
            except IndexFileClosed:
                continue  # deleted by retention meanwhile: it only held older positions
            if len(out) >= max_results:
                break
        return out

    def delete_before_position(self, position: int) -> list[int]:
        """Delete the files whose entries all point before ``position`` (end_position < position).

        Whole files, oldest first, never the last file. Returns the deleted sequence numbers.
        """
        with self._lock:
            self._check_open()
            deleted = []
            while len(self._files) > 1:
                seq, f = self._files[0]
                h = f.header()
                if h.index_count == 0 or h.end_position >= position:
                    break
                self._files.pop(0)
                f.close()
                f.path.unlink(missing_ok=True)
                self._dir_dirty = True
                deleted.append(seq)
            return deleted

    def truncate_from_position(self, position: int) -> int:
        """Forget every file holding a position >= ``position``; say where to put keys again.

        For recovery after a crash, with ``position`` the first CommitLog position
        whose keys may not have been flushed: the oldest such file is emptied in place
        (recreated at full size, same number) and the newer ones deleted. Returns the
        position from which the caller must put the keys of the messages again, in
        order: that file's begin_position, or ``position`` when nothing was forgotten
        from before it. Putting them again gives the same bytes as before.
        """
        with self._lock:
            self._check_open()
            restart = position
            k = len(self._files)
            while k > 0:
                h = self._files[k - 1][1].header()
                if h.index_count and h.end_position < position:
                    break
                k -= 1
                if h.index_count:
                    restart = min(restart, h.begin_position)
            if k == len(self._files):
                return restart
            for _, f in self._files[k + 1:]:
                f.close()
                f.path.unlink(missing_ok=True)
                self._dir_dirty = True
            del self._files[k + 1:]
            seq, f = self._files[k]
            if f.header().index_count:
                fresh = IndexFile.create(f.path, self._slot_num, self._index_num, replace=True)
                f.close()
                self._files[k] = (seq, fresh)
            return restart

    def flush(self) -> bool:
        """fsync the files written since the last flush, and the directory if it changed.

        True if anything was synced. Raises OSError.
        """
        with self._flush_lock:
            with self._lock:
                self._check_open()
                files = [f for _, f in self._files]
                sync_dir, self._dir_dirty = self._dir_dirty, False
            synced = False
            try:
                for f in files:
                    with contextlib.suppress(IndexFileClosed):
                        synced = f.flush() or synced
                if sync_dir:
                    fsync_directory(self._dir)
            except BaseException:
                with self._lock:
                    self._dir_dirty = self._dir_dirty or sync_dir
                raise
            return synced or sync_dir

    def close(self) -> None:
        """Close every file (does not flush). Idempotent."""
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            for _, f in self._files:
                f.close()

    def _open(self, seq: int) -> IndexFile:
        path = self._dir / index_file_name(seq)
        graded = self._geometry(seq)
        if graded != (self._slot_num, self._index_num) and \
                os.stat(path).st_size == index_file_size(self._slot_num, self._index_num):
            graded = (self._slot_num, self._index_num)  # written before files were graded
        return IndexFile.open(path, *graded)

    def _geometry(self, seq: int) -> tuple[int, int]:
        if not self._graded:
            return self._slot_num, self._index_num
        return geometry_of(seq, self._slot_num, self._index_num)

    def _roll(self) -> IndexFile:
        seq = self._files[-1][0] + 1 if self._files else 0
        f = IndexFile.create(self._dir / index_file_name(seq), *self._geometry(seq))
        self._files.append((seq, f))
        return f

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"IndexService {self._dir} is closed")
