"""ConsumeQueue: units, files, recovery, determinism, tag filter, retention, truncation, bisect."""

from __future__ import annotations

import bisect as bisect_module
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.consume_queue import (
    FILTER_SCAN_FACTOR,
    ConsumeQueue,
    ConsumeQueueCorrupt,
    CqUnit,
    OffsetOutOfRange,
)
from broker.consume_queue_layout import UNIT, UNIT_SIZE, cq_file_name
from protocol.tags import tag_hash

UPF = 4  # units per file in these tests
TAGS = [None, "a", "b", "c"]


def unit_of(i: int) -> tuple[int, int, int]:
    """Deterministic (position, size, tag hash) for queue offset i."""
    return 1000 + 64 * i, 40 + i % 7, tag_hash(TAGS[i % len(TAGS)])


def fill(cq: ConsumeQueue, n: int) -> None:
    for _ in range(n):
        cq.append(cq.max_offset, *unit_of(cq.max_offset))


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def assert_as_written_once(directory: Path, units: int, scratch: Path) -> None:
    """``directory`` holds the bytes of a new queue (in ``scratch``) after ``fill(units)``."""
    clean = ConsumeQueue(scratch, UPF)
    try:
        fill(clean, units)
        assert snapshot(directory) == snapshot(clean.directory)
    finally:
        clean.close()


@pytest.fixture
def cq(tmp_path: Path) -> Iterator[ConsumeQueue]:
    q = ConsumeQueue(tmp_path / "cq" / "TopicA" / "0", UPF)
    yield q
    q.close()


def test_tag_hash() -> None:
    assert tag_hash(None) == 0
    assert tag_hash("") == 0
    assert tag_hash("TagA") == mmh3.hash64("TagA", signed=True)[0]
    assert tag_hash("TagA") != tag_hash("TagB")


def test_new_queue_has_one_empty_file(cq: ConsumeQueue) -> None:
    assert names(cq.directory) == [cq_file_name(0)]
    assert cq.min_offset == cq.max_offset == len(cq) == 0
    assert cq.read(0, 10).units == [] and cq.read(0, 10).next_offset == 0
    assert cq_file_name(300_000) == "00000000000000300000"


def test_round_trip_and_layout(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 10)
    assert (cq.min_offset, cq.max_offset, len(cq)) == (0, 10, 10)
    for i in range(10):
        assert cq.get(i) == CqUnit(*unit_of(i))
    assert names(cq.directory) == [cq_file_name(0), cq_file_name(4), cq_file_name(8)]
    files = snapshot(cq.directory)
    assert [len(b) for b in files.values()] == [4 * UNIT_SIZE, 4 * UNIT_SIZE, 2 * UNIT_SIZE]
    raw = b"".join(files.values())
    assert raw == b"".join(UNIT.pack(*unit_of(i)) for i in range(10))  # big-endian q i q
    assert raw[:UNIT_SIZE] == (1000).to_bytes(8, "big") + (40).to_bytes(4, "big") + bytes(8)
    cq.flush()
    cq.close()
    again = ConsumeQueue(cq.directory, UPF)
    assert [again.get(i) for i in range(10)] == [CqUnit(*unit_of(i)) for i in range(10)]
    assert again.max_offset == 10
    fill(again, 1)
    assert again.get(10) == CqUnit(*unit_of(10))
    again.close()


def test_read_across_files(cq: ConsumeQueue) -> None:
    fill(cq, 10)
    r = cq.read(2, 5)
    assert r.units == [(i, CqUnit(*unit_of(i))) for i in range(2, 7)]
    assert r.next_offset == 7
    r = cq.read(7, 100)
    assert [o for o, _ in r.units] == [7, 8, 9] and r.next_offset == 10
    r = cq.read(10, 5)
    assert r.units == [] and r.next_offset == 10


def test_two_queues_from_the_same_input_are_byte_identical(tmp_path: Path) -> None:
    a = ConsumeQueue(tmp_path / "a", UPF)
    fill(a, 23)
    a.flush()
    b = ConsumeQueue(tmp_path / "b", UPF)  # built differently: reopened, flushed, truncated, redone
    fill(b, 9)
    b.close()
    b = ConsumeQueue(tmp_path / "b", UPF)
    fill(b, 10)
    b.flush()
    b.truncate_from(13)
    fill(b, 10)
    assert a.max_offset == b.max_offset == 23
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")
    a.close()
    b.close()


def test_append_at_a_wrong_offset_raises(cq: ConsumeQueue) -> None:
    fill(cq, 3)
    for wrong in (0, 2, 4, -1):
        with pytest.raises(ValueError, match="next offset is 3"):
            cq.append(wrong, 1, 1, 0)
    with pytest.raises(ValueError, match="size"):
        cq.append(3, 1, 0, 0)
    with pytest.raises(ValueError, match="position"):
        cq.append(3, -1, 1, 0)
    with pytest.raises(ValueError, match="tag hash"):
        cq.append(3, 1, 1, 1 << 63)
    assert cq.max_offset == 3


def test_torn_trailing_unit_is_cut_on_reopen(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 6)
    cq.close()
    last = cq.directory / cq_file_name(4)
    with last.open("ab") as f:
        f.write(UNIT.pack(*unit_of(6))[:13])
    q = ConsumeQueue(cq.directory, UPF)
    assert q.max_offset == 6
    assert last.stat().st_size == 2 * UNIT_SIZE
    fill(q, 5)
    assert_as_written_once(q.directory, 11, tmp_path / "clean")
    q.close()


def test_zero_tail_and_empty_last_file_are_cut(cq: ConsumeQueue) -> None:
    fill(cq, 4)  # file 0 full
    cq.close()
    (cq.directory / cq_file_name(4)).write_bytes(bytes(3 * UNIT_SIZE + 5))  # zeros, then torn
    q = ConsumeQueue(cq.directory, UPF)
    assert q.max_offset == 4
    assert names(q.directory) == [cq_file_name(0)]
    fill(q, 1)
    assert names(q.directory) == [cq_file_name(0), cq_file_name(4)]
    q.close()


def test_bad_directories_raise_corrupt(tmp_path: Path) -> None:
    d = tmp_path / "gap"
    d.mkdir()
    (d / cq_file_name(0)).write_bytes(UNIT.pack(1, 1, 0) * UPF)
    (d / cq_file_name(8)).write_bytes(UNIT.pack(1, 1, 0))
    with pytest.raises(ConsumeQueueCorrupt, match="not contiguous"):
        ConsumeQueue(d, UPF)
    with pytest.raises(ConsumeQueueCorrupt, match="multiple of units_per_file"):
        ConsumeQueue(d, 3)
    (d / cq_file_name(8)).unlink()
    (d / cq_file_name(4)).write_bytes(UNIT.pack(1, 1, 0))
    (d / cq_file_name(0)).write_bytes(UNIT.pack(1, 1, 0) * (UPF - 1))
    with pytest.raises(ConsumeQueueCorrupt, match="must be full"):
        ConsumeQueue(d, UPF)
    (d / cq_file_name(4)).unlink()
    (d / cq_file_name(0)).write_bytes(UNIT.pack(1, 1, 0) * (UPF + 1))
    with pytest.raises(ConsumeQueueCorrupt, match="more than"):
        ConsumeQueue(d, UPF)
    with pytest.raises(ValueError):
        ConsumeQueue(d, 0)


def test_read_with_a_tag_filter(cq: ConsumeQueue) -> None:
    fill(cq, 20)  # tags cycle None, a, b, c
    want = frozenset({tag_hash("b")})
    r = cq.read(0, 2, want)
    assert [o for o, _ in r.units] == [2, 6]
    assert all(u.tag_hash == tag_hash("b") for _, u in r.units)
    assert r.next_offset == 7  # continue after the last match
    r = cq.read(r.next_offset, 2, want)
    assert [o for o, _ in r.units] == [10, 14] and r.next_offset == 15
    r = cq.read(15, 10, want)
    assert [o for o, _ in r.units] == [18] and r.next_offset == 20
    r = cq.read(0, 3, frozenset({tag_hash("a"), tag_hash(None)}))
    assert [o for o, _ in r.units] == [0, 1, 4]


def test_filter_scan_is_bounded(cq: ConsumeQueue) -> None:
    for i in range(50):
        cq.append(i, i, 1, tag_hash("x"))
    cq.append(50, 50, 1, tag_hash("y"))
    r = cq.read(0, 2, frozenset({tag_hash("y")}))
    assert r.units == [] and r.next_offset == 2 * FILTER_SCAN_FACTOR
    offset, found = 0, []
    while offset < cq.max_offset:
        r = cq.read(offset, 2, frozenset({tag_hash("y")}))
        found += r.units
        assert r.next_offset > offset
        offset = r.next_offset
    assert found == [(50, CqUnit(50, 1, tag_hash("y")))]
    assert cq.read(0, 1, frozenset()).next_offset == FILTER_SCAN_FACTOR


def test_read_and_get_out_of_range(cq: ConsumeQueue) -> None:
    fill(cq, 5)
    with pytest.raises(OffsetOutOfRange) as e:
        cq.get(5)
    assert (e.value.offset, e.value.min_offset, e.value.max_offset) == (5, 0, 5)
    with pytest.raises(OffsetOutOfRange):
        cq.read(6, 1)
    with pytest.raises(ValueError):
        cq.read(0, 0)


def test_delete_before_whole_files_only(cq: ConsumeQueue) -> None:
    fill(cq, 10)
    assert cq.delete_before(3) == []
    assert cq.delete_before(7) == [0]
    assert (cq.min_offset, cq.max_offset, len(cq)) == (4, 10, 6)
    assert names(cq.directory) == [cq_file_name(4), cq_file_name(8)]
    with pytest.raises(OffsetOutOfRange) as e:
        cq.get(3)
    assert e.value.min_offset == 4
    with pytest.raises(OffsetOutOfRange):
        cq.read(2, 5)
    assert cq.get(4) == CqUnit(*unit_of(4))
    assert cq.delete_before(1000) == [4]  # never the last file
    assert cq.min_offset == 8
    cq.flush()
    cq.close()
    q = ConsumeQueue(cq.directory, UPF)
    assert (q.min_offset, q.max_offset) == (8, 10)
    fill(q, 3)
    assert q.read(8, 10).next_offset == 13
    q.close()


def test_delete_before_keeps_a_full_last_file(cq: ConsumeQueue) -> None:
    fill(cq, 8)
    assert cq.delete_before(100) == [0]
    assert (cq.min_offset, cq.max_offset) == (4, 8)
    fill(cq, 1)
    assert names(cq.directory) == [cq_file_name(4), cq_file_name(8)]


def test_truncate_from_then_append_again(cq: ConsumeQueue, tmp_path: Path) -> None:
    fill(cq, 11)
    cq.truncate_from(8)  # a file boundary: the file it would empty is deleted
    assert cq.max_offset == 8
    assert names(cq.directory) == [cq_file_name(0), cq_file_name(4)]
    with pytest.raises(OffsetOutOfRange):
        cq.get(8)
    cq.truncate_from(6)
    assert cq.max_offset == 6
    cq.truncate_from(6)  # no-op
    with pytest.raises(OffsetOutOfRange):
        cq.truncate_from(7)
    for i in range(6, 11):
        cq.append(i, 7, 7, 7)
    assert [cq.get(i) for i in (5, 6, 10)] == [CqUnit(*unit_of(5)), CqUnit(7, 7, 7), CqUnit(7, 7, 7)]
    cq.truncate_from(0)
    assert names(cq.directory) == [cq_file_name(0)] and cq.max_offset == 0
    fill(cq, 11)
    assert_as_written_once(cq.directory, 11, tmp_path / "clean")
    cq.flush()
    cq.close()
    q = ConsumeQueue(cq.directory, UPF)
    assert q.max_offset == 11
    q.close()


def test_truncate_to_min_offset_after_retention(cq: ConsumeQueue) -> None:
    fill(cq, 8)
    cq.delete_before(4)
    cq.truncate_from(4)
    assert (cq.min_offset, cq.max_offset) == (4, 4)
    assert names(cq.directory) == [cq_file_name(4)]
    cq.close()
    q = ConsumeQueue(cq.directory, UPF)
    assert (q.min_offset, q.max_offset) == (4, 4)
    fill(q, 1)
    assert q.get(4) == CqUnit(*unit_of(4))
    q.close()


def test_bisect_over_store_times(cq: ConsumeQueue) -> None:
    times = [100, 100, 105, 110, 110, 110, 120, 121, 150, 150, 151]
    store_time = {}
    for i, t in enumerate(times):
        cq.append(i, 5000 + 100 * i, 10, 0)
        store_time[5000 + 100 * i] = t
    calls = []

    def key(u: CqUnit) -> int:
        calls.append(u.position)
        return store_time[u.position]

    for target in [0, 100, 101, 110, 111, 121, 150, 151, 152, 10_000]:
        calls.clear()
        assert cq.bisect(key, target) == bisect_module.bisect_left(times, target), target
        assert len(calls) <= 4  # O(log n): ceil(log2(12))
    assert cq.offset_for_position(0) == 0
    assert cq.offset_for_position(5100) == 1
    assert cq.offset_for_position(5101) == 2
    assert cq.offset_for_position(10**9) == 11
    cq.delete_before(5)
    assert cq.bisect(key, 0) == 4  # min_offset
    assert cq.offset_for_position(5000) == 4


def test_bisect_while_retention_deletes(cq: ConsumeQueue) -> None:
    fill(cq, 12)

    def key(u: CqUnit) -> int:
        cq.delete_before(8)  # retention runs during the search
        return u.position

    assert cq.bisect(key, unit_of(2)[0]) == 8  # offset 2 is gone: the first kept one answers


def test_flush(cq: ConsumeQueue) -> None:
    assert cq.flush()  # the new first file: directory entry
    assert not cq.flush()
    fill(cq, 5)
    assert cq.flush()
    assert not cq.flush()
    cq.close()
    with pytest.raises(ValueError, match="closed"):
        cq.append(5, 1, 1, 0)
    cq.close()


def test_reads_while_appending(cq: ConsumeQueue) -> None:
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                high = cq.max_offset
                r = cq.read(0, 1000)
                assert len(r.units) >= high
                for o, u in r.units:
                    assert u == CqUnit(*unit_of(o))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    fill(cq, 300)
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert len(os.listdir(cq.directory)) == 75


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["append", "truncate", "delete", "reopen"]),
                              st.integers(0, 12)), max_size=25))
def test_model(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]) -> None:
    """Against a list model: whatever the history, the units and min/max offsets agree."""
    d = tmp_path_factory.mktemp("model")
    q = ConsumeQueue(d, 3)
    model: dict[int, tuple[int, int, int]] = {}
    low = 0
    try:
        for op, n in ops:
            high = low + len(model)
            if op == "append":
                for i in range(high, high + n):
                    q.append(i, *unit_of(i))
                    model[i] = unit_of(i)
            elif op == "truncate":
                target = max(low, high - n)
                q.truncate_from(target)
                model = {o: u for o, u in model.items() if o < target}
            elif op == "delete":
                last_start = low if high == low else (high - 1) // 3 * 3
                q.delete_before(low + n)
                low = min(max(low, (low + n) // 3 * 3), last_start)
                model = {o: u for o, u in model.items() if o >= low}
            else:
                q.close()
                q = ConsumeQueue(d, 3)
            assert (q.min_offset, q.max_offset) == (low, low + len(model))
            assert q.read(low, 100).units == [(o, CqUnit(*u)) for o, u in sorted(model.items())]
    finally:
        q.close()


def test_append_many_across_files_equals_appending_one_by_one(tmp_path: Path) -> None:
    one = ConsumeQueue(tmp_path / "one", UPF)
    fill(one, 11)
    many = ConsumeQueue(tmp_path / "many", UPF)
    many.append_many(0, [unit_of(i) for i in range(3)])
    many.append_many(3, [unit_of(i) for i in range(3, 11)])  # fills 3, a whole file, starts a third
    assert many.max_offset == 11
    assert snapshot(tmp_path / "one") == snapshot(tmp_path / "many")
    with pytest.raises(ValueError, match="size"):
        many.append_many(11, [unit_of(11), (5, 0, 0)])  # checked before anything is written
    assert many.max_offset == 11 and snapshot(tmp_path / "one") == snapshot(tmp_path / "many")
    one.close()
    many.close()


@pytest.mark.parametrize("start", [6, 8, 13])
def test_a_queue_may_start_at_any_offset_with_aligned_files_after_the_first(
        tmp_path: Path, start: int) -> None:
    """A replica restored from a snapshot numbers its queues as its peers do: the first file
    starts at the peers' next offset and ends at the next multiple of units_per_file."""
    d = tmp_path / "q"
    cq = ConsumeQueue(d, UPF, start_offset=start)
    assert (cq.min_offset, cq.max_offset) == (start, start)
    fill(cq, 11)
    assert cq.max_offset == start + 11
    names = sorted(p.name for p in d.iterdir())
    assert names[0] == cq_file_name(start) and all(int(n) % UPF == 0 for n in names[1:])
    read = cq.read(start, 100)
    assert [off for off, _ in read.units] == list(range(start, start + 11))
    assert all(u == CqUnit(*unit_of(off)) for off, u in read.units)
    cq.flush()
    cq.close()
    again = ConsumeQueue(d, UPF, start_offset=0)  # start_offset only applies to a new queue
    assert (again.min_offset, again.max_offset) == (start, start + 11)
    assert again.get(start + 5) == CqUnit(*unit_of(start + 5))
    again.truncate_from(start + 1)
    assert again.max_offset == start + 1 and again.get(start) == CqUnit(*unit_of(start))
    fill(again, 9)
    first_end = (start // UPF + 1) * UPF
    assert again.delete_before(first_end) == [start]
    assert again.min_offset == first_end
    assert again.bisect(lambda u: u.position, unit_of(first_end + 2)[0]) == first_end + 2
    again.close()
