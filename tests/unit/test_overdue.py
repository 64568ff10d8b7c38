"""Late redeliveries show up: retried messages a live group has not consumed, delays not released."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker.deferred.overdue import OverdueRetries, OverdueWatch, overdue_delays, overdue_retries
from broker.state.held import Prop
from broker.state.machine import BrokerStateMachine
from broker.store.commands import CommitOffset, CreateTopic, encode_admin
from protocol.message_format import Message, encode_message
from tests.unit.test_state_machine import Log

T0 = 1_700_000_000_000


def retried(i: int, group: str = "acc-g") -> bytes:
    return encode_message(Message(f"%RETRY%{group}", f"r{i}".encode(), 0, msg_id=i.to_bytes(16, "big")))


@pytest.fixture
def machine(tmp_path: Path):  # type: ignore[no-untyped-def]
    m = BrokerStateMachine(tmp_path / "store", index_slots=64, index_entries=1024)
    yield m
    m.close()


def test_retried_messages_past_the_threshold_and_not_committed_are_overdue(machine) -> None:  # type: ignore[no-untyped-def]
    log = Log()
    log.add([encode_admin(CreateTopic("%RETRY%acc-g", 1))], stamp=T0)
    for i in range(5):  # due (stored) at T0, T0+10 s, ... T0+40 s
        log.add([retried(i)], stamp=T0 + i * 10_000)
    machine.apply(log.entries)
    cq = machine.queue("%RETRY%acc-g", 0)
    assert cq is not None and cq.max_offset == 5
    now = T0 + 45_000  # 45, 35, 25, 15, 5 s past due

    (late,) = overdue_retries(machine, ["acc-g", "other"], now, 15_000)
    assert late == OverdueRetries("acc-g", 3, 45.0)  # 45, 35, 25 s: more than 15 s
    assert overdue_retries(machine, [], now, 15_000) == []  # no live consumer

    machine.apply([log.add([encode_admin(CommitOffset("acc-g", "%RETRY%acc-g", 0, 2))])])
    (late,) = overdue_retries(machine, ["acc-g"], now, 15_000)
    assert late == OverdueRetries("acc-g", 1, 25.0)
    machine.apply([log.add([encode_admin(CommitOffset("acc-g", "%RETRY%acc-g", 0, 3))])])
    assert overdue_retries(machine, ["acc-g"], now, 15_000) == []


def test_held_messages_past_their_time_are_overdue(machine) -> None:  # type: ignore[no-untyped-def]
    log = Log()
    log.add([encode_admin(CreateTopic("jobs", 1))], stamp=T0)
    for i, due in enumerate((T0 + 1_000, T0 + 60_000)):
        log.add([encode_message(Message("jobs", b"x", 0, msg_id=i.to_bytes(16, "big"),
                                        properties={Prop.DELIVER_AT: str(due)}))], stamp=T0)
    machine.apply(log.entries)
    assert len(machine.timers) == 2
    assert overdue_delays(machine, T0 + 10_000, 15_000) == 0
    assert overdue_delays(machine, T0 + 20_000, 15_000) == 1
    assert overdue_delays(machine, T0 + 80_000, 15_000) == 2


def test_the_leader_warns_once_a_minute_per_group_and_says_when_it_recovers(
        machine, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    log = Log()
    log.add([encode_admin(CreateTopic("%RETRY%acc-g", 1))], stamp=T0)
    log.add([retried(0)], stamp=T0)
    machine.apply(log.entries)
    cq = machine.queue("%RETRY%acc-g", 0)
    assert cq is not None
    clock = {"ms": T0 + 20_000, "mono": 100.0}
    leader = {"is": True}
    watch = OverdueWatch(machine, lambda: ["acc-g"], lambda: leader["is"],
                         threshold_s=15, clock_ms=lambda: clock["ms"], monotonic=lambda: clock["mono"])
    with caplog.at_level(logging.INFO, logger="broker.overdue"):
        watch.check()
        clock["mono"] += 5
        watch.check()  # still overdue, warned 5 s ago: quiet
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "acc-g" in warnings[0].getMessage()
        assert "%RETRY%acc-g" in warnings[0].getMessage()
        clock["mono"] += 60
        watch.check()
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
        machine.apply([log.add([encode_admin(CommitOffset("acc-g", "%RETRY%acc-g", 0, 1))])])
        watch.check()
        assert "on time again" in caplog.records[-1].getMessage()
        leader["is"] = False
        machine.apply([log.add([retried(1)], stamp=T0)])
        caplog.clear()
        watch.check()  # a follower measures (metrics) but does not log
        assert watch.last and not caplog.records
