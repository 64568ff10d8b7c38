"""Per-message acknowledgement on the leader (RocketMQ 5's POP; issue 29): POP_MESSAGE,
ACK_MESSAGE, CHANGE_INVISIBLE_DURATION, NACK_MESSAGE and UPDATE_GROUP_CONFIG (the layouts:
``protocol.pop``; the replicated state: ``broker.state.pops``).

A POP chooses, then claims through the log, then reads::

    1. messages of the group in flight whose invisibility ended (earliest deadline first):
       delivered again -- or, delivered max_deliveries times already, dead-lettered
       (a copy to %DLQ%group and a PopDead record in one write)
    2. new messages: from each queue's window end (``next``), queues taken in turn,
       within the group's cap of messages in flight (an ordered group: one of each queue
       that has none in flight)
    3. a PopClaim record per message (as many as records of POP_BODY_BYTES hold: the answer
       ships whole records), proposed in one write; the apply step decides each
       at the entry's store time (another consumer may have taken one meanwhile: LOCKED)
    4. the claimed messages' records read from the CommitLog, as a pull reads them

POPs of one (group, topic) on this leader run their steps 1-3 one at a time (an asyncio
lock), so two never claim the same new offsets; each waits one commit. Nothing is
claimed when the long poll finds no message: it waits for a queue of the topic to grow,
for the earliest invisibility to end or for a receipt of the group's topic to change
something here (an ack frees an ordered queue; a nack may be due sooner), with the
request's deadline, holding a slot of the
broker's parked long polls (``broker.processors.long_polls``: the caps pulls have).

Threads: the server's event loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol

from broker.clients.retry_topics import RetryQuotaExceeded
from broker.processors.base import Processor
from broker.processors.context import CONNECTION
from broker.processors.long_polls import ParkedPulls
from broker.processors.outcomes import OUTCOME_CODE
from broker.security.access_control import current_user
from broker.state.machine import Outcome
from broker.state.pops import MAX_IN_FLIGHT, InFlight
from broker.store.commands import encode_admin
from broker.store.consume_queue import OffsetOutOfRange
from broker.store.consume_queue_layout import CqUnit
from broker.store.fragments import MessageGone, read_message, read_message_at
from broker.store.pop_commands import GroupPolicy, PopAck, PopClaim, PopDead, PopInvisible
from protocol.message_format import MessageFormatError, encode_message, message_at
from protocol.names import validate_group, validate_topic
from protocol.pop import (
    AckRequest,
    ChangeInvisibleRequest,
    Claim,
    GroupConfigRequest,
    NackRequest,
    NackResponse,
    PoppedRecord,
    PopRequest,
    PopResponse,
)
from protocol.pull import PullRow
from protocol.remoting import Frame, FrameError, ResponseCode

if TYPE_CHECKING:
    from broker.processors.context import BrokerContext

__all__ = ["POP_BODY_BYTES", "PopProcessor"]

#: Longest a parked POP sleeps before it looks again for invisibilities that ended.
_LOOK_AGAIN_S = 1.0
#: A POP claims no more messages than whole records of this many bytes hold (at least one):
#: the answer then fits the frame size clients accept by default, as a pull's page does.
POP_BODY_BYTES = 4 * 1024 * 1024


class QueueWaiter(Protocol):
    async def wait(self, queue: tuple[str, int], timeout: float) -> None:
        """Return when ``queue`` (topic, queue id) grew, or after ``timeout`` seconds."""


class PopProcessor(Processor):

    def __init__(self, server: BrokerContext, signal: QueueWaiter, parked: ParkedPulls | None = None) -> None:
        """``parked``: the caps on long polls held at once (shared with pulls)."""
        super().__init__(server)
        self._signal = signal
        self._parked = parked or ParkedPulls()
        #: one claim at a time per (group, topic): its lock and how many POPs use it (dropped
        #: at none -- group names are the client's, so nothing is kept for a group not served)
        self._claiming: dict[tuple[str, str], tuple[asyncio.Lock, list[int]]] = {}
        self._turn = itertools.count()  # which queue a POP looks at first
        #: set when a receipt of the (group, topic) changed something: parked POPs look again
        #: (dropped when set, or when the last POP parked on it leaves)
        self._changed: dict[tuple[str, str], tuple[asyncio.Event, list[int]]] = {}

    # -- POP ------------------------------------------------------------------------------
    async def pop(self, frame: Frame) -> Frame:
        self._server.require_leader()
        req = PopRequest.from_frame(frame)
        group, topic = validate_group(req.group), validate_topic(req.topic)
        config = self._server.machine.topics.get(topic)
        if config is None:
            raise FrameError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic!r} does not exist")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + req.wait_ms / 1000
        while True:
            async with self._claim_turn((group, topic)):
                claimed = await self._claim(group, topic, config.queues, req.max_msgs, req.invisible_ms)
            if claimed or loop.time() >= deadline:
                records, gone = self._read(topic, claimed)
                if gone:  # retention deleted them: nothing to deliver, settled now
                    await self._server.write.send([encode_admin(PopDead(group, topic, q, offset, delivery))
                                                   for q, offset, delivery in gone])
                if records or loop.time() >= deadline:
                    return PopResponse(records=records or None).reply(frame)
                continue
            with self._parked.slot(CONNECTION.get(), current_user()):
                await self._wait(group, topic, config.queues, deadline)
            self._server.require_leader()

    async def _claim(self, group: str, topic: str, queues: int, most: int,
                     invisible_ms: int) -> list[tuple[int, int, int]]:
        """Claim up to ``most`` messages through the log: (queue id, offset, delivery) of
        each the apply step gave this POP."""
        pops = self._server.machine.pops
        policy = pops.policy(group)
        now = self._server.deferred.clock_ms()
        wanted: list[tuple[int, int]] = []
        dead: list[InFlight] = []
        for held in pops.expired(group, topic, now):
            if len(wanted) >= most:
                break
            if held.delivery >= policy.max_deliveries:
                dead.append(held)
            else:
                wanted.append((held.queue_id, held.offset))
        for held in dead:
            await self._dead_letter(group, topic, held)
        room = min(most - len(wanted), MAX_IN_FLIGHT - pops.span(group))
        wanted += self._new_offsets(group, topic, queues, room, policy.ordered,
                                    {q for q, _ in wanted})
        wanted = self._within_bytes(topic, wanted)
        if not wanted:
            return []
        outcomes = await self._server.write.send([
            encode_admin(PopClaim(group, topic, q, offset, invisible_ms)) for q, offset in wanted])
        return [(a.queue_id, a.queue_offset, a.position) for a in outcomes if a.outcome == Outcome.DONE]

    def _within_bytes(self, topic: str, wanted: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """The first of ``wanted`` whose records add up to at most POP_BODY_BYTES (at least
        one): the answer ships whole records, and must fit a client's frame. A prefix, so the
        new offsets of each queue stay in order."""
        size, records = 0, set[tuple[int, int]]()
        last: tuple[int, CqUnit] | None = None
        for i, (q, offset) in enumerate(wanted):
            if last is not None and last[0] == q and last[1].base <= offset < last[1].end:
                continue  # in the record counted just before
            cq = self._server.machine.queue(topic, q)
            try:
                unit = cq.get(offset) if cq is not None else None
            except OffsetOutOfRange:
                unit = None  # gone: claimed, then settled by the read
            if unit is None or (q, unit.base) in records:
                continue
            if records and size + unit.size > POP_BODY_BYTES:
                return wanted[:i]
            size += unit.size
            records.add((q, unit.base))
            last = (q, unit)
        return wanted

    def _new_offsets(self, group: str, topic: str, queues: int, room: int, ordered: bool,
                     again: set[int]) -> list[tuple[int, int]]:
        """Up to ``room`` offsets no consumer of the group was given, from the queues in turn;
        ``ordered``: one of a queue with nothing in flight (``again``: the queues of the
        messages this POP delivers again)."""
        found: list[tuple[int, int]] = []
        first = next(self._turn) % queues
        for q in [(first + i) % queues for i in range(queues)]:
            if len(found) >= room:
                break
            if ordered and (q in again or self._server.machine.pops.held_in(group, topic, q)):
                continue
            cq = self._server.machine.queue(topic, q)
            if cq is None:
                continue
            start = self._server.machine.pops.next_offset(group, topic, q)
            if start is None:  # the group's first POP here: from its committed offset, else the start
                committed = self._server.machine.committed_offset(group, topic, q)
                low = self._server.machine.retained_min_offset(cq, self._server.rlog.reader.start_position)
                start = max(low, committed or 0)
            end = min(cq.max_offset, start + (1 if ordered else room - len(found)))
            found += [(q, offset) for offset in range(start, end)]
        return found

    async def _wait(self, group: str, topic: str, queues: int, deadline: float) -> None:
        """Until a queue of ``topic`` grows, the group's earliest invisibility ends (looked at
        again at least every _LOOK_AGAIN_S), or ``deadline``."""
        loop = asyncio.get_running_loop()
        timeout = min(deadline - loop.time(), _LOOK_AGAIN_S)
        soonest = self._server.machine.pops.earliest_deadline(group, topic)
        if soonest is not None:
            timeout = min(timeout, max(0.0, (soonest - self._server.deferred.clock_ms()) / 1000))
        if timeout <= 0:
            return
        key = (group, topic)
        changed, users = self._changed.setdefault(key, (asyncio.Event(), [0]))
        users[0] += 1
        waits = [asyncio.ensure_future(self._signal.wait((topic, q), timeout)) for q in range(queues)]
        waits.append(asyncio.ensure_future(changed.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            users[0] -= 1
            if users[0] == 0 and self._changed.get(key, (None,))[0] is changed:
                del self._changed[key]

    @contextlib.asynccontextmanager
    async def _claim_turn(self, key: tuple[str, str]) -> AsyncIterator[None]:
        """The (group, topic)'s claim lock, held; the entry goes when no POP uses it."""
        lock, users = self._claiming.setdefault(key, (asyncio.Lock(), [0]))
        users[0] += 1
        try:
            async with lock:
                yield
        finally:
            users[0] -= 1
            if users[0] == 0:
                del self._claiming[key]

    def _read(self, topic: str, claimed: list[tuple[int, int, int]]) -> tuple[
            list[PoppedRecord], list[tuple[int, int, int]]]:
        """The records holding the claimed messages, each with its claimed (offset, delivery)s,
        and the claims whose message retention deleted (or whose topic went)."""
        by_record: dict[tuple[int, int], tuple[PullRow, list[tuple[int, int]]]] = {}
        gone: list[tuple[int, int, int]] = []
        reader = self._server.rlog.reader
        for q, offset, delivery in sorted(claimed):
            cq = self._server.machine.queue(topic, q)
            try:
                if cq is None:
                    raise MessageGone(f"topic {topic!r} has no queue {q}")
                unit = cq.get(offset)
                key = (q, unit.base)
                if key not in by_record:
                    record = read_message(reader, unit.position, unit.size)
                    by_record[key] = (PullRow(unit.base, unit.position, unit.store_ms, record), [])
            except (OffsetOutOfRange, MessageGone, ValueError):
                gone.append((q, offset, delivery))
                continue
            by_record[key][1].append((offset, delivery))
        return [PoppedRecord(q, row, tuple(Claim(o, n) for o, n in claims))
                for (q, _), (row, claims) in by_record.items()], gone

    def _look_again(self, group: str, topic: str) -> None:
        """A receipt settled a message or moved a deadline: wake the POPs parked on the group's
        topic (an ordered queue's next message, a nacked one due sooner than they planned)."""
        entry = self._changed.pop((group, topic), None)
        if entry is not None:
            entry[0].set()

    async def _dead_letter(self, group: str, topic: str, held: InFlight) -> bool:
        """Store a copy of ``held`` in %DLQ%group and settle it, in one write; False when the
        message is gone (retention) -- then it is only settled."""
        records = [encode_admin(PopDead(group, topic, held.queue_id, held.offset, held.delivery))]
        cq = self._server.machine.queue(topic, held.queue_id)
        try:
            if cq is None:
                raise MessageGone("the queue is gone")
            unit = cq.get(held.offset)
            position = unit.position + held.offset - unit.base
            record, at = read_message_at(self._server.rlog.reader, position)
            stored = message_at(record, position - at)
        except (OffsetOutOfRange, MessageGone, MessageFormatError, ValueError):
            await self._server.write.send(records)
            return False
        copy = self._server.deferred.retry_copy(stored, group, -1, position)  # -1: the DLQ
        copy = dataclasses.replace(copy, reconsume=held.delivery)
        if copy.topic not in self._server.machine.topics:  # made on first use: the user's quota
            try:
                self._server.retry_quota.take(current_user(), [copy.topic])
            except RetryQuotaExceeded as e:
                raise FrameError(ResponseCode.NO_PERMISSION, str(e)) from None
        await self._server.write.send([encode_message(copy), *records])
        return True

    # -- receipts ---------------------------------------------------------------------------
    async def ack(self, frame: Frame) -> Frame:
        self._server.require_leader()
        req = AckRequest.from_frame(frame)
        group, topic = validate_group(req.group), validate_topic(req.topic)
        try:
            ack = PopAck(group, topic, req.queue_id, req.offset, req.delivery)
            return await self._through_log(frame, ack)
        finally:
            self._look_again(group, topic)

    async def change_invisible(self, frame: Frame) -> Frame:
        self._server.require_leader()
        req = ChangeInvisibleRequest.from_frame(frame)
        group, topic = validate_group(req.group), validate_topic(req.topic)
        try:
            return await self._through_log(frame, PopInvisible(group, topic, req.queue_id, req.offset,
                                                               req.delivery, req.invisible_ms))
        finally:
            self._look_again(group, topic)

    async def nack(self, frame: Frame) -> Frame:
        """Give a message back: visible again after the group's backoff for its delivery, or,
        delivered max_deliveries times, dead-lettered now."""
        self._server.require_leader()
        req = NackRequest.from_frame(frame)
        group, topic = validate_group(req.group), validate_topic(req.topic)
        try:
            return await self._nack(frame, req, group, topic)
        finally:
            self._look_again(group, topic)

    async def _nack(self, frame: Frame, req: NackRequest, group: str, topic: str) -> Frame:
        policy = self._server.machine.pops.policy(group)
        if req.delivery >= policy.max_deliveries:
            current = [m for m in self._server.machine.pops.in_flight(group, topic)
                       if (m.queue_id, m.offset, m.delivery) == (req.queue_id, req.offset, req.delivery)]
            if current:
                await self._dead_letter(group, topic, current[0])
                return NackResponse(dead_lettered=True, backoff_ms=0).reply(frame)
        backoff = policy.backoff_after(req.delivery)
        (applied,) = await self._server.write.send([encode_admin(
            PopInvisible(group, topic, req.queue_id, req.offset, req.delivery, backoff))])
        code = OUTCOME_CODE[applied.outcome]
        if code != ResponseCode.SUCCESS or applied.outcome != Outcome.DONE:
            return frame.response(code if code != ResponseCode.SUCCESS else ResponseCode.INVALID_ARGUMENT,
                                  remark=applied.reason)
        return NackResponse(dead_lettered=False, backoff_ms=backoff).reply(frame)

    # -- the group's retry policy --------------------------------------------------------------
    async def group_config(self, frame: Frame) -> Frame:
        self._server.require_leader()
        req = GroupConfigRequest.from_frame(frame)
        return await self._through_log(frame, GroupPolicy(validate_group(req.group), req.backoff_ms,
                                                          req.max_deliveries, bool(req.ordered)))
