"""A replica whose open-file limit strangers try to exhaust (issue 15, row 6, the broker's side).

Before: idle connections to a follower's client port took every descriptor it had; it stopped
answering and stopped replicating (a new topic's files could not be opened) and logged
~1.4 MB/s. Now the client port keeps ``fd_reserve`` descriptors free: connections beyond
are closed at once, the follower keeps applying (new topics too) and serves the clients it
had, logs a line a minute about it, and takes new clients again once the strangers leave.
(The Raft port's half: tests/security/test_raft_port.py.)
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol.pull import PullRequest, PullResponse
from protocol.remoting import ResponseCode, decode_frame
from raftmq.local_group import LocalGroup
from tests.support.broker_group import running_brokers
from tests.support.raw_ws import read_binary, send_binary, upgrade

pytestmark = [pytest.mark.cluster]

RESERVE = 48
HEADROOM = 100  # descriptors the victim may open beyond what it holds when the flood starts
STRANGERS = 400
MESSAGES = 20
FLOOD_S = 6.0  # how long strangers keep coming
REFUSAL_WAIT_S = 30.0  # a new client's timeout: a refusal must come as a close, not as this timeout


def flood(address: str, held: list[socket.socket], stop: threading.Event) -> None:
    """Connect and hold, up to STRANGERS at a time; the ones the victim closed are replaced."""
    host, port = address.rsplit(":", 1)
    while not stop.is_set():
        for s in [s for s in held if _closed(s)]:
            held.remove(s)
            s.close()
        while len(held) < STRANGERS and not stop.is_set():
            try:
                held.append(socket.create_connection((host, int(port)), timeout=1))
            except OSError:
                break
        stop.wait(0.05)


def _closed(s: socket.socket) -> bool:
    try:
        s.setblocking(False)
        return s.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalGroup]:
    with running_brokers(tmp_path / "g", fd_reserve=RESERVE) as g:
        yield g


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def pull(s: socket.socket, opaque: int, topic: str, queue_id: int) -> tuple[int, int]:
    """(response code, messages) of one PULL over the raw WebSocket ``s``."""
    request = PullRequest(topic=topic, queue_id=queue_id, offset=0, max_msgs=64)
    send_binary(s, request.to_frame(opaque).encode())
    data = read_binary(s, 5)
    assert data is not None, "the victim did not answer a client it already had"
    reply = decode_frame(data)
    assert reply.opaque == opaque
    rows = PullResponse.from_frame(reply).rows if reply.code == ResponseCode.SUCCESS else ()
    return reply.code, len(rows or ())


def test_strangers_cannot_take_a_followers_descriptors(group: LocalGroup) -> None:
    from client import Admin, Message, Producer

    leader = group.wait_leader()
    victim = next(n for n in group.nodes if n != leader)
    proc = group.nodes[victim].proc
    assert proc is not None
    victim_address, leader_address = group.nodes[victim].http, group.nodes[leader].http
    client = upgrade(victim_address)  # a client the victim had before
    limit = open_descriptors(proc.pid) + HEADROOM
    resource.prlimit(proc.pid, resource.RLIMIT_NOFILE, (limit, limit))
    log = group.base / f"{victim}.log"
    log_before = log.stat().st_size
    strangers: list[socket.socket] = []
    stop = threading.Event()
    flooding = threading.Thread(target=flood, args=(victim_address, strangers, stop), daemon=True)
    try:
        flooding.start()
        flood_started = time.monotonic()
        admin = Admin(servers=[leader_address])
        producer = Producer(servers=[leader_address], group="during-the-flood").start()
        try:
            admin.create_topic("fresh", queues=4)  # new ConsumeQueue files on every replica
            for i in range(MESSAGES):
                producer.send(Message("fresh", b"m%d" % i, keys=[f"k{i}"]), shard_key=str(i))
        finally:
            producer.shutdown()
            admin.close()
        deadline = time.monotonic() + 15
        while True:
            got = [pull(client, 100 + q, "fresh", q) for q in range(4)]
            if sum(n for _, n in got) == MESSAGES:
                break
            assert time.monotonic() < deadline, f"the victim did not apply the new topic's messages: {got}"
            time.sleep(0.2)
        t0 = time.monotonic()
        with pytest.raises((OSError, AssertionError)) as refused:
            upgrade(victim_address, timeout=REFUSAL_WAIT_S).close()  # no room for another client now
        # closed by the victim (or its upgrade refused), not left to wait out its own timeout
        assert not isinstance(refused.value, TimeoutError), \
            f"a refused client waited for its own {REFUSAL_WAIT_S:g} s timeout: {refused.value!r}"
        print(f"\na new client refused after {time.monotonic() - t0:.2f} s: {refused.value!r}")
        time.sleep(max(0.0, FLOOD_S - (time.monotonic() - flood_started)))
        grown = log.stat().st_size - log_before
        flood_s = time.monotonic() - flood_started
        print(f"\nvictim: limit {limit} descriptors, {open_descriptors(proc.pid)} open under "
              f"{len(strangers)} strangers; its log grew {grown} bytes in {flood_s:.1f} s")
        assert grown < 16 << 10, f"the victim logged {grown} bytes in {flood_s:.1f} s"
    finally:
        stop.set()
        flooding.join(10)
        for s in strangers:
            s.close()
        client.close()
    deadline = time.monotonic() + 10
    while True:  # the strangers gone, it takes clients again
        try:
            upgrade(victim_address).close()
            break
        except (OSError, AssertionError):
            assert time.monotonic() < deadline, "the victim took no client after the strangers left"
            time.sleep(0.2)
