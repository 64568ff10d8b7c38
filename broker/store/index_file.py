"""IndexFile: one index file (``broker/store/index_layout.py``), mapped: put, query, roll back.

I/O: the file is mapped shared (``mmap``), as RocketMQ maps its IndexFiles: a put is
three stores into the mapping (entry, slot, header; the slot read first) and no system
call, which matters because the apply step indexes every message on every replica.
Only the pages touched become resident (a full default file is about 420 MB, sparse
until written; an IndexService's first files are smaller). Every access holds the
file's lock, so the mapping is never used after ``close``. ``flush`` fsyncs the
descriptor: on Linux that writes back the pages dirtied through the mapping too.
Creation writes with ``pwrite``.

A full disk: a store into a page of the mapping the file system has not allocated yet
ends the process with SIGBUS when it cannot allocate it -- no exception, no clean-up.
So no store lands on such a page: before a put writes, the file is allocated
(``os.posix_fallocate``) from its start -- header and slots, which puts touch anywhere --
to ``RESERVE_ENTRIES`` entries past the new ones (the entries fill in order). A full disk
then fails the allocation with OSError (ENOSPC) and the put writes nothing; the caller
may try it again later (``dledger.storage.disk_guard``). A file that was never put to reserves
nothing, so opening one never needs room.

Determinism: the file is created at its full size (header, slots, entries) by
truncation -- zeros -- plus the geometry stamp, and every put writes fixed places
derived only from the key, position, timestamp and the puts before it, so replicas
that put the same keys hold the same bytes.

Crash consistency: a put writes the entry, then the slot, then the header. A file is
consistent once flushed; one written after its last flush may be inconsistent after a
crash (pages are written back in any order). The broker should then redo the puts
after its last flushed position: ``IndexService.truncate_from_position`` empties the
files that may be affected and says where to start again. Reading never trusts links
blindly: slot heads and links outside ``1..index_count`` and links that do not
decrease end a chain.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from pathlib import Path

import mmh3

from broker.store.index_layout import (  # the defaults and IndexHeader: see __all__
    DEFAULT_INDEX_NUM,
    DEFAULT_SLOT_NUM,
    ENTRY,
    ENTRY_SIZE,
    GEOMETRY,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    SLOT,
    SLOT_SIZE,
    TIME_UNIT_MS,
    IndexFileCorrupt,
    IndexHeader,
    check_geometry,
    index_file_size,
    key_hash,
    time_diff,
)
from common.durable_file import fsync_directory
from dledger.storage.numbered_files import pread_full, pwrite_all

__all__ = [
    "DEFAULT_INDEX_NUM",
    "DEFAULT_SLOT_NUM",
    "IndexFile",
    "IndexFileClosed",
    "IndexFileCorrupt",
    "IndexHeader",
]

_I64_MAX = (1 << 63) - 1
#: Entries allocated ahead of the puts (20 bytes each): one posix_fallocate per 320 KiB.
RESERVE_ENTRIES = 16384


class IndexFileClosed(ValueError):
    """The IndexFile was closed (for an IndexService: deleted by retention meanwhile)."""


class IndexFile:
    """One index file. Make one with ``create`` or ``open``.

    Thread-safety: one internal lock guards every public method, so one thread may
    put while others query. ``flush`` syncs outside the lock (serialised with other
    flushes). Methods raise IndexFileClosed (a ValueError) after ``close``.
    """

    def __init__(self, path: Path, fd: int, slot_num: int, index_num: int) -> None:
        """Wrap an open descriptor of a file already checked by ``create`` or ``open``."""
        self._path = Path(path)
        self._fd = fd
        self._slot_num = slot_num
        self._index_num = index_num
        self._entries_at = HEADER_SIZE + slot_num * SLOT_SIZE
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._dirty = False
        self._closed = False
        self._reserved = 0  # bytes from the file's start known to be allocated
        self._map = mmap.mmap(fd, index_file_size(slot_num, index_num))
        (self._begin_ts, self._end_ts, self._begin_pos, self._end_pos,
         self._slot_count, self._count) = HEADER.unpack_from(self._map, 0)

    @classmethod
    def create(cls, path: Path, slot_num: int, index_num: int, *, replace: bool = False) -> IndexFile:
        """Create an empty file of this geometry at ``path``, durably, and open it.

        The file is written under a temporary name in the same directory
        (``.<name>.tmp``), fsynced, renamed onto ``path`` and the directory fsynced, so
        ``path`` never names a partial file. Raises ValueError for a bad geometry,
        FileExistsError if ``path`` exists (unless ``replace``), OSError.
        """
        check_geometry(slot_num, index_num)
        path = Path(path)
        if not replace and path.exists():
            raise FileExistsError(f"index file {path} already exists")
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, index_file_size(slot_num, index_num))
            pwrite_all(fd, GEOMETRY.pack(MAGIC, slot_num, index_num), HEADER_SIZE + slot_num * SLOT_SIZE)
            os.fsync(fd)
            os.replace(tmp, path)
            fsync_directory(path.parent)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        return cls(path, fd, slot_num, index_num)

    @classmethod
    def open(cls, path: Path, slot_num: int, index_num: int) -> IndexFile:
        """Open an existing file, which must have been created with this geometry.

        The header has no room for the geometry and the stamp in entry 0 can only
        be found knowing ``slot_num``, so the caller says what it expects and the
        file's size and stamp must agree. Raises IndexFileCorrupt if they do not or
        the header is impossible, OSError.
        """
        check_geometry(slot_num, index_num)
        path = Path(path)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            expected = index_file_size(slot_num, index_num)
            if size != expected:
                raise IndexFileCorrupt(f"index file {path} has {size} bytes, but slot_num {slot_num} "
                                       f"and index_num {index_num} make {expected}: created with "
                                       f"other sizes, or damaged")
            stamp = pread_full(fd, ENTRY_SIZE, HEADER_SIZE + slot_num * SLOT_SIZE)
            if len(stamp) != ENTRY_SIZE or GEOMETRY.unpack(stamp) != (MAGIC, slot_num, index_num):
                raise IndexFileCorrupt(f"index file {path} does not carry the stamp of slot_num "
                                       f"{slot_num} and index_num {index_num}: created with other "
                                       f"sizes, or damaged")
            f = cls(path, fd, slot_num, index_num)
            if not 0 <= f._count < index_num or not 0 <= f._slot_count <= min(slot_num, f._count):
                raise IndexFileCorrupt(f"index file {path} has an impossible header: index_count "
                                       f"{f._count}, hash_slot_count {f._slot_count}")
            return f
        except BaseException:
            os.close(fd)
            raise

    # -- properties ----------------------------------------------------------------
    @property
    def path(self) -> Path:
        return self._path

    @property
    def slot_num(self) -> int:
        return self._slot_num

    @property
    def index_num(self) -> int:
        return self._index_num

    @property
    def capacity(self) -> int:
        """Entries the file can hold: ``index_num - 1``."""
        return self._index_num - 1

    @property
    def free(self) -> int:
        """Entries that can still be put."""
        with self._lock:
            return self._index_num - 1 - self._count

    @property
    def is_full(self) -> bool:
        with self._lock:
            return self._count >= self._index_num - 1

    def header(self) -> IndexHeader:
        """A consistent snapshot of the header."""
        with self._lock:
            return self._header()

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    # -- writing ---------------------------------------------------------------------
    def put(self, key: str, position: int, store_timestamp_ms: int) -> bool:
        """Index ``key`` at CommitLog ``position`` with the message's store time.

        Returns False, writing nothing, when the file is full. Positions are expected
        to not decrease from put to put (``end_position`` is the last one's). Raises
        ValueError if ``position`` < 0; OSError (ENOSPC on a full disk) when the file
        cannot be allocated for it, writing nothing.
        """
        return self.put_many([key], position, store_timestamp_ms)

    def put_many(self, keys: list[str], position: int, store_timestamp_ms: int) -> bool:
        """``put`` each of ``keys`` in order at one position and time, if they all fit;
        False, writing nothing, if they do not."""
        if not 0 <= position <= _I64_MAX:
            raise ValueError(f"CommitLog position {position} is not in 0..2**63-1")
        return self.put_pairs([(key, position) for key in keys], store_timestamp_ms)

    def put_pairs(self, pairs: list[tuple[str, int]], store_timestamp_ms: int) -> bool:
        """``put`` each (key, position) of ``pairs`` in order -- a record's messages' keys, at
        one store time, positions not decreasing -- if they all fit; False, writing nothing,
        if they do not. One lock and one header write for all of them. OSError (ENOSPC) as
        ``put``, writing nothing."""
        if not pairs:
            return True
        ts = store_timestamp_ms
        with self._lock:
            self._check_open()
            m = self._map
            n, slot_count, slot_num = self._count, self._slot_count, self._slot_num
            if n + len(pairs) > self._index_num - 1:
                return False
            if pairs[0][1] < 0 or pairs[-1][1] > _I64_MAX:
                raise ValueError(f"CommitLog positions {pairs[0][1]}.. are not in 0..2**63-1")
            self._reserve(self._entries_at + (n + len(pairs) + 1) * ENTRY_SIZE)
            if n == 0:
                self._begin_ts, self._begin_pos, self._end_ts = ts, pairs[0][1], ts
            diff = time_diff(ts, self._begin_ts)
            entries_at = self._entries_at
            unpack_slot, pack_slot, pack_entry = SLOT.unpack_from, SLOT.pack_into, ENTRY.pack_into
            hash32 = mmh3.hash
            for key, position in pairs:
                h = hash32(key, signed=False) & 0x7FFFFFFF  # key_hash, inlined
                slot_at = HEADER_SIZE + (h % slot_num) * SLOT_SIZE
                (head,) = unpack_slot(m, slot_at)
                if not 0 < head <= n:
                    head = 0  # empty, or left by an unflushed put before a crash
                n += 1
                slot_count += head == 0
                pack_entry(m, entries_at + n * ENTRY_SIZE, h, position, diff, head)
                pack_slot(m, slot_at, n)
            position = pairs[-1][1]
            self._end_ts = max(self._end_ts, ts)
            self._end_pos = position
            self._slot_count, self._count = slot_count, n
            HEADER.pack_into(m, 0, self._begin_ts, self._end_ts, self._begin_pos, position, slot_count, n)
            self._dirty = True
            return True

    def rollback_to(self, header: IndexHeader) -> int:
        """Undo the puts made after this file's header was ``header``; returns how many.

        Entries are undone newest first: each one's slot goes back to the entry's
        ``prev_index`` (its head when it was put) and the entry is zeroed, then the
        header is restored -- the bytes equal those the file had when ``header`` was
        read, provided the undone entries themselves were written whole (always after
        a process crash; after a power loss rebuild the index instead).
        """
        with self._lock:
            self._check_open()
            if header.index_count > self._count:
                raise ValueError(f"{self._path}: cannot roll forward from {self._count} "
                                 f"to {header.index_count} entries")
            undone = 0
            for n in range(self._count, header.index_count, -1):
                at = self._entries_at + n * ENTRY_SIZE
                raw = self._map[at:at + ENTRY_SIZE]
                if raw == bytes(ENTRY_SIZE):
                    continue
                h, _, _, prev = ENTRY.unpack(raw)
                SLOT.pack_into(self._map, HEADER_SIZE + (h % self._slot_num) * SLOT_SIZE, prev)
                self._map[at:at + ENTRY_SIZE] = bytes(ENTRY_SIZE)
                undone += 1
            HEADER.pack_into(self._map, 0,
                             header.begin_timestamp, header.end_timestamp, header.begin_position,
                             header.end_position, header.hash_slot_count, header.index_count)
            self._dirty = True
            self._begin_ts, self._end_ts = header.begin_timestamp, header.end_timestamp
            self._begin_pos, self._end_pos = header.begin_position, header.end_position
            self._slot_count, self._count = header.hash_slot_count, header.index_count
            return undone

    def flush(self) -> bool:
        """fsync the file if it was written since the last flush; True if it was synced.

        Raises OSError if the fsync fails (the file stays marked dirty).
        """
        with self._flush_lock:
            with self._lock:
                self._check_open()
                if not self._dirty:
                    return False
                fd = os.dup(self._fd)
                self._dirty = False
            try:
                os.fsync(fd)
            except BaseException:
                with self._lock:
                    self._dirty = True
                raise
            finally:
                os.close(fd)
            return True

    def close(self) -> None:
        """Close the file (does not flush). Idempotent."""
        with self._flush_lock, self._lock:
            if self._closed:
                return
            self._closed = True
            self._map.close()
            os.close(self._fd)

    # -- reading ---------------------------------------------------------------------
    def query(self, key: str, begin_ms: int, end_ms: int, max_results: int) -> list[int]:
        """Positions of entries whose key hash is ``key``'s and whose time may be in range.

        Newest first, at most ``max_results``. An entry matches when its key hash is
        equal (the caller must check the message's real key: different keys can share
        a hash) and its one-second time window ``[t0, t0 + 999]`` overlaps
        ``[begin_ms, end_ms]`` (both inclusive). So every entry put with a store time in
        range is found, and an entry found was put with a store time at most 999 ms
        outside the range; with bounds on whole seconds from ``begin_timestamp`` the
        match is exact. Raises ValueError if ``max_results`` < 1.
        """
        if max_results < 1:
            raise ValueError(f"max_results must be >= 1, not {max_results}")
        h = key_hash(key)
        slot_at = HEADER_SIZE + (h % self._slot_num) * SLOT_SIZE
        with self._lock:
            self._check_open()
            out: list[int] = []
            if self._count == 0 or begin_ms > end_ms:
                return out
            (n,) = SLOT.unpack_from(self._map, slot_at)
            while 0 < n <= self._count and len(out) < max_results:
                entry_hash, position, diff, prev = ENTRY.unpack_from(
                    self._map, self._entries_at + n * ENTRY_SIZE)
                if entry_hash == h:
                    t0 = self._begin_ts + diff * TIME_UNIT_MS
                    if t0 <= end_ms and t0 + TIME_UNIT_MS - 1 >= begin_ms:
                        out.append(position)
                if prev >= n:
                    break  # a link must go to an older entry; anything else is damage
                n = prev
            return out

    # -- internals -------------------------------------------------------------------
    def _reserve(self, end: int) -> None:
        """Allocate the file from its start to past ``end`` (lock held; module docstring).
        Raises OSError, having changed nothing."""
        if end <= self._reserved:
            return
        target = min(len(self._map), end + RESERVE_ENTRIES * ENTRY_SIZE)
        os.posix_fallocate(self._fd, 0, target)
        self._reserved = target

    def _header(self) -> IndexHeader:
        return IndexHeader(self._begin_ts, self._end_ts, self._begin_pos, self._end_pos,
                           self._slot_count, self._count)

    def _check_open(self) -> None:
        if self._closed:
            raise IndexFileClosed(f"index file {self._path} is closed")
