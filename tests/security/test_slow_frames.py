"""The client port against slow and silent clients, on real broker processes (issue 15, row 5).

Before: 40 WebSocket connections each sending 7 MiB of a frame declared 8 MiB, then a byte
every 20 s, took the leader's RSS from 139 to 433 MB and held it, with no deadline, no idle
timeout and no cap on connections. Now a frame must arrive within ``frame_deadline_s`` (the
connection is closed with 1008 and the reason), frames still arriving hold at most
``max_partial_frame_bytes`` of all connections together, an idle connection is closed, and
connections beyond the per-address cap are refused with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from raftmq.local_group import LocalGroup
from tests.support.broker_group import create_topic, running_brokers, servers
from tests.support.procs import rss_bytes
from tests.support.raw_ws import FrameInbox, frame_header, read_close, upgrade

pytestmark = [pytest.mark.cluster]

LIMITS = {"frame_deadline_s": 4, "idle_timeout_s": 8, "max_partial_frame_bytes": 64 << 20,
          "max_connections_per_address": 128}  # two attacks back to back: the first's still closing
ATTACKERS = 40
DECLARED, SENT = 8 << 20, 7 << 20


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalGroup]:
    with running_brokers(tmp_path_factory.mktemp("slow") / "g", **LIMITS) as g:
        create_topic(g, "t", 1)
        yield g


def leader_of(group: LocalGroup) -> tuple[str, int]:
    name = group.wait_leader()
    proc = group.nodes[name].proc
    assert proc is not None
    return group.nodes[name].http, proc.pid


def slow_sender(address: str, until: float, closes: list[tuple[int, str, float]]) -> None:
    """7 MiB of a frame declared 8 MiB as fast as the broker takes them, then a byte every
    second until the broker closes the connection or ``until``; the close goes to ``closes``.
    Like a real client it reads while it sends (the broker cuts the connection CLOSE_WAIT_S
    after its close frame)."""
    try:
        s = upgrade(address)
    except (OSError, AssertionError) as e:
        closes.append((-1, f"upgrade failed: {e}", time.monotonic()))
        return
    started = time.monotonic()
    s.settimeout(0.5)
    inbox = FrameInbox(s)
    chunk = b"\0" * (256 << 10)
    try:
        s.sendall(frame_header(DECLARED))
        sent = 0
        while sent < SENT and time.monotonic() < until and inbox.ended is None:
            with contextlib.suppress(TimeoutError):  # the broker stopped reading: its budget
                sent += s.send(chunk)
            if (got := inbox.close_frame(0)) is not None:
                closes.append((*got, time.monotonic() - started))
                return
        while time.monotonic() < until and inbox.ended is None:
            with contextlib.suppress(OSError):
                s.send(b"\0")
            if (got := inbox.close_frame(1.0)) is not None:
                closes.append((*got, time.monotonic() - started))
                return
        how = "never closed" if inbox.ended is None else f"ended without a close frame ({inbox.ended})"
        closes.append((0, how, time.monotonic() - started))
    except OSError as e:
        closes.append((0, f"{type(e).__name__}: {e}", time.monotonic() - started))
    finally:
        s.close()


def test_an_idle_websocket_is_closed_with_a_reason(group: LocalGroup) -> None:
    address, _ = leader_of(group)
    s = upgrade(address)
    try:
        got = read_close(s, LIMITS["idle_timeout_s"] + 5)
    finally:
        s.close()
    assert got is not None, "an idle WebSocket was kept open"
    code, reason = got
    assert code == 1000 and "idle for 8 s" in reason, got


def test_connections_beyond_the_per_address_cap_are_refused_with_the_reason(group: LocalGroup) -> None:
    from client.aio.connection import ConnectionPool
    from client.errors import ConnectionLostError

    address, _ = leader_of(group)
    held: list[socket.socket] = []
    try:
        while len(held) < LIMITS["max_connections_per_address"]:
            try:
                held.append(upgrade(address))
            except AssertionError as e:  # a client of an earlier test may hold one still
                assert "too many connections" in str(e)
                break
        with pytest.raises(AssertionError, match=r"(?s)503.*too many connections from 127\.0\.0\.1"):
            upgrade(address).close()

        async def connect() -> None:
            pool = ConnectionPool()
            try:
                await pool.get(address)
            finally:
                await pool.close()

        with pytest.raises(ConnectionLostError, match=r"503 too many connections from 127\.0\.0\.1"):
            asyncio.run(connect())
    finally:
        for s in held:
            s.close()
    assert poll(lambda: upgrade(address).close() is None, 10), "no room again after the connections closed"


def poll(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if predicate():  # type: ignore[operator]
                return True
        time.sleep(0.1)
    return False


def attack(address: str, pid: int) -> tuple[int, list[tuple[int, str, float]]]:
    """ATTACKERS slow senders at once, until each is closed; (peak RSS, their closes)."""
    closes: list[tuple[int, str, float]] = []
    until = time.monotonic() + LIMITS["frame_deadline_s"] + 20
    threads = [threading.Thread(target=slow_sender, args=(address, until, closes), daemon=True)
               for _ in range(ATTACKERS)]
    for t in threads:
        t.start()
    peak = 0
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_bytes(pid))
        time.sleep(0.1)
    for t in threads:
        t.join(5)
    return peak, closes


def test_slow_senders_of_huge_frames_are_cut_off_and_their_memory_is_bounded(group: LocalGroup) -> None:
    address, pid = leader_of(group)
    before = rss_bytes(pid)
    peaks = []
    for _ in range(2):  # the second attack reuses what the first took: nothing accumulates
        peak, closes = attack(address, pid)
        peaks.append(peak)
        assert len(closes) == ATTACKERS
        cut = [c for c in closes if c[0] == 1008 and "frame took longer than 4 s" in c[1]]
        assert len(cut) == ATTACKERS, f"not cut off with 1008 and the reason: {set(closes) - set(cut)}"
        assert max(c[2] for c in cut) < LIMITS["frame_deadline_s"] + 6, "a frame was held past its deadline"
    print(f"\nleader RSS {before >> 20} MiB before, peaks {[p >> 20 for p in peaks]} MiB under two attacks "
          f"of {ATTACKERS} slow senders of {SENT >> 20} MiB each, {rss_bytes(pid) >> 20} MiB after")
    assert peaks[0] - before < 120 << 20, f"frames still arriving held {(peaks[0] - before) >> 20} MiB"
    assert peaks[1] - peaks[0] < 24 << 20, f"the second attack took {(peaks[1] - peaks[0]) >> 20} MiB more"
    from client import Message, Producer

    producer = Producer(servers=servers(group), group="after-the-attack").start()
    try:
        assert producer.send(Message("t", b"still serving")).queue_offset >= 0
    finally:
        producer.shutdown()
