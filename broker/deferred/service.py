"""The leader's side of deferred messages: turning requests into held messages, and
releasing them when due (see ``broker.state.held`` for the replicated state).

    send with DELAY / TIMER_DELIVER_MS ─▶ prepare(): __DELIVER_AT_MS = leader's now + delay
    CONSUMER_SEND_MSG_BACK ─▶ retry_copy(): %RETRY%group, reconsume + 1, delayed by the
                              group's retry policy (``raftmq group config``) or else the
                              retry schedule; %DLQ%group after the group's max;
                              __SENT_BACK = "group:position": a retried send-back is
                              stored once (state_machine.SENT_BACK_WINDOW_MS)
    END_TRANSACTION ─▶ committed_copy() (stored while the half is held) | RollbackHalf
    every TICK_S, on the leader only:
        Timers.due(now)  ─▶ a copy of each message with __SCHEDULED_FROM ─▶ its topic
        Halves.due(now)  ─▶ CHECK_TRANSACTION to a live producer of the group + CheckHalf;
                            RollbackHalf after MAX_CHECKS checks
        held records retention is about to reach ─▶ a copy with __CARRIED_FROM
                            (broker.deferred.carry_forward: at most CARRY_BYTES a round)

Every step is a proposal through the WritePath and its effect happens at apply, so a
leader change in the middle loses nothing and duplicates nothing (a second copy of a
released message finds no hold and is not stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from aiohttp import web

from broker.clients.registry import ConsumerRegistry, ForeignClient
from broker.deferred.carry_forward import carried_copy, carry_below, to_carry
from broker.replication.write_path import WritePath
from broker.state.held import (
    DEFAULT_DELAY_LEVELS,
    MAX_CHECKS,
    MAX_TIMER_AHEAD_MS,
    RETRY_DELAYS,
    Prop,
    parse_delay_levels,
    retry_delay_ms,
)
from broker.state.machine import BrokerStateMachine
from broker.store.commands import CheckHalf, RollbackHalf, encode_admin
from broker.store.fragments import MessageGone, read_message
from dledger.log import Log
from protocol.deferred import DEFAULT_MAX_RECONSUME, CheckTransactionRequest
from protocol.message_format import Message, decode_message, encode_message
from protocol.names import dlq_topic, retry_topic
from protocol.remoting import FrameError, ResponseCode

__all__ = ["DEFAULT_MAX_RECONSUME", "TICK_S", "DeferredService"]

log = logging.getLogger("broker.deferred")

TICK_S = 0.1
_INTERNAL = (Prop.DELIVER_AT, Prop.SCHEDULED_FROM, Prop.TRANSACTION_OF, Prop.SENT_BACK, Prop.CARRIED_FROM)


def _without(props: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in props.items() if k not in names}


class DeferredService:
    def __init__(self, rlog: Log, machine: BrokerStateMachine, write: WritePath,
                 producers: ConsumerRegistry, *, delay_levels: str = DEFAULT_DELAY_LEVELS,
                 retry_delays: str = RETRY_DELAYS,
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.rlog, self.machine, self.write, self.producers = rlog, machine, write, producers
        self.levels = parse_delay_levels(delay_levels)
        self.retry_schedule = parse_delay_levels(retry_delays)
        self.clock_ms = clock_ms
        self._opaques = 0

    # -- requests --------------------------------------------------------------------
    def prepare(self, m: Message) -> Message:
        """A producer's message as the leader stores it: delays become a delivery time.
        Raises FrameError for reserved properties (RETRY_TOPIC, ``__*``; a record carrying one
        is SPECIAL, so every client message with one comes here) or a bad delay."""
        bad = [k for k in m.properties if k.startswith("__") or k == Prop.RETRY_TOPIC]
        if bad:
            raise FrameError(ResponseCode.INVALID_ARGUMENT,
                             f"properties {bad} are reserved for the broker (RETRY_TOPIC and those "
                             "starting with '__'): remove them")
        level, timer = m.properties.get(Prop.DELAY), m.properties.get(Prop.TIMER)
        if level is None and timer is None:
            return m
        now = self.clock_ms()
        if level is not None:
            if not (level.isdigit() and 1 <= int(level) <= len(self.levels)):
                raise FrameError(ResponseCode.INVALID_ARGUMENT,
                                 f"DELAY must be a level 1..{len(self.levels)}, got {level!r}")
            at = now + self.levels[int(level) - 1]
        else:
            assert timer is not None
            if not timer.isdigit() or int(timer) > now + MAX_TIMER_AHEAD_MS:
                raise FrameError(ResponseCode.INVALID_ARGUMENT,
                                 f"TIMER_DELIVER_MS must be a time in ms at most 3 days ahead, got {timer!r}")
            at = int(timer)
        return Message(**{**_fields(m), "properties": {**m.properties, Prop.DELIVER_AT: str(at)}})

    def retry_copy(self, stored: Message, group: str, max_reconsume: int, position: int,
                   schedule: Sequence[int] = ()) -> Message:
        """The message a failed consumption sends back (``stored``, at CommitLog ``position``):
        retried later (after ``schedule``'s step for this retry: the group's retry policy; none:
        the broker's retry schedule), or dead-lettered. Marked with where it came from, so that
        a retried send-back is stored once."""
        times = stored.reconsume + 1
        origin = stored.properties.get(Prop.RETRY_TOPIC, stored.topic)
        props = {**_without(stored.properties, *_INTERNAL, Prop.DELAY, Prop.TIMER), Prop.RETRY_TOPIC: origin,
                 Prop.SENT_BACK: f"{group}:{position}"}
        if times > max_reconsume:
            return Message(**{**_fields(stored), "topic": dlq_topic(group), "queue_id": 0,
                              "properties": props, "reconsume": times,
                              "producer_id": None, "sequence": None})
        at = self.clock_ms() + retry_delay_ms(times, list(schedule) or self.retry_schedule)
        props[Prop.DELIVER_AT] = str(at)
        return Message(**{**_fields(stored), "topic": retry_topic(group), "queue_id": 0,
                          "properties": props, "reconsume": times, "producer_id": None, "sequence": None})

    @staticmethod
    def committed_copy(half: Message, position: int) -> Message:
        props = {**_without(half.properties, Prop.TRAN, Prop.PGROUP, Prop.CARRIED_FROM),
                 Prop.TRANSACTION_OF: str(position)}
        return Message(**{**_fields(half), "properties": props, "producer_id": None, "sequence": None})

    async def end_transaction(self, position: int, commit: bool) -> str:
        """Commit or roll back the half at ``position``; the answer says what happened."""
        held = self.machine.halves.get(position)
        if held is None:
            return "already resolved"
        if commit:
            half = decode_message(read_message(self.rlog.reader, held.at, held.size))
            (applied,) = await self.write.send([encode_message(self.committed_copy(half, position))])
        else:
            (applied,) = await self.write.send([encode_admin(RollbackHalf(position))])
        return applied.outcome

    # -- the leader's loop -----------------------------------------------------------------
    async def run(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            if not self.rlog.is_leader:
                continue
            try:
                await self._deliver_due()
                await self._check_halves()
                await self._carry_forward()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # not leader any more, timeouts: the next tick retries
                log.debug("deferred work: %s", e)

    async def _deliver_due(self) -> None:
        due = self.machine.timers.due(self.clock_ms(), 256)
        if not due:
            return
        copies = []
        for held in due:
            try:
                m = decode_message(read_message(self.rlog.reader, held.at, held.size))
            except MessageGone:
                log.error("delayed message at %d is no longer retained; dropping it", held.position)
                m = Message("", b"")
            props = {**_without(m.properties, Prop.DELIVER_AT, Prop.CARRIED_FROM),
                     Prop.SCHEDULED_FROM: str(held.position)}
            copies.append(encode_message(Message(**{**_fields(m), "properties": props,
                                                    "producer_id": None, "sequence": None})))
        await self.write.send(copies)

    async def _check_halves(self) -> None:
        now = self.clock_ms()
        for held in self.machine.halves.due(now)[:64]:
            if held.checks >= MAX_CHECKS:
                log.info("transaction half at %d: no outcome after %d checks; rolling back",
                         held.position, held.checks)
                await self.write.send([encode_admin(RollbackHalf(held.position))])
                continue
            asked = await self._ask_producer(held.group, held.position, held.at, held.size)
            log.info("transaction half at %d: check %d sent to %s", held.position, held.checks + 1,
                     asked or "no live producer")
            await self.write.send([encode_admin(CheckHalf(held.position, now))])

    async def _carry_forward(self) -> None:
        """Re-append the held records retention is about to reach (``broker.deferred.carry_forward``),
        the oldest first, at most CARRY_BYTES: each is read from its copy once that applies.
        Timers already due are left to ``_deliver_due``."""
        config, cl, now = self.rlog.config, self.rlog.reader, self.clock_ms()
        below = carry_below(cl.segments(), config.segment_bytes, cl.write_position, now=time.time(),
                            max_age_s=config.retention_hours * 3600, max_bytes=config.retention_bytes)
        held = [h for h in self.machine.timers.held() if h.due_ms > now] + self.machine.halves.held()
        copies = []
        for h in to_carry(held, below):
            try:
                m = decode_message(read_message(cl, h.at, h.size))
            except MessageGone:
                continue
            copies.append(encode_message(carried_copy(m, h.position)))
        if copies:
            results = await self.write.send(copies)
            log.info("carried %d held messages forward (%d were no longer held)", len(copies),
                     sum(1 for r in results if r.outcome != "done"))

    async def _ask_producer(self, group: str, position: int, at: int, size: int) -> str | None:
        """Send CHECK_TRANSACTION (oneway) for the half held by ``position`` (its bytes at
        ``at``) to one live producer of ``group``."""
        for conn in self.producers.connections(group):
            foreign = isinstance(conn, ForeignClient) and not conn.closed  # a RocketMQ producer
            if foreign or (isinstance(conn, web.WebSocketResponse) and not conn.closed):
                data = read_message(self.rlog.reader, at, size)
                if at != position:  # a carried copy: the message as its producer sent it
                    m = decode_message(data)
                    data = encode_message(Message(**{**_fields(m), "properties": _without(
                        m.properties, Prop.CARRIED_FROM)}))
                self._opaques = (self._opaques + 1) % (2**32)
                frame = CheckTransactionRequest(position=position, group=group, message=data).to_frame(
                    self._opaques, oneway=True)
                with contextlib.suppress(ConnectionError, RuntimeError):
                    if isinstance(conn, ForeignClient):
                        await conn.deliver(frame)
                    else:
                        await conn.send_bytes(frame.encode())
                    return group
        return None


def _fields(m: Message) -> dict[str, object]:
    return {f: getattr(m, f) for f in Message.__dataclass_fields__}
