"""``LogReader``: the reads of the CommitLog by position the layers above make -- a message
where a ConsumeQueue unit or an IndexFile points, the entry holding a position, the
retained range, the segments retention will cut -- so the broker never holds the concrete
``dledger.storage.commitlog.CommitLog``. A ``Log`` hands one out as ``Log.reader``; the
Raft log's and the memory log's ``CommitLog`` satisfies it (tests/typing_conformance.py).

Contract: positions are absolute byte offsets of entry records (the same entry at the same
position on every replica). A caller reads only entries it knows are committed -- the
broker reads what its apply step applied -- nothing here checks the commit index.
Any thread may call; each call is atomic against appends, truncation and retention, but
two calls may see different logs (retention can delete a segment in between).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dledger.storage.entry_format import Entry
    from dledger.storage.segments import SegmentInfo

__all__ = ["LogReader"]


class LogReader(Protocol):
    # -- the retained range
    @property
    def start_position(self) -> int:
        """The position of the first retained record (what retention has not deleted)."""
        ...

    @property
    def write_position(self) -> int:
        """The position the next record will be written at (the end of the log)."""
        ...

    @property
    def last_index(self) -> int:
        """The index of the last entry held (0: none)."""
        ...

    @property
    def awaiting_start(self) -> int:
        """The only index an empty log restarted by a reset accepts (0: not such a log)."""
        ...

    # -- reading by position
    def entry_containing(self, position: int) -> tuple[int, int] | None:
        """(index, record position) of the entry whose record holds ``position``, or None
        when no retained record does."""
        ...

    def record_size_of(self, index: int) -> int:
        """The size of entry ``index``'s record (header, body, padding); IndexError if not held."""
        ...

    def read_at(self, position: int, size: int) -> bytes:
        """``size`` raw bytes at ``position``; ValueError outside the retained range."""
        ...

    # -- reading by index (a message chained over consecutive entries)
    def entry(self, index: int) -> Entry:
        """The entry at ``index``, its body CRC-checked; IndexError if not held."""
        ...

    def entries(self, from_index: int, max_bytes: int) -> list[Entry]:
        """Consecutive entries from ``from_index``: at least one if it is held, more while
        their bodies stay within ``max_bytes``; ``[]`` past the end."""
        ...

    # -- what retention will cut
    def segments(self) -> list[SegmentInfo]:
        """The segment files, oldest first (start position, size on disk, mtime)."""
        ...
