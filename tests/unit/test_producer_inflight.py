"""Several requests in flight per queue, against a model broker and a network whose every
interleaving hypothesis chooses: answers in any order, answers lost after the broker
stored (the core retries the same bytes), refusals before storing (NOT_LEADER), attempts
given up with an unknown outcome. Whatever happens: nothing is stored twice, what is
stored is in send order, every SEND_OK names where its message is, and with no attempt
given up every message is stored, once, in order, under the one producer id (a gap of a
request that overtook a retried one is resent unchanged, not in a new epoch)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import client.aio.queue_sender as queue_sender
from client.aio.queue_sender import QueueSender, _Item
from client.backoff import Deadline
from client.errors import OutcomeUnknownError
from client.message import Message, SendResult
from client.queues import MessageQueue
from protocol.record_batch import decode_messages, read_header
from protocol.remoting import Frame, ResponseCode
from protocol.send import SendBatchRequest

Q = MessageQueue("t", "g1", 0)
OK, GAP = int(ResponseCode.SUCCESS), int(ResponseCode.SEQUENCE_GAP)
INVALID = int(ResponseCode.INVALID_ARGUMENT)


class ModelBroker:
    """The broker's idempotency rule (broker/state/producers.py): a record is stored if its
    base sequence is its producer's last + 1, a resend of a stored record is answered with
    its offsets, a gap is refused, any other overlap is INVALID."""

    def __init__(self) -> None:
        self.log: list[bytes] = []  # bodies, by queue offset
        self.last: dict[str, int] = {}
        self.records: dict[str, list[tuple[int, int, int]]] = {}  # producer -> (base, count, offset)

    def apply(self, request: SendBatchRequest) -> list[list[object]]:
        rows: list[list[object]] = []
        for record in request.records:
            h = read_header(record)
            pid = h.producer_id or ""
            last = self.last.get(pid, -1)
            if h.base_sequence == last + 1:
                offset = len(self.log)
                self.log.extend(m.body for m in decode_messages(record))
                self.last[pid] = last + h.count
                self.records.setdefault(pid, []).append((h.base_sequence, h.count, offset))
                rows += [[OK, 0, offset + i, "", offset + i] for i in range(h.count)]
            elif h.base_sequence > last + 1:
                rows += [[GAP, 0, -1, "gap", -1]] * h.count
            else:
                stored = [o for b, n, o in self.records.get(pid, []) if (b, n) == (h.base_sequence, h.count)]
                if stored:
                    rows += [[OK, 0, stored[0] + i, "already stored", stored[0] + i] for i in range(h.count)]
                else:
                    rows += [[INVALID, 0, -1, "overlap", -1]] * h.count
        return rows


@dataclass
class Attempt:
    request: SendBatchRequest
    action: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Network:
    """``leader_request`` as the core does it: retries a retriable failure with the same
    bytes until it gets an answer or gives up; the test decides each attempt's fate."""

    def __init__(self, broker: ModelBroker) -> None:
        self.broker = broker
        self.waiting: list[Attempt] = []

    async def leader_request(self, group: str, request: SendBatchRequest, *, deadline: Deadline,
                             topic: str | None = None) -> Frame:
        while True:
            attempt = Attempt(request)
            self.waiting.append(attempt)
            action = await attempt.action
            if action in ("answer", "lose", "give_up_stored"):
                rows = self.broker.apply(request)
                if action == "answer":
                    return Frame(0, 1, 1, "", {}, msgpack.packb(rows))
            if action.startswith("give_up"):
                raise OutcomeUnknownError(ResponseCode.OUTCOME_UNKNOWN, "no answer in time")
            # "lose" (stored, answer lost) and "refuse" (NOT_LEADER): the core tries again


class Sink:
    def __init__(self) -> None:
        self.outcome: SendResult | BaseException | None = None

    abandoned = False

    def settle(self, index: int, outcome: SendResult | BaseException) -> None:
        assert self.outcome is None, "settled twice"
        self.outcome = outcome


async def _quiet() -> None:
    for _ in range(20):  # every task runs until it waits on the network again
        await asyncio.sleep(0)


STEP = st.one_of(
    st.tuples(st.just("submit"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("act"), st.integers(0, 50),
              st.sampled_from(["answer", "answer", "answer", "lose", "refuse", "give_up", "give_up_stored"])),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(STEP, min_size=1, max_size=40), max_in_flight=st.integers(1, 4),
       batch_bytes=st.sampled_from([50, 120, 250, 10_000]),
       record_bytes=st.sampled_from([60, 160, 48 * 1024]))
def test_any_interleaving_stores_each_message_at_most_once_in_order(
        steps: list[tuple[str, int, object]], max_in_flight: int, batch_bytes: int,
        record_bytes: int) -> None:
    saved = queue_sender.RECORD_BYTES
    queue_sender.RECORD_BYTES = record_bytes
    try:
        asyncio.run(_run(steps, max_in_flight, batch_bytes))
    finally:
        queue_sender.RECORD_BYTES = saved


async def _run(steps: list[tuple[str, int, object]], max_in_flight: int, batch_bytes: int) -> None:
    broker = ModelBroker()
    net = Network(broker)
    sender = QueueSender(net, Q, "p", linger_ms=0, batch_bytes=batch_bytes,  # type: ignore[arg-type]
                         max_in_flight=max_in_flight)
    sent: list[tuple[bytes, Sink]] = []
    gave_up = False
    for kind, n, what in steps:
        if kind == "submit":
            batch = [_Item(Message("t", b"m%d" % (len(sent) + i)), Sink(), Deadline(60), bytes(16), 0, 50)
                     for i in range(n)]
            sent += [(i.message.body, i.sink) for i in batch]  # type: ignore[misc]
            sender.submit(batch, flush=bool(what))
        elif net.waiting:
            attempt = net.waiting.pop(n % len(net.waiting))
            gave_up |= str(what).startswith("give_up")
            attempt.action.set_result(str(what))
        await _quiet()
    for _ in range(1000):  # then a healthy network answers everything, oldest first
        if not net.waiting and all(s.outcome is not None for _, s in sent):
            break
        while net.waiting:
            net.waiting.pop(0).action.set_result("answer")
        await _quiet()
    assert all(s.outcome is not None for _, s in sent), "a message never got its outcome"

    bodies = [b for b, _ in sent]
    assert len(set(broker.log)) == len(broker.log), f"stored twice: {broker.log}"
    order = {b: i for i, b in enumerate(bodies)}
    assert [order[b] for b in broker.log] == sorted(order[b] for b in broker.log), "stored out of order"
    for body, sink in sent:
        if isinstance(sink.outcome, SendResult):
            assert broker.log[sink.outcome.queue_offset] == body
    if not gave_up:  # gaps were resent unchanged: one producer id, no new epoch
        assert set(broker.last) <= {"p.0"}
        assert broker.log == bodies
        assert all(isinstance(s.outcome, SendResult) for _, s in sent)
    await sender.close(1)
