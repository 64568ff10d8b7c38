"""What a ``CommitLog`` keeps in memory per entry: ``(position, term, kind, body length)``,
in flat arrays indexed by ``index - first``; bodies stay on disk::

    index:      first         first+1         ...   last
    positions:  [    0     ][     48       ] ...  [ 8192      ]   array('q')
    terms:      [    1     ][      1       ] ...  [    3      ]   array('q')
    body lens:  [   13     ][     80       ] ...  [    0      ]   array('q')
    kinds:      [  NOOP    ][    DATA      ] ...  [  NOOP     ]   array('B')

Positions only grow along the arrays (a record's position is its absolute place in the
segmented file). Not thread-safe: the ``CommitLog`` lock guards every use.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right

from dledger.storage.entry_format import record_size

__all__ = ["EntryColumns"]


class EntryColumns:
    """The per-entry columns of the entries ``first..last`` (see the module docstring)."""

    __slots__ = ("first", "kinds", "lens", "positions", "terms")

    def __init__(self) -> None:
        self.first = 0  # meaningful only while an entry is held
        self.positions = array("q")
        self.terms = array("q")
        self.lens = array("q")
        self.kinds = array("B")

    def __len__(self) -> int:
        return len(self.positions)

    def last(self) -> int:
        """The last entry's index (0: none held)."""
        return self.first + len(self.positions) - 1 if self.positions else 0

    def slot(self, index: int) -> int:
        """Entry ``index``'s place in the arrays; IndexError if it is not held."""
        if not self.positions or not self.first <= index <= self.last():
            first = self.first if self.positions else 0
            raise IndexError(f"index {index} outside [{first}, {self.last()}]")
        return index - self.first

    def size(self, i: int) -> int:
        """The record size of the entry in slot ``i``."""
        return record_size(self.lens[i])

    def push(self, position: int, index: int, term: int, kind: int, body_len: int) -> None:
        """Add the entry after the last (the first one sets ``first``)."""
        if not self.positions:
            self.first = index
        self.positions.append(position)
        self.terms.append(term)
        self.lens.append(body_len)
        self.kinds.append(kind)

    def cut_from(self, i: int) -> None:
        """Forget slot ``i`` and every later one."""
        for column in (self.positions, self.terms, self.lens, self.kinds):
            del column[i:]

    def drop_below(self, position: int) -> int:
        """Forget the entries whose records start below ``position``; returns how many."""
        dropped = bisect_left(self.positions, position)
        for column in (self.positions, self.terms, self.lens, self.kinds):
            del column[:dropped]
        self.first += dropped
        return dropped

    def clear(self) -> None:
        """Forget every entry."""
        self.cut_from(0)
        self.first = 0

    def index_at_position(self, position: int) -> int | None:
        """The index of the entry whose record starts at ``position``, or None."""
        i = bisect_left(self.positions, position)
        if i < len(self.positions) and self.positions[i] == position:
            return self.first + i
        return None

    def entry_containing(self, position: int) -> tuple[int, int] | None:
        """(index, record position) of the entry whose record holds ``position``, or None."""
        i = bisect_right(self.positions, position) - 1
        if i < 0:
            return None
        start = self.positions[i]
        if position >= start + record_size(self.lens[i]):
            return None
        return self.first + i, start
