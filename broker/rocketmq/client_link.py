"""``RocketClient``: one RocketMQ client connection as the broker sees it -- the object its
registrations and parked pulls are counted against (``CONNECTION``), and the way the
broker's own requests reach it (``broker.clients.registry.ForeignClient``):

    NOTIFY_CONSUMER_IDS_CHANGED (RaftMQ) -> NOTIFY_CONSUMER_IDS_CHANGED (40), oneway,
                                            ext consumerGroup
    CHECK_TRANSACTION (RaftMQ)           -> CHECK_TRANSACTION_STATE (39), oneway: the half
                                            message as a stored message, its position as
                                            ``commitLogOffset`` (the client's END_TRANSACTION
                                            sends it back), its UNIQ_KEY as msgId/transactionId

RocketMQ clients heartbeat every 30 s, and RaftMQ forgets a member after 30 s without one
(``broker.clients.registry.EXPIRY_S``): while the connection is open the front end repeats
the client's last heartbeat every ``KEEPALIVE_S``, for up to ``HEARTBEAT_TIMEOUT_S`` after
the client's own (RocketMQ's broker keeps a channel 120 s) -- and, with ACLs on, only while
the access key its requests were signed with is still held for the same user.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from broker.processors.context import CONNECTION
from broker.rocketmq.connection import RocketConnection
from broker.rocketmq.edge import Edge
from broker.rocketmq.translate import UNIQ_KEY, rocket_properties, stored_message
from broker.security.authorizer import Principal
from protocol.consumer import HeartbeatRequest, NotifyConsumersChanged
from protocol.deferred import CheckTransactionRequest
from protocol.message_format import MessageFormatError, decode_message
from protocol.remoting import Frame, FrameError, RequestCode
from protocol.rocketmq.codes import FrameFlag
from protocol.rocketmq.codes import RequestCode as RocketCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import (
    CheckTransactionStateRequestHeader,
    NotifyConsumerIdsChangedRequestHeader,
)
from protocol.rocketmq.message import encode_stored, message_id

__all__ = ["HEARTBEAT_TIMEOUT_S", "KEEPALIVE_S", "RocketClient"]

log = logging.getLogger("broker.rocketmq")

KEEPALIVE_S = 10.0
HEARTBEAT_TIMEOUT_S = 120.0


class RocketClient:
    """One RocketMQ connection's client (module docstring)."""

    def __init__(self, conn: RocketConnection, edge: Edge) -> None:
        self.conn = conn
        self._edge = edge
        self._heartbeat: HeartbeatRequest | None = None
        self._heard = 0.0
        self._keepalive: asyncio.Task[None] | None = None
        #: the user its last signed request came from (ACLs on), its decisions cached
        self.principal: Principal | None = None
        #: (access key, user) of its last signed request (ACLs on)
        self.signed_by: tuple[str, str] | None = None

    @property
    def remote(self) -> str:
        return self.conn.remote

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()

    def heard(self, heartbeat: HeartbeatRequest) -> None:
        """The client's own heartbeat was served: repeat it while the connection lives."""
        loop = asyncio.get_running_loop()
        self._heartbeat, self._heard = heartbeat, loop.time()
        if self._keepalive is None and not self.closed:
            self._keepalive = loop.create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        loop = asyncio.get_running_loop()
        CONNECTION.set(self)  # type: ignore[arg-type]
        while not self.closed and self._heartbeat is not None:
            await asyncio.sleep(KEEPALIVE_S)
            if loop.time() - self._heard > HEARTBEAT_TIMEOUT_S:
                return
            if self.signed_by is not None and not self._edge.broker.access.access_keys.holds(*self.signed_by):
                return  # its key was revoked (or its user deleted): it no longer acts as the user
            with contextlib.suppress(Exception):
                await self._edge.call(self._heartbeat)

    async def deliver(self, frame: Frame) -> None:
        """A broker request to this client (oneway), in RocketMQ's terms; others are dropped."""
        try:
            translated = self._translate(frame)
        except (FrameError, MessageFormatError) as e:
            log.info("a broker request to RocketMQ client %s was not sent: %s", self.remote, e)
            return
        if translated is not None:
            await self.conn.request(translated, 0)

    def _translate(self, frame: Frame) -> RemotingFrame | None:
        if frame.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            group = NotifyConsumersChanged.from_frame(frame).group
            ext, order = NotifyConsumerIdsChangedRequestHeader(consumer_group=group).to_ext()
            return RemotingFrame(RocketCode.NOTIFY_CONSUMER_IDS_CHANGED, 0, FrameFlag.ONEWAY, None, ext,
                                 ext_order=order)
        if frame.code == RequestCode.CHECK_TRANSACTION:
            check = CheckTransactionRequest.from_frame(frame)
            m = decode_message(check.message)
            host = self._edge.store_host()
            # a half sent without UNIQ_KEY (RocketMQ's clients always set one): its offsetMsgId
            uniq = rocket_properties(m).get(UNIQ_KEY) or message_id(host, check.position)
            body = encode_stored(stored_message(m, queue_offset=-1, position=check.position, store_ms=0,
                                                store_host=host))
            header = CheckTransactionStateRequestHeader(
                tran_state_table_offset=-1, commit_log_offset=check.position, msg_id=uniq,
                transaction_id=uniq, offset_msg_id=message_id(host, check.position))
            ext, order = header.to_ext()
            return RemotingFrame(RocketCode.CHECK_TRANSACTION_STATE, 0, FrameFlag.ONEWAY, None, ext, body,
                                 ext_order=order)
        return None
