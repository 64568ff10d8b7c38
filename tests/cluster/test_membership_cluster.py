"""Membership changes through the log (issue 13, row 6): a group grows 3 -> 4 -> 5, shrinks
to 3 and replaces a host with a new address, one `raftmq replica` command each, under
ordered load and with the leader killed during a change. New replicas catch up as
learners -- here from the leader's snapshot, retention having deleted the log's start --
before they count; clients given only the first three addresses follow the group."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Admin, Message, Producer, PullConsumer
from raftmq.local_group import LocalGroup
from tests.support.broker_group import SMALL_SEGMENT, retaining_brokers
from tests.support.replica_cmd import finished, replica_cmd

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SEGMENT = SMALL_SEGMENT
KEYS = 4


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[LocalGroup]:
    with retaining_brokers(tmp_path / "brokers", segments_kept=24, index_entries=4096,
                           cq_units_per_file=256) as group:
        yield group


class OrderedLoad:
    """Sends (key, seq) in order per key from a thread, paced; remembers what was acked."""

    def __init__(self, servers: list[str]) -> None:
        self.acked: dict[str, list[int]] = {f"k{k}": [] for k in range(KEYS)}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._producer = Producer(servers=servers, group="ordered", send_timeout=30)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            key = f"k{seq % KEYS}"
            n = seq // KEYS
            try:
                self._producer.send(Message("orders", f"{key}:{n}".encode()), shard_key=key)
                self.acked[key].append(n)
                seq += 1
            except Exception as e:  # retried with the same (key, n): order must still hold
                self.errors.append(repr(e))
            self._stop.wait(0.004)

    def total(self) -> int:
        return sum(len(v) for v in self.acked.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._producer.shutdown()


def replica(group: LocalGroup, *args: str, servers: list[str]) -> subprocess.Popen[str]:
    return replica_cmd(servers, *args)


def start_new(group: LocalGroup, name: str, members: list[str]) -> None:
    group.add_node(name, members)
    group.start_node(name)
    group.wait_status(name, lambda s: not s["member"], 30, f"{name} up as a learner")


def members_of(group: LocalGroup, name: str) -> list[str]:
    status = group.status(name)
    assert status is not None, name
    return sorted(status["members"])


def read_orders(servers: list[str]) -> dict[str, list[int]]:
    """Every stored message of "orders", per key, in queue order."""
    seen: dict[str, list[int]] = {f"k{k}": [] for k in range(KEYS)}
    c = PullConsumer(servers=servers, group="verify", read_from="leader")
    try:
        for queue in c.queues("orders"):
            offset = 0
            while True:
                result = c.pull(queue, offset, max_msgs=256)
                for m in result.messages:
                    key, n = m.body.decode().split(":")
                    seen[key].append(int(n))
                if result.next_offset == offset:
                    break
                offset = result.next_offset
    finally:
        c.shutdown()
    return seen


def test_grow_to_five_shrink_to_three_and_replace_a_host_under_ordered_load(brokers: LocalGroup) -> None:
    first = ["n1", "n2", "n3"]
    initial_servers = [brokers.nodes[n].http for n in first]
    admin = Admin(servers=initial_servers)
    try:
        admin.create_topic("orders", queues=2)
        admin.create_topic("pad", queues=1)
    finally:
        admin.close()
    with Producer(servers=initial_servers, group="pad", send_timeout=30) as p:
        for _ in range(400):  # ~7 MiB: retention deletes the log's start
            p.send_batch([Message("pad", b"p" * 900) for _ in range(20)])
    leader = brokers.wait_leader()
    brokers.wait_status(leader, lambda s: s["first_index"] > 1, 30, "retention deleted the start")

    load = OrderedLoad(initial_servers)
    try:
        # 3 -> 4: the learner is sent the leader's snapshot, then the log
        start_new(brokers, "n4", first)
        out = finished(replica(brokers, "add", "n4", "--raft", brokers.nodes["n4"].raft,
                             "--client", brokers.nodes["n4"].http, servers=initial_servers))
        assert "n4 is a member" in out
        n4 = brokers.status("n4")
        assert n4 is not None and n4["snapshot_installs"], "n4 should have installed a snapshot"
        for name in [*first, "n4"]:
            brokers.wait_status(name, lambda s: sorted(s["members"]) == ["n1", "n2", "n3", "n4"], 10,
                                "four members")

        # 4 -> 5, with the leader killed while the change is under way
        start_new(brokers, "n5", [*first, "n4"])
        proc = replica(brokers, "add", "n5", "--raft", brokers.nodes["n5"].raft,
                       "--client", brokers.nodes["n5"].http, servers=initial_servers)
        killed = brokers.wait_leader()
        brokers.kill(killed)
        finished(proc)
        brokers.start_node(killed)
        five = ["n1", "n2", "n3", "n4", "n5"]
        for name in five:
            brokers.wait_status(name, lambda s: sorted(s["members"]) == five, 30, "five members")

        # 5 -> 3: remove two of the first three (the CLI moves the leadership off them first)
        for name in ("n1", "n2"):
            finished(replica(brokers, "remove", name, servers=initial_servers))
        # replace a host: n3 -> n6 at a new address, one command
        start_new(brokers, "n6", ["n3", "n4", "n5"])
        finished(replica(brokers, "replace", "n3", "--name", "n6", "--raft", brokers.nodes["n6"].raft,
                       "--client", brokers.nodes["n6"].http, servers=initial_servers))
        final = ["n4", "n5", "n6"]
        for name in final:
            brokers.wait_status(name, lambda s: sorted(s["members"]) == final, 30, "the final members")
        for name in ("n1", "n2", "n3"):
            brokers.terminate(name)
        sent_before = load.total()
        deadline = time.monotonic() + 30
        while load.total() < sent_before + 50:  # the producer follows the group to its new hosts
            assert time.monotonic() < deadline, f"no sends after the old hosts stopped: {load.errors[-3:]}"
            time.sleep(0.05)
    finally:
        load.stop()

    final_servers = [brokers.nodes[n].http for n in final]
    leader = brokers.wait_leader(among=final)
    target = brokers.status(leader)["commit_index"]  # type: ignore[index]
    statuses: dict[str, Any] = {
        n: brokers.wait_status(n, lambda s: s["applied_index"] >= target and s["healthy"], 60,
                               f"{n} caught up") for n in final}
    stored = read_orders(final_servers)
    for key, acked in load.acked.items():
        got = stored[key]
        assert got == sorted(set(got)), f"{key}: out of order or duplicated: {got[:20]}..."
        missing = set(acked) - set(got)
        assert not missing, f"{key}: acknowledged and lost: {sorted(missing)[:10]}"
    assert load.total() > 200
    # the replicas agree: equal state digests at every index two of them hold
    digests = [s["state_digests"] for s in statuses.values()]
    common = set(digests[0]) & set(digests[1]) & set(digests[2])
    assert common, digests
    for index in common:
        assert len({d[index] for d in digests}) == 1, f"state digests differ at {index}"
