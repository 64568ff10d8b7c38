"""IndexFile and IndexService: a hash index from message keys to CommitLog positions.

As RocketMQ's IndexFile: a hash table laid out in one fixed-size file, with
chaining through the entries. ``slot_num`` slots hold the number of the newest
entry whose key hashes to them; each entry links to the previous entry of its
slot. All integers big-endian::

    ┌──────────────────────────────────── header, 40 bytes ───────────────────────────────────┐
    │ begin_timestamp i64 │ end_timestamp i64 │ begin_position i64 │ end_position i64 │
    │ hash_slot_count i32 │ index_count i32 │
    ├──────────────────────────────── slots, slot_num x 4 bytes ──────────────────────────────┤
    │ slot 0: newest entry number (i32, 0 = empty) │ slot 1 │ ... │ slot slot_num-1 │
    ├──────────────────────────────── entries, index_num x 20 bytes ──────────────────────────┤
    │ entry 0: geometry stamp  "RMQI" │ slot_num i32 │ index_num i32 │ 8 zero bytes │
    │ entry n: key_hash i32 │ position i64 │ time_diff i32 │ prev_index i32 │   n = 1 .. index_num-1
    └─────────────────────────────────────────────────────────────────────────────────────────┘

* ``key_hash = mmh3.hash(key, signed=False) & 0x7FFFFFFF``; its slot is ``key_hash % slot_num``.
* Entry numbers start at 1, so 0 means "none" in a slot or a ``prev_index``; a
  file holds ``index_num - 1`` entries. Entry 0 is never an entry: it holds the
  geometry the file was created with, so that opening it with other sizes is
  detected instead of misread.
* Timestamps are the leader's store times in ms since the epoch, carried in the
  entry. ``begin_*`` are those of the first put; ``end_position`` is the last put's;
  ``end_timestamp`` is the largest store time put (the last one's, as store times
  do not decrease). ``time_diff = (ts - begin_timestamp) // 1000``: whole seconds,
  floored, so an entry's time is known to be in ``[t0, t0 + 999]`` with
  ``t0 = begin_timestamp + 1000 * time_diff`` (clamped to i32; 68 years).
* ``hash_slot_count`` counts the slots in use; ``index_count`` the entries (0 in
  a new file, whose header is all zeros).

Determinism: the file is created at its full size (header, slots, entries) by
truncation -- zeros -- plus the geometry stamp, and every put writes fixed places
derived only from the key, position, timestamp and the puts before it, so
replicas that put the same keys hold the same bytes. Files in an IndexService are
named by a sequence number (``00000000000000000000``, ``...01``, ...), never by time.

I/O: each open file is mapped shared (``mmap``), as RocketMQ maps its IndexFiles: a
put is three stores into the mapping (entry, slot, header; the slot read first) and
no system call, which matters because the apply step indexes every message on every
replica. Only the pages touched become resident (a full default file is about
420 MB, sparse until written; an IndexService's first files are smaller, see
``IndexService``). Every access holds the file's lock, so the mapping is never
used after ``close``. ``flush`` fsyncs the descriptor: on Linux that writes back the
pages dirtied through the mapping too. Creation still writes with ``pwrite``.
A write into a sparse page when the disk is full ends the process with SIGBUS
instead of an OSError; the CommitLog, written first on the same disk, fails first.

Crash consistency: a put writes the entry, then the slot, then the header. A file
is consistent once flushed; one written after its last flush may be inconsistent
after a crash (pages are written back in any order). The broker should then redo
the puts after its last flushed position: ``IndexService.truncate_from_position``
empties the files that may be affected and says where to start again. Reading
never trusts links blindly: slot heads and links outside ``1..index_count`` and
links that do not decrease end a chain.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import mmh3

from dledger.durable_file import fsync_directory

__all__ = [
    "DEFAULT_INDEX_NUM",
    "DEFAULT_SLOT_NUM",
    "ENTRY",
    "ENTRY_SIZE",
    "GRADED_FILES",
    "HEADER",
    "HEADER_SIZE",
    "SLOT",
    "SLOT_SIZE",
    "IndexFile",
    "IndexFileClosed",
    "IndexFileCorrupt",
    "IndexHeader",
    "IndexService",
    "geometry_of",
    "index_file_name",
    "index_file_size",
    "key_hash",
]

HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = 40
assert HEADER.size == HEADER_SIZE
SLOT = struct.Struct(">i")
SLOT_SIZE = 4
assert SLOT.size == SLOT_SIZE
ENTRY = struct.Struct(">iqii")
ENTRY_SIZE = 20
assert ENTRY.size == ENTRY_SIZE
GEOMETRY = struct.Struct(">4sii8x")
assert GEOMETRY.size == ENTRY_SIZE
MAGIC = b"RMQI"

DEFAULT_SLOT_NUM = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
TIME_UNIT_MS = 1000
"""Entries keep their time to the second (``time_diff``), as RocketMQ's do."""

_NAME = re.compile(r"^\d{20}$")
_TEMP = re.compile(r"^\.\d{20}\.tmp$")
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_I64_MAX = (1 << 63) - 1


class IndexFileCorrupt(Exception):
    """A file that is not a well-formed IndexFile of the expected geometry; names the file."""


class IndexFileClosed(ValueError):
    """The IndexFile was closed (for an IndexService: deleted by retention meanwhile)."""


@dataclass(frozen=True, slots=True)
class IndexHeader:
    begin_timestamp: int
    end_timestamp: int
    begin_position: int
    end_position: int
    hash_slot_count: int
    index_count: int


def key_hash(key: str) -> int:
    """The 31-bit hash an entry stores for ``key``. Pure and thread-safe."""
    return mmh3.hash(key, signed=False) & 0x7FFFFFFF


def index_file_name(sequence: int) -> str:
    """The name of an IndexService's file number ``sequence``: 20 digits, zero-padded."""
    return f"{sequence:020d}"


def index_file_size(slot_num: int, index_num: int) -> int:
    """Bytes in an IndexFile of this geometry."""
    return HEADER_SIZE + slot_num * SLOT_SIZE + index_num * ENTRY_SIZE


#: Files 0, 1, 2 of an IndexService are 1/64, 1/16, 1/4 of its geometry; later ones whole.
GRADED_FILES = 3


def geometry_of(sequence: int, slot_num: int, index_num: int) -> tuple[int, int]:
    """(slot_num, index_num) of an IndexService's file number ``sequence``. Pure."""
    shrink = 4 ** max(0, GRADED_FILES - sequence)
    return max(1, slot_num // shrink), max(2, index_num // shrink)


def _check_geometry(slot_num: int, index_num: int) -> None:
    if not 1 <= slot_num <= _I32_MAX:
        raise ValueError(f"slot_num must be in 1..2**31-1, not {slot_num}")
    if not 2 <= index_num <= _I32_MAX:
        raise ValueError(f"index_num must be in 2..2**31-1 (entry 0 is reserved), not {index_num}")


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
        _check_geometry(slot_num, index_num)
        path = Path(path)
        if not replace and path.exists():
            raise FileExistsError(f"index file {path} already exists")
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, index_file_size(slot_num, index_num))
            _pwrite_all(fd, GEOMETRY.pack(MAGIC, slot_num, index_num),
                        HEADER_SIZE + slot_num * SLOT_SIZE)
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
        _check_geometry(slot_num, index_num)
        path = Path(path)
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            expected = index_file_size(slot_num, index_num)
            if size != expected:
                raise IndexFileCorrupt(f"index file {path} has {size} bytes, but slot_num {slot_num} "
                                       f"and index_num {index_num} make {expected}: created with "
                                       f"other sizes, or damaged")
            stamp = GEOMETRY.unpack(_pread_exact(fd, ENTRY_SIZE, HEADER_SIZE + slot_num * SLOT_SIZE, path))
            if stamp != (MAGIC, slot_num, index_num):
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
    def begin_timestamp(self) -> int:
        return self.header().begin_timestamp

    @property
    def end_timestamp(self) -> int:
        return self.header().end_timestamp

    @property
    def begin_position(self) -> int:
        return self.header().begin_position

    @property
    def end_position(self) -> int:
        return self.header().end_position

    @property
    def hash_slot_count(self) -> int:
        return self.header().hash_slot_count

    @property
    def index_count(self) -> int:
        return self.header().index_count

    @property
    def closed(self) -> bool:
        with self._lock:
            return self._closed

    # -- writing ---------------------------------------------------------------------
    def put(self, key: str, position: int, store_timestamp_ms: int) -> bool:
        """Index ``key`` at CommitLog ``position`` with the message's store time.

        Returns False, writing nothing, when the file is full. Positions are expected
        to not decrease from put to put (``end_position`` is the last one's). Raises
        ValueError if ``position`` < 0.
        """
        return self.put_many([key], position, store_timestamp_ms)

    def put_many(self, keys: list[str], position: int, store_timestamp_ms: int) -> bool:
        """``put`` each of ``keys`` in order at one position and time, if they all fit;
        False, writing nothing, if they do not."""
        if not 0 <= position <= _I64_MAX:
            raise ValueError(f"CommitLog position {position} is not in 0..2**63-1")
        ts = store_timestamp_ms
        with self._lock:
            self._check_open()
            m = self._map
            n, slot_count = self._count, self._slot_count
            if n + len(keys) > self._index_num - 1:
                return False
            if not keys:
                return True
            if n == 0:
                self._begin_ts, self._begin_pos, self._end_ts = ts, position, ts
            begin_ts = self._begin_ts
            diff = min(max((ts - begin_ts) // TIME_UNIT_MS, _I32_MIN), _I32_MAX)
            for key in keys:
                h = mmh3.hash(key, signed=False) & 0x7FFFFFFF  # key_hash, inlined: once per message
                slot_at = HEADER_SIZE + (h % self._slot_num) * SLOT_SIZE
                (head,) = SLOT.unpack_from(m, slot_at)
                if not 0 < head <= n:
                    head = 0  # empty, or left by an unflushed put before a crash
                n += 1
                slot_count += head == 0
                ENTRY.pack_into(m, self._entries_at + n * ENTRY_SIZE, h, position, diff, head)
                SLOT.pack_into(m, slot_at, n)
            self._end_ts = max(self._end_ts, ts)
            self._end_pos = position
            self._slot_count, self._count = slot_count, n
            HEADER.pack_into(m, 0, self._begin_ts, self._end_ts, self._begin_pos, position,
                             slot_count, n)
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
    def _header(self) -> IndexHeader:
        return IndexHeader(self._begin_ts, self._end_ts, self._begin_pos, self._end_pos,
                           self._slot_count, self._count)

    def _check_open(self) -> None:
        if self._closed:
            raise IndexFileClosed(f"index file {self._path} is closed")


class IndexService:
    """A directory of IndexFiles numbered 0, 1, 2, ...; the last one takes the puts.

    ::

        index/
          00000000000000000000   full
          00000000000000000001   full
          00000000000000000002   the one being written

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
        _check_geometry(slot_num, index_num)
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
        names = []
        for p in sorted(self._dir.iterdir()):
            if _TEMP.match(p.name):
                p.unlink(missing_ok=True)
                self._dir_dirty = True
            elif _NAME.match(p.name):
                names.append(p.name)
        try:
            for name in names:
                seq = int(name)
                if self._files and seq != self._files[-1][0] + 1:
                    raise IndexFileCorrupt(f"index files in {self._dir} are not numbered contiguously: "
                                           f"{index_file_name(self._files[-1][0])} is followed by {name}")
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
        unique = [k for k in dict.fromkeys(keys) if k]
        if not unique:
            return 0
        if len(unique) > self._index_num - 1:
            raise ValueError(f"{len(unique)} keys for one message, more than an index file holds "
                             f"({self._index_num - 1})")
        with self._lock:
            self._check_open()
            if not self._files or not self._files[-1][1].put_many(unique, position, ts_ms):
                f = self._roll()
                while not f.put_many(unique, position, ts_ms):  # a small first file: the next is larger
                    if f.index_num >= self._index_num:
                        raise AssertionError(f"index file {f.path} refused a put it had room for")
                    f = self._roll()
        return len(unique)

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
            keep = -1 if mark is None else mark[0]
            while self._files and self._files[-1][0] > keep:
                _, f = self._files.pop()
                f.close()
                f.path.unlink()
            if mark is not None:
                if not self._files or self._files[-1][0] != keep:
                    raise IndexFileCorrupt(f"index file {index_file_name(keep)} is missing")
                self._files[-1][1].rollback_to(mark[1])
            fsync_directory(self._dir)

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


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _pread_exact(fd: int, size: int, offset: int, path: Path) -> bytes:
    parts = []
    got = 0
    while got < size:
        data = os.pread(fd, size - got, offset + got)
        if not data:
            raise IndexFileCorrupt(f"index file {path} is shorter than expected: "
                                   f"{size} bytes at {offset}")
        parts.append(data)
        got += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)
