"""SegmentedFile: rolling with blank padding, names, reads, truncation, flush, retention."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from dledger.storage import numbered_files as numbered_files_module
from dledger.storage import segments as segments_module
from dledger.storage.entry_format import MAGIC_BLANK, decode_header
from dledger.storage.segments import CorruptLogError, SegmentedFile, segment_name

SEG = 4096


@pytest.fixture
def files(tmp_path: Path) -> Iterator[SegmentedFile]:
    f = SegmentedFile(tmp_path / "log", SEG)
    yield f
    f.close()


def rec(n: int, fill: int = 0x41) -> bytes:
    return bytes([fill]) * n


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_new_directory_has_one_empty_segment(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path / "a" / "b", SEG)
    assert names(tmp_path / "a" / "b") == ["00000000000000000000"]
    assert f.write_position == f.start_position == 0
    assert segment_name(1 << 30) == "00000000001073741824"
    f.close()


def test_append_rolls_with_blank_padding(files: SegmentedFile) -> None:
    assert files.append(rec(4000)) == 0
    assert files.append(rec(200, 0x42)) == SEG  # 96 bytes left: blank, then next segment
    assert names(files.directory) == ["00000000000000000000", "00000000000000004096"]
    first = files.directory / "00000000000000000000"
    assert first.stat().st_size == SEG
    tail = first.read_bytes()[4000:]
    header = decode_header(tail)
    assert header.magic == MAGIC_BLANK and header.size == 96
    assert tail[8:] == bytes(88)
    assert files.read(SEG, 200) == rec(200, 0x42)
    assert files.write_position == SEG + 200


def test_exact_fit_rolls_without_blank(files: SegmentedFile) -> None:
    files.append(rec(SEG - 8))
    files.append(rec(8))
    assert files.append(rec(8)) == SEG
    assert (files.directory / segment_name(0)).read_bytes() == rec(SEG - 8) + rec(8)


def test_bad_records_rejected(files: SegmentedFile) -> None:
    for bad in (b"", rec(12), rec(SEG + 8)):
        with pytest.raises(ValueError):
            files.append(bad)
    assert files.append(rec(SEG)) == 0  # a whole segment is fine


def test_read_bounds(files: SegmentedFile) -> None:
    files.append(rec(64))
    assert files.read(8, 16) == rec(16)
    for position, size in ((60, 8), (-8, 8), (0, 72)):
        with pytest.raises(ValueError):
            files.read(position, size)


def test_reopen_keeps_positions(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path, SEG)
    for _ in range(5):
        f.append(rec(1000))
    end = f.write_position
    f.close()
    g = SegmentedFile(tmp_path, SEG)
    assert g.write_position == end == SEG + 1000
    assert g.append(rec(8)) == end
    g.close()


def test_non_contiguous_segments_are_refused(tmp_path: Path) -> None:
    (tmp_path / segment_name(0)).write_bytes(b"")
    (tmp_path / segment_name(2 * SEG)).write_bytes(b"")
    with pytest.raises(CorruptLogError, match="00000000000000008192"):
        SegmentedFile(tmp_path, SEG)
    with pytest.raises(CorruptLogError, match="multiple of the segment size"):
        SegmentedFile(tmp_path, 3000)


def test_oversized_segment_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / segment_name(0)).write_bytes(bytes(SEG + 8))
    with pytest.raises(CorruptLogError, match="more than the segment size"):
        SegmentedFile(tmp_path, SEG)


def test_truncate_across_segments(files: SegmentedFile) -> None:
    positions = [files.append(rec(1000, i)) for i in range(10)]
    files.flush()
    files.truncate(positions[3])
    assert files.dirty
    assert names(files.directory) == [segment_name(0)]
    assert files.write_position == positions[3] == 3000
    assert files.append(rec(1000, 0x99)) == 3000
    assert files.read(3000, 1000) == rec(1000, 0x99)
    files.truncate(files.write_position)  # no-op
    with pytest.raises(ValueError):
        files.truncate(files.write_position + 8)


def test_truncate_at_segment_start_keeps_an_empty_segment(files: SegmentedFile) -> None:
    files.append(rec(4000))
    files.append(rec(200))
    files.truncate(SEG)
    assert files.write_position == SEG
    assert (files.directory / segment_name(SEG)).stat().st_size == 0
    assert files.append(rec(8)) == SEG


def test_flush_syncs_written_files_and_directory(files: SegmentedFile,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    dirs: list[Path] = []
    monkeypatch.setattr(segments_module.os, "fsync", lambda fd: synced.append(fd))
    monkeypatch.setattr(numbered_files_module, "fsync_directory", lambda d: dirs.append(d))
    assert files.dirty and files.flush()  # the new segment's directory entry
    assert dirs == [files.directory]
    assert not files.dirty and not files.flush()
    files.append(rec(8))
    synced.clear()
    dirs.clear()
    assert files.flush()
    assert len(synced) == 1 and dirs == []
    files.append(rec(4096))  # rolls: old + new segment and the directory
    synced.clear()
    assert files.flush()
    assert len(synced) == 2 and dirs == [files.directory]


def test_failed_fsync_keeps_files_dirty(files: SegmentedFile,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    files.flush()
    files.append(rec(8))

    def boom(fd: int) -> None:
        raise OSError(5, "EIO")

    monkeypatch.setattr(segments_module.os, "fsync", boom)
    with pytest.raises(OSError):
        files.flush()
    assert files.dirty


@pytest.mark.parametrize(("code", "sticky"), [(errno.EIO, True), (errno.ENOSPC, False)])
def test_a_failed_fsync_is_tried_again_only_when_it_was_for_want_of_space(
        files: SegmentedFile, monkeypatch: pytest.MonkeyPatch, code: int, sticky: bool) -> None:
    """Review finding: after EIO the kernel may have dropped the pages and reports the error
    once, so a retried fsync could succeed for data never on disk; the log must not take it
    as durable. Disk full (ENOSPC, EDQUOT) keeps the pages: trying again is right."""
    files.append(rec(8))
    real_fsync = os.fsync

    def fails(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fails)
    with pytest.raises(OSError):
        files.flush()
    monkeypatch.setattr(os, "fsync", real_fsync)  # the next fsync would report success
    if sticky:
        with pytest.raises(OSError, match=r"failed earlier.*restart the node") as raised:
            files.flush()
        assert raised.value.errno == errno.EIO
        files.append(rec(8))  # still written; never taken as durable
        with pytest.raises(OSError, match="failed earlier"):
            files.flush()
    else:
        assert files.flush() is True and not files.dirty


def test_delete_segments_before_never_deletes_the_last(files: SegmentedFile) -> None:
    for _ in range(12):
        files.append(rec(1000))  # 4 per segment: segments 0, 4096, 8192
    assert [s.start for s in files.segments()] == [0, SEG, 2 * SEG]
    assert files.delete_segments_before(SEG + 10) == [0]
    assert files.start_position == SEG
    with pytest.raises(ValueError):
        files.read(0, 8)
    assert files.delete_segments_before(1 << 40) == [SEG]
    assert [s.start for s in files.segments()] == [2 * SEG]
    assert files.read(2 * SEG, 1000) == rec(1000)


def test_segments_info(files: SegmentedFile) -> None:
    files.append(rec(4088))  # 8 bytes left: the smallest blank
    files.append(rec(16))
    infos = files.segments()
    assert [(i.start, i.path.name, i.size_on_disk) for i in infos] == [
        (0, segment_name(0), SEG), (SEG, segment_name(SEG), 16)]
    assert all(i.mtime > 0 for i in infos)


def test_read_available_is_short_at_end_of_file(files: SegmentedFile) -> None:
    files.append(rec(16))
    assert files.read_available(8, 32) == rec(8)
    assert files.read_available(16, 32) == b""
    assert files.locate(SEG + 24) == (files.directory / segment_name(SEG), 24)


def test_closed(tmp_path: Path) -> None:
    f = SegmentedFile(tmp_path, SEG)
    f.close()
    f.close()
    with pytest.raises(ValueError):
        f.append(rec(8))
    assert f.write_position == 0
    assert not any(os.path.basename(p).startswith(".") for p in os.listdir(tmp_path))


def test_reset_restarts_at_a_position_with_a_hole(files: SegmentedFile) -> None:
    for _ in range(6):
        files.append(rec(1000))
    start = 2 * SEG + 1000
    files.reset(start)
    assert names(files.directory) == [segment_name(2 * SEG)]
    assert (files.directory / segment_name(2 * SEG)).stat().st_size == 1000
    assert files.write_position == files.start_position == start
    assert not files.dirty  # durable when reset returns
    assert files.append(rec(3000)) == start
    assert files.append(rec(200)) == 3 * SEG  # 96 bytes left: rolls as with full history
    assert files.read(start, 8) == rec(8)
    for position in (2 * SEG, start - 8):
        with pytest.raises(ValueError):
            files.read(position, 8)
    with pytest.raises(ValueError):
        files.truncate(start - 8)
    files.truncate(start)
    assert names(files.directory) == [segment_name(2 * SEG)]
    assert files.write_position == start
    for bad in (-8, 12):
        with pytest.raises(ValueError):
            files.reset(bad)


def test_open_with_a_start_position(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        SegmentedFile(tmp_path, SEG, 4)
    with pytest.raises(ValueError):
        SegmentedFile(tmp_path, SEG, discard_existing=True)
    f = SegmentedFile(tmp_path, SEG, SEG + 64)  # no segment yet: created with the hole
    assert names(tmp_path) == [segment_name(SEG)]
    assert f.write_position == f.start_position == SEG + 64
    f.append(rec(4000))
    f.append(rec(4000))
    f.close()
    g = SegmentedFile(tmp_path, SEG, SEG + 64)
    assert g.start_position == SEG + 64 and g.write_position == 2 * SEG + 4000
    g.delete_segments_before(1 << 40)
    assert g.start_position == 2 * SEG
    g.close()
    g = SegmentedFile(tmp_path, SEG, SEG + 64)  # below the first segment: ignored
    assert g.start_position == 2 * SEG
    g.close()
    with pytest.raises(CorruptLogError, match="past the first segment"):
        SegmentedFile(tmp_path, SEG, 3 * SEG)
    os.truncate(tmp_path / segment_name(2 * SEG), 0)
    g = SegmentedFile(tmp_path, SEG, 2 * SEG + 24)  # a short only segment is extended
    assert g.write_position == 2 * SEG + 24
    g.close()


def test_open_discarding_existing_segments(tmp_path: Path) -> None:
    for start in (0, SEG, 3 * SEG):  # not contiguous: only discard_existing can open this
        (tmp_path / segment_name(start)).write_bytes(rec(64))
    (tmp_path / "LOG_START").write_bytes(b"kept")
    f = SegmentedFile(tmp_path, SEG, 5 * SEG + 16, discard_existing=True)
    assert names(tmp_path) == [segment_name(5 * SEG), "LOG_START"]
    assert f.write_position == 5 * SEG + 16 and not f.dirty
    f.close()
