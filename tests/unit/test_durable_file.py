"""atomic_write / read_or_none: replace, fsync order, failure leaves the old content."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common import durable_file
from common.durable_file import atomic_write, read_or_none


def test_write_read_replace(tmp_path: Path) -> None:
    path = tmp_path / "raft-state"
    assert read_or_none(path) is None
    atomic_write(path, b"one")
    assert read_or_none(path) == b"one"
    atomic_write(path, b"")
    assert read_or_none(path) == b""
    atomic_write(path, b"two" * 10_000)
    assert path.read_bytes() == b"two" * 10_000
    assert os.listdir(tmp_path) == ["raft-state"]  # no temp files left


def test_file_then_rename_then_directory_are_synced(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def replace(src: str | Path, dst: str | Path) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(durable_file.os, "fsync", fsync)
    monkeypatch.setattr(durable_file.os, "replace", replace)
    atomic_write(tmp_path / "f", b"data")
    assert events == ["fsync-file", "replace", "fsync-dir"]


def test_failed_write_keeps_the_old_content(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "state"
    atomic_write(path, b"old")

    def boom(fd: int) -> None:
        raise OSError(28, "ENOSPC")

    monkeypatch.setattr(durable_file.os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write(path, b"new")
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state"]


def test_read_or_none_raises_other_errors(tmp_path: Path) -> None:
    with pytest.raises(IsADirectoryError):
        read_or_none(tmp_path)
