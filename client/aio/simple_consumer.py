"""``AsyncSimpleConsumer``: per-message acknowledgement (RocketMQ 5's SimpleConsumer, issue 29).

Any number of consumers of one group share every queue of a topic: ``receive`` takes up to
N visible messages (the broker marks them invisible to the group for the duration asked);
each carries a ``Receipt``; ``ack`` settles one, ``change_invisible_duration`` extends (or
ends) its lease, ``nack`` gives it back -- visible again after the group's backoff, or in
%DLQ%group once it was delivered the group's maximum number of times. A message neither
acked nor nacked comes back when its invisibility ends (``delivery`` counts up). Every call
goes to the leader of each broker group holding the topic (``protocol.pop``).

A ``selector`` of tags or an ``sql`` SQL92 filter on properties is applied here: a message
it does not select is acked on receipt (the broker claims it all the same: a group meant to
read a part of a topic pays for the whole).

Delivery is at least once: a message whose ack was lost with a leader, or a POP whose
answer was lost, comes back after its invisibility (counted by ``SimpleMessage.delivery``).

Threads: one event loop (the blocking ``client.SimpleConsumer`` runs this on its own).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from client.aio.core import ClientCore
from client.aio.routes import PERM_READ
from client.backoff import Deadline
from client.credentials import Credentials
from client.message import ReceivedMessage, received_all
from client.queues import MessageQueue
from client.tag_filter import parse_tags
from protocol.pop import (
    MAX_POP,
    AckRequest,
    ChangeInvisibleRequest,
    NackRequest,
    NackResponse,
    PopRequest,
    PopResponse,
)
from protocol.remoting import Frame
from protocol.sql_filter import compile_filter
from protocol.tls import ClientTls

__all__ = ["AsyncSimpleConsumer", "Receipt", "SimpleMessage"]


@dataclass(frozen=True, slots=True)
class Receipt:
    """Which delivery of which message: what ``ack``, ``nack`` and ``change_invisible_duration``
    name. A receipt the message outlived (it went to another consumer) is refused."""

    broker_group: str
    topic: str
    queue_id: int
    offset: int
    delivery: int


@dataclass(frozen=True, slots=True)
class SimpleMessage:
    message: ReceivedMessage
    receipt: Receipt

    @property
    def body(self) -> bytes:
        return self.message.body

    @property
    def delivery(self) -> int:
        """1 for the first delivery of the message to its group, 2 for the next, ..."""
        return self.receipt.delivery


class AsyncSimpleConsumer:
    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_CONSUMER",
                 topic: str = "", *, selector: str | None = None, sql: str | None = None,
                 servers: Sequence[str] | None = None,
                 address_map: Mapping[str, str] | None = None, core: ClientCore | None = None,
                 tls: ClientTls | bool | None = None, credentials: Credentials | None = None,
                 timeout: float = 10.0) -> None:
        """``timeout``: how long an ack, nack or change is retried (failovers included).
        ``selector`` (tags) or ``sql`` (SQL92 on properties; FilterSyntaxError if invalid)."""
        if not topic:
            raise ValueError("a SimpleConsumer needs a topic")
        if selector is not None and sql is not None:
            raise ValueError("give a selector or an sql filter, not both")
        self.sql = None if sql is None else compile_filter(sql)
        self.group, self.topic, self.timeout = group, topic, timeout
        self.selector = parse_tags(selector)
        self.core = core or ClientCore(namesrv, servers, address_map=address_map, tls=tls,
                                       credentials=credentials)
        self._own_core = core is None
        self._turn = 0

    async def __aenter__(self) -> AsyncSimpleConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def receive(self, max_messages: int = 16, invisible_duration_s: float = 30.0,
                      wait_s: float = 0.0) -> list[SimpleMessage]:
        """Up to ``max_messages`` (1..32) visible messages, invisible to the group's other
        consumers for ``invisible_duration_s`` (>= 1 s); waits up to ``wait_s`` for one."""
        if not 1 <= max_messages <= MAX_POP:
            raise ValueError(f"max_messages must be 1..{MAX_POP}, got {max_messages}")
        route = await self.core.routes.route(self.topic)
        groups = sorted({q.group for q in route.queues(PERM_READ)})
        if not groups:
            return []
        self._turn += 1
        groups = groups[self._turn % len(groups):] + groups[:self._turn % len(groups)]
        share = math.ceil(max_messages / len(groups))
        invisible_ms = max(1000, int(invisible_duration_s * 1000))
        deadline = Deadline(wait_s)
        while True:
            # a long poll is held by the broker within the client's request timeout
            wait_ms = int(max(0.0, min(deadline.remaining(), self.core.request_timeout - 1.0)) * 1000)
            answers = await asyncio.gather(*(self._pop(g, share, invisible_ms, wait_ms) for g in groups),
                                           return_exceptions=True)
            got = [m for batch in answers if isinstance(batch, list) for m in batch]
            errors = [e for e in answers if isinstance(e, BaseException)]
            if errors and not got:
                raise errors[0]  # a broker group that failed does not cost the others' messages
            if got or deadline.expired():
                return got

    async def _pop(self, group: str, most: int, invisible_ms: int, wait_ms: int) -> list[SimpleMessage]:
        request = PopRequest(group=self.group, topic=self.topic, max_msgs=most, invisible_ms=invisible_ms,
                             wait_ms=wait_ms)
        reply = await self.core.leader_request(group, request, topic=self.topic,
                                               deadline=Deadline(self.timeout + wait_ms / 1000))
        out: list[SimpleMessage] = []
        unwanted: list[Receipt] = []
        for record in PopResponse.from_frame(reply).records or ():
            row = record.row
            queue = MessageQueue(self.topic, group, record.queue_id)
            messages = received_all(row.record, queue, row.offset, row.position, row.store_ms)
            for claim in record.claimed:
                m = messages[claim.offset - row.offset]
                receipt = Receipt(group, self.topic, record.queue_id, claim.offset, claim.delivery)
                if self.selector.matches(m.tags) and (self.sql is None or self.sql.matches(m.properties)):
                    out.append(SimpleMessage(m, receipt))
                else:
                    unwanted.append(receipt)
        for receipt in unwanted:  # not selected: settled at once
            await self._settle(AckRequest, receipt)
        return out

    async def ack(self, message: SimpleMessage | Receipt) -> None:
        """Settle the message: it is never delivered to the group again. Raises BrokerError
        (INVALID_ARGUMENT) if the receipt is stale."""
        await self._settle(AckRequest, _receipt(message))

    async def change_invisible_duration(self, message: SimpleMessage | Receipt, seconds: float) -> None:
        """The message stays invisible for ``seconds`` from now (0: visible again at once)."""
        r = _receipt(message)
        await self.core.leader_request(r.broker_group, ChangeInvisibleRequest(
            group=self.group, topic=r.topic, queue_id=r.queue_id, offset=r.offset, delivery=r.delivery,
            invisible_ms=int(seconds * 1000)), deadline=Deadline(self.timeout), topic=r.topic)

    async def nack(self, message: SimpleMessage | Receipt) -> bool:
        """Give the message back: visible after the group's backoff for this delivery. Returns
        True when it was dead-lettered instead (the group's max deliveries reached)."""
        r = _receipt(message)
        reply = await self._settle(NackRequest, r)
        return NackResponse.from_frame(reply).dead_lettered

    async def _settle(self, kind: type[AckRequest], r: Receipt) -> Frame:
        return await self.core.leader_request(
            r.broker_group, kind(group=self.group, topic=r.topic, queue_id=r.queue_id, offset=r.offset,
                                 delivery=r.delivery), deadline=Deadline(self.timeout), topic=r.topic)

    async def close(self) -> None:
        if self._own_core:
            await self.core.close()


def _receipt(message: SimpleMessage | Receipt) -> Receipt:
    return message.receipt if isinstance(message, SimpleMessage) else message
