"""What every processor answers a record's apply outcome with: the response code of each
``Outcome`` (``OUTCOME_CODE``), the ``WriteResponse`` of a stored record (``written``), and the
whole response frame (``answer``). One module, so processors never import each other."""

from __future__ import annotations

from broker.state.machine import Applied, Outcome
from protocol.remoting import Frame, ResponseCode
from protocol.send import WriteResponse

__all__ = ["OUTCOME_CODE", "answer", "written"]


OUTCOME_CODE = {
    Outcome.STORED: ResponseCode.SUCCESS,
    Outcome.DUPLICATE: ResponseCode.SUCCESS,
    Outcome.DONE: ResponseCode.SUCCESS,
    Outcome.TOPIC_NOT_EXIST: ResponseCode.TOPIC_NOT_EXIST,
    Outcome.NO_PERMISSION: ResponseCode.NO_PERMISSION,
    Outcome.INVALID: ResponseCode.INVALID_ARGUMENT,
    Outcome.SEQUENCE_GAP: ResponseCode.SEQUENCE_GAP,
    Outcome.LOCKED: ResponseCode.NO_PERMISSION,
    Outcome.ABANDONED: ResponseCode.SYSTEM_BUSY,  # not stored; a retry may succeed
    Outcome.FRAGMENT: ResponseCode.SYSTEM_ERROR,  # never a caller's outcome
    Outcome.IN_FLIGHT_CAP: ResponseCode.SYSTEM_BUSY,  # ack or nack what is held, then retry
}


def answer(frame: Frame, applied: Applied) -> Frame:
    """The response to one record's apply outcome: a WriteResponse, or the error's remark."""
    code = OUTCOME_CODE[applied.outcome]
    if code != ResponseCode.SUCCESS:
        return frame.response(code, remark=applied.reason)
    return written(applied).reply(frame)


def written(applied: Applied) -> WriteResponse:
    """Where a successfully applied record went."""
    return WriteResponse(queue_id=applied.queue_id, queue_offset=applied.queue_offset,
                         position=applied.position, duplicate=applied.outcome == Outcome.DUPLICATE)
