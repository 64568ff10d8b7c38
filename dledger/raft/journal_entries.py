"""The journal's entries as pysyncobj reads them: ``(command, index, term)`` tuples, read
from the CommitLog on demand, the newest from the journal's in-memory cache.

``RaftJournal.__getitem__`` (``dledger.raft.journal``) answers an int with ``tuple_at`` and
a slice with a ``LazyEntries`` view. Both read through the journal's ``recent`` dict (index
-> tuple), which the journal updates in place and never replaces.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from dledger.raft.codec import encode_command
from dledger.storage.commitlog import CommitLog
from dledger.storage.entry_format import Entry

__all__ = ["LazyEntries", "RaftTuple", "as_tuple", "tuple_at"]

_READ_AHEAD_BYTES = 256 * 1024

RaftTuple = tuple[bytes, int, int]


def as_tuple(entry: Entry) -> RaftTuple:
    """``entry`` as pysyncobj holds it: (its command bytes, index, term)."""
    return (encode_command(entry.kind, entry.body), entry.index, entry.term)


def tuple_at(log: CommitLog, recent: Mapping[int, RaftTuple], index: int) -> RaftTuple:
    """Entry ``index`` as a tuple: from ``recent`` when cached, else read from ``log``."""
    cached = recent.get(index)
    return cached if cached is not None else as_tuple(log.entry(index))


class LazyEntries:
    """A read-only view ``log[start:stop]`` of ``(command, index, term)`` tuples.

    pysyncobj slices the whole tail on every send and iterates only until its
    batch is full, so entries are read from disk on demand (in read-ahead
    chunks). Pickles as a plain list when pysyncobj puts it in a message.
    """

    __slots__ = ("_log", "_recent", "_start", "_stop")

    def __init__(self, log: CommitLog, recent: Mapping[int, RaftTuple], start: int, stop: int) -> None:
        self._log = log
        self._recent = recent
        self._start = start
        self._stop = max(start, stop)

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, item: int | slice) -> Any:
        n = len(self)
        if isinstance(item, slice):
            lo, hi, step = item.indices(n)
            if step != 1:
                return list(self)[item]
            return LazyEntries(self._log, self._recent, self._start + lo, self._start + max(lo, hi))
        if item < 0:
            item += n
        if not 0 <= item < n:
            raise IndexError(item)
        return tuple_at(self._log, self._recent, self._start + item)

    def __iter__(self) -> Iterator[RaftTuple]:
        index = self._start
        recent = self._recent
        while index < self._stop:
            cached = recent.get(index)
            if cached is not None:
                yield cached
                index += 1
                continue
            chunk = self._log.entries(index, _READ_AHEAD_BYTES, self._stop - 1)
            if not chunk:
                return
            for entry in chunk:
                yield as_tuple(entry)
            index = chunk[-1].index + 1

    def __reversed__(self) -> Iterator[RaftTuple]:
        return reversed(list(self))

    def __reduce__(self) -> tuple[type, tuple[list[RaftTuple]]]:
        return (list, (list(self),))
