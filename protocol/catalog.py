"""Which class is the request and which the response body of each RequestCode.

Every code has both, except QUERY_BY_TIME (reserved: no broker serves it) and the two
oneway requests a broker sends to clients (no response). An error answer to any request
carries only its code and remark; a NOT_LEADER answer carries a ``NotLeaderResponse``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from protocol.acl import (
    AuthFinishRequest,
    AuthResponse,
    AuthStartRequest,
    DeleteUserRequest,
    GrantRequest,
    ListPoliciesRequest,
    ListUsersRequest,
    PoliciesResponse,
    PutUserRequest,
    RevokeRequest,
    UsersResponse,
)
from protocol.consumer import (
    ConsumerListRequest,
    ConsumerListResponse,
    HeartbeatRequest,
    NotifyConsumersChanged,
    UnregisterRequest,
)
from protocol.deferred import (
    CheckTransactionRequest,
    EndTransactionRequest,
    EndTransactionResponse,
    SendBackRequest,
    SendBackResponse,
)
from protocol.offset import (
    CommitOffsetRequest,
    LockQueuesRequest,
    LockQueuesResponse,
    QueryOffsetRequest,
    QueryOffsetResponse,
    UnlockQueuesRequest,
)
from protocol.pull import PullRequest, PullResponse
from protocol.query import (
    QueryMessageRequest,
    QueryResponse,
    ResetOffsetRequest,
    ResetOffsetResponse,
    SearchOffsetRequest,
    SearchOffsetResponse,
    ViewMessageRequest,
)
from protocol.remoting import RequestCode
from protocol.send import SendBatchRequest, SendBatchResponse, SendMessageRequest, WriteResponse
from protocol.topic import (
    CreateTopicRequest,
    DeleteTopicRequest,
    GetRouteRequest,
    GetTopicsRequest,
    RouteResponse,
    TopicsResponse,
)
from protocol.wire import EmptyResponse, Request, Response

__all__ = ["CATALOG", "UNSERVED"]

#: code -> (its request class, its SUCCESS response class or None for a oneway request)
CATALOG: Mapping[RequestCode, tuple[type[Request], type[Response] | None]] = MappingProxyType({
    RequestCode.SEND_MESSAGE: (SendMessageRequest, WriteResponse),
    RequestCode.SEND_BATCH: (SendBatchRequest, SendBatchResponse),
    RequestCode.PULL_MESSAGE: (PullRequest, PullResponse),
    RequestCode.QUERY_MESSAGE: (QueryMessageRequest, QueryResponse),
    RequestCode.VIEW_MESSAGE_BY_ID: (ViewMessageRequest, QueryResponse),
    RequestCode.SEARCH_OFFSET: (SearchOffsetRequest, SearchOffsetResponse),
    RequestCode.COMMIT_OFFSET: (CommitOffsetRequest, WriteResponse),
    RequestCode.QUERY_OFFSET: (QueryOffsetRequest, QueryOffsetResponse),
    RequestCode.RESET_OFFSET: (ResetOffsetRequest, ResetOffsetResponse),
    RequestCode.HEARTBEAT: (HeartbeatRequest, EmptyResponse),
    RequestCode.UNREGISTER_CLIENT: (UnregisterRequest, EmptyResponse),
    RequestCode.GET_CONSUMER_LIST: (ConsumerListRequest, ConsumerListResponse),
    RequestCode.CONSUMER_SEND_MSG_BACK: (SendBackRequest, SendBackResponse),
    RequestCode.LOCK_BATCH_MQ: (LockQueuesRequest, LockQueuesResponse),
    RequestCode.UNLOCK_BATCH_MQ: (UnlockQueuesRequest, LockQueuesResponse),
    RequestCode.GET_ROUTE: (GetRouteRequest, RouteResponse),
    RequestCode.CREATE_TOPIC: (CreateTopicRequest, WriteResponse),
    RequestCode.DELETE_TOPIC: (DeleteTopicRequest, WriteResponse),
    RequestCode.GET_TOPICS: (GetTopicsRequest, TopicsResponse),
    RequestCode.END_TRANSACTION: (EndTransactionRequest, EndTransactionResponse),
    RequestCode.CHECK_TRANSACTION: (CheckTransactionRequest, None),
    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: (NotifyConsumersChanged, None),
    RequestCode.AUTH_START: (AuthStartRequest, AuthResponse),
    RequestCode.AUTH_FINISH: (AuthFinishRequest, AuthResponse),
    RequestCode.PUT_USER: (PutUserRequest, WriteResponse),
    RequestCode.DELETE_USER: (DeleteUserRequest, WriteResponse),
    RequestCode.LIST_USERS: (ListUsersRequest, UsersResponse),
    RequestCode.GRANT: (GrantRequest, WriteResponse),
    RequestCode.REVOKE: (RevokeRequest, WriteResponse),
    RequestCode.LIST_POLICIES: (ListPoliciesRequest, PoliciesResponse),
})

#: Codes with no contract: reserved, answered REQUEST_CODE_NOT_SUPPORTED.
UNSERVED = frozenset({RequestCode.QUERY_BY_TIME})
