"""RaftMQ answers as RocketMQ answers: response codes, and the errors of a RaftMQ frame
turned into a RocketMQ response with the remark kept.

    RaftMQ                        RocketMQ (what its client does with it)
    NOT_LEADER, NO_LEADER,        SERVICE_NOT_AVAILABLE: a producer retries (another broker
    DISK_FULL                     name when there is one) and its route refresh (every 30 s,
                                  or at once when a broker is unreachable) names the new master
    FLUSH_TIMEOUT,                SYSTEM_ERROR: retried by the producer -- the message may be
    OUTCOME_UNKNOWN               stored twice (RocketMQ clients have no idempotent producer)
    MESSAGE_TOO_LARGE,            MESSAGE_ILLEGAL
    INVALID_ARGUMENT (a send)
    AUTH_FAILED, NO_PERMISSION    NO_PERMISSION
    the rest                      the code of the same name, else SYSTEM_ERROR
"""

from __future__ import annotations

from protocol.remoting import Frame, FrameError
from protocol.remoting import ResponseCode as Native
from protocol.rocketmq.codes import ResponseCode as Rocket
from protocol.rocketmq.frame import RemotingFrame
from protocol.wire import NotLeaderResponse

__all__ = ["ROCKET_CODE", "refused", "rocket_code"]

_NATIVE = {c.value: c for c in Native}

ROCKET_CODE: dict[int, Rocket] = {
    Native.SUCCESS: Rocket.SUCCESS,
    Native.SYSTEM_ERROR: Rocket.SYSTEM_ERROR,
    Native.SYSTEM_BUSY: Rocket.SYSTEM_BUSY,
    Native.REQUEST_CODE_NOT_SUPPORTED: Rocket.REQUEST_CODE_NOT_SUPPORTED,
    Native.MALFORMED_FRAME: Rocket.SYSTEM_ERROR,
    Native.MESSAGE_TOO_LARGE: Rocket.MESSAGE_ILLEGAL,
    Native.INVALID_NAME: Rocket.MESSAGE_ILLEGAL,
    Native.TOPIC_NOT_EXIST: Rocket.TOPIC_NOT_EXIST,
    Native.NOT_LEADER: Rocket.SERVICE_NOT_AVAILABLE,
    Native.NO_LEADER: Rocket.SERVICE_NOT_AVAILABLE,
    Native.NO_PERMISSION: Rocket.NO_PERMISSION,
    Native.PULL_NOT_FOUND: Rocket.PULL_NOT_FOUND,
    Native.PULL_OFFSET_MOVED: Rocket.PULL_OFFSET_MOVED,
    Native.PULL_RETRY_IMMEDIATELY: Rocket.PULL_RETRY_IMMEDIATELY,
    Native.FLUSH_TIMEOUT: Rocket.SYSTEM_ERROR,
    Native.OUTCOME_UNKNOWN: Rocket.SYSTEM_ERROR,
    Native.SEQUENCE_GAP: Rocket.SYSTEM_ERROR,
    Native.QUERY_NOT_FOUND: Rocket.QUERY_NOT_FOUND,
    Native.INVALID_ARGUMENT: Rocket.SYSTEM_ERROR,
    Native.SUBSCRIPTION_INVALID: Rocket.SUBSCRIPTION_PARSE_FAILED,
    Native.AUTH_FAILED: Rocket.NO_PERMISSION,
    Native.DISK_FULL: Rocket.SERVICE_NOT_AVAILABLE,
}


def rocket_code(native: int, *, send: bool = False) -> Rocket:
    if send and native == Native.INVALID_ARGUMENT:
        return Rocket.MESSAGE_ILLEGAL
    return ROCKET_CODE.get(native, Rocket.SYSTEM_ERROR)


def refused(request: RemotingFrame, answer: Frame, *, send: bool = False, code: int | None = None,
            remark: str | None = None) -> RemotingFrame:
    """``request``'s RocketMQ answer for the RaftMQ error ``answer`` (its remark kept; a
    NOT_LEADER's names the leader); ``code`` and ``remark``: a message's own in a batch answer."""
    native = answer.code if code is None else code
    remark = answer.remark if remark is None else remark
    if not remark:
        try:
            remark = _NATIVE[native].meaning
        except KeyError:
            remark = f"code {native}"
    if native == Native.NOT_LEADER:
        try:
            named = NotLeaderResponse.from_frame(answer).leader_address or "unknown"
        except FrameError:
            named = "unknown"
        remark = f"not the leader of its group (the leader is {named}): {answer.remark}"
    return request.response(rocket_code(native, send=send), remark=f"RaftMQ: {remark}")
