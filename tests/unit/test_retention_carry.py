"""A held message does not pin retention: delayed messages and transaction halves in the
oldest segments are carried forward (re-appended) so ``retention_bytes`` is a real cap.

One broker replica in process over a one-node ``ReplicatedLog`` (real segments, real
retention), segments of 240 KiB and a cap of 4 segments; ordinary traffic of many times
the cap flows while messages delayed beyond it wait.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from broker.remoting.guarded_site import GuardedSite
from broker.remoting.server import AppliedSignal, BrokerServer
from broker.state.machine import BrokerStateMachine
from client import LocalTransactionState, Message, Producer, TransactionProducer
from dledger.applier import Applier
from dledger.config import MAX_ENTRY_BYTES, GroupConfig
from dledger.raft.replicated_log import ReplicatedLog
from raftmq.local_group import free_port
from tests.support.client_calls import collecting_consumer, create_topic_at
from tests.support.founding import founding
from tests.support.procs import wait_until

#: these tests open IP sockets (a real port, the Raft transport or a client connection)
pytestmark = pytest.mark.sockets

SEGMENT = 4 * MAX_ENTRY_BYTES
CAP = 4 * SEGMENT
QUICK_CONSUMER = {"long_poll_s": 0.5, "rebalance_interval": 1.0, "commit_interval": 0.2, "suspend_s": 0.1}


@pytest.fixture
def capped(tmp_path: Path) -> Iterator[tuple[str, ReplicatedLog, BrokerStateMachine]]:
    """A broker on 127.0.0.1 over a one-node group whose log is capped at ``CAP`` bytes."""
    cfg = GroupConfig(node="n1", peers={"n1": f"127.0.0.1:{free_port()}"}, data_dir=tmp_path / "log",
                      secret="t", segment_bytes=SEGMENT, retention_hours=1000.0, retention_bytes=CAP,
                      retention_check_s=0.05)
    rlog = ReplicatedLog(founding(cfg))
    machine = BrokerStateMachine(tmp_path / "store", index_slots=64, index_entries=4096,
                                 segment_bytes=SEGMENT)
    rlog.set_applied_floor(machine.durable_index)
    rlog.set_snapshot_source(machine)
    applier = Applier(rlog, machine).start()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    address = f"127.0.0.1:{free_port()}"
    runners: list[web.AppRunner] = []

    async def up() -> None:
        server = BrokerServer(rlog, machine, applier, AppliedSignal(asyncio.get_running_loop()),
                              lambda n: address, addresses={"n1": address})
        runner = server.runner()
        await runner.setup()
        await GuardedSite(runner, "127.0.0.1", int(address.rsplit(":", 1)[1])).start()
        runners.append(runner)

    try:
        wait_until(timeout=10, predicate=lambda: rlog.is_leader, what="a leader")
        thread.start()
        asyncio.run_coroutine_threadsafe(up(), loop).result(10)
        yield address, rlog, machine
    finally:
        if runners:
            asyncio.run_coroutine_threadsafe(runners[0].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        applier.stop()
        rlog.close()
        machine.close()


def log_bytes(rlog: ReplicatedLog) -> int:
    return sum(s.size_on_disk for s in rlog.commitlog.segments())


def test_delayed_messages_are_carried_so_the_log_stays_under_its_cap(
        capped: tuple[str, ReplicatedLog, BrokerStateMachine]) -> None:
    broker, rlog, machine = capped
    create_topic_at([broker], "later", 1)
    create_topic_at([broker], "filler", 4)
    c, got = collecting_consumer([broker], "later", "g", **QUICK_CONSUMER)
    try:
        with Producer(servers=[broker]) as p:
            due: dict[bytes, int] = {}
            for i in range(12):
                at = int(time.time() * 1000) + 15_000 + 100 * i
                body = f"delayed-{i}".encode() * 200
                p.send(Message("later", body, keys=[f"k{i}"], properties={"n": str(i)},
                               deliver_at_ms=at), shard_key="d")
                due[body] = at
            first = {h.position for h in machine.timers.due(10**15, 100)}
            assert len(first) == 12
            chunk = b"x" * 40_000
            for _ in range(20):  # ten times the cap while they wait, half the cap at a time
                for i in range(CAP // 2 // len(chunk)):
                    p.send(Message("filler", chunk), shard_key=str(i % 4))
                wait_until(timeout=5, predicate=lambda: log_bytes(rlog) <= CAP,
                           what=f"the log under its cap ({log_bytes(rlog)} > {CAP} bytes)")
            assert rlog.commitlog.start_position > max(first), "the held originals went with the log"
            assert len(machine.timers) == 12, "nothing delivered early, nothing lost"
            assert all(h.at > h.position for h in machine.timers.held())
        wait_until(timeout=20, predicate=lambda: len(got) >= 12, what="the delayed messages")
        time.sleep(0.5)
        assert len(got) == 12, "each delivered once"
        for m in got:
            at = due[m.body]
            assert at <= m.store_timestamp <= at + 2000, (m.store_timestamp - at)
            assert list(m.keys) == [f"k{m.properties['n']}"] and m.topic == "later"
            assert not [k for k in m.properties if k.startswith("__C")], m.properties
        assert len({m.msg_id for m in got}) == 12
    finally:
        c.shutdown()


def test_a_transaction_half_is_carried_and_still_commits_by_its_position(
        capped: tuple[str, ReplicatedLog, BrokerStateMachine]) -> None:
    broker, rlog, machine = capped
    create_topic_at([broker], "tx", 1)
    create_topic_at([broker], "filler", 4)
    decided = threading.Event()
    asked: list[dict[str, str]] = []

    class Listener:
        def execute_local_transaction(self, _m: Message, _arg: object) -> LocalTransactionState:
            return LocalTransactionState.UNKNOWN

        def check_local_transaction(self, m) -> LocalTransactionState:  # type: ignore[no-untyped-def]
            asked.append(dict(m.properties))
            return LocalTransactionState.COMMIT if decided.is_set() else LocalTransactionState.UNKNOWN

    c, got = collecting_consumer([broker], "tx", "g", **QUICK_CONSUMER)
    tp = TransactionProducer(servers=[broker], group="pg", listener=Listener())
    try:
        tp.start()
        tp.send_in_transaction(Message("tx", b"half", keys=["h"]), "open")
        (identity,) = machine.halves.positions()
        with Producer(servers=[broker]) as p:
            chunk = b"x" * 40_000
            for i in range(6 * CAP // len(chunk)):
                p.send(Message("filler", chunk), shard_key=str(i % 4))
        wait_until(timeout=5, predicate=lambda: log_bytes(rlog) <= CAP, what="the log under its cap")
        assert rlog.commitlog.start_position > identity
        assert machine.halves.positions() == [identity], "the half keeps its identity"
        decided.set()
        wait_until(timeout=30, predicate=lambda: len(got) >= 1, what="the committed message")
        time.sleep(0.5)
        assert [m.body for m in got] == [b"half"]
        assert not [k for k in got[0].properties if k.startswith("__C")]
        assert asked and not [k for a in asked for k in a if k.startswith("__C")], asked
    finally:
        tp.shutdown()
        c.shutdown()
