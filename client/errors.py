"""Typed client errors. Each says whether trying again may help (``retriable``) and what to do.

    ClientError
    ├── BrokerError          the broker answered with an error code (``code``, ``remark``)
    │   ├── NotLeaderError   (retriable) the node is a follower; the client re-routes by itself
    │   ├── NoLeaderError    (retriable) the group is electing a leader
    │   ├── TopicNotExistError, InvalidNameError, MessageTooLargeError, NoPermissionError,
    │   │   SequenceGapError, InvalidArgumentError, SubscriptionInvalidError
    │   ├── AuthFailedError  wrong user or password, or credentials missing (ACLs are on)
    │   ├── OutcomeUnknownError (retriable) the request may or may not have taken effect
    │   └── DiskFullError    (retriable) a replica's disk is full; writes resume once space is freed
    ├── ConnectionLostError  (retriable) the broker could not be reached or the connection dropped
    ├── RequestTimeoutError  (retriable) no answer in time; a send may still have been stored
    ├── RouteNotFoundError   (retriable) no name server or node knows the topic yet
    ├── TlsError             the server's certificate was refused (wrong or missing CA, a name
    │                        the certificate does not cover): the same on every attempt
    ├── BufferFullError      (retriable) the producer holds ``buffer_bytes`` of sends not yet
    │                        answered: the brokers take messages slower than they are sent
    └── ClientClosedError    the producer/consumer was shut down
"""

from __future__ import annotations

from protocol.remoting import ResponseCode

__all__ = [
    "AuthFailedError",
    "BrokerError",
    "BufferFullError",
    "ClientClosedError",
    "ClientError",
    "ConnectionLostError",
    "DiskFullError",
    "InvalidArgumentError",
    "InvalidNameError",
    "MessageTooLargeError",
    "NoLeaderError",
    "NoPermissionError",
    "NotLeaderError",
    "OutcomeUnknownError",
    "RequestTimeoutError",
    "RouteNotFoundError",
    "SequenceGapError",
    "SubscriptionInvalidError",
    "TlsError",
    "TopicNotExistError",
    "broker_error",
]


class ClientError(Exception):
    retriable: bool = False


class BrokerError(ClientError):
    def __init__(self, code: int, remark: str, address: str = "", leader: str | None = None) -> None:
        try:
            name = ResponseCode(code).name
            meaning = ResponseCode(code).meaning
        except ValueError:
            name, meaning = f"code {code}", "unknown response code"
        where = f" from {address}" if address else ""
        super().__init__(f"{name}{where}: {remark or meaning}")
        self.code = code
        self.remark = remark
        self.address = address
        self.leader = leader
        self.retriable = code in {c.value for c in ResponseCode if c.retriable}


class NotLeaderError(BrokerError):
    """The node is not the group's leader; ``leader`` is the leader's address if known."""


class NoLeaderError(BrokerError):
    """The group has no leader (an election is running); retry after a pause."""


class TopicNotExistError(BrokerError):
    """Create the topic first (`raftmq topic create NAME`); auto-create is off."""


class InvalidNameError(BrokerError):
    pass


class MessageTooLargeError(BrokerError):
    pass


class NoPermissionError(BrokerError):
    """The user may not do this (the remark names the user, the action and the resource),
    or the topic is not writable."""


class AuthFailedError(BrokerError):
    """Not authenticated: wrong user name or password, or no credentials where the broker
    needs them (``credentials=``, or RAFTMQ_USER / RAFTMQ_PASSWORD for the CLI)."""


class SequenceGapError(BrokerError):
    pass


class InvalidArgumentError(BrokerError):
    pass


class SubscriptionInvalidError(BrokerError):
    pass


class OutcomeUnknownError(BrokerError):
    """The write may or may not have been stored. An idempotent resend never duplicates it."""


class DiskFullError(BrokerError):
    """A replica's disk is full (the message names it): the write was not stored, unless the
    message says it may still commit. Writes resume by themselves once space is freed there;
    an idempotent producer's resend never duplicates."""


class ConnectionLostError(ClientError):
    retriable = True


class RequestTimeoutError(ClientError):
    retriable = True


class RouteNotFoundError(ClientError):
    retriable = True


class TlsError(ClientError):
    """The server's certificate did not verify against the client's CA (``tls=``)."""


class BufferFullError(ClientError):
    retriable = True


class ClientClosedError(ClientError):
    pass


_BY_CODE: dict[int, type[BrokerError]] = {
    ResponseCode.NOT_LEADER: NotLeaderError,
    ResponseCode.NO_LEADER: NoLeaderError,
    ResponseCode.TOPIC_NOT_EXIST: TopicNotExistError,
    ResponseCode.INVALID_NAME: InvalidNameError,
    ResponseCode.MESSAGE_TOO_LARGE: MessageTooLargeError,
    ResponseCode.NO_PERMISSION: NoPermissionError,
    ResponseCode.AUTH_FAILED: AuthFailedError,
    ResponseCode.SEQUENCE_GAP: SequenceGapError,
    ResponseCode.INVALID_ARGUMENT: InvalidArgumentError,
    ResponseCode.SUBSCRIPTION_INVALID: SubscriptionInvalidError,
    ResponseCode.OUTCOME_UNKNOWN: OutcomeUnknownError,
    ResponseCode.FLUSH_TIMEOUT: OutcomeUnknownError,
    ResponseCode.DISK_FULL: DiskFullError,
}


def broker_error(code: int, remark: str, address: str = "", leader: str | None = None) -> BrokerError:
    """The typed error for a broker's error response."""
    return _BY_CODE.get(code, BrokerError)(code, remark, address, leader)
