"""The applier across a gap retention left (``dledger.applier.Applier._bridge``): a
received snapshot at the log's start, or at a later index the committed log reaches."""

from __future__ import annotations

from typing import Any

from dledger.applier import Applier
from dledger.storage.commitlog import LogGap


class FakeLog:
    def __init__(self, received: tuple[int, bytes] | None) -> None:
        self.received = received
        self.standing: list[bool] = []

    def received_snapshot(self) -> tuple[int, bytes] | None:
        return self.received

    def forget_received_snapshot(self) -> None:
        self.received = None

    def stand_for_election(self, allowed: bool, reason: str) -> None:
        self.standing.append(allowed)


class FakeMachine:
    def __init__(self) -> None:
        self.installed: list[tuple[int, bytes]] = []

    def applied_index(self) -> int:
        return self.installed[-1][0] if self.installed else 0

    def apply(self, entries: Any) -> None:
        raise AssertionError("not reached")

    def install_snapshot(self, index: int, data: bytes) -> None:
        self.installed.append((index, data))


def _bridge(received: tuple[int, bytes] | None) -> tuple[Applier, FakeLog, FakeMachine]:
    rlog, machine = FakeLog(received), FakeMachine()
    applier = Applier(rlog, machine)  # type: ignore[arg-type]
    applier._stop.set()  # no recheck wait while stalled
    applier._bridge(LogGap(1, 98))
    return applier, rlog, machine


def test_a_snapshot_at_the_log_start_bridges_the_gap() -> None:
    applier, rlog, machine = _bridge((97, b"s97"))
    assert machine.installed == [(97, b"s97")] and applier.stalled is None and rlog.received is None


def test_a_later_snapshot_fetched_because_the_named_one_was_pruned_bridges_the_gap() -> None:
    """SnapshotFetch takes a later snapshot (up to the committed index) when no member holds
    the one the leader's dump named any more; applying goes on after it."""
    applier, _, machine = _bridge((300, b"s300"))
    assert machine.installed == [(300, b"s300")] and applier.stalled is None


def test_an_older_snapshot_than_the_gap_or_none_leaves_the_applier_stalled() -> None:
    for received in [(40, b"s40"), None]:
        applier, rlog, machine = _bridge(received)
        assert machine.installed == [] and applier.stalled is not None
        assert rlog.standing == [False]
