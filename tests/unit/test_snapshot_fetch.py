"""Snapshot transfer in checksummed chunks, resumed where a broken transfer stopped."""

from __future__ import annotations

import hashlib
import zlib
from pathlib import Path
from typing import Any

import pytest

from dledger.raft.snapshot_fetch import CHUNK_BYTES, PART, REQUEST_TIMEOUT_S, SnapshotFetch
from dledger.storage.log_start import StateRef

SNAP = bytes(range(256)) * (CHUNK_BYTES * 4 // 256) + b"tail"  # 4 chunks and 4 bytes
REF = StateRef(41, len(SNAP), hashlib.sha256(SNAP).hexdigest())


class Net:
    """Replicas by name; messages are delivered when ``run`` is called (or dropped)."""

    def __init__(self) -> None:
        self.nodes: dict[str, SnapshotFetch] = {}
        self.queue: list[tuple[str, str, dict[str, Any]]] = []
        self.drop: set[str] = set()  # replicas whose messages are lost
        self.served: list[tuple[str, int]] = []  # (server, offset) of every chunk answered

    def send_from(self, sender: str) -> Any:
        def send(node: str, message: dict[str, Any]) -> None:
            self.queue.append((sender, node, message))
        return send

    def run(self, limit: int = 100) -> None:
        for _ in range(limit):
            if not self.queue:
                return
            sender, to, message = self.queue.pop(0)
            if sender in self.drop or to in self.drop:
                continue
            if message["type"] == "snapshot_chunk" and "data" in message:
                self.served.append((sender, message["offset"]))
            assert self.nodes[to].on_message(sender, message)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def replica(net: Net, name: str, tmp: Path, clock: Clock, held: dict[int, bytes] | None = None,
            leader: str | None = "n1", got: list[tuple[int, bytes]] | None = None,
            reachable: int = 0) -> SnapshotFetch:
    d = tmp / name
    d.mkdir(exist_ok=True)
    others = [n for n in ("n1", "n2", "n3") if n != name]
    fetch = SnapshotFetch(d, members=lambda: others, leader=lambda: leader, send=net.send_from(name),
                          snapshot_bytes=lambda i: (held or {}).get(i),
                          done=lambda i, data: (got if got is not None else []).append((i, data)),
                          held_indexes=lambda: sorted(held or {}), reachable=lambda: reachable,
                          clock=clock)
    net.nodes[name] = fetch
    return fetch


def test_a_snapshot_arrives_in_chunks_and_is_verified(tmp_path: Path) -> None:
    net, clock, got = Net(), Clock(), []
    replica(net, "n1", tmp_path, clock, held={41: SNAP})
    replica(net, "n2", tmp_path, clock, held={41: SNAP})
    f = replica(net, "n3", tmp_path, clock, got=got)
    f.want(REF)
    assert f.progress() == {"index": 41, "received": 0, "size": len(SNAP), "from": None}
    f.tick()
    net.run()
    assert got == [(41, SNAP)]
    assert [o for _, o in net.served] == [i * CHUNK_BYTES for i in range(5)]
    assert {s for s, _ in net.served} == {"n1"}  # the leader first
    assert f.wanted is None and not (tmp_path / "n3" / PART).exists()


def test_a_broken_transfer_resumes_where_it_stopped_also_after_a_restart(tmp_path: Path) -> None:
    net, clock, got = Net(), Clock(), []
    replica(net, "n1", tmp_path, clock, held={41: SNAP})
    replica(net, "n2", tmp_path, clock)  # does not hold it
    f = replica(net, "n3", tmp_path, clock, got=got)
    f.want(REF)
    f.tick()
    net.run(limit=4)  # two chunks arrive, then the link breaks
    net.drop.add("n1")
    net.run()
    assert f.progress()["received"] == 2 * CHUNK_BYTES  # type: ignore[index]
    # the follower restarts: the part file says where to go on
    f = replica(net, "n3", tmp_path, clock, got=got)
    assert f.wanted == REF and f.progress()["received"] == 2 * CHUNK_BYTES  # type: ignore[index]
    f.tick()  # asks n1 (the leader): no answer
    net.run()
    clock.now += REQUEST_TIMEOUT_S + 0.1
    f.tick()  # asks n2: "not held"
    net.run()
    net.drop.clear()
    f.tick()  # back to n1
    net.run()
    assert got == [(41, SNAP)]
    offsets = [o for _, o in net.served]
    assert offsets == [0, CHUNK_BYTES, 2 * CHUNK_BYTES, 3 * CHUNK_BYTES, 4 * CHUNK_BYTES]  # nothing twice


def test_a_damaged_chunk_is_asked_for_again_and_a_damaged_whole_is_fetched_again(tmp_path: Path) -> None:
    net, clock, got = Net(), Clock(), []
    replica(net, "n1", tmp_path, clock, held={41: SNAP})
    f = replica(net, "n3", tmp_path, clock, got=got)
    f.want(REF)
    f.tick()
    sender, to, reply = net.queue.pop(0)
    net.nodes[to].on_message(sender, reply)  # n1 answers chunk 0
    _, _, chunk = net.queue.pop(0)
    f.on_message("n1", {**chunk, "data": b"X" + chunk["data"][1:]})  # damaged on the way
    assert f.progress()["received"] == 0  # type: ignore[index]
    clock.now += REQUEST_TIMEOUT_S + 0.1
    f.tick()
    net.run()
    assert got == [(41, SNAP)]

    # a part file damaged on disk (here: after a crash) fails the SHA-256: fetched again
    got.clear()
    f.want(StateRef(42, len(SNAP), REF.sha256))
    part = tmp_path / "n3" / PART
    part.write_bytes(b"\0" * len(SNAP))
    f = replica(net, "n3", tmp_path, clock, got=got)
    net.nodes["n1"] = replica(net, "n1", tmp_path, clock, held={42: SNAP})
    f.tick()
    net.run()
    assert f.restarts == 1 and got == [(42, SNAP)]


@pytest.mark.parametrize("bad", [
    {"offset": 5},                                 # not where the follower is
    {"data": b"x" * (CHUNK_BYTES + 1)},            # larger than a chunk
    {"total": 7},                                  # another snapshot's size
    {"sha256": "0" * 64},                          # another snapshot
    {"crc32": 1},                                  # damaged
    {"data": "text"},                              # not bytes
])
def test_a_hostile_or_stale_chunk_changes_nothing(tmp_path: Path, bad: dict[str, Any]) -> None:
    net, clock, got = Net(), Clock(), []
    f = replica(net, "n3", tmp_path, clock, got=got)
    f.want(REF)
    f.tick()
    net.queue.clear()
    chunk = SNAP[:CHUNK_BYTES]
    message = {"type": "snapshot_chunk", "index": 41, "offset": 0, "total": len(SNAP),
               "sha256": REF.sha256, "data": chunk, "crc32": zlib.crc32(chunk), **bad}
    assert f.on_message("n1", message)
    assert f.progress()["received"] == 0 and not got  # type: ignore[index]
    assert f.on_message("n2", {**message, **{"offset": 0, "data": chunk, "crc32": zlib.crc32(chunk)}})
    assert f.progress()["received"] == 0  # type: ignore[index]  # not asked of n2


def test_the_serving_side_answers_only_what_it_holds(tmp_path: Path) -> None:
    net, clock = Net(), Clock()
    server = replica(net, "n1", tmp_path, clock, held={41: SNAP})
    for request, expect in [({"index": 41, "offset": len(SNAP) + 10, "sha256": REF.sha256}, b""),
                            ({"index": 40, "offset": 0, "sha256": REF.sha256}, "not held"),
                            ({"index": 41, "offset": 0, "sha256": "f" * 64}, "another snapshot"),
                            ({"index": "41", "offset": 0}, None), ({"index": 41, "offset": -1}, None)]:
        net.queue.clear()
        assert server.on_message("n3", {"type": "snapshot_read", **request})
        if expect is None:
            assert not net.queue
        else:
            (_, _, reply), = net.queue
            assert reply.get("data", reply.get("error", "")).startswith(expect)
    assert not server.on_message("n3", {"type": "append_entries"})


def test_a_snapshot_larger_than_accepted_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    net, clock = Net(), Clock()
    f = replica(net, "n3", tmp_path, clock)
    f.want(StateRef(41, 1 << 40, REF.sha256))
    assert f.wanted is None and "more than this replica accepts" in caplog.text


LATER = b"the state after entry 300" * 1000


def test_a_snapshot_no_member_holds_any_more_is_replaced_by_a_later_one_within_reach(
        tmp_path: Path) -> None:
    """CI run 1 of 9846a9b (tests/cluster/test_membership_cluster.py, grow to five): the
    snapshot a new replica's log-start dump named (41 here) was pruned on every member by
    retention while the replica was still fetching it -- its log was caught up, so nothing
    held it back -- and it asked for it for ever, never applying. A member holding a later
    snapshot the replica's committed log reaches (300 <= 500) offers it; one beyond reach
    (900) is not taken."""
    net, clock, got = Net(), Clock(), []
    replica(net, "n1", tmp_path, clock, held={900: b"beyond"})
    replica(net, "n2", tmp_path, clock, held={300: LATER, 900: b"beyond"})
    f = replica(net, "n3", tmp_path, clock, got=got, reachable=500)
    f.want(REF)
    for _ in range(4):
        f.tick()
        net.run()
        clock.now += REQUEST_TIMEOUT_S
    assert got == [(300, LATER)]
    assert f.wanted is None


def test_without_a_later_snapshot_within_reach_the_fetch_keeps_asking(tmp_path: Path) -> None:
    net, clock, got = Net(), Clock(), []
    replica(net, "n1", tmp_path, clock, held={900: b"beyond"})
    replica(net, "n2", tmp_path, clock, held={40: b"older"})
    f = replica(net, "n3", tmp_path, clock, got=got, reachable=500)
    f.want(REF)
    for _ in range(4):
        f.tick()
        net.run()
        clock.now += REQUEST_TIMEOUT_S
    assert got == [] and f.wanted == REF


def test_a_later_offer_too_large_is_not_taken_and_a_repeated_install_keeps_the_later_fetch(
        tmp_path: Path) -> None:
    net, clock, got = Net(), Clock(), []
    replica(net, "n1", tmp_path, clock, held={300: LATER})
    f = replica(net, "n3", tmp_path, clock, got=got, reachable=500)
    f.want(REF)
    f.tick()
    net.run(limit=1)  # n3's request reaches n1 ...
    assert f.wanted == REF
    net.run(limit=1)  # ... whose answer offers the later one: taken
    assert f.wanted is not None and f.wanted.index == 300
    f.want(REF)  # the leader's install of the named one again: the later fetch goes on
    assert f.wanted.index == 300
    f.tick()
    net.run()
    assert got == [(300, LATER)]
    huge = replica(net, "n2", tmp_path, clock, got=[], reachable=500)
    huge.want(REF)
    huge._ask_from("n1")  # n1 offers 300: pretend it is larger than a replica accepts
    assert any(sender == "n2" for sender, _, _ in net.queue)
    net.queue.clear()
    reply = {"type": "snapshot_chunk", "index": REF.index, "offset": 0, "error": "not held",
             "later": {"index": 300, "size": 1 << 40, "sha256": "0" * 64}}
    huge.on_message("n1", reply)
    assert huge.wanted == REF, "an offer larger than accepted is not taken"
