"""ConsumeQueue v2 (a unit per record): layout, lookup inside records, files named by base
offset, recovery, determinism, retention, truncation, bisect, tag summaries."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.consume_queue import ConsumeQueue, ConsumeQueueCorrupt, OffsetOutOfRange
from broker.store.consume_queue_layout import (
    TAG_BLOOM,
    TAG_ONE,
    UNIT,
    UNIT_SIZE,
    bloom_bits,
    cq_file_name,
    summary_may_match,
    tag_summary,
)
from protocol.tags import tag_hash

UPF = 4  # units per file in these tests
Unit = tuple[int, int, int, int, int, int, int]


def units_from(base: int, counts: list[int], position: int = 1000, stamp: int = 5_000) -> list[Unit]:
    """Consecutive units of records of ``counts`` messages from queue offset ``base``."""
    out = []
    for i, n in enumerate(counts):
        out.append((position + 512 * i, 100 + n, n, TAG_ONE, base, stamp + 10 * i, tag_hash("a")))
        base += n
    return out


def fill(cq: ConsumeQueue, counts: list[int]) -> list[Unit]:
    units = units_from(cq.max_offset, counts)
    cq.append_many(cq.max_offset, units)
    return units


def files_units(cq: ConsumeQueue) -> list[bytes]:
    return [p.read_bytes() for p in sorted(cq.directory.iterdir())]


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.fixture
def cq(tmp_path: Path) -> Iterator[ConsumeQueue]:
    q = ConsumeQueue(tmp_path / "cq" / "TopicA" / "0", UPF)
    yield q
    q.close()


def test_units_are_40_bytes_and_files_are_named_by_their_first_base_offset(cq: ConsumeQueue) -> None:
    fill(cq, [3, 1, 5, 2, 4, 7])
    assert (cq.min_offset, cq.max_offset, len(cq)) == (0, 22, 22)
    assert names(cq.directory) == [cq_file_name(0), cq_file_name(11)]  # 3+1+5+2 before the second
    raw = b"".join(files_units(cq))
    assert len(raw) == 6 * UNIT_SIZE
    assert raw[:UNIT_SIZE] == UNIT.pack(1000, 103, 3, TAG_ONE, 0, 0, 5_000, tag_hash("a"))


def test_an_offset_inside_a_record_finds_its_record(cq: ConsumeQueue) -> None:
    fill(cq, [3, 1, 5, 2, 4, 7])
    bases = [0, 3, 4, 9, 11, 15]
    for offset in range(22):
        unit = cq.get(offset)
        assert unit.base == max(b for b in bases if b <= offset) and unit.base <= offset < unit.end
        read = cq.read(offset, 2)
        assert read.units[0] == unit and read.next_offset == read.units[-1].end
    assert [u.base for u in cq.read(4, 10).units] == [4, 9, 11, 15]  # across files
    assert cq.read(22, 5).units == [] and cq.read(22, 5).next_offset == 22
    with pytest.raises(OffsetOutOfRange):
        cq.get(22)
    with pytest.raises(OffsetOutOfRange):
        cq.read(23, 1)


def test_two_queues_from_the_same_units_are_byte_identical(tmp_path: Path) -> None:
    a, b = ConsumeQueue(tmp_path / "a", UPF), ConsumeQueue(tmp_path / "b", UPF)
    units = units_from(0, [2, 9, 1, 1, 4, 3, 3, 8, 1])
    a.append_many(0, units)
    for u in units:  # one by one
        b.append_many(u[4], [u])
    assert names(a.directory) == names(b.directory)
    assert files_units(a) == files_units(b)
    a.close()
    b.close()


def test_a_bad_append_writes_nothing(cq: ConsumeQueue) -> None:
    fill(cq, [2])
    with pytest.raises(ValueError, match="next offset"):
        cq.append_many(3, units_from(3, [1]))
    with pytest.raises(ValueError, match="does not follow"):
        cq.append_many(2, [*units_from(2, [1]), *units_from(9, [1])])
    with pytest.raises(ValueError, match="count"):
        cq.append_many(2, [(1, 1, 0, 0, 2, 0, 0)])
    assert cq.max_offset == 2 and len(b"".join(files_units(cq))) == UNIT_SIZE


def test_reopen_recovers_a_torn_unit_a_zero_tail_and_an_empty_last_file(tmp_path: Path) -> None:
    d = tmp_path / "q"
    cq = ConsumeQueue(d, UPF)
    cq.append_many(0, units_from(0, [2, 2, 2, 2, 2, 2]))
    cq.close()
    last = d / cq_file_name(8)
    with open(last, "ab") as f:
        f.write(b"\x00" * UNIT_SIZE * 2 + b"\x01" * 7)
    cq = ConsumeQueue(d, UPF)
    assert (cq.min_offset, cq.max_offset) == (0, 12)
    assert names(d) == [cq_file_name(0), cq_file_name(8)]
    assert last.stat().st_size == 2 * UNIT_SIZE
    cq.append_many(12, units_from(12, [1, 1]))  # file 8 is full now
    cq.close()
    (d / cq_file_name(14)).write_bytes(b"")  # created, then a crash before its first unit
    cq = ConsumeQueue(d, UPF)
    assert names(d) == [cq_file_name(0), cq_file_name(8)] and cq.max_offset == 14
    cq.append_many(14, units_from(14, [1]))
    assert cq.get(14).base == 14 and names(d)[-1] == cq_file_name(14)
    cq.close()


def test_bad_directories_raise_corrupt(tmp_path: Path) -> None:
    full = b"".join(UNIT.pack(*u[:4], 0, *u[4:]) for u in units_from(0, [1] * UPF))
    d = tmp_path / "gap"
    d.mkdir()
    (d / cq_file_name(0)).write_bytes(full)
    (d / cq_file_name(5)).write_bytes(b"")  # the first file ends at 4
    with pytest.raises(ConsumeQueueCorrupt, match="contiguous"):
        ConsumeQueue(d, UPF)
    d = tmp_path / "short"
    d.mkdir()
    (d / cq_file_name(0)).write_bytes(full[:UNIT_SIZE])
    (d / cq_file_name(1)).write_bytes(b"")
    with pytest.raises(ConsumeQueueCorrupt, match="must be full"):
        ConsumeQueue(d, UPF)
    d = tmp_path / "misnamed"
    d.mkdir()
    (d / cq_file_name(3)).write_bytes(full[:UNIT_SIZE])
    with pytest.raises(ConsumeQueueCorrupt, match="starts with offset 0"):
        ConsumeQueue(d, UPF)


def test_a_queue_restored_at_an_offset_starts_there(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "q", UPF, start_offset=4096)
    assert (cq.min_offset, cq.max_offset) == (4096, 4096)
    cq.close()
    cq = ConsumeQueue(tmp_path / "q", UPF)  # reopened empty: the name keeps it
    assert cq.max_offset == 4096
    cq.append_many(4096, units_from(4096, [64]))
    assert cq.get(4100).base == 4096 and cq.max_offset == 4160
    cq.close()


def test_delete_before_takes_whole_files_and_never_the_last(cq: ConsumeQueue) -> None:
    fill(cq, [1] * 10)
    assert cq.delete_before(5) == [0]  # file 0 holds 0..3; 4..7 has 5
    assert cq.min_offset == 4
    assert cq.delete_before(1000) == [4]
    assert (cq.min_offset, cq.max_offset) == (8, 10)
    assert cq.get(8).base == 8


def test_truncate_from_a_record_boundary_then_append_again(tmp_path: Path) -> None:
    d = tmp_path / "q"
    cq = ConsumeQueue(d, UPF)
    units = units_from(0, [2, 3, 1, 4, 2, 2, 5])
    cq.append_many(0, units)
    with pytest.raises(OffsetOutOfRange, match="inside a record"):
        cq.truncate_from(3)
    cq.truncate_from(10)  # the first unit of the second file: the file goes
    assert (cq.max_offset, names(d)) == (10, [cq_file_name(0)])
    cq.truncate_from(5)
    assert cq.max_offset == 5
    cq.append_many(5, units[2:])
    cq.close()
    clean = ConsumeQueue(tmp_path / "clean", UPF)
    clean.append_many(0, units)
    assert files_units(ConsumeQueue(d, UPF)) == files_units(clean)
    clean.truncate_from(0)
    assert (clean.min_offset, clean.max_offset) == (0, 0)
    clean.close()


def test_truncate_to_the_first_offset_after_retention_keeps_the_numbering(tmp_path: Path) -> None:
    d = tmp_path / "q"
    cq = ConsumeQueue(d, UPF)
    cq.append_many(0, units_from(0, [3] * 9))
    cq.delete_before(12)
    first = cq.min_offset
    assert first == 12
    cq.truncate_from(first)
    assert (cq.min_offset, cq.max_offset) == (12, 12)
    cq.close()
    cq = ConsumeQueue(d, UPF)
    assert cq.max_offset == 12  # an empty first file: its name is the next offset
    cq.close()


def test_bisect_by_store_time_and_position(cq: ConsumeQueue) -> None:
    fill(cq, [2, 3, 1, 4, 2, 2, 5])  # stamps 5000, 5010, ...; positions 1000 + 512 i
    assert cq.bisect(lambda u: u.store_ms, 0) == 0
    assert cq.bisect(lambda u: u.store_ms, 5_010) == 2
    assert cq.bisect(lambda u: u.store_ms, 5_011) == 5
    assert cq.bisect(lambda u: u.store_ms, 10_000) == cq.max_offset
    assert cq.offset_for_position(1000 + 512 * 4) == 10
    cq.delete_before(10)  # the first file: records 0..3, offsets 0..9
    assert cq.bisect(lambda u: u.store_ms, 0) == cq.min_offset == 10


def test_flush_and_reads_while_appending(cq: ConsumeQueue) -> None:
    assert cq.flush()  # the new file's directory entry
    assert not cq.flush()
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                end = cq.max_offset
                if end:
                    unit = cq.get(end - 1)
                    assert unit.base < end <= unit.end
            except BaseException as e:
                errors.append(e)
                return

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(200):
        fill(cq, [3])
    stop.set()
    t.join(timeout=10)
    assert not errors and cq.max_offset == 600 and cq.flush()


def test_tag_summaries_never_miss_a_tag_they_hold() -> None:
    hashes = [tag_hash(t) for t in ("a", "b", "c", None)]
    assert tag_summary([hashes[0]] * 3) == (TAG_ONE, hashes[0])
    kind, value = tag_summary(hashes)
    assert kind == TAG_BLOOM
    bits = [bloom_bits(h) for h in hashes]
    for h in hashes:
        assert summary_may_match(kind, value, frozenset([h]), [bloom_bits(h)])
    assert summary_may_match(TAG_ONE, hashes[0], frozenset(hashes[:2]), bits[:2])
    assert not summary_may_match(TAG_ONE, hashes[2], frozenset(hashes[:2]), bits[:2])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["append", "delete", "truncate", "reopen"]),
                          st.integers(1, 9)), max_size=25))
def test_model(tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]) -> None:
    """Against a list of records: every offset finds its record, whatever the history."""
    d = tmp_path_factory.mktemp("model") / "q"
    cq = ConsumeQueue(d, 3)
    model: list[Unit] = []  # the units held
    start = 0
    try:
        for op, n in ops:
            if op == "append":
                new = units_from(model[-1][4] + model[-1][2] if model else start, [n])
                cq.append_many(new[0][4], new)
                model += new
            elif op == "delete" and model:
                cq.delete_before(model[0][4] + n)
                start = cq.min_offset
                model = [u for u in model if u[4] >= start]
            elif op == "truncate" and model:
                keep = model[: max(0, len(model) - n)]
                cut = keep[-1][4] + keep[-1][2] if keep else start
                cq.truncate_from(cut)
                model = keep
            elif op == "reopen":
                cq.close()
                cq = ConsumeQueue(d, 3)
            end = model[-1][4] + model[-1][2] if model else cq.min_offset
            assert cq.max_offset == end
            for u in model:
                for offset in (u[4], u[4] + u[2] - 1):
                    assert cq.get(offset).astuple() == u
    finally:
        cq.close()
        for p in d.iterdir():
            os.unlink(p)


def test_a_read_for_some_messages_stops_at_the_record_that_brings_them(cq: ConsumeQueue) -> None:
    fill(cq, [3] * 40)
    got = cq.read(4, 100, max_messages=10)  # 4..5 of the record at 3, then 6.., 9.., 12..14
    assert [u.base for u in got.units] == [3, 6, 9, 12] and got.next_offset == 15
    assert [u.base for u in cq.read(4, 2, max_messages=10).units] == [3, 6]
    assert len(cq.read(0, 100).units) == 40
    assert cq.read(117, 5, max_messages=50).next_offset == 120


def test_a_failed_fsync_leaves_what_it_covered_pending(cq: ConsumeQueue,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cq.flush()
    fill(cq, [3, 1])

    def boom(fd: int) -> None:
        raise OSError(5, "EIO")

    with monkeypatch.context() as m:
        m.setattr(os, "fsync", boom)
        with pytest.raises(OSError, match="EIO"):
            cq.flush()
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    assert cq.flush() is True and synced, "the failed flush's files were forgotten"
    assert cq.flush() is False
