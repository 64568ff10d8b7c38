"""Re-sending a dead letter (a message of ``%DLQ%group``): a plain copy of what the
producer sent, to its original topic, without the broker's bookkeeping properties."""

from __future__ import annotations

from client.message import Message, ReceivedMessage

__all__ = ["resend_copy"]

#: Set by the broker on held, delayed and retried copies; a resent message starts afresh.
_INTERNAL_PROPS = ("RETRY_TOPIC", "DELAY", "TIMER_DELIVER_MS")


def resend_copy(m: ReceivedMessage, topic: str | None = None) -> Message:
    """The message to send for dead letter ``m``: to ``topic`` (default: the topic it was
    first sent to), with its body, tags, keys and user properties ("__" ones are the
    broker's)."""
    origin = m.properties.get("RETRY_TOPIC", m.topic)
    props = {k: v for k, v in m.properties.items() if k not in _INTERNAL_PROPS and not k.startswith("__")}
    return Message(topic or origin, m.body, m.tags, list(m.keys), props)
