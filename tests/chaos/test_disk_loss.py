"""A replica that forgot what it acknowledged must not vote acknowledged messages away
(issue 24, guarantee 1).

The sequence that lost 60 and 299 of 300 acknowledged messages before storage identities:

    1  leader L, followers F1 and F2; F1 stalls (SIGSTOP, or its links cut by Toxiproxy)
    2  sends acknowledged: stored on L and F2 only
    3  F2 forgets: its data directory wiped (a replaced host), or its log cut by
       --repair-log, or its hard state (term and vote) deleted, or its commitlog folder
       lost while its hard state and storage-id survive (no recovery cut to tell)
    4  L crashes (kill -9)
    5  F2 started again as docs/DEPLOY.md says; F1 resumes
    6  F1, which lacks the messages, asks for votes: F2 must not grant one -- no leader
       among {F1, F2} while L is down
    7  L restarts: it leads (only it holds the messages), F2 catches up and is recorded
    8  leadership is transferred to F2: the replaced storage leads, sends go on

``Scenario.finish`` then checks every acknowledged message is stored and delivered once,
in order, on every replica.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable

import pytest

from tests.chaos.scenario import Scenario
from tests.support.log_damage import flip_a_byte

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.timeout(240)]

MakeScenario = Callable[..., Scenario]
NO_LEADER_WINDOW_S = 6.0  # F1's election timeouts are 0.4-1.2 s: it asks many times in this window
TRANSFER_DEADLINE_S = 30.0


def _never_a_leader(s: Scenario, among: list[str], window: float) -> None:
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        for name in among:
            st = s.brokers.status(name)
            assert not (st and st["role"] == "leader"), \
                f"{name} was elected while the only holder of the acknowledged messages was down: {st}"
        time.sleep(0.1)


def _transfer_to(s: Scenario, target: str) -> None:
    """POST /admin/leader/transfer {"to": target} on the leader until ``target`` leads (a
    transfer answers 503 when the target was not caught up within 3 s: asked again)."""
    deadline = time.monotonic() + TRANSFER_DEADLINE_S
    answers: list[tuple[int, dict[str, object]]] = []
    while time.monotonic() < deadline:
        leader = s.leader()
        if leader == target:
            return
        answers.append(s.brokers.http.call(s.brokers.nodes[leader].http, "/admin/leader/transfer",
                                           {"to": target}, timeout=15))
        if answers[-1][0] != 200:
            time.sleep(0.5)  # between attempts, not a wait for an event
    raise AssertionError(f"{target} did not take the leadership within {TRANSFER_DEADLINE_S:g} s: {answers}")


@pytest.mark.parametrize("forget", ["wiped", "repaired", "hard-state-lost", "commitlog-lost"])
@pytest.mark.parametrize("stall", ["sigstop", "toxic"])
def test_a_replica_that_forgot_never_votes_acknowledged_messages_away(
        make_scenario: MakeScenario, forget: str, stall: str) -> None:
    s = make_scenario().start()
    leader = s.leader()
    f1, f2 = [n for n in s.brokers.names if n != leader]
    s.brokers.group.wait_following(leader, timeout=20)
    if stall == "sigstop":
        os.kill(s.brokers.nodes[f1].proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
    else:
        s.brokers.isolate(f1, clients=False)
    s.event(f"{f1} stalled ({stall})")
    try:
        s.workload.wait_more_acked(300, 60, "sends acknowledged by the leader and one follower")
        behind = s.brokers.status(f1)
        ahead = s.brokers.status(leader)
        if behind is not None:  # the toxic: F1 answers its status, and is behind
            assert ahead is not None and behind["commit_index"] < ahead["commit_index"], (behind, ahead)
        position = (s.brokers.status(f2) or {}).get("write_position", 0)
        s.brokers.kill(f2)
        if forget == "wiped":
            s.brokers.wipe(f2)
        elif forget == "repaired":
            flip_a_byte(s.brokers.base / f2 / "commitlog", position // 2)
        elif forget == "commitlog-lost":
            shutil.rmtree(s.brokers.base / f2 / "commitlog")  # raft-state and storage-id kept
        else:
            (s.brokers.base / f2 / "raft-state").unlink()
        s.event(f"kill -9 {f2}; {forget}")
        s.brokers.kill(leader)
        s.event(f"kill -9 {leader} (the leader)")
        s.brokers.incarnation[f2] += 1
        s.brokers.group.start_node(f2, *(["--repair-log"] if forget == "repaired" else []))
        s.brokers.wait_status(f2, lambda st: st["voter"] is False, 30, f"{f2} up, not a voter")
    finally:
        if stall == "sigstop":
            os.kill(s.brokers.nodes[f1].proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
        else:
            s.brokers.heal()
    s.event(f"{f2} started again ({'--repair-log' if forget == 'repaired' else 'as documented'}); "
            f"{f1} resumed")
    forgotten = s.brokers.status(f2)
    assert forgotten is not None and forgotten["storage"].startswith("j-"), forgotten
    _never_a_leader(s, [f1, f2], NO_LEADER_WINDOW_S)
    s.event(f"no leader among {f1}, {f2} for {NO_LEADER_WINDOW_S:g} s")
    s.brokers.start([leader])
    assert s.leader() == leader, "only the old leader holds every acknowledged message"
    s.event(f"{leader} back and leading")
    s.brokers.wait_status(f2, lambda st: st["voter"] is True, 60, f"{f2} recorded and voting again")
    s.event(f"{f2} caught up and was recorded: it votes again")
    s.workload.wait_more_acked(100, 60)
    _transfer_to(s, f2)
    s.event(f"leadership transferred to {f2}, the replaced storage")
    s.workload.wait_more_acked(100, 60, f"sends acknowledged with {f2} leading")
    assert s.leader() == f2, "the transferred leadership did not hold"
    s.finish()
