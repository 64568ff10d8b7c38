"""Which processor serves which request code, and how a handler's errors are answered.

``dispatch_table`` is the one place every request code served is registered against its
processor's handler, as RocketMQ's remoting server registers its processors. ``answer``
runs a handler and turns what it raises into the response's code:

    FrameError                 its own code (INVALID_ARGUMENT, ...) and message
    NotLeader                  NOT_LEADER naming the leader and its client address
    InvalidName, MessageTooLarge, NoLeader, OutcomeUnknown, DiskFull
                               their codes; any other ProposeError SYSTEM_BUSY
    anything else              SYSTEM_ERROR (logged; the client reads "internal error")
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from broker.store.entry_batch import MessageTooLarge
from dledger.errors import DiskFull, NoLeader, NotLeader, OutcomeUnknown, ProposeError
from protocol.names import InvalidName
from protocol.remoting import Frame, FrameError, RequestCode, ResponseCode
from protocol.wire import NotLeaderResponse

if TYPE_CHECKING:
    from broker.remoting.server import BrokerServer

__all__ = ["SERVED_WHEN_UNHEALTHY", "Handler", "answer", "dispatch_table"]

log = logging.getLogger("broker.server")

Handler = Callable[[Frame], Awaitable[Frame]]

#: A handler's error -> the answer's code, the first that matches (ProposeError, the base
#: of the log's errors, last); FrameError and NotLeader are answered with more.
_ERROR_CODES: tuple[tuple[type[Exception], ResponseCode], ...] = (
    (InvalidName, ResponseCode.INVALID_NAME), (MessageTooLarge, ResponseCode.MESSAGE_TOO_LARGE),
    (NoLeader, ResponseCode.NO_LEADER), (OutcomeUnknown, ResponseCode.OUTCOME_UNKNOWN),
    (DiskFull, ResponseCode.DISK_FULL), (ProposeError, ResponseCode.SYSTEM_BUSY))
_ANSWERED_ERRORS = tuple(kind for kind, _ in _ERROR_CODES)
#: Requests an unhealthy replica still answers: none of them reads or changes state.
SERVED_WHEN_UNHEALTHY = frozenset({RequestCode.HEARTBEAT, RequestCode.UNREGISTER_CLIENT})


def dispatch_table(server: BrokerServer) -> dict[int, Handler]:
    """Every request code served -> its processor's handler (of ``server``'s processors)."""
    sends, pulls, topics, offsets = (server.sends, server.pulls, server.topic_requests,
                                     server.offset_requests)
    pops, clients, queries = server.pop_requests, server.client_requests, server.queries
    deferred, acl, keys = server.deferred_requests, server.acl_requests, server.access_key_requests
    return {
        RequestCode.SEND_MESSAGE: sends.send,
        RequestCode.SEND_BATCH: sends.send_batch,
        RequestCode.PULL_MESSAGE: pulls.pull,
        RequestCode.CREATE_TOPIC: topics.create_topic,
        RequestCode.DELETE_TOPIC: topics.delete_topic,
        RequestCode.GET_TOPICS: topics.topics,
        RequestCode.COMMIT_OFFSET: offsets.commit_offset,
        RequestCode.LOCK_BATCH_MQ: offsets.lock_queues,
        RequestCode.UNLOCK_BATCH_MQ: offsets.lock_queues,
        RequestCode.QUERY_OFFSET: offsets.query_offset,
        RequestCode.POP_MESSAGE: pops.pop,
        RequestCode.ACK_MESSAGE: pops.ack,
        RequestCode.CHANGE_INVISIBLE_DURATION: pops.change_invisible,
        RequestCode.NACK_MESSAGE: pops.nack,
        RequestCode.UPDATE_GROUP_CONFIG: pops.group_config,
        RequestCode.HEARTBEAT: clients.heartbeat,
        RequestCode.QUERY_MESSAGE: queries.query_by_key,
        RequestCode.VIEW_MESSAGE_BY_ID: queries.view_by_id,
        RequestCode.RESET_OFFSET: queries.reset_offset,
        RequestCode.GET_ROUTE: topics.route,
        RequestCode.SEARCH_OFFSET: queries.search_offset,
        RequestCode.UNREGISTER_CLIENT: clients.unregister,
        RequestCode.GET_CONSUMER_LIST: clients.consumer_list,
        RequestCode.CONSUMER_SEND_MSG_BACK: deferred.send_back,
        RequestCode.END_TRANSACTION: deferred.end_transaction,
        RequestCode.AUTH_START: acl.auth_start,
        RequestCode.AUTH_FINISH: acl.auth_finish,
        RequestCode.PUT_USER: acl.put_user,
        RequestCode.DELETE_USER: acl.delete_user,
        RequestCode.LIST_USERS: acl.list_users,
        RequestCode.GRANT: acl.grant,
        RequestCode.REVOKE: acl.grant,
        RequestCode.LIST_POLICIES: acl.list_policies,
        RequestCode.PUT_ACCESS_KEY: keys.put_access_key,
        RequestCode.REVOKE_ACCESS_KEY: keys.revoke_access_key,
        RequestCode.LIST_ACCESS_KEYS: keys.list_access_keys,
    }


async def answer(frame: Frame, handler: Handler, leader_address: Callable[[str], str | None]) -> Frame:
    """``handler``'s response to ``frame``, or the error response for what it raised
    (``leader_address``: a member's client address, for NOT_LEADER). Raises nothing."""
    try:
        return await handler(frame)
    except FrameError as e:
        return frame.response(e.code, remark=e.message)
    except NotLeader as e:
        address = leader_address(e.leader or "")
        return NotLeaderResponse(leader=e.leader, leader_address=address).reply(
            frame, ResponseCode.NOT_LEADER, remark=str(e))
    except _ANSWERED_ERRORS as e:
        code = next(c for kind, c in _ERROR_CODES if isinstance(e, kind))
        return frame.response(code, remark=str(e))
    except Exception:
        log.exception("request %s failed", frame.code)
        return frame.response(ResponseCode.SYSTEM_ERROR, remark="internal error; see the broker log")
