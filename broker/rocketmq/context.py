"""``RocketBroker``: what the RocketMQ front end may reach of its broker -- the narrow view
``broker.remoting.server.BrokerServer`` satisfies (so this folder never imports the server).

Requests are served by ``handle``, the server's one dispatch of RaftMQ frames: the same
processors, the same access check, health gate and error answers as on the native port.

Threads: the server's event loop only.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING, Protocol

from broker.rocketmq.connection import FrameMeter
from protocol.message_format import Message
from protocol.remoting import Frame

if TYPE_CHECKING:
    from broker.security.access_control import AccessControl
    from dledger.log import Log

__all__ = ["MembershipNotices", "MessageReader", "Registry", "RocketBroker"]


class MessageReader(Protocol):
    def message_at(self, position: int) -> tuple[Message, int]:
        """The message at a CommitLog position and its store time; FrameError QUERY_NOT_FOUND."""

    def queue_offset_of(self, topic: str, queue_id: int, position: int) -> int:
        """The queue offset of the message at a CommitLog position; -1 if its queue holds none."""


class Registry(Protocol):
    def drop_connection(self, connection: Hashable) -> set[str]: ...


class MembershipNotices(Protocol):
    async def members_changed(self, groups: set[str]) -> None:
        """Tell the members of these groups that their membership changed."""


class RocketBroker(Protocol):
    @property
    def rlog(self) -> Log: ...
    @property
    def access(self) -> AccessControl: ...
    @property
    def queries(self) -> MessageReader: ...
    @property
    def consumers(self) -> Registry: ...
    @property
    def producers(self) -> Registry: ...
    @property
    def client_requests(self) -> MembershipNotices: ...
    @property
    def addresses(self) -> dict[str, str]: ...
    @property
    def max_frame_bytes(self) -> int: ...
    @property
    def max_message_bytes(self) -> int: ...
    @property
    def connections(self) -> FrameMeter: ...

    def lag_rows(self, group: str) -> list[dict[str, object]]:
        """A group's committed offset beside each queue's bounds (topic, queue, committed,
        min_offset, max_offset, lag)."""

    def unhealthy(self) -> str | None:
        """Why this replica must not serve (None: it may)."""

    async def handle(self, frame: Frame) -> Frame:
        """A RaftMQ request frame's answer (never raises)."""
