"""StageClock (issue 30): each stage of an entry's commit observed once, in its histogram,
driven point by point with a clock the test sets (no threads, no sockets)."""

from __future__ import annotations

import pytest

from dledger.stage_clock import STAGES, StageClock


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _observed(clock: StageClock) -> dict[str, tuple[int, float]]:
    """stage -> (observations, total seconds), stages never observed left out."""
    out = {}
    for stage, histogram in clock.histograms.items():
        buckets, total = histogram.snapshot()
        if buckets[-1][1]:
            out[stage] = (buckets[-1][1], total)
    return out


def test_the_stage_set_is_fixed() -> None:
    assert StageClock().histograms.keys() == set(STAGES)
    assert len(STAGES) == len(set(STAGES)) == 12


def test_a_proposal_and_a_followers_entry_each_pass_every_stage_once() -> None:
    t = _Clock()
    clock = StageClock(clock=t)
    command = b"\x00proposal"
    clock.proposed(command)                      # t=0
    t.now = 3.0
    clock.appended(5, command, began=1.0)        # queue 1, append 2
    t.now = 7.0
    clock.synced(5)                              # leader_fsync 4
    t.now = 8.0
    clock.sent(5)                                # send 1
    t.now = 11.0
    clock.acked(5)                               # replicate 3
    t.now = 12.0
    clock.committed(5)                           # commit 1
    t.now = 14.0
    clock.applied(5)                             # apply 2
    # a follower: the entry arrives in an append_entries the transport is handling
    t.now = 20.0
    clock.receiving(True)
    t.now = 22.0
    clock.appended(9, b"\x00from the leader", began=21.0)  # follower_append 2
    clock.receiving(False)
    t.now = 25.0
    clock.synced(9)                              # follower_fsync 3
    t.now = 26.0
    clock.ack_sent(9)                            # follower_ack 1
    clock.observe("receive", 0.5)
    clock.observe("answer", 0.25)
    assert _observed(clock) == {
        "queue": (1, 1.0), "append": (1, 2.0), "leader_fsync": (1, 4.0), "send": (1, 1.0),
        "replicate": (1, 3.0), "commit": (1, 1.0), "apply": (1, 2.0),
        "follower_append": (1, 2.0), "follower_fsync": (1, 3.0), "follower_ack": (1, 1.0),
        "receive": (1, 0.5), "answer": (1, 0.25)}


def test_one_fsync_and_one_ack_carry_every_entry_below_them_only() -> None:
    t = _Clock()
    clock = StageClock(clock=t)
    commands = [bytes([i]) * 3 for i in range(3)]
    for index, command in enumerate(commands, start=1):
        clock.proposed(command)
        clock.appended(index, command, began=0.0)
    t.now = 1.0
    clock.synced(2)   # a group commit of entries 1 and 2; 3 waits for the next fsync
    t.now = 2.0
    clock.sent(3)     # 3 has not been fsynced: it cannot have been sent
    clock.acked(1)
    assert _observed(clock)["leader_fsync"] == (2, 2.0)
    assert _observed(clock)["send"] == (2, 2.0)
    assert _observed(clock)["replicate"] == (1, 0.0)


def test_an_entry_appended_outside_a_proposal_or_an_append_is_not_timed() -> None:
    """A leader's own no-op or bind entry: no submission and no append_entries."""
    clock = StageClock()
    clock.appended(1, b"\x00no-op", began=clock.clock())
    clock.synced(1)
    clock.ack_sent(1)
    assert _observed(clock) == {}


def test_an_unknown_server_stage_is_refused() -> None:
    with pytest.raises(KeyError):
        StageClock().observe("nap", 1.0)
