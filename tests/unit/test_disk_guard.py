"""The disk-full flag (``dledger/storage/disk_guard.py``) and what a leader refuses with it
(``dledger/raft/full_disks.py``): raised by a write that failed for want of space, lowered only
once the resume threshold is free again; a writer that cannot skip its write waits."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from dledger.errors import DiskFull
from dledger.raft.full_disks import FollowerDisks, refusal
from dledger.storage import disk_guard
from dledger.storage.disk_guard import DiskGuard, is_out_of_space

ENOSPC = OSError(errno.ENOSPC, "No space left on device")


class Disk:
    """Free bytes a test sets."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self) -> int:
        return self.free


def test_out_of_space_raises_the_flag_and_only_the_resume_threshold_lowers_it(tmp_path: Path) -> None:
    free = Disk(0)
    guard = DiskGuard(tmp_path, resume_free_bytes=1000, free_bytes=free)
    assert not guard.full and guard.status()["full"] is False
    assert guard.note("appending entry 7", ENOSPC)
    assert guard.full and "appending entry 7" in (guard.reason or "")
    free.free = 999  # some room, not enough: a disk at its edge does not flap
    assert guard.check()
    free.free = 1000
    assert not guard.check()
    assert guard.reason is None and guard.status() == {
        "free_bytes": 1000, "full": False, "full_reason": None, "full_since": None,
        "resume_free_bytes": 1000}


def test_other_errors_are_not_a_full_disk(tmp_path: Path) -> None:
    guard = DiskGuard(tmp_path, 1000, free_bytes=Disk(0))
    assert not guard.note("reading", OSError(errno.EIO, "I/O error"))
    assert not guard.note("reading", ValueError("no"))
    assert not guard.full
    assert is_out_of_space(OSError(errno.EDQUOT, "Disk quota exceeded"))


def test_a_failure_reported_once_room_is_back_does_not_raise_the_flag(tmp_path: Path) -> None:
    guard = DiskGuard(tmp_path, 1000, free_bytes=Disk(5000))
    assert guard.note("a checkpoint begun before space was freed", ENOSPC)
    assert not guard.full


def test_a_writer_that_cannot_skip_waits_until_its_write_fits(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disk_guard, "RETRY_S", 0.001)
    guard = DiskGuard(tmp_path, 1000, free_bytes=Disk(0))
    attempts = []

    def write() -> str:
        attempts.append(1)
        if len(attempts) < 4:
            raise ENOSPC
        return "written"

    assert guard.wait_for_space("a ConsumeQueue unit", write) == "written"
    assert len(attempts) == 4 and guard.full
    with pytest.raises(OSError, match="I/O"):
        guard.wait_for_space("x", lambda: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")))


def test_closing_ends_a_wait_with_the_error(tmp_path: Path) -> None:
    guard = DiskGuard(tmp_path, 1000, free_bytes=Disk(0))
    outcome: list[BaseException] = []

    def never_fits() -> None:
        raise ENOSPC

    def wait() -> None:
        try:
            guard.wait_for_space("x", never_fits)
        except OSError as e:
            outcome.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    guard.close()
    waiter.join(timeout=5)
    assert not waiter.is_alive() and outcome and outcome[0].errno == errno.ENOSPC


def test_the_real_file_system_is_measured(tmp_path: Path) -> None:
    assert DiskGuard(tmp_path, 0).free_bytes() > 0


@pytest.mark.parametrize(("members", "full", "refused"), [
    (3, {"n2", "n3"}, True), (3, {"n3"}, False), (5, {"n4", "n5"}, False), (5, {"n3", "n4", "n5"}, True),
    (1, set(), False)])
def test_a_leader_refuses_when_the_members_with_room_are_no_majority(
        tmp_path: Path, members: int, full: set[str], refused: bool) -> None:
    guard = DiskGuard(tmp_path, 1000, free_bytes=Disk(10 ** 9))
    answer = refusal("n1", "g1", guard, full, members)
    assert (answer is not None) == refused
    if answer is not None:
        assert isinstance(answer, DiskFull) and answer.retriable and answer.definitely_not_committed
        assert answer.nodes == sorted(full)
        assert all(n in str(answer) for n in full) and "g1" in str(answer)


def test_a_leader_whose_own_disk_is_full_refuses_naming_itself(tmp_path: Path) -> None:
    guard = DiskGuard(tmp_path, 1000, free_bytes=Disk(0))
    guard.note("appending entry 9 to the CommitLog", ENOSPC)
    answer = refusal("n1", "g1", guard, {"n1"}, 3)
    assert answer is not None and answer.nodes == ["n1"] and "entry 9" in str(answer)


def test_followers_disks_are_what_their_last_answer_said() -> None:
    disks = FollowerDisks()
    disks.heard("n2", True)
    disks.heard("n3", False)
    assert disks.is_full("n2") and not disks.is_full("n3") and not disks.is_full("n9")
    assert disks.full_among(["n1", "n2", "n3"]) == {"n2"}
    disks.heard("n2", False)
    assert disks.full_among(["n2"]) == set()


def test_a_disk_smaller_than_ten_times_the_threshold_resumes_at_a_tenth_of_it(tmp_path: Path) -> None:
    free = Disk(0)
    guard = DiskGuard(tmp_path, resume_free_bytes=64 << 20, free_bytes=free)
    guard.measure_total = lambda: 100 << 20
    assert guard.resume_threshold() == 10 << 20
    guard.note("x", ENOSPC)
    free.free = 10 << 20
    assert not guard.check()


def test_a_disk_with_less_than_an_entry_free_is_full_before_a_write_fails(tmp_path: Path) -> None:
    """A replica learns its disk is full from a failed write, or -- so that it does not win an
    election it would give up at its first append -- from ``check`` seeing less than one
    entry's room free."""
    free = Disk(disk_guard.NO_ROOM_BYTES)
    guard = DiskGuard(tmp_path, resume_free_bytes=1000 * disk_guard.NO_ROOM_BYTES, free_bytes=free)
    assert not guard.check()
    free.free = disk_guard.NO_ROOM_BYTES - 1
    assert guard.check() and "bytes free" in (guard.reason or "")
    free.free = 1000 * disk_guard.NO_ROOM_BYTES
    assert not guard.check()
