"""The producer's per-queue sender against a scripted broker: resends are byte-identical
(same producer id and sequences), batches accumulate while one is in flight, and a
refused message starts a new epoch for the ones behind it."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack

from client.aio.producer import QueueSender, _Item
from client.backoff import Deadline
from client.errors import OutcomeUnknownError, TopicNotExistError
from client.message import Message
from client.queues import MessageQueue
from protocol.message_format import Message as Stored
from protocol.message_format import decode_message, encode_message
from protocol.record_batch import decode_messages
from protocol.remoting import Frame, ResponseCode
from protocol.send import SendBatchRequest

Q = MessageQueue("t", "g1", 0)


class ScriptedCore:
    """``leader_request`` answers from a script: an exception to raise, or a row code per message
    (``bodies``: each request's messages as records of one, re-encoded)."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.bodies: list[list[bytes]] = []
        self.gate: asyncio.Event | None = None

    async def leader_request(self, group: str, request: SendBatchRequest, *, deadline: Deadline,
                             topic: str | None = None) -> Frame:
        records = [encode_message(m) for r in request.records for m in _messages(r)]
        self.bodies.append(records)
        if self.gate is not None:
            await self.gate.wait()
        step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, BaseException):
            raise step
        codes = step if isinstance(step, list) else [0] * len(records)
        rows = [[c, 0, i, "", 100 + i] for i, c in enumerate(codes)]
        return Frame(0, 1, 1, "", {}, msgpack.packb(rows))


def items(n: int, loop: asyncio.AbstractEventLoop) -> list[_Item]:
    return [_Item(Message("t", f"m{i}".encode()), loop.create_future(), Deadline(5)) for i in range(n)]


def seqs(records: list[bytes]) -> list[tuple[str | None, int | None]]:
    return [(decode_message(r).producer_id, decode_message(r).sequence) for r in records]


def test_a_retried_batch_is_resent_unchanged() -> None:
    async def main() -> None:
        core = ScriptedCore([OutcomeUnknownError(ResponseCode.OUTCOME_UNKNOWN, "lost")])
        # the core's own retry loop is what resends; here one failure reaches the sender
        sender = QueueSender(core, Q, "p")  # type: ignore[arg-type]
        batch = items(3, asyncio.get_running_loop())
        sender.submit(batch)
        results = await asyncio.gather(*(i.future for i in batch), return_exceptions=True)
        assert all(isinstance(r, OutcomeUnknownError) for r in results)
        # an unknown outcome ends the epoch: later messages use a new producer id from 0
        more = items(2, asyncio.get_running_loop())
        sender.submit(more)
        await asyncio.gather(*(i.future for i in more))
        assert seqs(core.bodies[0]) == [("p.0", 0), ("p.0", 1), ("p.0", 2)]
        assert seqs(core.bodies[1]) == [("p.1", 0), ("p.1", 1)]
        await sender.close(1)

    asyncio.run(main())


def test_messages_queued_while_a_batch_is_in_flight_ride_in_the_next_one() -> None:
    async def main() -> None:
        core = ScriptedCore([])
        core.gate = asyncio.Event()
        sender = QueueSender(core, Q, "p")  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        first = items(1, loop)
        sender.submit(first)
        await asyncio.sleep(0.01)  # the first batch is in flight, held at the gate
        rest = items(5, loop)
        for item in rest:
            sender.submit([item])
        core.gate.set()
        done = await asyncio.gather(*(i.future for i in first + rest))
        assert [len(b) for b in core.bodies] == [1, 5]  # one request for the five queued meanwhile
        assert [r.queue_offset for r in done] == [0, 0, 1, 2, 3, 4]
        assert seqs(core.bodies[1]) == [("p.0", s) for s in range(1, 6)]
        await sender.close(1)

    asyncio.run(main())


def test_a_refused_message_fails_alone_and_the_rest_are_resent_in_a_new_epoch() -> None:
    async def main() -> None:
        gap = ResponseCode.SEQUENCE_GAP
        core = ScriptedCore([[0, ResponseCode.TOPIC_NOT_EXIST, gap, gap]])
        sender = QueueSender(core, Q, "p")  # type: ignore[arg-type]
        batch = items(4, asyncio.get_running_loop())
        sender.submit(batch)
        results = await asyncio.gather(*(i.future for i in batch), return_exceptions=True)
        assert results[0].queue_offset == 0  # type: ignore[union-attr]
        assert isinstance(results[1], TopicNotExistError)
        assert not isinstance(results[2], BaseException) and not isinstance(results[3], BaseException)
        assert seqs(core.bodies[1]) == [("p.1", 0), ("p.1", 1)]  # resent: new id, from 0
        await sender.close(1)

    asyncio.run(main())


def test_a_broker_that_forgot_the_producer_gets_the_batch_again_in_a_new_epoch() -> None:
    async def main() -> None:
        gap = ResponseCode.SEQUENCE_GAP
        core = ScriptedCore([[gap, gap]])  # the broker expired this producer (silent a day)
        sender = QueueSender(core, Q, "p")  # type: ignore[arg-type]
        sender._next_seq = 7  # it had sent 7 messages long ago
        batch = items(2, asyncio.get_running_loop())
        sender.submit(batch)
        results = await asyncio.gather(*(i.future for i in batch))
        assert [r.queue_offset for r in results] == [0, 1]
        assert seqs(core.bodies[0]) == [("p.0", 7), ("p.0", 8)]
        assert seqs(core.bodies[1]) == [("p.1", 0), ("p.1", 1)]
        await sender.close(1)

    asyncio.run(main())


def _messages(record: bytes) -> list[Stored]:
    return [Stored(r.topic, r.body, r.queue_id, r.tags, r.keys, r.properties, r.msg_id, r.flag, r.born_ts_ms,
                   r.born_host, r.producer_id, r.sequence, r.reconsume) for r in decode_messages(record)]
