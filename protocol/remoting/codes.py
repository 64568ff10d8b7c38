"""The wire's request and response codes: what a frame asks for and how it turned out.

``RequestCode`` names what a request asks for (codes spaced by area); ``ResponseCode``
carries the outcome and its meaning; ``RETRIABLE`` says which outcomes a client may
retry. ``protocol.remoting.frame`` frames them; both ends import them from ``protocol.remoting``.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["RETRIABLE", "RequestCode", "ResponseCode"]


class RequestCode(IntEnum):
    """What a request asks for. Codes are spaced by area; new ones go in the gaps."""

    SEND_MESSAGE = 10
    SEND_BATCH = 11
    PULL_MESSAGE = 12
    QUERY_MESSAGE = 13
    VIEW_MESSAGE_BY_ID = 14
    QUERY_BY_TIME = 15
    SEARCH_OFFSET = 16  # a queue's min/max offsets, and the first offset stored at/after a time
    COMMIT_OFFSET = 20
    QUERY_OFFSET = 21
    RESET_OFFSET = 22
    HEARTBEAT = 30
    UNREGISTER_CLIENT = 31
    GET_CONSUMER_LIST = 32
    CONSUMER_SEND_MSG_BACK = 33  # a failed consumption: retry the message later (or dead-letter it)
    LOCK_BATCH_MQ = 34  # an orderly consumer takes its queues' consume locks (through the log)
    UNLOCK_BATCH_MQ = 35
    POP_MESSAGE = 36  # per-message acknowledgement (protocol.pop): take visible messages of a group
    ACK_MESSAGE = 37
    CHANGE_INVISIBLE_DURATION = 38
    NACK_MESSAGE = 39
    GET_ROUTE = 40
    CREATE_TOPIC = 50
    DELETE_TOPIC = 51
    GET_TOPICS = 52
    UPDATE_GROUP_CONFIG = 53  # a group's retry policy, through the log (protocol.pop)
    END_TRANSACTION = 60
    CHECK_TRANSACTION = 61  # broker -> client
    NOTIFY_CONSUMER_IDS_CHANGED = 62  # broker -> client
    AUTH_START = 70  # SCRAM-SHA-256: client-first (protocol.acl)
    AUTH_FINISH = 71  # SCRAM-SHA-256: client-final with the proof
    PUT_USER = 72  # users and policies: entries in the log (super users only)
    DELETE_USER = 73
    LIST_USERS = 74
    GRANT = 75
    REVOKE = 76
    LIST_POLICIES = 77
    PUT_ACCESS_KEY = 78  # RocketMQ access keys (AK/SK): entries in the log (protocol.access_keys)
    REVOKE_ACCESS_KEY = 79
    LIST_ACCESS_KEYS = 80


class ResponseCode(IntEnum):
    """The outcome carried by a response; ``meaning`` says what it tells the client.

    Whether a client may send the same request again is ``RETRIABLE`` (``.retriable``).
    """

    meaning: str

    def __new__(cls, value: int, meaning: str) -> ResponseCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.meaning = meaning
        return member

    SUCCESS = 0, "the request was carried out"
    SYSTEM_ERROR = 1, "the broker failed unexpectedly; the remark says how"
    SYSTEM_BUSY = 2, "the broker is overloaded (flow control); back off and retry"
    REQUEST_CODE_NOT_SUPPORTED = 3, "this broker does not know the request code"
    MALFORMED_FRAME = 4, "the frame could not be decoded"
    MESSAGE_TOO_LARGE = 5, "the frame or a message in it exceeds the size limit"
    INVALID_NAME = 6, "a topic or group name breaks the naming rules"
    TOPIC_NOT_EXIST = 7, "the topic does not exist"
    NOT_LEADER = 8, "this node is not the Raft leader; refresh the route and retry"
    NO_LEADER = 9, "the group has no leader right now (election); retry after a pause"
    NO_PERMISSION = 10, "the topic or broker does not permit this operation"
    PULL_NOT_FOUND = 11, "no new message at the requested offset (the long poll expired)"
    PULL_OFFSET_MOVED = 12, "the requested offset is outside the queue; pull from a valid one"
    PULL_RETRY_IMMEDIATELY = 13, "nothing was returned this time; pull again at once"
    FLUSH_TIMEOUT = 14, "the write was not confirmed durable in time; it may still commit"
    OUTCOME_UNKNOWN = 15, "the request may or may not have taken effect"
    SEQUENCE_GAP = 16, "an idempotent producer skipped sequence numbers; resend the missing ones"
    QUERY_NOT_FOUND = 17, "the query matched nothing"
    INVALID_ARGUMENT = 18, "a request field is missing or has a wrong type or value"
    SUBSCRIPTION_INVALID = 19, "the subscription expression is invalid or unknown"
    AUTH_FAILED = 20, "not authenticated: wrong user or password, or no credentials given"
    DISK_FULL = 21, ("a replica's disk is full (the remark names it): the write was not stored, "
                     "unless the remark says it may still commit; retry after a pause")

    @property
    def retriable(self) -> bool:
        return self in RETRIABLE


#: Codes after which the same request may be sent again (after a pause or a route
#: refresh). FLUSH_TIMEOUT and OUTCOME_UNKNOWN (and a DISK_FULL whose remark says so) may
#: have taken effect: resending a message is exactly-once only for an idempotent producer
#: (producer_id + sequence), at-least-once otherwise.
RETRIABLE: frozenset[ResponseCode] = frozenset({
    ResponseCode.SYSTEM_BUSY,
    ResponseCode.NOT_LEADER,
    ResponseCode.NO_LEADER,
    ResponseCode.PULL_RETRY_IMMEDIATELY,
    ResponseCode.FLUSH_TIMEOUT,
    ResponseCode.OUTCOME_UNKNOWN,
    ResponseCode.DISK_FULL,
})
