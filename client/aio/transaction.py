"""Transactional messages: a half message, your local transaction, then commit or rollback.

    r = await producer.send_in_transaction(Message("orders", b"..."), arg)
        1. the message is stored as a *half*: invisible to consumers
        2. listener.execute_local_transaction(message, arg) -> COMMIT | ROLLBACK | UNKNOWN
        3. COMMIT makes it visible in its topic, ROLLBACK drops it, UNKNOWN leaves it open
    an open half (UNKNOWN, or this producer died) is checked back by the group's leader:
    after 6 s it asks a live producer of the same group, over that producer's connection,
    listener.check_local_transaction(message) -> COMMIT | ROLLBACK | UNKNOWN, up to 15
    times, then rolls it back.

The producer heartbeats its group to every replica it knows (every 2 s and on every new
connection), so whichever replica leads can reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from client.aio.producer import AsyncProducer
from client.backoff import Deadline
from client.errors import ClientError
from client.message import Message, ReceivedMessage, SendResult, received
from client.queues import MessageQueue
from protocol.consumer import HeartbeatRequest
from protocol.deferred import CheckTransactionRequest, EndTransactionRequest
from protocol.message_format import MessageFormatError, decode_record

__all__ = ["AsyncTransactionProducer", "LocalTransactionState", "TransactionListener",
           "TransactionResult"]

log = logging.getLogger("client.transaction")

HEARTBEAT_S = 2.0


class LocalTransactionState(enum.Enum):
    COMMIT = "COMMIT"
    ROLLBACK = "ROLLBACK"
    UNKNOWN = "UNKNOWN"


class TransactionListener(Protocol):
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState: ...

    def check_local_transaction(self, message: ReceivedMessage) -> LocalTransactionState: ...


@dataclass(frozen=True, slots=True)
class TransactionResult:
    send_result: SendResult
    state: LocalTransactionState


class AsyncTransactionProducer(AsyncProducer):
    def __init__(self, namesrv: str | Sequence[str] | None = None, group: str = "DEFAULT_TX_PRODUCER", *,
                 listener: TransactionListener, servers: Sequence[str] | None = None,
                 address_map: Mapping[str, str] | None = None, **options: Any) -> None:
        super().__init__(namesrv, group, servers=servers, address_map=address_map, **options)
        self.listener = listener
        self.core.on_check_transaction = self._on_check
        self.core.pool.on_connect.append(lambda _address: self._beat_soon())
        self._heartbeat: asyncio.Task[None] | None = None
        self._checks: set[asyncio.Task[None]] = set()

    async def start(self) -> AsyncTransactionProducer:
        self._heartbeat = asyncio.create_task(self._heartbeat_forever())
        return self

    async def shutdown(self, timeout: float = 10.0) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for t in list(self._checks):
            t.cancel()
        await super().shutdown(timeout)

    # -- sending ----------------------------------------------------------------------
    async def send_in_transaction(self, message: Message, arg: Any = None,
                                  shard_key: str | None = None) -> TransactionResult:
        props = {**message.properties, "TRAN_MSG": "true", "PGROUP": self.group}
        half = Message(message.topic, message.body, message.tags, message.keys, props)
        sent = await self.send(half, shard_key)
        await self._beat_all()  # the leader can check us back from now on
        loop = asyncio.get_running_loop()
        try:
            state = await loop.run_in_executor(None, self.listener.execute_local_transaction, message, arg)
        except Exception:
            log.exception("execute_local_transaction failed; the broker will check back")
            state = LocalTransactionState.UNKNOWN
        await self._end(sent.queue, sent.position, state)
        return TransactionResult(sent, state)

    async def _end(self, queue: MessageQueue, position: int, state: LocalTransactionState) -> None:
        if state == LocalTransactionState.UNKNOWN:
            return
        try:
            end = EndTransactionRequest(position=position, commit=state == LocalTransactionState.COMMIT)
            await self.core.leader_request(queue.group, end, deadline=Deadline(self.send_timeout),
                                           topic=queue.topic)
        except ClientError as e:  # the broker checks back later: nothing is lost
            log.warning("could not end the transaction of half %d (%s); the broker will check back",
                        position, e)

    # -- check-backs --------------------------------------------------------------------
    def _on_check(self, address: str, check: CheckTransactionRequest) -> None:
        task = asyncio.get_running_loop().create_task(self._answer_check(address, check))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer_check(self, address: str, check: CheckTransactionRequest) -> None:
        try:
            stored = decode_record(check.message)
        except MessageFormatError as e:
            log.warning("%s asked about half %d with bytes that are not a message: %s", address,
                        check.position, e)
            return
        queue = MessageQueue(stored.topic, self._group_of(address), stored.queue_id)
        message = received(stored, queue, -1, check.position, 0)
        loop = asyncio.get_running_loop()
        try:
            state = await loop.run_in_executor(None, self.listener.check_local_transaction, message)
        except Exception:
            log.exception("check_local_transaction failed; leaving the transaction open")
            return
        await self._end(queue, check.position, state)

    def _group_of(self, address: str) -> str:
        for group in self.core.routes.known_groups():
            if address in self.core.routes.replicas(group):
                return group
        return ""

    def _beat_soon(self) -> None:
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(self._beat_all())

    async def _beat_all(self) -> None:
        addresses = {a for g in self.core.routes.known_groups() for a in self.core.routes.replicas(g)}
        addresses.update(self.core.routes.static_servers())
        for address in sorted(addresses):
            with contextlib.suppress(ClientError):
                conn = await self.core.pool.get(address)
                await conn.call(HeartbeatRequest(client_id=self.core.client_id, producer_group=self.group),
                                timeout=3)

    async def _heartbeat_forever(self) -> None:
        """Beat every replica of every group (a check-back may come from any group this
        producer's transactions went to, and from whichever replica leads it)."""
        beats = 0
        while True:
            if beats % 5 == 0:  # learn groups that appeared (name server mode)
                with contextlib.suppress(ClientError):
                    for group, addresses in (await self.core.routes.groups()).items():
                        if group:
                            self.core.routes.register_group(group, addresses)
            await self._beat_all()
            beats += 1
            await asyncio.sleep(HEARTBEAT_S)
