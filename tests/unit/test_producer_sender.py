"""The producer's per-queue sender against a scripted broker: resends are byte-identical
(same producer id and sequences), messages accumulate while requests are in flight, a
refused message starts a new epoch for the ones behind it, several requests go before the
first is answered, and gaps from overtaking retries are resent in order."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from client.aio.queue_sender import QueueSender, _Item
from client.backoff import Deadline
from client.errors import ClientClosedError, OutcomeUnknownError, TopicNotExistError
from client.message import Message, SendResult
from client.queues import MessageQueue
from protocol.message_format import decode_message, encode_message, message_of
from protocol.record_batch import decode_messages
from protocol.remoting import Frame, ResponseCode
from protocol.send import SendBatchRequest
from tests.support.scripted_core import until

Q = MessageQueue("t", "g1", 0)
GAP = ResponseCode.SEQUENCE_GAP


class Sink:
    """A message's outcome, as a future (what a caller of the producer awaits)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future[SendResult] = loop.create_future()

    @property
    def abandoned(self) -> bool:
        return self.future.done()

    def settle(self, index: int, outcome: SendResult | BaseException) -> None:
        if self.future.done():
            return
        if isinstance(outcome, BaseException):
            self.future.set_exception(outcome)
        else:
            self.future.set_result(outcome)


class ScriptedCore:
    """``leader_request`` answers from a script: an exception to raise, or a row code per message
    (``bodies``: each request's messages as records of one, re-encoded); ``gate`` (set when made
    ``gated``) holds answers back until it is set."""

    def __init__(self, script: list[Any], *, gated: bool = False) -> None:
        self.script = script
        self.bodies: list[list[bytes]] = []
        self.gate: asyncio.Event | None = asyncio.Event() if gated else None

    async def leader_request(self, group: str, request: SendBatchRequest, *, deadline: Deadline,
                             topic: str | None = None) -> Frame:
        records = [encode_message(message_of(m)) for r in request.records for m in decode_messages(r)]
        self.bodies.append(records)
        if self.gate is not None:
            await self.gate.wait()
        step = self.script.pop(0) if self.script else "ok"
        if isinstance(step, BaseException):
            raise step
        codes = step if isinstance(step, list) else [0] * len(records)
        rows = [[c, 0, i, "", 100 + i] for i, c in enumerate(codes)]
        return Frame(0, 1, 1, "", {}, msgpack.packb(rows))


def items(n: int, prefix: str = "m") -> list[_Item]:
    loop = asyncio.get_running_loop()
    return [_Item(Message("t", f"{prefix}{i}".encode()), Sink(loop), Deadline(5), bytes(16), 0, 50)
            for i in range(n)]


def submitted_singly(sender: QueueSender, n: int) -> list[_Item]:
    """``items(n)`` submitted to ``sender`` one at a time, as single sends are."""
    batch = items(n)
    for item in batch:
        sender.submit([item])
    return batch


def futures(batch: list[_Item]) -> list[asyncio.Future[SendResult]]:
    return [i.sink.future for i in batch]  # type: ignore[attr-defined]


def seqs(records: list[bytes]) -> list[tuple[str | None, int | None]]:
    return [(decode_message(r).producer_id, decode_message(r).sequence) for r in records]


def run_sender(scenario: Callable[[ScriptedCore, QueueSender], Awaitable[None]], core: ScriptedCore,
               **options: Any) -> None:
    """Run ``scenario`` on a new loop with a ``QueueSender(core, Q, "p", **options)``; the
    sender is closed after, also when the scenario fails."""
    async def main() -> None:
        sender = QueueSender(core, Q, "p", **options)  # type: ignore[arg-type]
        try:
            await scenario(core, sender)
        finally:
            await sender.close(1)

    asyncio.run(main())


def test_a_retried_batch_is_resent_unchanged() -> None:
    async def scenario(core: ScriptedCore, sender: QueueSender) -> None:
        batch = items(3)
        sender.submit(batch)
        results = await asyncio.gather(*futures(batch), return_exceptions=True)
        assert all(isinstance(r, OutcomeUnknownError) for r in results)
        # an unknown outcome ends the epoch: later messages use a new producer id from 0
        more = items(2)
        sender.submit(more)
        await asyncio.gather(*futures(more))
        assert seqs(core.bodies[0]) == [("p.0", 0), ("p.0", 1), ("p.0", 2)]
        assert seqs(core.bodies[1]) == [("p.1", 0), ("p.1", 1)]

    # the core's own retry loop is what resends; here one failure reaches the sender
    run_sender(scenario, ScriptedCore([OutcomeUnknownError(ResponseCode.OUTCOME_UNKNOWN, "lost")]))


def test_messages_queued_while_a_batch_is_in_flight_ride_in_the_next_one() -> None:
    async def scenario(core: ScriptedCore, sender: QueueSender) -> None:
        first = items(1)
        sender.submit(first)
        assert len(core.bodies) == 0 and len(sender._in_flight) == 1  # sent at once: nothing in flight
        rest = submitted_singly(sender, 5)
        core.gate.set()  # type: ignore[union-attr]
        done = await asyncio.gather(*futures(first + rest))
        assert [len(b) for b in core.bodies] == [1, 5]  # one request for the five queued meanwhile
        assert [r.queue_offset for r in done] == [0, 0, 1, 2, 3, 4]
        assert seqs(core.bodies[1]) == [("p.0", s) for s in range(1, 6)]

    run_sender(scenario, ScriptedCore([], gated=True))


def test_a_refused_message_fails_alone_and_the_rest_are_resent_in_a_new_epoch() -> None:
    async def scenario(core: ScriptedCore, sender: QueueSender) -> None:
        batch = items(4)
        sender.submit(batch)
        results = await asyncio.gather(*futures(batch), return_exceptions=True)
        assert results[0].queue_offset == 0  # type: ignore[union-attr]
        assert isinstance(results[1], TopicNotExistError)
        assert not isinstance(results[2], BaseException) and not isinstance(results[3], BaseException)
        assert seqs(core.bodies[1]) == [("p.1", 0), ("p.1", 1)]  # resent: new id, from 0

    run_sender(scenario, ScriptedCore([[0, ResponseCode.TOPIC_NOT_EXIST, GAP, GAP]]))


def test_a_broker_that_forgot_the_producer_gets_the_batch_again_in_a_new_epoch() -> None:
    async def scenario(core: ScriptedCore, sender: QueueSender) -> None:
        sender._next_seq = 7  # it had sent 7 messages long ago
        batch = items(2)
        sender.submit(batch)
        results = await asyncio.gather(*futures(batch))
        assert [r.queue_offset for r in results] == [0, 1]
        assert seqs(core.bodies[0]) == [("p.0", 7), ("p.0", 8)]
        assert seqs(core.bodies[1]) == [("p.1", 0), ("p.1", 1)]

    run_sender(scenario, ScriptedCore([[GAP, GAP]]))  # the broker expired this producer (silent a day)


class ManualClockLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when the test moves it (``advance``): timers such as
    the sender's linger fire exactly when their time is reached, however slow the machine."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def time(self) -> float:
        return self.now

    async def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on and let what is due run."""
        self.now += seconds
        for _ in range(5):
            await asyncio.sleep(0)


def test_single_messages_go_at_once_when_idle_else_linger_and_share_a_record() -> None:
    # on the loop's own clock, stopped: a 30 ms linger cannot end before the test looks (a
    # 5 ms sleep raced it on a busy machine)
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, ManualClockLoop)
        core = ScriptedCore([], gated=True)  # no answers yet
        sender = QueueSender(core, Q, "p", linger_ms=30, max_in_flight=4)  # type: ignore[arg-type]
        try:
            batch = submitted_singly(sender, 5)
            await loop.advance(0.029)
            assert [len(b) for b in core.bodies] == [1]  # the first at once; the others linger
            await loop.advance(0.001)
            assert [len(b) for b in core.bodies] == [1, 4]  # then go together, the first unanswered
            core.gate.set()  # type: ignore[union-attr]
            await asyncio.gather(*futures(batch))
        finally:
            core.gate.set()  # type: ignore[union-attr]
            await sender.close(1)  # (its timeout is on the stopped clock: nothing may be left waiting)

    with asyncio.Runner(loop_factory=ManualClockLoop) as runner:
        runner.run(main())


def test_with_linger_0_waiting_messages_go_when_the_request_in_flight_is_answered() -> None:
    async def scenario(core: ScriptedCore, sender: QueueSender) -> None:
        batch = submitted_singly(sender, 5)
        await asyncio.sleep(0.02)
        assert [len(b) for b in core.bodies] == [1]
        assert sender._timer is None  # no timer to wake up for: it waits for the answer
        core.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(*futures(batch))
        assert [len(b) for b in core.bodies] == [1, 4]

    run_sender(scenario, ScriptedCore([], gated=True), linger_ms=0, max_in_flight=4)


def test_a_full_batch_goes_without_lingering_and_several_go_before_the_first_is_answered() -> None:
    async def scenario(core: ScriptedCore, sender: QueueSender) -> None:
        batch = items(18)  # 50 bytes each: 4 per request
        sender.submit(batch)
        await asyncio.sleep(0)
        assert [len(b) for b in core.bodies] == [4, 4, 4]  # three in flight, none answered
        core.gate.set()  # type: ignore[union-attr]
        done = await asyncio.wait_for(asyncio.gather(*futures(batch)), 5)
        # the last two went once nothing was in flight (not full, and the linger is long)
        assert [len(b) for b in core.bodies] == [4, 4, 4, 4, 2]
        assert [s for b in core.bodies for _, s in seqs(b)] == list(range(18))
        assert done[-1].queue_offset == 1

    run_sender(scenario, ScriptedCore([], gated=True), linger_ms=10_000, batch_bytes=200, max_in_flight=3)


def test_records_are_compressed_as_the_producer_asks() -> None:
    from client.aio.producer import AsyncProducer
    from protocol.record_batch import read_header

    class Keep(ScriptedCore):
        records: list[bytes] = []

        async def leader_request(self, group: str, request: SendBatchRequest, *, deadline: Deadline,
                                 topic: str | None = None) -> Frame:
            self.records.extend(request.records)
            return await super().leader_request(group, request, deadline=deadline, topic=topic)

    async def main() -> None:
        for compression, codec in ((None, 0), ("zstd", 1), ("lz4", 2)):
            core = Keep([])
            core.records = []
            sender = QueueSender(core, Q, "p", compression=compression)  # type: ignore[arg-type]
            batch = items(50, prefix="a fairly compressible body ")
            sender.submit(batch, flush=True)
            await asyncio.gather(*futures(batch))
            (record,) = core.records
            assert read_header(record).codec == codec
            assert [m.body for m in decode_messages(record)] == [i.message.body for i in batch]
            await sender.close(1)
        try:
            AsyncProducer(core=core, compression="gzip")  # type: ignore[arg-type]
        except ValueError as e:
            assert "zstd" in str(e)
        else:
            raise AssertionError("an unknown codec was taken")

    asyncio.run(main())


def test_closing_behind_an_unanswered_request_settles_the_answered_ones_and_says_the_rest_may_be_stored(
        ) -> None:
    class HeadNeverAnswered(ScriptedCore):
        async def leader_request(self, group: str, request: SendBatchRequest, *, deadline: Deadline,
                                 topic: str | None = None) -> Frame:
            first = not self.bodies
            answer = await super().leader_request(group, request, deadline=deadline, topic=topic)
            if first:
                await asyncio.Event().wait()  # sent, and no answer comes
            return answer

    async def main() -> None:
        core = HeadNeverAnswered([])
        sender = QueueSender(core, Q, "p", batch_bytes=200, max_in_flight=2, linger_ms=10_000)  # type: ignore[arg-type]
        batch = items(8)  # 50 bytes each: 4 per request, both in flight
        sender.submit(batch)
        await until(lambda: len(sender._in_flight) == 2 and sender._in_flight[1].outcome is not None)
        await sender.close(0.05)
        results = await asyncio.gather(*futures(batch), return_exceptions=True)
        assert [r.queue_offset for r in results[4:]] == [0, 1, 2, 3], results[4:]  # answered SEND_OK
        for r in results[:4]:
            assert isinstance(r, ClientClosedError) and "may or may not be stored" in str(r), r

    asyncio.run(main())
