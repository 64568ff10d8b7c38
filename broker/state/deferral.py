"""Held messages in the apply step: delayed and retried messages (``Timers``), transaction
halves (``Halves``) and the send-backs seen (replicated state; see ``broker.state.held``).

``route`` decides where a valid message is stored: its own queue; held (a delivery time
after its store time: ``SCHEDULE_TOPIC_XXXX`` queue = its delay level, or 0; a transaction
half: ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0); or nowhere -- a released or committed copy
whose hold is gone was delivered already, and a send-back seen within its window is one
(DUPLICATE). ``carry`` applies a carried-forward copy (``__CARRIED_FROM``): the message it
names, still held, is read from the copy from now on; the copy itself goes in no queue.

Checkpoint form: ``"timers"`` and ``"halves"`` as ``Timers.state`` and ``Halves.state``,
``"sent_back"`` as ``SendBacks.state``.
"""

from __future__ import annotations

from typing import Any

from broker.state.held import (
    Halves,
    Prop,
    Timers,
)
from broker.state.send_backs import SendBacks
from protocol.message_format import Message
from protocol.names import SCHEDULE_TOPIC, TRANS_HALF_TOPIC

__all__ = ["Deferral"]


class Deferral:
    """Apply thread changes it; the leader's scheduler reads ``timers`` and ``halves``."""

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        state = state or {}
        self.timers = Timers(state.get("timers"))
        self.halves = Halves(state.get("halves"))
        self.send_backs = SendBacks(state.get("sent_back"))

    def route(self, m: Message, position: int, size: int, stamp: int) -> tuple[str, int] | str:
        """(topic, queue id) to store ``m`` in -- holding it if it is deferred -- or why it is
        not stored: it is a duplicate. ``position``, ``size``: its record's; ``stamp``: its
        store time."""
        props = m.properties
        released = props.get(Prop.SCHEDULED_FROM)
        if released is not None:
            if not (released.isdigit() and self.timers.release(int(released))):
                return "this delayed message was delivered"
            return m.topic, m.queue_id
        committed = props.get(Prop.TRANSACTION_OF)
        if committed is not None:
            if not (committed.isdigit() and self.halves.resolve(int(committed))):
                return "this transaction was resolved"
            return m.topic, m.queue_id
        origin = props.get(Prop.SENT_BACK)
        if origin is not None and not self.send_backs.admit(origin, stamp):
            return "this message was sent back already"
        if props.get(Prop.TRAN) == "true":
            self.halves.hold(position, size, stamp, props.get(Prop.PGROUP, ""), m.topic)
            return TRANS_HALF_TOPIC, 0
        due = props.get(Prop.DELIVER_AT, "")
        if due.isdigit() and int(due) > stamp:
            self.timers.hold(position, size, int(due), props.get(Prop.RETRY_TOPIC) or m.topic)
            level = props.get(Prop.DELAY, "")
            return SCHEDULE_TOPIC, int(level) if level.isdigit() and int(level) < 1024 else 0
        return m.topic, m.queue_id

    def carry(self, m: Message, position: int, size: int) -> str | None:
        """``m`` is a carried-forward copy at ``position`` (``size`` bytes): the message held
        by the position in its ``__CARRIED_FROM`` is read from it now. None when it was, else
        why not (it was delivered, resolved, or its topic deleted, before the copy applied)."""
        identity = m.properties.get(Prop.CARRIED_FROM, "")
        if not identity.isdigit():
            return "a carried copy names no held message"
        held_by = int(identity)
        if self.timers.carry(held_by, position, size) or self.halves.carry(held_by, position, size):
            return None
        return "this held message was delivered or resolved before it was carried"

    def forget_topic(self, topic: str) -> None:
        """``topic`` was deleted: its delayed messages, retries and transaction halves go."""
        self.timers.forget_topic(topic)
        self.halves.forget_topic(topic)

    def drop_hold(self, m: Message) -> None:
        """A released or committed copy that cannot be stored (its topic went away): the hold
        goes too, or the leader would release it again forever."""
        released = m.properties.get(Prop.SCHEDULED_FROM, "")
        if released.isdigit():
            self.timers.release(int(released))
        committed = m.properties.get(Prop.TRANSACTION_OF, "")
        if committed.isdigit():
            self.halves.resolve(int(committed))

    def held_positions(self) -> list[int]:
        """The CommitLog positions of every held message (any thread; may raise RuntimeError
        if the apply thread changes the tables meanwhile)."""
        return [*self.timers.stored_positions(), *self.halves.stored_positions()]

    def state(self) -> dict[str, Any]:
        return {"timers": self.timers.state(), "halves": self.halves.state(),
                "sent_back": self.send_backs.state()}
