"""The Raft hard state file (``dledger/storage/hard_state.py``): two slots overwritten in turn, the
newer valid one wins, the earlier msgpack form is converted, and -- the point of it -- a
term and vote can still be saved when the disk is full."""

from __future__ import annotations

import errno
from pathlib import Path

import msgpack
import pytest

from common.durable_file import atomic_write
from dledger.storage.hard_state import (
    FILE_SIZE,
    MAX_VOTE_BYTES,
    PAGE,
    SLOT_SIZE,
    HardState,
    HardStateCorrupt,
    HardStateFile,
    decode_slot,
    encode_slot,
)
from tests.support.tmpfs import require_mount, tmpfs


def test_a_new_file_holds_nothing_and_saves_survive_reopening(tmp_path: Path) -> None:
    f = HardStateFile(tmp_path / "raft-state")
    assert f.state == HardState(0, None, 0)
    assert (tmp_path / "raft-state").stat().st_size == FILE_SIZE
    for term in range(1, 6):
        f.save(HardState(term, f"10.0.0.{term}:20001", term * 100))
    f.close()
    assert HardStateFile(tmp_path / "raft-state").state == HardState(5, "10.0.0.5:20001", 500)


def test_saves_alternate_slots_and_a_torn_newer_slot_leaves_the_state_before(tmp_path: Path) -> None:
    path = tmp_path / "raft-state"
    f = HardStateFile(path)
    f.save(HardState(3, "a:1", 0))
    f.save(HardState(4, None, 10))
    f.close()
    data = bytearray(path.read_bytes())
    slots = [decode_slot(bytes(data[at:at + SLOT_SIZE])) for at in (0, PAGE)]
    assert sorted(s[1].term for s in slots if s) == [3, 4]  # both slots in use
    newer = 0 if slots[0] and slots[0][1].term == 4 else PAGE
    data[newer + 20] ^= 0xFF  # the newer slot torn mid-write: its CRC fails
    path.write_bytes(bytes(data))
    assert HardStateFile(path).state == HardState(3, "a:1", 0)


def test_neither_slot_intact_is_refused_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "raft-state"
    path.write_bytes(bytes(FILE_SIZE))
    with pytest.raises(HardStateCorrupt, match="raft-state"):
        HardStateFile(path)


def test_the_earlier_msgpack_form_is_read_and_converted(tmp_path: Path) -> None:
    path = tmp_path / "raft-state"
    atomic_write(path, msgpack.packb({"term": 9, "voted_for": "127.0.0.1:20002", "commit": 77}))
    f = HardStateFile(path)
    assert f.state == HardState(9, "127.0.0.1:20002", 77)
    f.close()
    assert path.stat().st_size == FILE_SIZE
    assert HardStateFile(path).state == HardState(9, "127.0.0.1:20002", 77)


def test_a_vote_longer_than_a_slot_holds_is_refused() -> None:
    encode_slot(1, HardState(1, "x" * MAX_VOTE_BYTES, 0))
    with pytest.raises(ValueError):
        encode_slot(1, HardState(1, "x" * (MAX_VOTE_BYTES + 1), 0))


def test_a_term_and_vote_are_saved_on_a_full_disk(tmp_path: Path) -> None:
    """Where a file replaced whole cannot be written any more, the slots still can."""
    require_mount()
    with tmpfs(tmp_path / "disk", 256 << 10) as disk:
        f = HardStateFile(disk.path / "raft-state")
        filler = disk.path / "filler"
        with pytest.raises(OSError) as full, filler.open("wb") as out:
            while True:
                out.write(bytes(64 << 10))
                out.flush()
        assert full.value.errno == errno.ENOSPC
        with pytest.raises(OSError):
            atomic_write(disk.path / "other-state", bytes(100))
        f.save(HardState(42, "10.0.0.3:20001", 5))
        f.close()
        assert HardStateFile(disk.path / "raft-state").state == HardState(42, "10.0.0.3:20001", 5)
