"""Who is connected (RocketMQ's ClientManageProcessor): HEARTBEAT (consumer subscriptions,
producer groups for transaction check-backs), UNREGISTER_CLIENT, GET_CONSUMER_LIST, and
NOTIFY_CONSUMER_IDS_CHANGED pushed to a group's members when it changes. Membership is
per WebSocket (``CONNECTION``, set by the server for the frame being handled) and per
replica: it is not in the log. (The layouts: ``protocol.consumer``.)
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from aiohttp import web

from broker.clients.registry import ClientIdTaken, ForeignClient, TooManyMembers, check_subscriptions
from broker.clients.retry_topics import RetryQuotaExceeded
from broker.processors.base import Processor
from broker.processors.context import CONNECTION
from broker.security.access_control import current_user
from broker.store.commands import CreateTopic, Perm, encode_admin
from dledger.errors import ProposeError
from protocol.consumer import (
    ConsumerListRequest,
    ConsumerListResponse,
    HeartbeatRequest,
    NotifyConsumersChanged,
    UnregisterRequest,
)
from protocol.names import retry_topic, validate_group
from protocol.remoting import Frame, FrameError, ResponseCode
from protocol.wire import EmptyResponse

if TYPE_CHECKING:
    from broker.processors.context import BrokerContext

__all__ = ["ConsumerProcessor"]

log = logging.getLogger("broker.consumers")

#: The WebSocket the frame being handled arrived on (consumer membership is per connection).
class ConsumerProcessor(Processor):
    def __init__(self, server: BrokerContext) -> None:
        super().__init__(server)
        self._opaques = itertools.count(1)  # of the requests this broker sends to clients

    async def heartbeat(self, frame: Frame) -> Frame:
        """A client's heartbeat: its consumer groups' subscriptions, or its producer group."""
        req = HeartbeatRequest.from_frame(frame)
        client_id = req.client_id
        subscriptions: dict[str, list[str]] = {}
        if req.subscriptions is not None:
            if not client_id:
                raise FrameError(ResponseCode.INVALID_ARGUMENT, "a consumer heartbeat needs clientId")
            try:
                check_subscriptions(req.subscriptions)
            except ValueError as e:
                raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
            subscriptions = {validate_group(g): list(t) for g, t in req.subscriptions.items()}
        ws = CONNECTION.get()
        user = current_user()
        producer_group = req.producer_group
        producer_id = client_id or str(id(ws))
        try:  # (ACLs on) another user's live client is not to be taken over: checked before either
            if producer_group:
                self._server.producers.require_owner(validate_group(producer_group), producer_id, user)
            for group in subscriptions:
                self._server.consumers.require_owner(group, client_id, user)
        except ClientIdTaken as e:
            raise FrameError(ResponseCode.NO_PERMISSION, f"{e}; use a client id of your own") from None
        try:
            if producer_group and ws is not None:
                self._server.producers.heartbeat(ws, producer_id, {validate_group(producer_group): []}, user)
            if subscriptions and ws is not None:
                await self.members_changed(self._server.consumers.heartbeat(ws, client_id, subscriptions,
                                                                            user))
        except TooManyMembers as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT, str(e)) from None
        await self._create_retry_topics(subscriptions, user)
        return EmptyResponse().reply(frame)

    async def _create_retry_topics(self, subscriptions: Mapping[str, list[str]], user: str | None) -> None:
        """The leader creates ``%RETRY%group`` (one queue) for a group that subscribes to it
        (clustering consumers do), as RocketMQ does at the heartbeat: the consumer routes and
        pulls its retry queue from the start, so the first redelivery is on time. At most
        the user's quota (``broker.clients.retry_topics``): past it, NO_PERMISSION."""
        missing = [retry_topic(g) for g, topics in sorted(subscriptions.items())
                   if retry_topic(g) in topics and retry_topic(g) not in self._server.machine.topics]
        if not missing or not self._server.rlog.is_leader:
            return
        try:
            self._server.retry_quota.take(user, missing)
        except RetryQuotaExceeded as e:
            raise FrameError(ResponseCode.NO_PERMISSION, str(e)) from None
        try:
            outcomes = await self._server.write.send([encode_admin(CreateTopic(t, 1, Perm.READ_WRITE))
                                              for t in missing])
        except ProposeError as e:  # the next heartbeat (or the first send-back) creates it
            log.info("could not create %s yet: %s", missing, e)
            return
        for topic, applied in zip(missing, outcomes, strict=True):
            log.info("created retry topic %s: %s", topic, applied.outcome)

    async def unregister(self, frame: Frame) -> Frame:
        req = UnregisterRequest.from_frame(frame)
        # only what this connection registered (issue 15 row 2: any client unregistered any other)
        ws = CONNECTION.get()
        await self.members_changed(self._server.consumers.unregister(req.client_id, req.group, ws))
        return EmptyResponse().reply(frame)

    async def consumer_list(self, frame: Frame) -> Frame:
        clients = self._server.consumers.clients(validate_group(ConsumerListRequest.from_frame(frame).group))
        return ConsumerListResponse(client_ids=tuple(clients)).reply(frame)

    async def members_changed(self, groups: set[str]) -> None:
        """Tell the members of each group that its membership changed (oneway, best effort)."""
        for group in sorted(groups):
            for conn in self._server.consumers.connections(group):
                note = NotifyConsumersChanged(group=group).to_frame(next(self._opaques) % (2**32),
                                                                    oneway=True)
                if isinstance(conn, web.WebSocketResponse) and not conn.closed:
                    with contextlib.suppress(ConnectionError, RuntimeError):
                        await conn.send_bytes(note.encode())
                elif isinstance(conn, ForeignClient) and not conn.closed:
                    await conn.deliver(note)
