"""State beyond the log, under ordered load with retention deleting the log's start every
few seconds (``tests/chaos/brokers.py`` RETENTION): a host replaced with an empty disk, a
follower down while the size cap deletes what it needs, leadership moved under load, and
the group's membership changed 3 -> 4 -> 5 -> 3 and a host moved to a new address with
``raftmq replica`` (the leader killed during a change).

Besides the message invariants (``Scenario.finish``), every scenario checks that every
replica's state digest is equal at every index two of them recorded, and that the
ConsumeQueues are equal unit by unit over the offsets every replica holds.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Callable

import pytest

from tests.chaos.scenario import Scenario
from tests.support.replica_cmd import finished, replica_cmd

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
                                         data=json.dumps({"to": target}).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=15) as resp:
            moved_to = json.loads(resp.read())["leader"]
        at = s.event(f"transfer {turn}: {leader} -> {moved_to}")
        assert moved_to == target
        s.failover_after(at)
        s.workload.wait_more_acked(150, 30)
    s.finish()


def _replica(s: Scenario, *args: str) -> subprocess.Popen[str]:
    """``raftmq replica ARGS`` against the current members (the operator's tool talks to the
    brokers directly, as the harness does)."""
    return replica_cmd([s.brokers.nodes[n].http for n in s.brokers.names], *args, timeout_s=90)


def _done(s: Scenario, proc: subprocess.Popen[str], what: str) -> str:
    out = finished(proc, what, timeout=120)
    said = [line.strip() for line in out.splitlines()
            if line.strip() and " raft " not in line and line.strip() != "members:"]
    s.event(f"{what}: " + " / ".join(said[-2:]))
    return out


def _add(s: Scenario, name: str) -> subprocess.Popen[str]:
    s.brokers.start_learner(name)
    s.brokers.wait_status(name, lambda st: not st["member"], 30, f"{name} up as a learner")
    node = s.brokers.nodes[name]
    return _replica(s, "add", name, "--raft", node.raft, "--client", node.http)


def _members_agree(s: Scenario) -> None:
    want = sorted(s.brokers.names)
    for name in s.brokers.names:
        s.brokers.wait_status(name, lambda st: sorted(st["members"]) == want, 30, f"members {want}")


def test_membership_3_4_5_3_and_a_host_moved_with_a_leader_kill_during_a_change(
        make_scenario: MakeScenario) -> None:
    s = make_scenario(retention=True, spare=3).start()
    b = s.brokers
    first = s.brokers.wait_status(s.leader(), lambda st: st["first_index"] > 1, 60,
                                  "retention deleting the log's start")["first_index"]
    s.event(f"the leader's log starts at {first}: a new replica needs the snapshot")
    _done(s, _add(s, "n4"), "3 -> 4")
    assert (b.status("n4") or {}).get("snapshot_installs"), "n4 caught up without the snapshot"
    b.admit("n4")
    _members_agree(s)
    s.workload.wait_more_acked(100, 30)

    adding = _add(s, "n5")
    killed = s.leader()
    _down(s, killed)
    at = s.event(f"{killed} (leader) killed while n5 is being added")
    s.failover_after(at)
    _done(s, adding, "4 -> 5")
    b.admit("n5")
    s.restart(killed)
    _members_agree(s)
    s.workload.wait_more_acked(100, 30)

    for name in ("n1", "n2"):  # 5 -> 3; the tool moves the leadership off a leader first
        _done(s, _replica(s, "remove", name), f"remove {name}")
        b.retire(name)
        s.workload.wait_more_acked(50, 30)
    _members_agree(s)

    node = b.nodes["n6"]
    b.start_learner("n6")
    b.wait_status("n6", lambda st: not st["member"], 30, "n6 up as a learner")
    _done(s, _replica(s, "replace", "n3", "--name", "n6", "--raft", node.raft, "--client", node.http),
          "n3 replaced by n6 at a new address")
    b.admit("n6")
    b.retire("n3")
    _members_agree(s)
    assert sorted(b.names) == ["n4", "n5", "n6"]
    s.workload.wait_more_acked(200, 45)  # clients given n1-n3 follow the group to its new hosts
    s.finish()
