"""Redeliveries and transactions on the leader: CONSUMER_SEND_MSG_BACK (a retry copy in
%RETRY%group on the retry schedule, or %DLQ%group past maxReconsumeTimes) and
END_TRANSACTION (commit or roll back a half message); the held copies are released by
``broker.deferred_service``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.deferred_service import DEFAULT_MAX_RECONSUME
from broker.fragments import MessageGone, read_message_at
from broker.send_processor import answer
from protocol.message_format import MessageFormatError, decode_message, encode_message
from protocol.names import validate_group
from protocol.remoting import Frame, FrameError, ResponseCode, ext_bool, ext_int, ext_str

if TYPE_CHECKING:
    from broker.server import BrokerServer

__all__ = ["DeferredProcessor"]



class DeferredProcessor:
    def __init__(self, server: BrokerServer) -> None:
        self._server = server

    async def send_back(self, frame: Frame) -> Frame:
        """A consumer could not consume the message at ``position``: store a retry copy in
        %RETRY%group (delayed by the retry schedule) or, past ``maxReconsumeTimes``, in
        %DLQ%group."""
        self._server.require_leader()
        group = validate_group(ext_str(frame, "group"))
        position = ext_int(frame, "position", minimum=0)
        max_times = ext_int(frame, "maxReconsumeTimes", DEFAULT_MAX_RECONSUME, minimum=0, maximum=10_000)
        try:
            stored = decode_message(read_message_at(self._server.rlog.commitlog, position))
        except (MessageGone, MessageFormatError, ValueError) as e:
            raise FrameError(ResponseCode.INVALID_ARGUMENT,
                             f"no message at position {position}: {e}") from None
        copy = self._server.deferred.retry_copy(stored, group, max_times, position)
        (applied,) = await self._server.write.send([encode_message(copy)])
        reply = answer(frame, applied)
        if reply.code != ResponseCode.SUCCESS:
            return reply
        return frame.response(ResponseCode.SUCCESS, ext={**reply.ext, "topic": copy.topic,
                                                         "reconsumeTimes": copy.reconsume})

    async def end_transaction(self, frame: Frame) -> Frame:
        """Commit (make the half message visible in its topic) or roll back a transaction."""
        self._server.require_leader()
        position = ext_int(frame, "position", minimum=0)
        outcome = await self._server.deferred.end_transaction(position, ext_bool(frame, "commit"))
        return frame.response(ResponseCode.SUCCESS, ext={"outcome": outcome})
