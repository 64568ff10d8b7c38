"""POP state (issue 29, ``broker.state.pops``) through the apply step alone: records in
entries stamped with store times, no clock, no network. Claims, acks, stale receipts,
invisibility ends, changes, the cap, the retry policy, checkpoint/snapshot form and replay."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.state import pops
from broker.state.machine import BrokerStateMachine, Outcome
from broker.state.pops import DEFAULT_POLICY, InFlight, PopTables, RetryPolicy
from broker.state.snapshot import Snapshot
from broker.store.commands import CreateTopic, DeleteTopic, decode_admin, encode_admin
from broker.store.pop_commands import GroupPolicy, PopAck, PopClaim, PopDead, PopInvisible
from tests.support.ram_dir import ram_dir
from tests.unit.test_state_machine import Log, msg

T0 = 1_700_000_000_000


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    yield from ram_dir()


def _machine(root: Path) -> BrokerStateMachine:
    return BrokerStateMachine(root, index_slots=8, index_entries=64)


def _apply(sm: BrokerStateMachine, log: Log, records: list[bytes],
           stamp: int) -> list[tuple[Outcome, int, int, int]]:
    entry = log.add(records, stamp)
    sm.apply([entry])
    results = sm.results(entry.index)
    assert results is not None
    return [(r.outcome, r.queue_id, r.queue_offset, r.position) for r in results]


def claim(offset: int, ms: int, group: str = "g") -> bytes:
    return encode_admin(PopClaim(group, "jobs", 0, offset, ms))


def ack(offset: int, delivery: int) -> bytes:
    return encode_admin(PopAck("g", "jobs", 0, offset, delivery))


def invisible(offset: int, delivery: int, ms: int) -> bytes:
    return encode_admin(PopInvisible("g", "jobs", 0, offset, delivery, ms))


def _with_messages(sm: BrokerStateMachine, log: Log, count: int = 4) -> None:
    _apply(sm, log, [encode_admin(CreateTopic("jobs", 2))], T0)
    _apply(sm, log, [msg("jobs", i, queue=0) for i in range(count)], T0)


def test_the_records_round_trip() -> None:
    for record in (GroupPolicy("g", (1000, 5000), 3), PopClaim("g", "jobs", 1, 7, 30_000),
                   PopAck("g", "jobs", 1, 7, 2), PopInvisible("g", "jobs", 1, 7, 2, 500),
                   PopDead("g", "jobs", 1, 7, 4)):
        assert decode_admin(encode_admin(record)) == record
    with pytest.raises(ValueError):
        decode_admin(encode_admin(GroupPolicy("g", (), 3)))  # no backoff step
    with pytest.raises(ValueError):
        decode_admin(encode_admin(PopAck("g", "jobs", 1, 7, 0)))  # deliveries start at 1


def test_a_claimed_message_is_invisible_until_its_deadline_then_delivered_again(tmp_path: Path) -> None:
    sm, log = _machine(tmp_path), Log()
    _with_messages(sm, log)
    assert _apply(sm, log, [claim(0, 10_000)], T0) == [(Outcome.DONE, 0, 0, 1)]
    # another consumer's claim before the deadline is refused; at the deadline it is delivery 2
    (refused,) = _apply(sm, log, [claim(0, 10_000)], T0 + 9_999)
    assert refused[0] == Outcome.LOCKED
    assert _apply(sm, log, [claim(0, 10_000)], T0 + 10_000) == [
        (Outcome.DONE, 0, 0, 2)]
    assert sm.pops.in_flight("g", "jobs") == [InFlight(0, 0, T0 + 20_000, 2)]
    # the first holder's ack is stale; the second's settles it
    (stale,) = _apply(sm, log, [ack(0, 1)], T0 + 10_001)
    assert stale[0] == Outcome.INVALID
    assert _apply(sm, log, [ack(0, 2)], T0 + 10_002) == [(Outcome.DONE, 0, 0, 2)]
    assert sm.pops.in_flight("g", "jobs") == []
    (again,) = _apply(sm, log, [ack(0, 2)], T0 + 10_003)
    assert again[0] == Outcome.DUPLICATE  # an ack resent after a lost answer
    (settled,) = _apply(sm, log, [claim(0, 10_000)], T0 + 99_000)
    assert settled[0] == Outcome.DUPLICATE  # an acked message never comes back


def test_claims_go_in_order_and_stop_at_the_queue_end(tmp_path: Path) -> None:
    sm, log = _machine(tmp_path), Log()
    _with_messages(sm, log, count=3)
    claims = [claim(o, 1000) for o in (0, 2, 1, 3, 2)]
    got = _apply(sm, log, claims, T0)
    assert [g[0] for g in got] == [Outcome.DONE, Outcome.INVALID, Outcome.DONE, Outcome.INVALID, Outcome.DONE]
    assert sm.pops.next_offset("g", "jobs", 0) == 3
    # a message stored in the same entry as its claim can be claimed
    got = _apply(sm, log, [msg("jobs", 9, queue=0), claim(3, 1000)], T0)
    assert got[1] == (Outcome.DONE, 0, 3, 1)
    # another group has a window of its own
    assert _apply(sm, log, [claim(1, 1000, "h")], T0)[0][0] == Outcome.DONE


def test_changing_the_invisibility_extends_or_shortens_the_lease(tmp_path: Path) -> None:
    sm, log = _machine(tmp_path), Log()
    _with_messages(sm, log)
    _apply(sm, log, [claim(0, 1_000)], T0)
    assert _apply(sm, log, [invisible(0, 1, 60_000)], T0 + 900)[0][0] == Outcome.DONE
    (held,) = _apply(sm, log, [claim(0, 1_000)], T0 + 30_000)
    assert held[0] == Outcome.LOCKED  # extended past the first deadline
    _apply(sm, log, [invisible(0, 1, 0)], T0 + 30_001)  # a nack with no backoff
    assert _apply(sm, log, [claim(0, 1_000)], T0 + 30_001) == [
        (Outcome.DONE, 0, 0, 2)]


def test_the_floor_passes_settled_messages_and_the_cap_bounds_the_window(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pops, "MAX_IN_FLIGHT", 3)
    sm, log = _machine(tmp_path), Log()
    _with_messages(sm, log, count=6)
    got = _apply(sm, log, [claim(o, 1000) for o in range(4)], T0)
    assert [g[0] for g in got] == [Outcome.DONE] * 3 + [Outcome.IN_FLIGHT_CAP]
    assert sm.pops.span("g") == 3
    _apply(sm, log, [ack(1, 1), ack(2, 1)], T0)
    assert sm.pops.span("g") == 3  # offset 0 is still held: the window stays open
    assert _apply(sm, log, [claim(3, 1000)], T0)[0][0] == Outcome.IN_FLIGHT_CAP
    _apply(sm, log, [encode_admin(PopDead("g", "jobs", 0, 0, 1))], T0)
    assert sm.pops.span("g") == 0 and sm.pops.state()["pops"]["g\x00jobs\x000"] == [3, 3, [], []]
    assert _apply(sm, log, [claim(3, 1000)], T0)[0][0] == Outcome.DONE


def test_the_retry_policy_is_kept_in_the_log(tmp_path: Path) -> None:
    sm, log = _machine(tmp_path), Log()
    assert sm.pops.policy("g") == DEFAULT_POLICY
    _apply(sm, log, [encode_admin(GroupPolicy("g", (1_000, 5_000, 30_000), 4))], T0)
    policy = sm.pops.policy("g")
    assert policy == RetryPolicy((1_000, 5_000, 30_000), 4)
    assert [policy.backoff_after(n) for n in (1, 2, 3, 4, 9)] == [1_000, 5_000, 30_000, 30_000, 30_000]


def test_pop_state_is_in_the_checkpoint_and_a_restart_and_a_replay_agree(tmp_path: Path) -> None:
    log = Log()
    first = _machine(tmp_path / "a")
    before = first._state.state()
    assert "pops" not in before and "retry" not in before  # no POP: the state keeps its form
    _with_messages(first, log)
    _apply(first, log, [encode_admin(GroupPolicy("g", (2_000,), 3))], T0)
    _apply(first, log, [claim(o, 5_000) for o in range(3)], T0)
    _apply(first, log, [ack(1, 1)], T0 + 10)
    state = first._state.state()
    assert state["pops"] == {"g\x00jobs\x000": [3, 0, [1], [[0, T0 + 5_000, 1], [2, T0 + 5_000, 1]]]}
    assert state["retry"] == {"g": [[2_000], 3]}
    first.checkpoint()
    first.close()
    restarted = _machine(tmp_path / "a")
    assert restarted._state.state() == state and restarted.pops.span("g") == 3
    replica = _machine(tmp_path / "b")  # another replica, the same entries in other batches
    replica.apply(log.entries[:3])
    replica.apply(log.entries[3:])
    assert replica._state.state() == state
    _apply(restarted, Log(), [encode_admin(DeleteTopic("jobs"))], T0 + 20)
    assert "pops" not in restarted._state.state() and restarted.pops.span("g") == 0
    restarted.close()
    replica.close()


def test_tables_load_their_own_form() -> None:
    tables = PopTables({"g\x00jobs\x001": [5, 2, [4], [[2, 99, 3], [3, 98, 1]]]}, {"g": [[1_000], 2]})
    assert tables.in_flight("g", "jobs") == [InFlight(1, 3, 98, 1), InFlight(1, 2, 99, 3)]
    assert tables.span("g") == 3 and tables.groups() == {"g": 2}
    assert tables.state()["pops"] == {"g\x00jobs\x001": [5, 2, [4], [[2, 99, 3], [3, 98, 1]]]}


_OPS = st.lists(st.tuples(st.sampled_from(["claim", "ack", "invisible", "dead"]), st.integers(0, 7),
                          st.integers(1, 3), st.integers(0, 5_000), st.integers(0, 3_000)),
                max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS)
def test_any_history_keeps_the_window_invariants_and_replicas_agree(
        ops: list[tuple[str, int, int, int, int]]) -> None:
    """Random claims, acks, changes and dead-letters (offsets 0..7, deliveries 1..3, store
    times moving forward): a message is never in flight and settled at once, the floor only
    moves past settled offsets, the span is what the windows hold, nothing settled is claimed
    again; a replica applying the same records from the checkpoint form agrees."""
    tables, now, queue_end = PopTables(), T0, 6
    settled: set[int] = set()
    for kind, offset, delivery, ms, advance in ops:
        now += advance
        record = {"claim": PopClaim("g", "jobs", 0, offset, ms),
                  "ack": PopAck("g", "jobs", 0, offset, delivery),
                  "invisible": PopInvisible("g", "jobs", 0, offset, delivery, ms),
                  "dead": PopDead("g", "jobs", 0, offset, delivery)}[kind]
        outcome = tables.apply(record, now, queue_end)[0]
        if kind == "claim" and offset in settled:
            assert outcome == Outcome.DUPLICATE  # a settled message is never handed out again
        if kind in ("ack", "dead") and outcome == Outcome.DONE:
            settled.add(offset)
        state = tables.state().get("pops", {}).get("g\x00jobs\x000")
        if state is None:
            continue
        next_offset, floor, above, held = state
        held_offsets = {o for o, _, _ in held}
        assert floor <= next_offset <= queue_end
        assert not held_offsets & set(above) and all(floor < o < next_offset for o in above)
        assert held_offsets <= set(range(floor, next_offset))
        assert set(range(floor, next_offset)) == held_offsets | set(above)
        assert {o for o in settled if o >= floor} == set(above)  # the ones acked above the floor
        assert tables.span("g") == next_offset - floor
        replica = PopTables(tables.state().get("pops"), tables.state().get("retry"))
        assert replica.state() == tables.state() and replica.span("g") == tables.span("g")


def test_an_ordered_group_has_one_message_of_a_queue_in_flight_at_a_time(tmp_path: Path) -> None:
    sm, log = _machine(tmp_path), Log()
    _with_messages(sm, log, count=3)
    policy = GroupPolicy("g", (1_000,), 5, ordered=True)
    assert decode_admin(encode_admin(policy)) == policy
    _apply(sm, log, [encode_admin(policy)], T0)
    got = _apply(sm, log, [claim(0, 10_000), claim(1, 10_000)], T0)
    assert [g[0] for g in got] == [Outcome.DONE, Outcome.LOCKED]  # 1 waits for 0
    _apply(sm, log, [invisible(0, 1, 0)], T0 + 1)  # a nack: 0 comes back first, 1 still waits
    got = _apply(sm, log, [claim(1, 10_000), claim(0, 10_000)], T0 + 2)
    assert [g[0] for g in got] == [Outcome.LOCKED, Outcome.DONE]
    _apply(sm, log, [ack(0, 2)], T0 + 3)
    assert _apply(sm, log, [claim(1, 10_000)], T0 + 3)[0][0] == Outcome.DONE
    assert sm.pops.state()["retry"] == {"g": [[1_000], 5, True]}
    assert PopTables(None, sm.pops.state()["retry"]).policy("g").ordered


def test_a_replica_installing_a_snapshot_keeps_the_deadlines_and_the_acks(tmp_path: Path) -> None:
    """A follower behind the retained log start gets the POP state in the snapshot: the
    claims' deadlines, deliveries and acks carry on as on its peer (no acked message comes
    back, no lease is lost)."""
    log, peer = Log(), _machine(tmp_path / "peer")
    _with_messages(peer, log, count=3)
    _apply(peer, log, [encode_admin(GroupPolicy("g", (2_000,), 4)), claim(0, 30_000), claim(1, 30_000)], T0)
    _apply(peer, log, [ack(0, 1)], T0 + 5)
    index = log.entries[-1].index
    data = Snapshot.of(index, peer._state.state()).encode()
    new = _machine(tmp_path / "new")
    try:
        new.install_snapshot(index, data)
        assert new.pops.state() == peer.pops.state() and new.pops.policy("g") == RetryPolicy((2_000,), 4)
        for sm in (peer, new):  # the next entries, the same on both
            got = _apply(sm, Log(), [claim(0, 1_000), claim(1, 1_000), claim(2, 1_000)], T0 + 10)
            assert [g[0] for g in got] == [Outcome.DUPLICATE, Outcome.LOCKED, Outcome.DONE]
        assert new._state.state()["pops"] == peer._state.state()["pops"]
    finally:
        peer.close()
        new.close()


def test_expired_and_earliest_deadline_read_what_a_pop_needs() -> None:
    tables = PopTables()
    for q, offset, ms in ((0, 0, 500), (0, 1, 100), (1, 0, 300)):
        tables.apply(PopClaim("g", "jobs", q, offset, ms), 0, 10)
    assert tables.earliest_deadline("g", "jobs") == 100 and tables.earliest_deadline("g", "other") is None
    assert tables.expired("g", "jobs", 300) == [InFlight(0, 1, 100, 1), InFlight(1, 0, 300, 1)]
    assert tables.expired("g", "jobs", 99) == [] and tables.held_in("g", "jobs", 0) == 2
