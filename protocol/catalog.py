"""Which class is the request and which the response body of each RequestCode.

Every code has both, except QUERY_BY_TIME (reserved: no broker serves it) and the two
oneway requests a broker sends to clients (no response). An error answer to any request
carries only its code and remark; a NOT_LEADER answer carries a ``NotLeaderResponse``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from protocol import access_keys, acl, consumer, deferred, offset, pop, pull, query, send, topic
from protocol.remoting import RequestCode
from protocol.wire import EmptyResponse, Request, Response

__all__ = ["CATALOG", "UNSERVED"]

#: code -> (its request class, its SUCCESS response class or None for a oneway request)
CATALOG: Mapping[RequestCode, tuple[type[Request], type[Response] | None]] = MappingProxyType({
    # sends (protocol.send)
    RequestCode.SEND_MESSAGE: (send.SendMessageRequest, send.WriteResponse),
    RequestCode.SEND_BATCH: (send.SendBatchRequest, send.SendBatchResponse),
    # pulls (protocol.pull)
    RequestCode.PULL_MESSAGE: (pull.PullRequest, pull.PullResponse),
    # reads by key, id and time (protocol.query)
    RequestCode.QUERY_MESSAGE: (query.QueryMessageRequest, query.QueryResponse),
    RequestCode.VIEW_MESSAGE_BY_ID: (query.ViewMessageRequest, query.QueryResponse),
    RequestCode.SEARCH_OFFSET: (query.SearchOffsetRequest, query.SearchOffsetResponse),
    RequestCode.RESET_OFFSET: (query.ResetOffsetRequest, query.ResetOffsetResponse),
    # offsets and orderly locks (protocol.offset)
    RequestCode.COMMIT_OFFSET: (offset.CommitOffsetRequest, send.WriteResponse),
    RequestCode.QUERY_OFFSET: (offset.QueryOffsetRequest, offset.QueryOffsetResponse),
    RequestCode.LOCK_BATCH_MQ: (offset.LockQueuesRequest, offset.LockQueuesResponse),
    RequestCode.UNLOCK_BATCH_MQ: (offset.UnlockQueuesRequest, offset.LockQueuesResponse),
    # per-message acknowledgement, group retry policies (protocol.pop)
    RequestCode.POP_MESSAGE: (pop.PopRequest, pop.PopResponse),
    RequestCode.ACK_MESSAGE: (pop.AckRequest, send.WriteResponse),
    RequestCode.CHANGE_INVISIBLE_DURATION: (pop.ChangeInvisibleRequest, send.WriteResponse),
    RequestCode.NACK_MESSAGE: (pop.NackRequest, pop.NackResponse),
    RequestCode.UPDATE_GROUP_CONFIG: (pop.GroupConfigRequest, send.WriteResponse),
    # clients and their groups (protocol.consumer)
    RequestCode.HEARTBEAT: (consumer.HeartbeatRequest, EmptyResponse),
    RequestCode.UNREGISTER_CLIENT: (consumer.UnregisterRequest, EmptyResponse),
    RequestCode.GET_CONSUMER_LIST: (consumer.ConsumerListRequest, consumer.ConsumerListResponse),
    RequestCode.NOTIFY_CONSUMER_IDS_CHANGED: (consumer.NotifyConsumersChanged, None),
    # send-backs and transactions (protocol.deferred)
    RequestCode.CONSUMER_SEND_MSG_BACK: (deferred.SendBackRequest, deferred.SendBackResponse),
    RequestCode.END_TRANSACTION: (deferred.EndTransactionRequest, deferred.EndTransactionResponse),
    RequestCode.CHECK_TRANSACTION: (deferred.CheckTransactionRequest, None),
    # routes and topics (protocol.topic)
    RequestCode.GET_ROUTE: (topic.GetRouteRequest, topic.RouteResponse),
    RequestCode.CREATE_TOPIC: (topic.CreateTopicRequest, send.WriteResponse),
    RequestCode.DELETE_TOPIC: (topic.DeleteTopicRequest, send.WriteResponse),
    RequestCode.GET_TOPICS: (topic.GetTopicsRequest, topic.TopicsResponse),
    # authentication, users and policies (protocol.acl)
    RequestCode.AUTH_START: (acl.AuthStartRequest, acl.AuthResponse),
    RequestCode.AUTH_FINISH: (acl.AuthFinishRequest, acl.AuthResponse),
    RequestCode.PUT_USER: (acl.PutUserRequest, send.WriteResponse),
    RequestCode.DELETE_USER: (acl.DeleteUserRequest, send.WriteResponse),
    RequestCode.LIST_USERS: (acl.ListUsersRequest, acl.UsersResponse),
    RequestCode.GRANT: (acl.GrantRequest, send.WriteResponse),
    RequestCode.REVOKE: (acl.RevokeRequest, send.WriteResponse),
    RequestCode.LIST_POLICIES: (acl.ListPoliciesRequest, acl.PoliciesResponse),
    # RocketMQ access keys (protocol.access_keys)
    RequestCode.PUT_ACCESS_KEY: (access_keys.PutAccessKeyRequest, send.WriteResponse),
    RequestCode.REVOKE_ACCESS_KEY: (access_keys.RevokeAccessKeyRequest, send.WriteResponse),
    RequestCode.LIST_ACCESS_KEYS: (access_keys.ListAccessKeysRequest, access_keys.AccessKeysResponse),
})

#: Codes with no contract: reserved, answered REQUEST_CODE_NOT_SUPPORTED.
UNSERVED = frozenset({RequestCode.QUERY_BY_TIME})
