"""Verify markers (issue 33): every replica digests its state and reads back its ConsumeQueue
units at the marker's entry, identically; a byte flipped in a ConsumeQueue file behind the
replica's back shows there, naming the queue; units below the marker's CommitLog position
are left out, so a replica restored from a snapshot compares with its peers; and the
verdicts of ``broker.replication.verify_compare``. In memory, no network, but for one in-process
broker answering ``POST /admin/verify``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from broker.http_api.verify import Verifier
from broker.replication.verify_compare import EQUAL, INCOMPLETE, MISMATCH, compare, needs_rows
from broker.state.machine import BrokerStateMachine, Outcome
from broker.state.marker_digest import DONE, MarkerResult, read_back
from broker.store.commands import CreateTopic, DeleteTopic, VerifyMarker, encode_admin
from broker.store.consume_queue import ConsumeQueue
from broker.store.consume_queue_layout import UNIT_SIZE
from raftmq.cluster_verify import EXIT_INCOMPLETE, verify_groups
from tests.support.inprocess_broker import serving_broker
from tests.support.ram_dir import ram_dir
from tests.unit.test_snapshots import SEGMENT, SegmentedLog, message
from tests.unit.test_snapshots import workload as segmented_workload
from tests.unit.test_state_machine import Log, msg, workload


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """pytest's ``tmp_path``, in RAM (``tests.support.ram_dir``: these tests fsync a lot)."""
    yield from ram_dir()


def machine(path: Path, segment_bytes: int | None = None) -> BrokerStateMachine:
    return BrokerStateMachine(path, cq_units_per_file=16, index_slots=64, index_entries=1024,
                              segment_bytes=segment_bytes)


def marker(log: Log | SegmentedLog, marker_id: str = "m1", from_position: int = 0) -> int:
    return log.add([encode_admin(VerifyMarker(marker_id, from_position))]).index


def digested(m: BrokerStateMachine, index: int) -> MarkerResult:
    result = m.markers.get(index)
    assert result is not None and result.done.wait(10), result
    return result


def answers(**results: MarkerResult) -> dict[str, dict[str, object]]:
    return {node: r.summary() for node, r in results.items()}


def test_replicas_digest_alike_at_a_marker_in_any_batching_and_only_what_is_before_it(
        tmp_path: Path) -> None:
    log = workload()
    at = marker(log)
    log.add([msg("orders", 9000 + k, queue=k % 4) for k in range(8)])  # after it: not covered
    a, b = machine(tmp_path / "a"), machine(tmp_path / "b")
    try:
        a.apply(log.entries)
        for i in range(0, len(log.entries), 5):
            b.apply(log.entries[i:i + 5])
        ra, rb = digested(a, at), digested(b, at)
        assert ra.state == rb.state == DONE
        assert (ra.state_digest, ra.queues_digest, ra.rows) == (rb.state_digest, rb.queues_digest, rb.rows)
        assert a.recent_digests()[at] == ra.state_digest  # compared by the divergence check too
        assert ra.units == 305 and len(ra.rows) == 6  # the records before the marker, in 4 + 2 queues
        assert a.results(at)[0].outcome == Outcome.DONE  # type: ignore[index]
        assert a.markers.by_id("m1") is ra and a.markers.last() is ra
        verdict = compare(at, answers(n1=ra, n2=rb))
        assert verdict.outcome == EQUAL and verdict.compared == ["n1", "n2"]
        assert (verdict.queues, verdict.units) == (6, 305)
    finally:
        a.close()
        b.close()


def test_a_replica_replaying_the_marker_after_a_crash_digests_it_alike(tmp_path: Path) -> None:
    log = workload()
    at = marker(log)
    log.add([msg("orders", 9000 + k, queue=k % 4) for k in range(8)])
    whole = machine(tmp_path / "whole")
    crashed = tmp_path / "crashed"
    sm = machine(crashed)
    try:
        whole.apply(log.entries)
        sm.apply(log.entries[:20])
        sm.checkpoint()
        saved = (crashed / "state.checkpoint").read_bytes()
        sm.apply(log.entries)  # past the marker, then the checkpoint lost
        sm.close()
        (crashed / "state.checkpoint").write_bytes(saved)
        sm = machine(crashed)
        assert sm.markers.get(at) is None and sm.applied_index() == 20
        sm.apply(log.entries[20:])
        mine, theirs = digested(sm, at), digested(whole, at)
        assert (mine.state_digest, mine.queues_digest, mine.rows) == (
            theirs.state_digest, theirs.queues_digest, theirs.rows)
    finally:
        whole.close()
        sm.close()


def test_a_consume_queue_byte_flipped_on_disk_behind_a_replicas_back_is_named(tmp_path: Path) -> None:
    log = workload()
    a, b, c = (machine(tmp_path / n) for n in "abc")
    for m in (a, b, c):
        m.apply(log.entries)
    c.close()  # stopped, a byte flipped, restarted
    path = tmp_path / "c" / "consumequeue" / "orders" / "1" / "00000000000000000000"
    data = bytearray(path.read_bytes())
    data[3 * UNIT_SIZE + 31] ^= 0x40  # the fourth unit's store time
    path.write_bytes(bytes(data))
    c = machine(tmp_path / "c")
    at = marker(log)
    try:
        for m in (a, b, c):
            m.apply(log.entries[-1:])
        results = {"n1": digested(a, at), "n2": digested(b, at), "n3": digested(c, at)}
        assert len({r.state_digest for r in results.values()}) == 1  # the running hash never re-reads
        summaries = {n: r.summary() for n, r in results.items()}
        assert needs_rows(summaries)
        verdict = compare(at, summaries, {n: r.rows for n, r in results.items()})
        assert verdict.outcome == MISMATCH and not verdict.not_compared
        (bad,) = verdict.mismatches
        assert bad["replicas"] == ["n3"] and bad["queue"] == ["orders", 1]
        assert "topic orders queue 1" in bad["detail"] and "n1, n2" in bad["detail"]
    finally:
        for m in (a, b, c):
            m.close()


def test_a_replica_restored_from_a_snapshot_compares_from_the_markers_position(tmp_path: Path) -> None:
    log = segmented_workload()
    cut = [e.index for e in log.entries if e.position % SEGMENT == 0 and e.index > 1][2]
    start = log.entries[cut - 1].position  # the restored replica's log starts there
    whole = marker(log, "whole", 0)
    log.add([message("orders", 50_000 + k, queue=k) for k in range(4)])
    from_start = marker(log, "from-start", start)
    peer, new = machine(tmp_path / "peer", SEGMENT), machine(tmp_path / "new", SEGMENT)
    try:
        peer.apply(log.entries)
        data = peer.snapshot_bytes(cut - 1)
        assert data is not None
        new.install_snapshot(cut - 1, data)
        new.apply(log.entries[cut - 1:])
        mine, theirs = digested(new, from_start), digested(peer, from_start)
        assert [r[:6] for r in mine.rows] == [r[:6] for r in theirs.rows]  # not where each holds from
        assert mine.queues_digest == theirs.queues_digest and mine.units < digested(peer, whole).units
        assert compare(from_start, answers(n1=theirs, n2=mine)).outcome == EQUAL
        # From position 0 the restored replica lacks the units before its log: not compared,
        # and not a difference.
        rows = {"n1": digested(peer, whole).rows, "n2": digested(new, whole).rows}
        verdict = compare(whole, answers(n1=digested(peer, whole), n2=digested(new, whole)), rows)
        assert verdict.outcome == INCOMPLETE and not verdict.mismatches
        assert all(n == "n2" and "holds it from offset" in why for n, why in verdict.not_compared)
    finally:
        peer.close()
        new.close()


def test_a_queue_deleted_before_it_is_read_back_leaves_the_result_incomplete_not_different(
        tmp_path: Path) -> None:
    log = workload()
    at = marker(log)
    log.add([encode_admin(DeleteTopic("audit"))])
    log.add([encode_admin(CreateTopic("audit", 2))])
    log.add([msg("audit", 7000 + k, queue=k % 2) for k in range(3)])  # another queue, same name
    m = machine(tmp_path / "m")
    try:
        m.apply(log.entries)  # one apply call: the queues go before the read-back starts
        result = digested(m, at)
        assert result.state == "incomplete" and "topic audit queue 0: it was closed" in result.why
        verdict = compare(at, {"n1": result.summary(), "n2": result.summary()})
        assert verdict.outcome == INCOMPLETE and not verdict.mismatches
    finally:
        m.close()


def test_read_stored_gives_the_units_bytes_as_the_files_hold_them(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "q", units_per_file=2)
    try:
        units = [(1000 * i, 100, 3, 0, 3 * i, 5, 7) for i in range(5)]  # bases 0, 3, 6, 9, 12
        cq.append_many(0, units)
        files = b"".join(p.read_bytes() for p in sorted((tmp_path / "q").iterdir()))
        assert cq.read_stored(0, 100) == files
        assert cq.read_stored(4, 2) == files[UNIT_SIZE:3 * UNIT_SIZE]  # from the unit holding 4
        assert cq.read_stored(15, 4) == b""
        first, count, digest = read_back(cq, 2000, 12)  # units at positions >= 2000, below offset 12
        assert (first, count) == (6, 2) and len(digest) == 32
    finally:
        cq.close()


def test_queue_files_that_do_not_read_back_as_units_give_a_digest_saying_so(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "q", units_per_file=16)
    units = [(1000 * i, 100, 3, 0, 3 * i, 5, 7) for i in range(5)]
    cq.append_many(0, units)
    cq.close()
    path = next((tmp_path / "q").iterdir())
    data = bytearray(path.read_bytes())
    data[4 * UNIT_SIZE + 12:4 * UNIT_SIZE + 14] = b"\x00\x00"  # the last unit's count: ends at 12
    path.write_bytes(bytes(data))
    cq = ConsumeQueue(tmp_path / "q", units_per_file=16)
    try:
        _, _, digest = read_back(cq, 0, 15)
        assert digest.startswith("unreadable: ") and "do not lead on" in digest
    finally:
        cq.close()


def summary(digest: str = "s", queues: str = "q", state: str = "done") -> dict[str, object]:
    return {"state": state, "state_digest": digest, "queues_digest": queues, "queues": 2, "units": 9,
            "from_position": 0}


def test_verdicts_name_the_odd_replica_or_say_what_was_not_compared() -> None:
    odd = compare(7, {"n1": summary(), "n2": summary("x"), "n3": summary()})
    assert odd.outcome == MISMATCH and odd.mismatches[0]["replicas"] == ["n2"]
    assert odd.mismatches[0]["queue"] is None and "n1, n3" in odd.mismatches[0]["detail"]
    tie = compare(7, {"n1": summary("a"), "n2": summary("b"), "n3": "it does not answer"})
    assert tie.outcome == MISMATCH and tie.mismatches[0]["replicas"] == ["n1", "n2"]
    assert "no majority" in tie.mismatches[0]["detail"] and tie.not_compared == [["n3", "it does not answer"]]
    down = compare(7, {"n1": summary(), "n2": summary(), "n3": "it does not answer"})
    assert down.outcome == INCOMPLETE and down.compared == ["n1", "n2"] and not down.mismatches
    alone = compare(7, {"n1": summary(), "n2": {"state": "unknown", "why": "it holds no digest"},
                        "n3": summary(state="incomplete") | {"why": "topic t queue 0: gone"}})
    assert alone.outcome == INCOMPLETE and alone.compared == ["n1"]
    assert [n for n, _ in alone.not_compared] == ["n2", "n3"] and "gone" in alone.not_compared[1][1]
    rows = {"n1": [["t", 0, 0, 4, 2, "d1", 0]], "n2": [["t", 0, 0, 4, 2, "d1", 0]],
            "n3": [["t", 0, 0, 4, 2, "unreadable: short", 0]]}
    bad = compare(7, {"n1": summary(), "n2": summary(), "n3": summary(queues="other")}, rows)
    assert [m["replicas"] for m in bad.mismatches] == [["n3"]] and bad.mismatches[0]["queue"] == ["t", 0]
    assert "unreadable: short" in bad.mismatches[0]["detail"]


@pytest.mark.sockets
def test_post_admin_verify_compares_at_a_marker_and_status_shows_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with serving_broker(tmp_path) as (server, address), aiohttp.ClientSession() as http:
            await server.write.send([encode_admin(CreateTopic("orders", 2))])
            await server.write.send([msg("orders", k, queue=k % 2) for k in range(3)])
            async with http.post(f"http://{address}/admin/verify", json={"timeout_s": 10}) as r:
                assert r.status == 200, await r.text()
                doc = await r.json()
            assert doc["compared"] == ["n1"] and doc["outcome"] == INCOMPLETE  # one replica: no peer
            assert (doc["queues"], doc["units"]) == (2, 3) and doc["index"] >= 3
            async with http.get(f"http://{address}/admin/verify/{doc['index']}?rows=1") as r:
                mine = await r.json()
            assert mine["state"] == DONE and len(mine["rows"]) == 2 and mine["node"] == "n1"
            async with http.get(f"http://{address}/admin/verify/{doc['index'] + 100}") as r:
                assert (await r.json())["state"] == "not applied"
            async with http.get(f"http://{address}/status") as r:
                status = await r.json()
            assert status["last_verify"]["index"] == doc["index"] == status["last_marker"]["index"]
            assert status["last_verify"]["outcome"] == INCOMPLETE and status["log_start_position"] == 0
            assert abs(status["last_verify"]["at_ms"] / 1000 - time.time()) < 60, status["last_verify"]
        assert (tmp_path / "log" / "LAST_VERIFY").exists()  # kept across restarts

    asyncio.run(scenario())


class _FakeView:
    """The parts of a ``ServerView`` the verifier's gathering reads: this replica's name and
    data directory (``_ask`` is replaced, so no machine and no HTTP)."""

    def __init__(self, data_dir: Path) -> None:
        self.rlog = SimpleNamespace(config=SimpleNamespace(data_dir=data_dir, node="n1"))


class _FakeHttp:
    """``ClusterHttp`` as ``raftmq cluster verify`` uses it: /status of each replica, and the
    leader's answer to POST /admin/verify."""

    def __init__(self, statuses: dict[str, dict[str, Any]], verdict: dict[str, Any]) -> None:
        self.statuses, self.verdict = statuses, verdict
        self.posted: list[tuple[str, str, Any]] = []

    def get(self, address: str, path: str, timeout: float = 5.0) -> Any:
        assert path == "/status"
        return self.statuses[address]

    def call(self, address: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 30.0) -> tuple[int, dict[str, Any]]:
        self.posted.append((address, path, body))
        return 200, self.verdict


def test_a_replica_up_but_behind_at_the_deadline_is_named_and_verify_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 33: the deadline names a replica that answers but has not applied the marker
    ("it is behind"), distinct from one down; ``raftmq cluster verify`` then exits 2 (not
    compared), not 0 and not 1."""
    asked: dict[str, int] = {}

    async def ask(node: str, address: str, index: int, headers: Any, rows: bool = False) -> dict[str, Any]:
        asked[node] = asked.get(node, 0) + 1
        if node == "n3":
            return {"index": index, "state": "not applied", "applied_index": 40,
                    "why": "it has applied entries up to 40 only"}
        return {**summary(), "index": index, "applied_index": index}

    verifier = Verifier(_FakeView(tmp_path))  # type: ignore[arg-type]
    verifier._ask = ask  # type: ignore[method-assign]
    members = {"n1": "a:1", "n2": "a:2", "n3": "a:3"}
    answers = asyncio.run(verifier._gather(members, 50, 0.5, {}))
    assert answers["n3"] == ("it had applied entries up to 40 only, not the marker at 50, after 0.5 s: "
                             "it is behind")
    assert asked["n3"] >= 2 and asked["n1"] == asked["n2"] == 1, "polled until the deadline, not once"
    comparison = compare(50, answers)
    assert comparison.outcome == INCOMPLETE and comparison.compared == ["n1", "n2"]

    statuses = {a: {"role": "leader" if n == "n1" else "follower", "healthy": True, "state_digests": {}}
                for n, a in members.items()}
    http = _FakeHttp(statuses, {"group": "g1", "leader": "n1", **comparison.to_json()})
    assert verify_groups({"g1": members}, http, 0.5) == EXIT_INCOMPLETE == 2  # type: ignore[arg-type]
    assert http.posted == [("a:1", "/admin/verify", {"timeout_s": 0.5})]
    out = capsys.readouterr().out
    assert "g1: could not compare replica n3 at index 50 (marker): it had applied entries up to 40" in out
    assert "it is behind" in out and "verify: INCOMPLETE" in out and "verify: OK" not in out
