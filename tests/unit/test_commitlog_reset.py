"""CommitLog.reset: restart at the leader's retained start, same positions, crash states."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.durable_file import atomic_write
from dledger.storage import commitlog as commitlog_module
from dledger.storage import segments as segments_module
from dledger.storage.commitlog import CommitLog, CorruptLogError
from dledger.storage.entry_format import HEADER_SIZE, EntryKind, FormatError, record_size
from dledger.storage.log_start_marker import (
    MAGIC_START,
    START_MARKER,
    StartMarker,
    decode_start_marker,
    encode_start_marker,
)
from dledger.storage.segments import segment_name

SEG = 4096
RESET_AT = 23
N = 60


def kind(i: int) -> EntryKind:
    return EntryKind(i % 3)


def term(i: int) -> int:
    return 1 + i // 20


def body(i: int) -> bytes:
    """Varied lengths (0..1299, so varied padding and blank records), distinct per index."""
    if kind(i) == EntryKind.NOOP:
        return b""
    return (f"[{i}]".encode() * 400)[:(i * 397) % 1300]


def open_log(path: Path, repair: bool = False) -> CommitLog:
    return CommitLog(path, segment_size=SEG, repair=repair)


def fill(log: CommitLog, first: int, last: int) -> list[int]:
    return [log.append(i, term(i), kind(i), body(i)) for i in range(first, last + 1)]


def segment_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.isdigit())


def check_entries(log: CommitLog, first: int, last: int) -> None:
    assert (log.first_index, log.last_index, len(log)) == (first, last, last - first + 1)
    for e in log.entries(first, 1 << 30):
        assert (e.term, e.kind, e.body) == (term(e.index), kind(e.index), body(e.index))
    assert [e.index for e in log.entries(first, 1 << 30)] == list(range(first, last + 1))


def marker(path: Path) -> StartMarker | None:
    data = (path / START_MARKER).read_bytes() if (path / START_MARKER).exists() else None
    return None if data is None else decode_start_marker(data)


def check_empty_at(log: CommitLog, index: int, position: int, *, then_append: bool = False) -> None:
    """``log`` is empty and takes only entry ``index``, at ``position`` (appended if ``then_append``)."""
    assert (len(log), log.first_index, log.last_index, log.last_term) == (0, 0, 0, 0)
    assert log.write_position == log.start_position == position
    for bad in (index - 1, index + 1, 1):
        if bad >= 1:
            with pytest.raises(ValueError, match=f"expected {index}"):
                log.append(bad, term(bad), kind(bad), body(bad))
    if then_append:
        assert log.append(index, term(index), kind(index), body(index)) == position


@dataclass(frozen=True)
class Leader:
    """Log A: entries 1..N over several segments, in ``path``."""

    path: Path
    positions: list[int]

    @property
    def start(self) -> int:
        """The position of entry RESET_AT, where a reset follower restarts."""
        return self.positions[RESET_AT - 1]

    @property
    def reset_segment(self) -> str:
        """The name of the segment holding ``start``."""
        return segment_name(self.start - self.start % SEG)


@pytest.fixture
def leader(tmp_path: Path) -> Leader:
    a = open_log(tmp_path / "a")
    positions = fill(a, 1, N)
    a.flush()
    a.close()
    return Leader(tmp_path / "a", positions)


def reset_follower(path: Path, positions: list[int], upto: int | None = None) -> CommitLog:
    """Log B: some old entries of its own, then reset to A's entry RESET_AT, then A's entries."""
    b = open_log(path)
    b.append(1, 1, EntryKind.NOOP, b"")
    b.append(2, 1, EntryKind.DATA, b"old entry this follower had" * 9)
    b.reset(RESET_AT, positions[RESET_AT - 1])
    if upto is not None:
        fill(b, RESET_AT, upto)
    return b


# -- 1. same positions and bytes as the leader --------------------------------------------
def test_reset_follower_matches_the_leader_byte_for_byte(tmp_path: Path,
                                                         leader: Leader) -> None:
    a_dir, positions = leader.path, leader.positions
    start = leader.start
    assert start % SEG != 0  # not at a segment start: the reset segment has a hole
    a_files = segment_files(a_dir)
    assert len(a_files) >= 5
    ends = [positions[i] + record_size(len(body(i + 1))) for i in range(N)]
    gaps = [(end, nxt) for end, nxt in zip(ends, positions[1:], strict=False) if end < nxt]
    assert len(gaps) >= 3  # several segments end with a blank record
    assert all(nxt % SEG == 0 and end // SEG == nxt // SEG - 1 for end, nxt in gaps)

    b = open_log(tmp_path / "b")
    fill(b, 1, 5)
    b.reset(RESET_AT, start)
    check_empty_at(b, RESET_AT, start)
    assert [p.name for p in segment_files(tmp_path / "b")] == [leader.reset_segment]
    assert marker(tmp_path / "b") == StartMarker(RESET_AT, start, True)
    assert b.append(RESET_AT, term(RESET_AT), kind(RESET_AT), body(RESET_AT)) == start
    assert fill(b, RESET_AT + 1, N) == positions[RESET_AT:]
    check_entries(b, RESET_AT, N)
    assert b.position_of(RESET_AT) == b.start_position == start
    b.flush()
    b.close()

    b_files = segment_files(tmp_path / "b")
    first_seg = start - start % SEG
    assert [p.name for p in b_files] == [p.name for p in a_files if int(p.name) >= first_seg]
    for path in b_files:
        seg_start = int(path.name)
        lo = max(seg_start, start) - seg_start
        a_bytes, b_bytes = (a_dir / path.name).read_bytes(), path.read_bytes()
        assert len(b_bytes) == len(a_bytes)
        assert b_bytes[lo:] == a_bytes[lo:]


# -- 2. reopen -------------------------------------------------------------------------
def test_reopen_after_reset_keeps_entries_and_positions(tmp_path: Path,
                                                        leader: Leader) -> None:
    a_dir, positions = leader.path, leader.positions
    b = reset_follower(tmp_path / "b", positions, upto=N)
    b.flush()
    b.close()
    b = open_log(tmp_path / "b")
    assert b.recovery.cut_at is None and not b.recovery.finished_reset
    check_entries(b, RESET_AT, N)
    assert [b.position_of(i) for i in range(RESET_AT, N + 1)] == positions[RESET_AT - 1:]
    assert b.start_position == leader.start
    a = open_log(a_dir)
    assert a.append(N + 1, 9, EntryKind.DATA, b"next") == b.append(N + 1, 9, EntryKind.DATA,
                                                                  b"next")
    a.close()
    b.close()


# -- 3. crash states -------------------------------------------------------------------
def _old_log(path: Path, positions: list[int], upto: int) -> None:
    """A follower log holding entries 1..upto, the last few from a deposed leader's term."""
    log = open_log(path)
    fill(log, 1, min(upto, RESET_AT - 3))
    for i in range(RESET_AT - 2, upto + 1):
        log.append(i, 0, EntryKind.DATA, b"divergent" * (i % 40))
    log.flush()
    log.close()


@pytest.mark.parametrize("state", ["all-old", "gap", "none", "new-empty", "new-short"])
def test_interrupted_reset_recovers_as_the_reset_log(tmp_path: Path,
                                                     leader: Leader,
                                                     state: str) -> None:
    """PENDING marker + whatever files a crash left: recovery finishes the reset."""
    positions = leader.positions
    path, start = tmp_path / "b", leader.start
    _old_log(path, positions, upto=RESET_AT + 20)  # old segments overlap the reset position
    old = segment_files(path)
    assert len(old) >= 4 and int(old[0].name) <= start < int(old[-1].name)
    atomic_write(path / START_MARKER, encode_start_marker(RESET_AT, start, complete=False))
    reset_file = path / leader.reset_segment
    if state == "gap":
        old[1].unlink()  # deletions persisted out of order: names are not contiguous
    elif state != "all-old":
        for p in old:
            p.unlink()
        if state == "new-empty":
            reset_file.write_bytes(b"")  # created, ftruncate not durable
        elif state == "new-short":
            reset_file.write_bytes(bytes(8))
    b = open_log(path)
    assert b.recovery.finished_reset
    check_empty_at(b, RESET_AT, start)
    assert segment_files(path) == [reset_file]
    assert marker(path) == StartMarker(RESET_AT, start, True)
    assert fill(b, RESET_AT, N) == positions[RESET_AT - 1:]
    b.close()
    b = open_log(path)
    check_entries(b, RESET_AT, N)
    b.close()


def test_complete_marker_with_no_record_yet_is_an_empty_log(tmp_path: Path,
                                                            leader: Leader) -> None:
    positions, start = leader.positions, leader.start
    reset_follower(tmp_path / "b", positions).close()
    reset_file = tmp_path / "b" / leader.reset_segment
    assert reset_file.stat().st_size == start % SEG
    b = open_log(tmp_path / "b")
    assert (b.recovery.entries, b.recovery.cut_at, b.recovery.finished_reset) == (0, None, False)
    check_empty_at(b, RESET_AT, start, then_append=True)
    b.close()


def test_failure_after_the_pending_marker_closes_then_reopen_finishes(
        tmp_path: Path, leader: Leader, monkeypatch: pytest.MonkeyPatch) -> None:
    start = leader.start
    b = open_log(tmp_path / "b")
    fill(b, 1, 40)

    def boom(directory: Path) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr(segments_module, "fsync_directory", boom)
    with pytest.raises(OSError):
        b.reset(RESET_AT, start)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="closed"):
        b.append(RESET_AT, 1, EntryKind.DATA, b"")
    assert marker(tmp_path / "b") == StartMarker(RESET_AT, start, False)
    b.close()
    b = open_log(tmp_path / "b")
    assert b.recovery.finished_reset
    check_empty_at(b, RESET_AT, start)
    b.close()


def test_failed_pending_marker_write_leaves_the_old_log(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    b = open_log(tmp_path)
    fill(b, 1, 40)

    def boom(path: Path, data: bytes) -> None:
        raise OSError(28, "ENOSPC")

    monkeypatch.setattr(commitlog_module, "atomic_write", boom)
    with pytest.raises(OSError):
        b.reset(RESET_AT, 8 * SEG + 64)
    check_entries(b, 1, 40)
    assert b.append(41, term(41), kind(41), body(41)) > 0
    assert not (tmp_path / START_MARKER).exists()
    b.close()


# -- 4. torn / corrupt first record after a reset -------------------------------------------
@pytest.mark.parametrize("keep", [1, 8, 31, 32, 40])
def test_torn_first_record_after_reset_is_cut(tmp_path: Path, leader: Leader,
                                              keep: int) -> None:
    positions, start = leader.positions, leader.start
    b = reset_follower(tmp_path / "b", positions, upto=RESET_AT)
    size = b.record_size_of(RESET_AT)
    b.flush()
    b.close()
    keep = min(keep, size - 8)
    os.truncate(tmp_path / "b" / leader.reset_segment, start % SEG + keep)
    b = open_log(tmp_path / "b")
    assert (b.recovery.entries, b.recovery.cut_at, b.recovery.cut_bytes) == (0, start, keep)
    check_empty_at(b, RESET_AT, start, then_append=True)
    b.close()


def test_corrupt_first_record_after_reset_is_corruption_not_a_reset(
        tmp_path: Path, leader: Leader) -> None:
    positions, start = leader.positions, leader.start
    reset_follower(tmp_path / "b", positions, upto=RESET_AT + 5).close()
    reset_file = tmp_path / "b" / leader.reset_segment
    with reset_file.open("r+b") as f:
        f.seek(start % SEG + 8)
        f.write((999).to_bytes(8, "big"))  # the index field of entry RESET_AT
    with pytest.raises(CorruptLogError, match=f"where {RESET_AT} was expected"):
        open_log(tmp_path / "b")
    b = open_log(tmp_path / "b", repair=True)
    assert b.recovery.cut_at == start
    check_empty_at(b, RESET_AT, start)
    b.close()


# -- 5. retention and truncation after a reset --------------------------------------------
def test_delete_before_after_reset_then_reopen(tmp_path: Path,
                                               leader: Leader) -> None:
    positions, start = leader.positions, leader.start
    b = reset_follower(tmp_path / "b", positions, upto=40)
    assert b.delete_before(RESET_AT + 1) == 0  # entry RESET_AT + 1 is in the reset segment
    assert b.start_position == start
    fill(b, 41, N)  # more segments
    starts = [s.start for s in b.segments()]
    assert len(starts) >= 4 and starts[0] == start - start % SEG
    third = b.index_at_position(starts[2])
    assert third is not None
    dropped = b.delete_before(third)
    assert b.first_index == third and dropped == third - RESET_AT
    assert b.start_position == starts[2]
    check_entries(b, third, N)
    assert [b.position_of(i) for i in range(third, N + 1)] == positions[third - 1:]
    b.flush()
    b.close()
    assert marker(tmp_path / "b") == StartMarker(RESET_AT, start, True)
    b = open_log(tmp_path / "b")  # the marker is stale now: ignored and deleted
    assert not (tmp_path / "b" / START_MARKER).exists()
    check_entries(b, third, N)
    assert b.start_position == starts[2]
    assert b.append(N + 1, 9, EntryKind.DATA, b"x") == b.write_position - HEADER_SIZE - 8
    b.close()


def test_truncate_everything_after_reset(tmp_path: Path, leader: Leader) -> None:
    positions, start = leader.positions, leader.start
    b = reset_follower(tmp_path / "b", positions, upto=N)
    assert len(b.segments()) > 2
    b.truncate_from(RESET_AT + 3)
    end = b.position_of(RESET_AT + 2) + b.record_size_of(RESET_AT + 2)  # no blank kept after it
    assert (b.last_index, b.write_position) == (RESET_AT + 2, end)
    assert fill(b, RESET_AT + 3, RESET_AT + 3) == [positions[RESET_AT + 2]]  # where the leader has it
    b.truncate_from(RESET_AT)
    check_empty_at(b, RESET_AT, start)
    assert [p.name for p in segment_files(tmp_path / "b")] == [leader.reset_segment]
    b.flush()
    b.close()
    b = open_log(tmp_path / "b")
    check_empty_at(b, RESET_AT, start)
    assert fill(b, RESET_AT, N) == positions[RESET_AT - 1:]
    b.close()


def test_reset_again_and_to_a_segment_start(tmp_path: Path) -> None:
    b = open_log(tmp_path)
    fill(b, 1, 30)
    b.reset(100, 3 * SEG)
    assert [p.name for p in segment_files(tmp_path)] == [segment_name(3 * SEG)]
    assert (tmp_path / segment_name(3 * SEG)).stat().st_size == 0
    assert b.append(100, 1, EntryKind.DATA, b"a") == 3 * SEG
    b.reset(7, 64)  # backwards works too: everything is thrown away
    check_empty_at(b, 7, 64)
    assert b.append(7, 1, EntryKind.DATA, b"b") == 64
    b.close()
    b = open_log(tmp_path)
    assert (b.first_index, b.last_index, b.position_of(7), b.start_position) == (7, 7, 64, 64)
    b.close()


# -- 6. bad arguments and markers --------------------------------------------------------
@pytest.mark.parametrize(("index", "position"),
                         [(0, 0), (-1, 8), (1, -8), (1, 12), (1, 4), (1 << 63, 0), (1, 1 << 63)])
def test_bad_reset_arguments(tmp_path: Path, index: int, position: int) -> None:
    b = open_log(tmp_path)
    fill(b, 1, 10)
    with pytest.raises(ValueError):
        b.reset(index, position)
    check_entries(b, 1, 10)
    assert not (tmp_path / START_MARKER).exists()
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.reset(1, 0)


def test_marker_encoding() -> None:
    data = encode_start_marker(RESET_AT, 12_344, complete=True)
    assert len(data) == 24 and data[:4] == MAGIC_START.to_bytes(4, "big")
    assert decode_start_marker(data) == StartMarker(RESET_AT, 12_344, True)
    pending = encode_start_marker(5, 0, complete=False)
    assert decode_start_marker(pending) == StartMarker(5, 0, False)
    for bad in (data[:-1], data[:12] + b"\x01" + data[13:], bytes(24),
                b"\xd1\xed\x57\x51" + bytes(20)):
        with pytest.raises(FormatError):
            decode_start_marker(bad)


def test_unreadable_marker_is_refused(tmp_path: Path) -> None:
    b = open_log(tmp_path)
    fill(b, 1, 3)
    b.close()
    (tmp_path / START_MARKER).write_bytes(b"garbage")
    with pytest.raises(CorruptLogError, match=START_MARKER):
        open_log(tmp_path)


def test_complete_marker_past_the_first_segment_is_refused(tmp_path: Path) -> None:
    b = open_log(tmp_path)
    fill(b, 1, 3)
    b.close()
    atomic_write(tmp_path / START_MARKER, encode_start_marker(50, 2 * SEG + 8, complete=True))
    with pytest.raises(CorruptLogError, match="past the first segment"):
        open_log(tmp_path)
