"""Two of three replicas' disks full (issue 15, row 9; build item 7).

n2's and n3's data directories are small tmpfs mounts; ordered, idempotent sends fill them.
While they are full the group must say so and stay calm: clients get DISK_FULL naming a
node whose disk is full (not OUTCOME_UNKNOWN "lost the leadership"), the term does not
climb with elections, ``/status`` and ``/metrics`` show the flag and the free bytes, and
every process stays up (an IndexFile page written through its mapping on a full tmpfs
would end a process with SIGBUS). Then the mounts get more room -- nothing is restarted --
and writes resume by themselves; the orderly consumer finally holds every acknowledged
message once, in order (``tests/support/message_history.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from client import ConsumeStatus, Message, PushConsumer
from client.aio import AsyncProducer
from client.errors import ClientError
from raftmq.local_group import LocalGroup
from tests.support.broker_group import SMALL_SEGMENT, create_topic, servers
from tests.support.message_history import MessageHistory
from tests.support.procs import wait_until
from tests.support.tmpfs import require_mount, tmpfs

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(300)]

SMALL_DISK = 6 << 20
ROOMY_DISK = 256 << 20  # free space then exceeds the default resume threshold (64 MiB)
FULL = ("n2", "n3")
KEYS = 4
PAD = b"x" * 2048
OBSERVE_S = 10.0


class Senders:
    """One ordered sender per shard key on a loop thread; outcomes go to ``history``,
    errors (with when they came) to ``errors``."""

    def __init__(self, group: LocalGroup, history: MessageHistory) -> None:
        self.group = group
        self.history = history
        self.errors: list[tuple[float, str]] = []
        self.acked_at: list[tuple[float, float]] = []  # (send started, acknowledged)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Senders:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the senders did not stop"

    def acked_after(self, t: float) -> bool:
        return any(started > t for started, _ in self.acked_at)

    async def _run(self) -> None:
        async with AsyncProducer(servers=servers(self.group), group="disk-producer",
                                 send_timeout=4.0) as producer:
            await asyncio.gather(*(self._key(producer, f"k{k}") for k in range(KEYS)))

    async def _key(self, producer: AsyncProducer, key: str) -> None:
        n = 0
        while not self._stop.is_set():
            payload = f"{key}:{n:06d}:".encode() + PAD
            n += 1
            started = time.monotonic()
            try:
                r = await producer.send(Message("orders", payload), shard_key=key)
            except ClientError as e:
                self.history.unknown(payload, key)
                self.errors.append((time.monotonic(), str(e)))
                await asyncio.sleep(0.2)
            else:
                self.history.ok(payload, key, str(r.queue), r.queue_offset)
                self.acked_at.append((started, time.monotonic()))


def status(group: LocalGroup, name: str) -> dict[str, Any]:
    s = group.status(name, timeout=3.0)
    assert s is not None, f"{name} does not answer /status:\n{group.log_tail(name)}"
    return s


def metric(group: LocalGroup, name: str, series: str) -> float:
    with urllib.request.urlopen(f"http://{group.nodes[name].http}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    found = re.search(rf"^{series}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert found, f"{name}'s /metrics has no {series}"
    return float(found.group(1))


def top_term(group: LocalGroup) -> int:
    return max(status(group, n)["term"] for n in group.nodes)


def test_two_full_disks_answer_disk_full_and_writes_resume_when_space_returns(tmp_path: Path) -> None:
    require_mount()
    base = tmp_path / "brokers"
    history = MessageHistory()
    with contextlib.ExitStack() as stack:
        disks = {n: stack.enter_context(tmpfs(base / n, SMALL_DISK)) for n in FULL}
        group = LocalGroup(base, 3, module="broker", raft={"segment_bytes": SMALL_SEGMENT},
                           broker={"index_slots": 4096, "index_entries": 65536})
        stack.callback(group.stop)  # before the unmounts (the stack unwinds in reverse)
        group.start()
        group.wait_leader(timeout=30)
        create_topic(group, "orders", KEYS)
        consumer = PushConsumer(servers=servers(group), group="billing", topic="orders", orderly=True,
                                from_where="first", commit_interval=0.5, long_poll_s=1.0)

        def listener(msgs, _ctx):  # type: ignore[no-untyped-def]
            for m in msgs:
                history.delivered(m.body, str(m.queue), m.queue_offset, "c1")
            return ConsumeStatus.SUCCESS

        consumer.register(listener)
        consumer.start()
        stack.callback(consumer.shutdown)
        senders = Senders(group, history).start()
        stack.callback(senders.stop)

        # -- the disks fill ----------------------------------------------------------------
        wait_until(lambda: any(disks[n].free_bytes() < 256 << 10 for n in FULL) and senders.errors,
                   90, interval=0.2, what="n2's and n3's disks filling up and sends failing")
        time.sleep(1.0)  # the group settles into whatever it does with full disks
        term_before, errors_before = top_term(group), len(senders.errors)
        observed_from = time.monotonic()
        wait_until(lambda: time.monotonic() - observed_from >= OBSERVE_S, OBSERVE_S + 5, interval=0.5,
                   what="the observation window")
        term_after = top_term(group)
        window = [e for _, e in senders.errors[errors_before:]]
        print(f"while full: term {term_before} -> {term_after}, {len(window)} errors, e.g. "
              f"{window[:2]}")
        for name in group.nodes:
            assert group.nodes[name].alive, f"{name} died while the disks were full:\n{group.log_tail(name)}"
        assert window, "no send failed while two of three disks were full"
        named = [e for e in window if "DISK_FULL" in e and any(n in e for n in FULL)]
        assert named and len(named) * 2 >= len(window), f"few DISK_FULL errors naming n2 or n3: {window[:5]}"
        assert term_after - term_before <= 2, f"elections went on: term {term_before} -> {term_after}"
        for name in FULL:
            disk = status(group, name)["disk"]
            assert disk["full"] is True, f"{name}'s /status shows no disk-full flag: {disk}"
            assert disk["free_bytes"] < 1 << 20
            assert metric(group, name, "raftmq_disk_full") == 1
            assert metric(group, name, "raftmq_disk_free_bytes") < 1 << 20
        assert metric(group, "n1", "raftmq_disk_full") == 0

        # -- room again: writes resume by themselves ---------------------------------------
        for disk in disks.values():
            disk.resize(ROOMY_DISK)
        roomy_at = time.monotonic()
        wait_until(lambda: senders.acked_after(roomy_at), 60, interval=0.2,
                   what="a send started after the disks got room being acknowledged")
        resumed = next(acked for started, acked in senders.acked_at if started > roomy_at) - roomy_at
        print(f"writes resumed {resumed:.2f} s after the disks got room")
        for name in FULL:
            wait_until(lambda n=name: status(group, n)["disk"]["full"] is False, 15,
                       what=f"{name}'s disk-full flag clearing")
        acked = len(history.acked())
        wait_until(lambda: len(history.acked()) >= acked + 200, 60, what="200 more acknowledged sends")
        senders.stop()
        wait_until(lambda: not history.missing(), 90, interval=0.2,
                   what="every acknowledged message consumed")
    history.check(exactly_once=True)
    print("disk full and back:", history.summary())
