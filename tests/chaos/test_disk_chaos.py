"""Disks that fill up mid-run (issue 15, build item 7), under the ordered workload.

Every replica's data directory is a tmpfs mount (needs root) with room to spare; after the
warm-up the chosen ones are shrunk to what they hold plus a little, so the workload's
padded messages fill them within seconds: the CommitLog, the ConsumeQueues, the IndexFiles
and the checkpoints all meet ENOSPC somewhere. Then they get room again -- nothing is
restarted -- and ``Scenario.finish`` runs the verifier: no acknowledged message lost,
order per key, no duplicates, identical CommitLogs, equal ConsumeQueues and digests.

* the leader's disk: it hands the leadership over; the two others go on storing and
  acknowledging; once it has room it catches up;
* two of three disks: no majority can store, the leader answers DISK_FULL and keeps its
  term (no elections); once they have room, writes resume by themselves.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable

import pytest

from tests.chaos.scenario import Scenario
from tests.support.tmpfs import TmpfsMount, require_mount, tmpfs

pytestmark = [pytest.mark.chaos, pytest.mark.cluster, pytest.mark.timeout(240)]

MakeScenario = Callable[..., Scenario]

ROOMY = 512 << 20  # above the default resume threshold (64 MiB)
HEADROOM = 3 << 20  # what a shrunk disk has left for the workload to fill
FULL_WITHIN_S = 60.0
QUIET_S = 8.0  # how long the full disks are watched for elections
#: what a replica whose disk fills logs at ERROR: the fault this file injects
DISK_FULL_LOG = [r"ERROR dledger\.disk_guard: the disk of \S+ is full",
                 r"ERROR dledger\.replicated_log: this node no longer stands for election: its disk is full"]


def _shrink(disk: TmpfsMount) -> None:
    disk.resize(shutil.disk_usage(disk.path).used + HEADROOM)


def _wait_full(s: Scenario, names: list[str]) -> float:
    for name in names:
        s.brokers.wait_status(name, lambda st: st["disk"]["full"], FULL_WITHIN_S,
                              f"{name}'s disk filling up")
    free = [(s.brokers.status(n) or {}).get("disk", {}).get("free_bytes") for n in names]
    return s.event(f"{', '.join(names)}: disk full ({free} bytes free)")


def _settled_leader(s: Scenario, full: list[str]) -> tuple[str, int]:
    """The leader once it sits on a disk with room, and the highest term the replicas report.

    Each full replica that leads hands the leadership over once (term +1 each): when two
    fill up one after the other, the first may hand it to the second just before that one
    fills too. Those hand-overs are the design; what must not follow is elections."""
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline:
        statuses = {n: s.brokers.status(n) or {} for n in s.brokers.names}
        leaders = [n for n, st in statuses.items() if st.get("role") == "leader"]
        if len(leaders) == 1 and leaders[0] not in full:
            return leaders[0], max(int(st.get("term", 0)) for st in statuses.values())
        time.sleep(0.1)
    raise AssertionError(f"no leader on a disk with room within 30 s (full: {full})")


@pytest.mark.parametrize("which", ["the leader's disk", "two of three disks"])
def test_disks_fill_up_mid_run_then_get_room(make_scenario: MakeScenario, which: str) -> None:
    require_mount()
    s = make_scenario(pad=4000, rate=50.0)
    s.brokers.expected_log += DISK_FULL_LOG
    with contextlib.ExitStack() as stack:
        disks = {n: stack.enter_context(tmpfs(s.brokers.base / n, ROOMY)) for n in s.brokers.names}
        for name in s.brokers.names:  # the mounts hide the directories formed for the new group
            s.brokers.group.init_storage(name)
        stack.callback(s.brokers.stop)  # stopped before the unmounts (the stack unwinds backwards)
        s.start()
        leader = s.leader()
        targets = [leader] if which == "the leader's disk" else sorted(s.rng.sample(s.brokers.names, 2))
        for name in targets:
            _shrink(disks[name])
        s.event(f"{which}: {', '.join(targets)} shrunk to {HEADROOM >> 20} MiB of room")
        full_at = _wait_full(s, targets)
        if which == "the leader's disk":
            s.failover_after(full_at)  # the two others store and acknowledge
            new = s.leader(among=[n for n in s.brokers.names if n != leader])
            s.event(f"{leader} handed the leadership to {new}")
        settled, term_before = _settled_leader(s, targets)
        acked_before = s.history.acked_count
        deadline = time.monotonic() + QUIET_S
        while time.monotonic() < deadline:  # nothing to wait for: watching that nothing happens
            time.sleep(0.5)
        _, term_after = _settled_leader(s, targets)
        rose = term_after - term_before
        acked = s.history.acked_count - acked_before
        s.event(f"{QUIET_S:g} s with {which} full under leader {settled}: the term rose by {rose}, "
                f"{acked} sends acknowledged")
        assert rose == 0, f"elections while the disks were full: term +{rose}"
        for name in targets:
            st = s.brokers.status(name) or {}
            assert st["disk"]["full"] and st["role"] != "leader", (name, st.get("role"), st.get("disk"))
        if which == "the leader's disk":
            assert acked > 0, "the two replicas with room stopped acknowledging"
        for name in targets:
            disks[name].resize(ROOMY)
        room_at = s.event(f"{', '.join(targets)} have room again")
        took = s.failover_after(room_at)
        s.notes.append(f"{which}: writes acknowledged {took:.2f} s after the disks got room")
        for name in targets:
            s.brokers.wait_status(name, lambda st: not st["disk"]["full"], 15, f"{name}'s flag lowered")
            s.catch_up(name)
        s.workload.wait_more_acked(200, 30)
        s.finish()
