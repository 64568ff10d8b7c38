"""The Raft port against a hostile client (issue 15, rows 4 and 6): nothing a stranger sends
is buffered beyond a small bound before the connection has proved it knows the group's
secret, a connection that does not finish its handshake is closed, and the group keeps
replicating meanwhile."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dledger.raft.peer_guard import HANDSHAKE_TIMEOUT_S, MAX_PENDING_HANDSHAKES
from raftmq.local_group import LocalGroup
from tests.support.procs import led, rss_bytes

pytestmark = [pytest.mark.cluster]


@pytest.fixture
def group(tmp_path: Path) -> Iterator[LocalGroup]:
    with led(LocalGroup(tmp_path / "group", 3), LocalGroup.wait_leader) as g:
        yield g


def dial(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    return s


def wait_closed(s: socket.socket, timeout: float) -> bool:
    """True once the peer closed ``s`` (EOF or reset) within ``timeout``."""
    s.settimeout(0.2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if s.recv(4096) == b"":
                return True
        except TimeoutError:
            continue
        except OSError:
            return True
    return False


def poll(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_a_huge_frame_before_authentication_is_not_buffered(group: LocalGroup) -> None:
    victim = next(n for n in group.nodes if n != group.wait_leader())
    proc = group.nodes[victim].proc
    assert proc is not None
    before = rss_bytes(proc.pid)
    s = dial(group.nodes[victim].raft)
    sent = 0
    chunk = b"\0" * (1 << 20)
    try:
        s.sendall(struct.pack("i", 2**31 - 1))
        deadline = time.monotonic() + 30
        while sent < (256 << 20) and time.monotonic() < deadline:
            s.sendall(chunk)
            sent += len(chunk)
    except OSError:
        pass  # closed by the node: what should happen
    finally:
        s.close()
    assert sent < (32 << 20), f"the node took {sent >> 20} MiB of a frame no peer may send"
    assert rss_bytes(proc.pid) - before < (32 << 20)
    assert "before authentication" in group.log_tail(victim, 50)
    index, _ = group.propose(group.wait_leader(), b"still replicating")
    assert index > 0


def test_a_connection_that_never_finishes_its_handshake_is_closed(group: LocalGroup) -> None:
    address = group.nodes["n1"].raft
    silent = dial(address)
    trickle = dial(address)
    try:
        trickle.sendall(struct.pack("i", 40))  # a small frame, one byte at a time
        started = time.monotonic()
        closed_trickle = False
        while time.monotonic() - started < HANDSHAKE_TIMEOUT_S + 10:
            try:
                trickle.sendall(b"x")
            except OSError:
                closed_trickle = True
                break
            if wait_closed(trickle, 0.5):
                closed_trickle = True
                break
        assert closed_trickle, "a handshake trickled one byte at a time was kept open"
        assert wait_closed(silent, HANDSHAKE_TIMEOUT_S + 5), "a silent connection was kept open"
    finally:
        silent.close()
        trickle.close()


def test_idle_strangers_cannot_hold_the_port_and_the_group_keeps_replicating(
        group: LocalGroup) -> None:
    leader = group.wait_leader()
    victim = next(n for n in group.nodes if n != leader)
    strangers = [dial(group.nodes[victim].raft) for _ in range(MAX_PENDING_HANDSHAKES * 3)]
    try:
        for i in range(20):  # a follower keeps taking entries while strangers crowd its port
            group.propose(group.wait_leader(), f"entry {i}".encode())
        target = group.status(leader)["commit_index"]  # type: ignore[index]
        assert poll(lambda: (group.status(victim) or {}).get("commit_index", 0) >= target, 10)
        open_now = sum(1 for s in strangers if not wait_closed(s, 0.01))
        assert open_now <= MAX_PENDING_HANDSHAKES, f"{open_now} unauthenticated connections held"
        assert all(wait_closed(s, HANDSHAKE_TIMEOUT_S + 5) for s in strangers)
    finally:
        for s in strangers:
            s.close()
