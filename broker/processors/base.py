"""The base of the request processors (``broker/processors/*.py``, RocketMQ's processor per
request family): each holds the server whose state it reads and whose write path it
proposes through, and answers the frames ``BrokerContext``'s dispatch table routes to it.

Threads: the server's event loop only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker.processors.outcomes import answer
from broker.store.commands import AdminRecord, encode_admin
from protocol.remoting import Frame

if TYPE_CHECKING:
    from broker.processors.context import BrokerContext

__all__ = ["Processor"]


class Processor:
    """One request family's handlers over ``server``."""

    def __init__(self, server: BrokerContext) -> None:
        self._server = server

    async def _through_log(self, frame: Frame, command: AdminRecord) -> Frame:
        """Leader: propose ``command`` (one record) and answer ``frame`` with its apply
        outcome -- a WriteResponse, or the refusal's code and remark. Leadership is the
        caller's check (``require_leader``, before it reads the request)."""
        (applied,) = await self._server.write.send([encode_admin(command)])
        return answer(frame, applied)
