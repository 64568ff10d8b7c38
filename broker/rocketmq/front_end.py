"""``RocketFrontEnd``: a broker replica's RocketMQ port -- the same TCP port as its native
clients', told apart by the first byte (``common.protocol_sniffer``) -- and the one table of
the RocketMQ request codes it serves, each by a handler that translates the request into
RaftMQ's and its answer back (``sends``, ``pulls``, ``offsets``, ``clients``, ``queries``).

    request                           handler
    SEND_MESSAGE(_V2), SEND_BATCH_MESSAGE          sends
    PULL_MESSAGE                                   pulls (long polling)
    QUERY/UPDATE_CONSUMER_OFFSET, GET_MAX/MIN_OFFSET,
    SEARCH_OFFSET_BY_TIMESTAMP, LOCK/UNLOCK_BATCH_MQ   offsets
    HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, CHECK_CLIENT_CONFIG,
    CONSUMER_SEND_MSG_BACK, END_TRANSACTION        clients
    VIEW_MESSAGE_BY_ID, QUERY_MESSAGE, UPDATE_AND_CREATE_TOPIC   queries
    GET_TOPIC_STATS_INFO, GET_CONSUME_STATS, GET_BROKER_RUNTIME_INFO (mqadmin)   admin
    anything else                     REQUEST_CODE_NOT_SUPPORTED, the remark naming the code

Security: with ACLs on (``[broker] acl``) every request must carry RocketMQ's AK/SK
signature (``AclClientRPCHook``): its access key is looked up in the replicated table, its
secret unsealed with the cluster secret and the signature checked
(``broker.security.access_keys``); the request is then served as the user the key maps to
(``CONNECTION_AUTH``), so the broker's own access check decides what it may do. An unsigned
request, an unknown or revoked key or a wrong signature is refused with NO_PERMISSION, its
remark saying which. Off loopback the port follows the broker's exposure rule (it is the
client port: TLS and ACLs, or ``--insecure``). Requests are served through the broker's own
dispatch (``RocketBroker.handle``), so their health gate, access check and errors are the
native port's -- except three that read the broker directly, each checking its native
equivalent's need first (``Edge.require``): VIEW_MESSAGE_BY_ID (the message at a CommitLog
position, through the broker's ``queries`` reader, after the same health gate),
GET_CONSUME_STATS (the broker's ``lag_rows`` of the group) and GET_BROKER_RUNTIME_INFO (the
log's positions and disk use). The connection is the one consumer registrations and parked
pulls are counted against (``CONNECTION``), and its registrations go when it closes.

Threads: the server's event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from broker.processors.context import CONNECTION
from broker.rocketmq.admin import AdminHandlers
from broker.rocketmq.answers import rocket_code
from broker.rocketmq.client_link import RocketClient
from broker.rocketmq.clients import ClientHandlers
from broker.rocketmq.connection import RocketConnection, RocketLimits
from broker.rocketmq.context import RocketBroker
from broker.rocketmq.edge import Edge
from broker.rocketmq.offsets import OffsetHandlers
from broker.rocketmq.pulls import PullHandlers
from broker.rocketmq.queries import QueryHandlers
from broker.rocketmq.sends import SendHandlers
from broker.security.access_control import CONNECTION_AUTH, ConnectionAuth
from broker.security.access_keys import AccessKeyRefused
from broker.security.authorizer import Principal
from protocol.remoting import FrameError
from protocol.rocketmq.codes import RequestCode, ResponseCode
from protocol.rocketmq.frame import RemotingFrame
from protocol.rocketmq.headers import HeaderError
from protocol.rocketmq.signature import SignedRequest

__all__ = ["RocketFrontEnd", "code_name"]

log = logging.getLogger("broker.rocketmq")

Handler = Callable[[RocketClient, RemotingFrame], Awaitable[RemotingFrame]]

#: an unexpected failure of a request code is logged (with its traceback) at most this often
LOG_EVERY_S = 60.0


def code_name(code: int) -> str:
    try:
        return f"{RequestCode(code).name} ({code})"
    except ValueError:
        return str(code)


class RocketFrontEnd:
    """RocketMQ's broker codes over ``broker`` (module docstring)."""

    def __init__(self, broker: RocketBroker, listen: str, limits: RocketLimits | None = None) -> None:
        self._broker = broker
        self.limits = limits or RocketLimits(max_frame_bytes=broker.max_frame_bytes,
                                             meter=broker.connections)
        self.edge = Edge(broker, listen)
        self._notices: set[asyncio.Task[None]] = set()
        self._logged: dict[int, float] = {}  # request code -> when a failure was last logged
        self.connections: dict[RocketConnection, RocketClient] = {}
        sends, pulls, offsets = SendHandlers(self.edge), PullHandlers(self.edge), OffsetHandlers(self.edge)
        clients, queries = ClientHandlers(self.edge), QueryHandlers(self.edge)
        admin = AdminHandlers(self.edge)
        self._handlers: dict[int, Handler] = {
            RequestCode.SEND_MESSAGE: sends.send,
            RequestCode.SEND_MESSAGE_V2: sends.send,
            RequestCode.SEND_BATCH_MESSAGE: sends.send_batch,
            RequestCode.PULL_MESSAGE: pulls.pull,
            RequestCode.QUERY_CONSUMER_OFFSET: offsets.query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: offsets.update_consumer_offset,
            RequestCode.GET_MAX_OFFSET: offsets.queue_offset,
            RequestCode.GET_MIN_OFFSET: offsets.queue_offset,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: offsets.queue_offset,
            RequestCode.LOCK_BATCH_MQ: offsets.lock_batch,
            RequestCode.UNLOCK_BATCH_MQ: offsets.lock_batch,
            RequestCode.HEART_BEAT: clients.heartbeat,
            RequestCode.UNREGISTER_CLIENT: clients.unregister,
            RequestCode.CHECK_CLIENT_CONFIG: clients.check_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: clients.consumer_list,
            RequestCode.CONSUMER_SEND_MSG_BACK: clients.send_back,
            RequestCode.END_TRANSACTION: clients.end_transaction,
            RequestCode.VIEW_MESSAGE_BY_ID: queries.view_by_id,
            RequestCode.QUERY_MESSAGE: queries.query,
            RequestCode.UPDATE_AND_CREATE_TOPIC: queries.create_topic,
            RequestCode.GET_TOPIC_STATS_INFO: admin.topic_stats,
            RequestCode.GET_CONSUME_STATS: admin.consume_stats,
            RequestCode.GET_BROKER_RUNTIME_INFO: admin.runtime_info,
        }

    @property
    def codes(self) -> frozenset[int]:
        """The request codes served."""
        return frozenset(self._handlers)

    def protocol(self) -> RocketConnection:
        """A new connection's protocol (the sniffer's ``alternate``)."""
        conn = RocketConnection(self.serve, self.limits, on_close=self._closed)
        self.connections[conn] = RocketClient(conn, self.edge)
        return conn

    def _closed(self, conn: RocketConnection) -> None:
        client = self.connections.pop(conn, None)
        if client is None:
            return
        client.close()
        gone = self._broker.consumers.drop_connection(client)
        self._broker.producers.drop_connection(client)
        if gone:  # the other members hear at once, as on the native port
            task = asyncio.get_running_loop().create_task(self._broker.client_requests.members_changed(gone))
            self._notices.add(task)
            task.add_done_callback(self._notices.discard)

    async def serve(self, conn: RocketConnection, frame: RemotingFrame) -> RemotingFrame:
        """``frame``'s answer (never raises)."""
        client = self.connections.get(conn)
        if client is None:  # a connection not made by ``protocol`` (tests): kept until closed
            client = self.connections[conn] = RocketClient(conn, self.edge)
        handler = self._handlers.get(frame.code)
        if handler is None:
            return frame.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                  remark=f"RaftMQ: request code {code_name(frame.code)} is not supported")
        if self._broker.access.enabled:
            refusal = self._sign_in(client, frame)
            if refusal is not None:
                return refusal
        CONNECTION.set(client)  # type: ignore[arg-type]  # any hashable connection object
        try:
            return await handler(client, frame)
        except HeaderError as e:
            return frame.response(ResponseCode.SYSTEM_ERROR, remark=f"RaftMQ: {e}")
        except FrameError as e:  # a value RaftMQ's frames cannot carry (an int beyond 64 bits, ...),
            return frame.response(rocket_code(e.code), remark=f"RaftMQ: {e.message}")  # a need unmet
        except Exception:
            now = time.monotonic()
            if now - self._logged.get(frame.code, -LOG_EVERY_S) >= LOG_EVERY_S:  # a client may repeat it
                self._logged[frame.code] = now
                log.exception("RocketMQ request %s failed (logged at most once a minute per code)",
                              code_name(frame.code))
            return frame.response(ResponseCode.SYSTEM_ERROR,
                                  remark="RaftMQ: internal error; see the broker log")

    def _sign_in(self, client: RocketClient, frame: RemotingFrame) -> RemotingFrame | None:
        """ACLs on: serve ``frame`` as the user whose access key signed it (this task's
        ``CONNECTION_AUTH``); its NO_PERMISSION answer when no key did."""
        access = self._broker.access
        request = SignedRequest.of(frame)
        try:
            user = access.access_keys.user_of(request)
        except AccessKeyRefused as e:
            access.audit_denied(None, client.remote, f"RocketMQ {code_name(frame.code)}", f"signature: {e}")
            return frame.response(ResponseCode.NO_PERMISSION, remark=f"RaftMQ: {e}")
        principal = client.principal
        if principal is None or principal.user != user:  # decisions cached per connection and user
            principal = client.principal = Principal.of(user, client.remote.rpartition(":")[0].strip("[]"))
        client.signed_by = (request.access_key or "", user)
        CONNECTION_AUTH.set(ConnectionAuth(client.remote, principal=principal))
        return None

    def close_connections(self) -> None:
        for conn in list(self.connections):
            conn.close()

    def closed(self, conn: RocketConnection) -> None:
        """``conn`` is gone (its protocol calls this; tests too)."""
        self._closed(conn)
