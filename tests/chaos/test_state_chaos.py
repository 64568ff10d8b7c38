"""State beyond the log, under ordered load with retention deleting the log's start every
few seconds (``tests/chaos/brokers.py`` RETENTION): a host replaced with an empty disk, a
follower down while the size cap deletes what it needs, leadership moved under load.

Besides the message invariants (``Scenario.finish``), every scenario checks that every
replica's state digest is equal at every index two of them recorded, and that the
ConsumeQueues are equal unit by unit over the offsets every replica holds.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable

import pytest

from tests.chaos.scenario import Scenario

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.timeout(180)]

MakeScenario = Callable[..., Scenario]


def _passed(s: Scenario, name: str, what: str) -> int:
    """Wait until the live nodes' log starts after ``name``'s last entry; the leader's start."""
    last = s.brokers.group.status(name) if s.brokers.alive(name) else None
    mine = last["last_index"] if last else s.last_index[name]
    leader = s.leader()

    def moved() -> int:
        st = s.brokers.status(leader)
        return st["first_index"] if st and st["first_index"] > mine + 1 else 0

    s.workload.wait_more_acked(100, 30)
    deadline = time.monotonic() + 60
    while not (first := moved()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"retention did not pass {name}'s last entry {mine} ({what})")
        s.workload.wait_more_acked(20, 30)
    s.event(f"retention passed {name}'s last entry {mine}: the leader's log starts at {first}")
    return first


def _down(s: Scenario, name: str) -> None:
    s.last_index[name] = (s.brokers.status(name) or {}).get("last_index", 0)
    s.brokers.kill(name)
    s.event(f"kill -9 {name} (its log ends at {s.last_index[name]})")


def test_host_replaced_with_an_empty_disk_behind_the_retained_start(make_scenario: MakeScenario) -> None:
    s = make_scenario(retention=True).start()
    follower = s.rng.choice([n for n in s.brokers.names if n != s.leader()])
    _down(s, follower)
    s.brokers.wipe(follower)
    s.event(f"{follower}'s data directory deleted (host replaced)")
    _passed(s, follower, "while the host was replaced")
    s.restart(follower)
    installs = (s.brokers.status(follower) or {}).get("snapshot_installs")
    s.event(f"{follower} restored from the leader's snapshot: {installs}")
    assert installs, "the replaced host did not install a snapshot"
    s.workload.wait_more_acked(200, 30)
    s.finish()


def test_follower_down_while_the_size_cap_deletes_what_it_needs(make_scenario: MakeScenario) -> None:
    s = make_scenario(retention=True).start()
    follower = s.rng.choice([n for n in s.brokers.names if n != s.leader()])
    _down(s, follower)
    _passed(s, follower, "while the follower was down")
    s.restart(follower)
    assert (s.brokers.status(follower) or {}).get("snapshot_installs")
    s.workload.wait_more_acked(200, 30)
    s.finish()


def test_leadership_transferred_under_load_with_retention(make_scenario: MakeScenario) -> None:
    s = make_scenario(retention=True).start()
    for turn in range(3):
        leader = s.leader()
        target = s.rng.choice([n for n in s.brokers.names if n != leader])
        request = urllib.request.Request(f"http://{s.brokers.nodes[leader].http}/admin/leader/transfer",
                                         data=json.dumps({"to": target}).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=15) as resp:
            moved_to = json.loads(resp.read())["leader"]
        at = s.event(f"transfer {turn}: {leader} -> {moved_to}")
        assert moved_to == target
        s.failover_after(at)
        s.workload.wait_more_acked(150, 30)
    s.finish()
