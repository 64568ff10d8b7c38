"""LeadershipTransfer on its own (fake Raft view): one transfer at a time, proposals paused
exactly while one runs."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from dledger.membership import Member
from dledger.raft.election.leadership_transfer import LeadershipTransfer


def test_a_second_transfer_while_one_runs_gives_up_at_once_and_proposals_reopen_after_the_first() -> None:
    """Review finding: the hand-over thread and an admin transfer could run together and the
    first to end reopened proposals while the other still moved the leadership."""
    view = SimpleNamespace(is_leader=True, leader="me")  # nobody takes it: each transfer times out
    transfer = LeadershipTransfer(
        SimpleNamespace(), view, SimpleNamespace(notify=lambda: None), "me:1",  # type: ignore[arg-type]
        members=lambda: {"a": Member("a", "me:1"), "b": Member("b", "b:1")},
        peer_node=lambda m: SimpleNamespace(address=m.raft),  # type: ignore[arg-type, return-value]
        follower_disks=SimpleNamespace(is_full=lambda n: False),  # type: ignore[arg-type]
        must_not_lead=frozenset, not_leader=lambda: AssertionError("leads"))  # type: ignore[arg-type, return-value]
    results: list[Any] = []
    first = threading.Thread(target=lambda: results.append(transfer.transfer("b", timeout=0.5)))
    first.start()
    deadline = time.monotonic() + 5
    while not transfer.paused:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert transfer.transfer("b", timeout=0.1) is None and transfer.paused  # gave up; still paused
    first.join(5)
    assert results == [None] and not transfer.paused
