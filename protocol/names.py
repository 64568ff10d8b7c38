"""Topic and consumer/producer group names: RocketMQ's rules.

::

    name   := [%|a-zA-Z0-9_-]{1,N}        N = 127 for a topic, 255 for a group

    reserved topics (refused unless system=True):
        %RETRY%<group>                     a consumer group's retry topic   (made by the broker)
        %DLQ%<group>                       a consumer group's dead-letter topic
        SCHEDULE_TOPIC_XXXX                delayed messages
        RMQ_SYS_TRANS_HALF_TOPIC           transaction half messages
        RMQ_SYS_TRANS_OP_HALF_TOPIC        transaction commit/rollback records
        rmq_sys_*, RMQ_SYS_*               any other system topic

A retry or dead-letter topic is valid when what follows its prefix is a valid
group name, so it may be longer than 127 characters (as in RocketMQ, where the
broker creates them without the user-topic length check).
"""

from __future__ import annotations

import string
from typing import Any

__all__ = [
    "DLQ_PREFIX",
    "GROUP_MAX_LENGTH",
    "RETRY_PREFIX",
    "SCHEDULE_TOPIC",
    "SYSTEM_TOPIC_PREFIXES",
    "TOPIC_MAX_LENGTH",
    "TRANS_HALF_TOPIC",
    "TRANS_OP_HALF_TOPIC",
    "InvalidName",
    "dlq_topic",
    "is_reserved_topic",
    "retry_topic",
    "validate_group",
    "validate_topic",
]

TOPIC_MAX_LENGTH = 127
GROUP_MAX_LENGTH = 255
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_")

_ALLOWED = frozenset(string.ascii_letters + string.digits + "_-%|")
_ALLOWED_TEXT = "letters, digits, '_', '-', '%', '|'"
_RESERVED_NAMES = {
    SCHEDULE_TOPIC: "the delayed-message topic",
    TRANS_HALF_TOPIC: "the transaction half-message topic",
    TRANS_OP_HALF_TOPIC: "the transaction op topic",
}
_RESERVED_PREFIXES = {
    RETRY_PREFIX: "consumer groups' retry topics",
    DLQ_PREFIX: "consumer groups' dead-letter topics",
    **{prefix: "system topics" for prefix in SYSTEM_TOPIC_PREFIXES},
}


class InvalidName(ValueError):
    """A topic or group name that breaks the rules; the message says what is allowed.

    ``kind`` is "topic" or "group"; ``name`` is the refused value.
    """

    def __init__(self, kind: str, name: Any, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name


def validate_topic(name: str, *, system: bool = False) -> str:
    """Return ``name`` if it is a valid topic name, else raise InvalidName.

    Reserved names and prefixes are refused unless ``system`` (the broker's own
    topics); with ``system``, ``%RETRY%<group>`` and ``%DLQ%<group>`` need a valid
    group after the prefix.
    """
    _check_str("topic", name)
    prefix = _group_topic_prefix(name)
    if system and prefix:
        if name == prefix:
            raise InvalidName("topic", name, f"topic {name!r} names no group after its prefix")
        _check_shape("topic", name, len(prefix) + GROUP_MAX_LENGTH)
        return name
    _check_shape("topic", name, TOPIC_MAX_LENGTH)
    if not system:
        _check_not_reserved(name)
    return name


def validate_group(name: str) -> str:
    """Return ``name`` if it is a valid (consumer or producer) group name, else raise InvalidName."""
    _check_str("group", name)
    _check_shape("group", name, GROUP_MAX_LENGTH)
    return name


def retry_topic(group: str) -> str:
    """The retry topic of consumer ``group`` (validated): ``%RETRY%<group>``."""
    return RETRY_PREFIX + validate_group(group)


def dlq_topic(group: str) -> str:
    """The dead-letter topic of consumer ``group`` (validated): ``%DLQ%<group>``."""
    return DLQ_PREFIX + validate_group(group)


def is_reserved_topic(name: str) -> bool:
    """True for the names and prefixes only the broker may use (no other check)."""
    return name in _RESERVED_NAMES or name.startswith(tuple(_RESERVED_PREFIXES))


def _group_topic_prefix(name: str) -> str | None:
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if name.startswith(prefix):
            return prefix
    return None


def _check_str(kind: str, name: Any) -> None:
    if not isinstance(name, str):
        raise InvalidName(kind, name, f"{kind} name must be a str, got {type(name).__name__}")


def _check_shape(kind: str, name: str, max_length: int) -> None:
    if not name:
        raise InvalidName(kind, name,
                          f"{kind} name is empty; use 1 to {max_length} of: {_ALLOWED_TEXT}")
    if len(name) > max_length:
        raise InvalidName(kind, name, f"{kind} {_show(name)} is {len(name)} characters long; "
                                      f"at most {max_length} allowed")
    for position, char in enumerate(name):
        if char not in _ALLOWED:
            raise InvalidName(kind, name, f"{kind} {_show(name)} contains {char!r} at position "
                                          f"{position}; allowed: {_ALLOWED_TEXT}")


def _check_not_reserved(name: str) -> None:
    if name in _RESERVED_NAMES:
        raise InvalidName("topic", name, f"topic {name!r} is reserved ({_RESERVED_NAMES[name]}); "
                                         "choose another name")
    for prefix, what in _RESERVED_PREFIXES.items():
        if name.startswith(prefix):
            raise InvalidName("topic", name, f"topic {_show(name)} starts with the reserved prefix "
                                             f"{prefix!r} ({what}); choose another name")


def _show(name: str) -> str:
    return repr(name) if len(name) <= 40 else repr(name[:37]) + "..."
