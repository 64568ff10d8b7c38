"""``dledger.storage.entry_columns``: the CommitLog's per-entry arrays, without files."""

from __future__ import annotations

import pytest

from dledger.storage.entry_columns import EntryColumns
from dledger.storage.entry_format import EntryKind, record_size


def columns_of(first: int, bodies: list[int], start: int = 0) -> EntryColumns:
    """Entries ``first..`` with these body lengths, records back to back from ``start``."""
    cols = EntryColumns()
    position = start
    for i, body_len in enumerate(bodies):
        cols.push(position, first + i, 1, EntryKind.DATA, body_len)
        position += record_size(body_len)
    return cols


def test_an_empty_columns_holds_no_index() -> None:
    cols = EntryColumns()
    assert (len(cols), cols.last()) == (0, 0)
    with pytest.raises(IndexError):
        cols.slot(1)


def test_slots_count_from_the_first_index_pushed() -> None:
    cols = columns_of(7, [10, 0, 100])
    assert (cols.first, cols.last(), len(cols)) == (7, 9, 3)
    assert [cols.slot(i) for i in (7, 8, 9)] == [0, 1, 2]
    assert cols.size(2) == record_size(100)
    for outside in (6, 10):
        with pytest.raises(IndexError, match=r"outside \[7, 9\]"):
            cols.slot(outside)


def test_positions_find_the_entry_starting_at_or_holding_them() -> None:
    cols = columns_of(1, [10, 20], start=64)
    second = 64 + record_size(10)
    assert cols.index_at_position(64) == 1 and cols.index_at_position(second) == 2
    assert cols.index_at_position(65) is None
    assert cols.entry_containing(second + 3) == (2, second)
    assert cols.entry_containing(63) is None
    assert cols.entry_containing(second + record_size(20)) is None  # past the last record


def test_cut_from_forgets_the_tail_and_drop_below_the_head() -> None:
    cols = columns_of(1, [0] * 6)
    cols.cut_from(4)  # keeps slots 0..3: indexes 1..4
    assert (cols.first, cols.last()) == (1, 4)
    assert cols.drop_below(cols.positions[2]) == 2  # entries 1 and 2 start below it
    assert (cols.first, cols.last(), cols.index_at_position(cols.positions[0])) == (3, 4, 3)
    cols.clear()
    assert (len(cols), cols.last(), cols.first) == (0, 0, 0)
    cols.push(4096, 50, 2, EntryKind.NOOP, 0)  # an empty log restarts at any index
    assert (cols.first, cols.last()) == (50, 50)
