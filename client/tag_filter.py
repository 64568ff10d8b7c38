"""Subscription expressions by tag, and the two-stage tag filter.

An expression is ``"*"`` (or ``""``, or None): every message; or tags joined by
``"||"``, such as ``"TagA || TagB"``: a message whose tag is one of them. Spaces
around a tag are trimmed and empty parts are ignored (``"a || || b"`` is
``{"a", "b"}``), but an expression with no tag at all (``"||"``) is an error,
and so is ``"*"`` combined with tags.

Filtering happens twice, as in RocketMQ: the broker compares the tag hashes in
its ConsumeQueue units with ``TagSelector.hashes()`` (coarse: two tags may share
a hash), then the client checks the real tag with ``TagSelector.matches``. A
message without a tag (None or ``""``, hash 0) matches only the "all" selector.

Pure and thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.tags import tag_hash

__all__ = ["SUB_ALL", "TAG_SEPARATOR", "SubscriptionError", "TagSelector", "parse_tags"]

SUB_ALL = "*"
TAG_SEPARATOR = "||"


class SubscriptionError(ValueError):
    """A subscription expression that selects nothing sensible; the message says why."""


@dataclass(frozen=True)
class TagSelector:
    """A parsed subscription expression; ``tags`` is None for "all"."""

    expression: str
    tags: frozenset[str] | None

    def hashes(self) -> list[int] | None:
        """The sorted tag hashes for the broker's coarse filter; None means every message."""
        if self.tags is None:
            return None
        return sorted({tag_hash(tag) for tag in self.tags})

    def matches(self, tag: str | None) -> bool:
        """Whether a message with ``tag`` is selected (exact comparison, done in the client)."""
        if self.tags is None:
            return True
        return bool(tag) and tag in self.tags


def parse_tags(expression: str | None) -> TagSelector:
    """Parse a subscription expression; raises SubscriptionError if it has no tag.

    None, ``""``, ``"*"`` (spaces around them allowed) select every message. The
    returned selector keeps ``expression`` as given (``"*"`` for None).
    """
    if expression is None:
        return TagSelector(SUB_ALL, None)
    if expression.strip() in ("", SUB_ALL):
        return TagSelector(expression, None)
    tags = frozenset(part.strip() for part in expression.split(TAG_SEPARATOR)) - {""}
    if not tags:
        raise SubscriptionError(f"subscription expression {expression!r} names no tag")
    if SUB_ALL in tags:
        raise SubscriptionError(
            f"subscription expression {expression!r} combines {SUB_ALL!r} with tags; use {SUB_ALL!r} alone"
        )
    return TagSelector(expression, tags)
