"""CommitLog: append/read, deterministic positions, recovery, truncation, retention, threads."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from dledger.storage.commitlog import CommitLog, CorruptLogError
from dledger.storage.entry_format import HEADER_SIZE, EntryKind, encode_blank, record_size
from dledger.storage.segments import SegmentedFile, segment_name

SEG = 4096


def body(i: int) -> bytes:
    """Bodies of varied lengths (so varied padding), distinct per index."""
    return f"<{i}>".encode() * (i % 9 + 3)


def open_log(path: Path, repair: bool = False) -> CommitLog:
    return CommitLog(path, segment_size=SEG, repair=repair)


def fill(log: CommitLog, upto: int, start: int = 1, term: int = 1) -> list[int]:
    return [log.append(i, term, EntryKind.DATA, body(i)) for i in range(start, upto + 1)]


def check_entries(log: CommitLog, first: int, last: int) -> None:
    assert (log.first_index, log.last_index) == (first, last)
    for i in range(first, last + 1):
        assert log.entry(i).body == body(i)


def segment_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.isdigit())


def patch_file(path: Path, offset: int, data: bytes) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(data)


def test_append_and_read_back(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    assert (len(log), log.first_index, log.last_index, log.last_term) == (0, 0, 0, 0)
    assert log.append(1, 1, EntryKind.NOOP, b"") == 0
    assert log.append(2, 1, EntryKind.DATA, b"hello") == HEADER_SIZE
    assert log.append(3, 2, EntryKind.RAFT, b"raft") == HEADER_SIZE + record_size(5)
    assert (len(log), log.first_index, log.last_index, log.last_term) == (3, 1, 3, 2)
    e = log.entry(2)
    assert (e.index, e.term, e.kind, e.body, e.position) == (2, 1, EntryKind.DATA, b"hello", 32)
    assert [log.term_at(i) for i in (1, 2, 3)] == [1, 1, 2]
    assert log.kind_at(3) == EntryKind.RAFT and log.record_size_of(2) == 40
    assert log.position_of(3) == 72 and log.write_position == 72 + 40
    for bad in (0, 4):
        with pytest.raises(IndexError):
            log.entry(bad)
        with pytest.raises(IndexError):
            log.term_at(bad)
    log.close()


def test_append_index_rules(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    with pytest.raises(ValueError):
        log.append(0, 1, EntryKind.DATA, b"")
    assert log.append(100, 5, EntryKind.DATA, b"x") == 0  # a log may start anywhere
    for bad in (100, 102, 1):
        with pytest.raises(ValueError, match="expected 101"):
            log.append(bad, 5, EntryKind.DATA, b"x")
    log.append(101, 5, EntryKind.DATA, b"x")
    assert (log.first_index, log.last_index) == (100, 101)
    with pytest.raises(ValueError):
        log.append(102, 5, EntryKind.DATA, bytes(SEG))  # larger than a segment
    log.close()


def test_reopen_gives_the_same_entries(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    positions = fill(log, 300)
    log.flush()
    log.close()
    again = open_log(tmp_path)
    assert again.recovery.entries == 300 and again.recovery.cut_at is None
    check_entries(again, 1, 300)
    assert [again.position_of(i) for i in range(1, 301)] == positions
    assert len(segment_files(tmp_path)) > 3
    assert again.append(301, 2, EntryKind.NOOP, b"") == again.write_position - HEADER_SIZE
    again.close()


def test_positions_are_identical_on_independent_replicas(tmp_path: Path) -> None:
    for name in ("a", "b"):
        log = open_log(tmp_path / name)
        fill(log, 250)
        log.close()
    a, b = segment_files(tmp_path / "a"), segment_files(tmp_path / "b")
    assert [p.name for p in a] == [p.name for p in b]
    assert len(a) > 2 and all(pa.read_bytes() == pb.read_bytes() for pa, pb in zip(a, b,
                                                                                  strict=True))
    assert [p.name for p in a][:2] == [segment_name(0), segment_name(SEG)]


def test_recovery_reads_only_headers_of_older_segments(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path)
    fill(log, 200)
    log.close()
    reads: list[tuple[int, int]] = []
    original = SegmentedFile.read_available

    def spy(self: SegmentedFile, position: int, size: int) -> bytes:
        reads.append((position, size))
        return original(self, position, size)

    monkeypatch.setattr(SegmentedFile, "read_available", spy)
    again = open_log(tmp_path)
    last_start = again.segments()[-1].start
    older = [r for r in reads if r[0] < last_start]
    in_older = sum(1 for i in range(1, 201) if again.position_of(i) < last_start)
    blanks = len(again.segments()) - 1  # at most one blank header per older segment
    assert in_older <= len(older) <= in_older + blanks
    assert all(size == HEADER_SIZE for _, size in older)
    assert len(reads) - len(older) <= 2  # the last segment is read in chunks
    again.close()


def _last_record_layout(tmp_path: Path, n: int) -> tuple[Path, int, int]:
    log = open_log(tmp_path)
    fill(log, n)
    position, size = log.position_of(n), log.record_size_of(n)
    log.close()
    last = segment_files(tmp_path)[-1]
    return last, position - int(last.name), size


# body(27) is 45 bytes: header 0-31, body 32-76, padding 77-79
@pytest.mark.parametrize("n", [27, 28])
@pytest.mark.parametrize("keep", [1, 7, 8, 31, 32, 40, 76, 77, 78, -1])
def test_torn_tail_cuts_only_the_last_entry(tmp_path: Path, n: int, keep: int) -> None:
    last_file, offset, size = _last_record_layout(tmp_path, n)
    keep = size + keep if keep < 0 else min(keep, size - 1)
    os.truncate(last_file, offset + keep)
    log = open_log(tmp_path)
    check_entries(log, 1, n - 1)
    position = int(last_file.name) + offset
    assert (log.recovery.entries, log.recovery.cut_at, log.recovery.cut_bytes) == (
        n - 1, position, keep)
    assert log.write_position == position
    assert log.append(n, 1, EntryKind.DATA, body(n)) == position
    log.close()
    check_entries(open_log(tmp_path), 1, n)


def test_torn_first_record_of_the_last_segment(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 200)
    n = log.index_at_position(log.segments()[-1].start)
    assert n is not None
    log.close()
    last_file = segment_files(tmp_path)[-1]
    os.truncate(last_file, 10)
    log = open_log(tmp_path)
    check_entries(log, 1, n - 1)
    assert log.recovery.cut_at == log.write_position == int(last_file.name)
    log.close()


@pytest.mark.parametrize("garbage", [bytes(64), b"\xd1\xed\x6e\x01" + bytes(60), os.urandom(50)])
def test_garbage_after_the_last_record_is_cut(tmp_path: Path, garbage: bytes) -> None:
    log = open_log(tmp_path)
    fill(log, 30)
    end = log.write_position
    log.close()
    with segment_files(tmp_path)[-1].open("ab") as f:
        f.write(garbage)
    log = open_log(tmp_path)
    check_entries(log, 1, 30)
    assert (log.recovery.cut_at, log.recovery.cut_bytes) == (end, len(garbage))
    log.close()


def test_bad_crc_of_the_last_record_is_cut(tmp_path: Path) -> None:
    last_file, offset, _ = _last_record_layout(tmp_path, 40)
    patch_file(last_file, offset + HEADER_SIZE + 2, b"#")
    log = open_log(tmp_path)
    check_entries(log, 1, 39)
    assert log.recovery.cut_at == int(last_file.name) + offset
    log.close()


TERM_FIELD = 16  # the term's 8 bytes in an entry header (dledger.storage.entry_format)


@pytest.mark.parametrize(("field", "data", "why"), [
    (HEADER_SIZE, b"#", "CRC mismatch"),  # a body byte
    (TERM_FIELD, b"\xff" + bytes(7), "out of range"),  # a term beyond 2**63
    (TERM_FIELD, (3).to_bytes(8, "big"), "CRC mismatch"),  # a plausible term: under the CRC
], ids=["body", "term-out-of-range", "term-plausible"])
def test_damage_mid_last_segment_refuses_then_repairs(tmp_path: Path, field: int, data: bytes,
                                                      why: str) -> None:
    """A damaged record followed by valid ones is found on open and cut by repair -- a
    flipped byte in a header's term too, never an OverflowError nor a wrong term kept (a
    chaos run's --repair-log start died on ``OverflowError: int too big to convert``)."""
    log = open_log(tmp_path)
    fill(log, 40)
    victim = log.index_at_position(log.segments()[-1].start)
    assert victim is not None and victim + 3 < 40
    position = log.position_of(victim + 2)
    log.close()
    last_file = segment_files(tmp_path)[-1]
    offset = position - int(last_file.name)
    patch_file(last_file, offset + field, data)
    with pytest.raises(CorruptLogError) as err:
        open_log(tmp_path)
    message = str(err.value)
    assert last_file.name in message and f"offset {offset}" in message
    assert why in message and "repair" in message and "peers" in message
    log = open_log(tmp_path, repair=True)
    check_entries(log, 1, victim + 1)
    assert log.recovery.cut_at == position
    log.close()


def test_a_flipped_padding_byte_mid_log_refuses_then_repairs(tmp_path: Path) -> None:
    """The zero bytes after a body are part of the record: a flipped one is damage found
    on open and cut by repair, as a body byte is (a chaos run flipped one at a random
    position: the repair found nothing, the replica kept its log and voted)."""
    log = open_log(tmp_path)
    fill(log, 40)
    first = log.index_at_position(log.segments()[-1].start)
    assert first is not None
    victim = next(i for i in range(first + 2, 37) if len(body(i)) % 8)
    position = log.position_of(victim)
    pad_at = position + HEADER_SIZE + len(body(victim))
    log.close()
    last_file = segment_files(tmp_path)[-1]
    patch_file(last_file, pad_at - int(last_file.name), b"\xff")
    with pytest.raises(CorruptLogError) as err:
        open_log(tmp_path)
    assert "padding" in str(err.value)
    log = open_log(tmp_path, repair=True)
    check_entries(log, 1, victim - 1)
    assert log.recovery.cut_at == position
    log.close()


def _older_segment_victim(tmp_path: Path) -> tuple[Path, int, int]:
    """200 entries; returns (first segment file, offset, index) of a middle record in it."""
    log = open_log(tmp_path)
    fill(log, 200)
    boundary = log.index_at_position(SEG)
    assert boundary is not None and len(log.segments()) > 3
    victim = boundary // 2
    offset = log.position_of(victim)
    log.close()
    return tmp_path / segment_name(0), offset, victim


def test_corrupt_header_in_an_older_segment_refuses_then_repairs(tmp_path: Path) -> None:
    first, offset, victim = _older_segment_victim(tmp_path)
    patch_file(first, offset + 8, (999_999).to_bytes(8, "big"))  # the index field
    with pytest.raises(CorruptLogError) as err:
        open_log(tmp_path)
    message = str(err.value)
    assert str(first) in message and f"offset {offset}" in message
    assert f"where {victim} was expected" in message
    assert "not a torn tail" in message and "repair" in message
    log = open_log(tmp_path, repair=True)
    check_entries(log, 1, victim - 1)
    assert log.recovery.cut_at == offset == log.write_position
    assert segment_files(tmp_path) == [first]
    assert log.append(victim, 2, EntryKind.DATA, body(victim)) == offset
    log.close()


def test_out_of_range_term_in_an_older_segment_refuses_then_repairs(tmp_path: Path) -> None:
    first, offset, victim = _older_segment_victim(tmp_path)
    patch_file(first, offset + TERM_FIELD, b"\x80" + bytes(7))  # headers only are scanned here
    with pytest.raises(CorruptLogError) as err:
        open_log(tmp_path)
    assert f"offset {offset}" in str(err.value) and "term" in str(err.value)
    log = open_log(tmp_path, repair=True)
    check_entries(log, 1, victim - 1)
    assert log.recovery.cut_at == offset
    log.close()


def test_plausible_term_in_an_older_segment_is_found_when_read(tmp_path: Path) -> None:
    first, offset, victim = _older_segment_victim(tmp_path)
    patch_file(first, offset + TERM_FIELD, (1).to_bytes(8, "big")[:-1] + b"\x02")
    log = open_log(tmp_path)  # headers only: the header's own checksum is read with the body
    with pytest.raises(CorruptLogError, match="CRC mismatch"):
        log.entry(victim)
    log.close()
    log = open_log(tmp_path, repair=True)
    check_entries(log, 1, victim - 1)
    assert log.recovery.cut_at == offset
    log.close()


def test_corrupt_body_in_an_older_segment(tmp_path: Path) -> None:
    first, offset, victim = _older_segment_victim(tmp_path)
    patch_file(first, offset + HEADER_SIZE + 1, b"#")
    log = open_log(tmp_path)  # headers only: found when read
    assert log.last_index == 200 and log.recovery.cut_at is None
    for read in (lambda: log.entry(victim), lambda: log.entries(victim - 1, 1 << 20)):
        with pytest.raises(CorruptLogError) as err:
            read()
        message = str(err.value)
        assert str(first) in message and f"offset {offset}" in message
        assert "CRC mismatch" in message and "repair" in message
    log.close()
    log = open_log(tmp_path, repair=True)  # repair verifies every CRC and cuts there
    check_entries(log, 1, victim - 1)
    assert log.recovery.cut_at == offset
    log.close()


def _first_rolled_boundary(log: CommitLog) -> tuple[int, int]:
    """(index of the first entry of a segment preceded by a blank, position of that blank)."""
    for info in log.segments()[1:]:
        index = log.index_at_position(info.start)
        assert index is not None
        blank_at = log.position_of(index - 1) + log.record_size_of(index - 1)
        if blank_at < info.start:
            return index, blank_at
    raise AssertionError("no segment ends with a blank record")


def test_corrupt_blank_in_an_older_segment_is_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    fill(log, 200)
    _, blank_at = _first_rolled_boundary(log)
    log.close()
    start = blank_at - blank_at % SEG
    patch_file(tmp_path / segment_name(start), blank_at - start, b"\xff\xff\xff\xff")
    with pytest.raises(CorruptLogError, match=f"offset {blank_at - start}.*bad magic"):
        open_log(tmp_path)


def test_torn_segment_roll_is_redone_identically(tmp_path: Path) -> None:
    reference = open_log(tmp_path / "ref")
    fill(reference, 200)
    rolled, blank_at = _first_rolled_boundary(reference)
    reference.truncate_from(rolled + 1)
    reference.close()
    log = open_log(tmp_path / "torn")
    fill(log, rolled - 1)
    assert log.write_position == blank_at
    log.close()
    with segment_files(tmp_path / "torn")[-1].open("ab") as f:
        f.write(encode_blank(SEG - blank_at % SEG))  # blank written, not extended: crash
    log = open_log(tmp_path / "torn")
    check_entries(log, 1, rolled - 1)
    assert log.recovery.cut_at == blank_at
    log.append(rolled, 1, EntryKind.DATA, body(rolled))
    log.close()
    ref, torn = segment_files(tmp_path / "ref"), segment_files(tmp_path / "torn")
    assert [p.name for p in ref] == [p.name for p in torn]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(ref, torn, strict=True))


def test_truncate_from_then_append_again(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    positions = fill(log, 120)
    log.truncate_from(121)  # past the end: no-op
    log.truncate_from(50)
    assert (log.last_index, log.write_position) == (49, positions[49])
    assert log.index_at_position(positions[49]) is None
    assert log.append(50, 2, EntryKind.RAFT, b"new") == positions[49]
    assert log.last_term == 2
    log.flush()
    log.close()
    log = open_log(tmp_path)
    assert log.last_index == 50 and log.entry(50).body == b"new"
    assert all(log.entry(i).body == body(i) for i in range(1, 50))
    log.truncate_from(1)
    assert (len(log), log.first_index, log.last_index) == (0, 0, 0)
    assert log.append(7, 3, EntryKind.NOOP, b"") == 0
    log.close()

def test_truncating_an_entry_that_rolled_the_segment_also_drops_the_blank_before_it(
        tmp_path: Path) -> None:
    """Found by the soak: a leader's entry too large for its segment's rest went to the
    next segment behind a blank; a new leader's conflict truncated it, and the next
    (small) entry landed after the blank instead of where the peers put it: every
    later position, and every ConsumeQueue unit, differed from the peers'."""
    peer, replica = open_log(tmp_path / "peer"), open_log(tmp_path / "replica")
    fill(peer, 30)
    fill(replica, 30)
    room = SEG - peer.write_position % SEG
    big = b"x" * room  # its record (header + body) does not fit in the room left
    assert replica.append(31, 1, EntryKind.DATA, big) == peer.write_position + room  # rolled
    replica.truncate_from(31)  # the conflict: entry 31 of term 1 is replaced by term 2's
    assert replica.write_position == peer.write_position
    for log in (peer, replica):
        log.append(31, 2, EntryKind.NOOP, b"")
        log.append(32, 2, EntryKind.DATA, body(32))
    assert [replica.position_of(i) for i in (31, 32)] == [peer.position_of(i) for i in (31, 32)]
    replica.flush()
    replica.close()
    replica = open_log(tmp_path / "replica")  # and recovery sees a well-formed log
    assert replica.entry(32).body == body(32)
    assert replica.write_position == peer.write_position
    peer.close()
    replica.close()



def test_entries_limits_and_one_read_per_segment(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log = open_log(tmp_path)
    fill(log, 200)
    boundary = log.index_at_position(SEG)
    assert boundary is not None
    reads: list[int] = []
    original = SegmentedFile.read

    def spy(self: SegmentedFile, position: int, size: int) -> bytes:
        reads.append(position)
        return original(self, position, size)

    monkeypatch.setattr(SegmentedFile, "read", spy)
    got = log.entries(boundary - 5, 1 << 20, upto_index=boundary + 5)
    assert [e.index for e in got] == list(range(boundary - 5, boundary + 6))
    assert all(e.body == body(e.index) and e.position == log.position_of(e.index) for e in got)
    assert reads[0] == log.position_of(boundary - 5) and len(reads) <= 2  # one per segment
    limit = sum(len(body(i)) for i in range(boundary - 5, boundary + 2))
    got = log.entries(boundary - 5, limit)
    assert [e.index for e in got] == list(range(boundary - 5, boundary + 2))
    assert [e.index for e in log.entries(boundary - 5, limit - 1)][-1] == boundary
    assert [e.index for e in log.entries(3, 0)] == [3]  # at least one
    assert log.entries(201, 1 << 20) == [] and log.entries(5, 1 << 20, upto_index=4) == []
    assert [e.index for e in log.entries(198, 1 << 20)] == [198, 199, 200]
    log.close()


def test_index_at_position(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    positions = fill(log, 100)
    assert all(log.index_at_position(p) == i for i, p in enumerate(positions, 1))
    assert log.index_at_position(positions[3] + 8) is None
    assert log.index_at_position(log.write_position) is None
    log.close()


def test_delete_before_keeps_positions(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    positions = fill(log, 200)
    starts = [s.start for s in log.segments()]
    second = log.index_at_position(starts[1])
    third = log.index_at_position(starts[2])
    assert second is not None and third is not None
    assert log.delete_before(1) == 0
    assert log.delete_before(third - 1) == second - 1  # only the first segment is all < index
    assert log.first_index == second and log.start_position == starts[1]
    assert log.delete_before(third) == third - second
    assert log.first_index == third
    check_entries(log, third, 200)
    assert [log.position_of(i) for i in range(third, 201)] == positions[third - 1:]
    with pytest.raises(IndexError):
        log.entries(second, 100)
    with pytest.raises(IndexError):
        log.truncate_from(second)
    assert log.delete_before(10_000) > 0  # everything but the last segment
    assert [s.start for s in log.segments()] == starts[-1:] and log.last_index == 200
    first = log.first_index
    log.append(201, 1, EntryKind.DATA, body(201))
    log.close()
    log = open_log(tmp_path)
    check_entries(log, first, 201)
    assert log.position_of(201) == log.write_position - record_size(len(body(201)))
    log.close()


def test_concurrent_append_flush_and_read(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, segment_size=1 << 16)
    n = 2000
    deadline = time.monotonic() + 20
    errors: list[BaseException] = []
    done = threading.Event()
    read_upto: list[int] = []
    flushes: list[int] = []

    def writer() -> None:
        try:
            for i in range(1, n + 1):
                log.append(i, 1 + i // 500, EntryKind.DATA, body(i))
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    def flusher() -> None:
        count = 0
        try:
            while not done.is_set() and time.monotonic() < deadline:
                count += log.flush()
            count += log.flush()
        except BaseException as e:
            errors.append(e)
        flushes.append(count)

    def reader() -> None:
        nxt = 1
        try:
            while nxt <= n and time.monotonic() < deadline:
                for e in log.entries(nxt, 4096):
                    assert (e.index, e.body, e.term) == (nxt, body(nxt), 1 + nxt // 500)
                    nxt += 1
        except BaseException as e:
            errors.append(e)
        read_upto.append(nxt - 1)

    threads = [threading.Thread(target=t, daemon=True) for t in (writer, flusher, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 1)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert read_upto == [n] and flushes[0] >= 1
    assert not log.dirty and log.last_index == n and len(log.segments()) > 1
    log.close()
