"""Carrying held messages forward (``broker.deferred.carry_forward``): the leader's choice of what to
carry, and the apply step deciding by log order -- a carried copy moves where a held
message is read from, never its identity; a release, commit or rollback applied before
or after it delivers the message once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.deferred.carry_forward import carried_copy, carry_below, to_carry
from broker.state.held import Held, Prop, Timers
from broker.state.machine import BrokerStateMachine, Outcome
from broker.store.commands import CheckHalf, CreateTopic, RollbackHalf, encode_admin
from dledger.storage.segments import SegmentInfo
from protocol.message_format import Message, decode_message, encode_message
from tests.support.ram_dir import ram_dir
from tests.unit.test_state_machine import Log

T0 = 1_700_000_000_000
DUE = T0 + 3 * 86_400_000  # three days later


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    yield from ram_dir()


def delayed(i: int = 1) -> Message:
    return Message("orders", f"later-{i}".encode(), 0, keys=(f"k{i}",), msg_id=i.to_bytes(16, "big"),
                   properties={Prop.DELIVER_AT: str(DUE), "user": "x"})


def half(i: int = 1) -> Message:
    return Message("orders", b"half", 0, msg_id=i.to_bytes(16, "big"),
                   properties={Prop.TRAN: "true", Prop.PGROUP: "pg"})


def released(m: Message, identity: int, prop: str = Prop.SCHEDULED_FROM) -> bytes:
    props = {k: v for k, v in m.properties.items() if k not in (Prop.DELIVER_AT, Prop.TRAN, Prop.PGROUP)}
    return encode_message(Message(m.topic, m.body, 0, keys=m.keys, msg_id=m.msg_id,
                                  properties={**props, prop: str(identity)}))


def machine(path: Path) -> BrokerStateMachine:
    return BrokerStateMachine(path, index_slots=8, index_entries=64)


def outcome(sm: BrokerStateMachine, entry_index: int) -> str:
    results = sm.results(entry_index)
    assert results is not None
    return results[0].outcome


def test_a_carried_timer_is_read_from_its_copy_and_released_once(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("orders", 1))], stamp=T0)
    m = delayed()
    held = log.add([encode_message(m)], stamp=T0)
    identity = held.position + 32 + (log.entries[-1].body.index(encode_message(m)))
    carry = log.add([encode_message(carried_copy(m, identity))], stamp=T0 + 1)
    carry2 = log.add([encode_message(carried_copy(m, identity))], stamp=T0 + 2)  # a repeated carry
    release = log.add([released(m, identity)], stamp=DUE)
    late = log.add([encode_message(carried_copy(m, identity))], stamp=DUE + 1)  # after release
    sm = machine(tmp_path / "a")
    sm.apply(log.entries[:3])
    (h,) = sm.timers.held()
    assert (h.position, h.due_ms) == (identity, DUE) and h.at > identity
    copy = decode_message(sm_read(log, h.at, h.size))
    assert copy.msg_id == m.msg_id and copy.properties[Prop.DELIVER_AT] == str(DUE)
    assert outcome(sm, carry.index) == Outcome.DONE
    assert sm.queue("SCHEDULE_TOPIC_XXXX", 0).max_offset == 1, "the copy goes in no queue"
    sm.close()
    sm = machine(tmp_path / "a")  # the moved hold survives a restart
    assert sm.timers.held()[0].at == h.at
    sm.apply(log.entries[sm.applied_index():])
    assert outcome(sm, carry2.index) == Outcome.DONE
    assert outcome(sm, release.index) == Outcome.STORED
    assert outcome(sm, late.index) == Outcome.DUPLICATE
    assert len(sm.timers) == 0 and sm.queue("orders", 0).max_offset == 1
    sm.close()


def sm_read(log: Log, position: int, size: int) -> bytes:
    for e in log.entries:
        start = e.position + 32
        if start <= position < start + len(e.body):
            return e.body[position - start:position - start + size]
    raise LookupError(position)


def test_a_release_applied_before_its_carry_wins(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("orders", 1))], stamp=T0)
    m = delayed()
    log.add([encode_message(m)], stamp=T0)
    sm = machine(tmp_path / "a")
    sm.apply(log.entries)
    identity = sm.timers.held()[0].position
    release = log.add([released(m, identity)], stamp=DUE)
    carry = log.add([encode_message(carried_copy(m, identity))], stamp=DUE)
    sm.apply(log.entries[2:])
    assert [outcome(sm, e.index) for e in (release, carry)] == [Outcome.STORED, Outcome.DUPLICATE]
    assert len(sm.timers) == 0 and sm.queue("orders", 0).max_offset == 1
    sm.close()


def test_a_carried_half_keeps_its_identity_through_checks_and_commit(tmp_path: Path) -> None:
    log = Log()
    log.add([encode_admin(CreateTopic("orders", 1))], stamp=T0)
    h = half()
    log.add([encode_message(h)], stamp=T0)
    sm = machine(tmp_path / "a")
    sm.apply(log.entries)
    identity = sm.halves.positions()[0]
    log.add([encode_message(carried_copy(h, identity))], stamp=T0 + 1)
    check = log.add([encode_admin(CheckHalf(identity, T0 + 7_000))], stamp=T0 + 7_000)
    commit = log.add([released(h, identity, Prop.TRANSACTION_OF)], stamp=T0 + 8_000)
    rollback = log.add([encode_admin(RollbackHalf(identity))], stamp=T0 + 9_000)
    sm.apply(log.entries[2:4])
    (held,) = sm.halves.held()
    assert held.position == identity and held.at > identity and held.checks == 1 and held.group == "pg"
    sm.apply(log.entries[4:])
    assert outcome(sm, check.index) == Outcome.DONE
    assert [outcome(sm, e.index) for e in (commit, rollback)] == [Outcome.STORED, Outcome.DUPLICATE]
    assert sm.queue("orders", 0).max_offset == 1
    sm.close()


def test_tables_written_before_carrying_load_unchanged() -> None:
    timers = Timers({8: [10, 5, "t"]})
    assert timers.state() == {8: [10, 5, "t"]}
    assert timers.carry(8, 4096, 12) and timers.state() == {8: [12, 5, "t", 4096]}
    assert Timers(timers.state()).held()[0].at == 4096
    assert not timers.carry(9, 4096, 12)


SEG = 1000


def segs(n: int, age_s: float = 0.0, now: float = 10_000.0) -> list[SegmentInfo]:
    return [SegmentInfo(i * SEG, Path(f"{i}"), SEG, now - age_s) for i in range(n)]


def test_what_is_carried_before_retention_reaches_it() -> None:
    # size: carried once wholly more than half the cap behind the end
    assert carry_below(segs(6), SEG, 5500, now=10_000, max_age_s=10**9, max_bytes=4000) == 3000
    assert carry_below(segs(2), SEG, 1500, now=10_000, max_age_s=10**9, max_bytes=4000) == 0
    # age: segments older than half the age limit, never the active one
    assert carry_below(segs(4, age_s=60), SEG, 3500, now=10_000, max_age_s=100, max_bytes=None) == 3000
    assert carry_below(segs(4, age_s=40), SEG, 3500, now=10_000, max_age_s=100, max_bytes=None) == 0
    held = [Held(p, 400, 0) for p in (2500, 100, 900, 3100)]
    assert [h.position for h in to_carry(held, 3000, budget=900)] == [100, 900]
    assert [h.position for h in to_carry(held, 3000, budget=10)] == [100]  # at least one
