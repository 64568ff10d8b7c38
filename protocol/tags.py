"""Tag hashing: the 64-bit value a ConsumeQueue unit stores for a message's tag, which a
tag-filtered pull (RocketMQ's ``SubscriptionData.codeSet``) sends to the broker."""

from __future__ import annotations

import mmh3

__all__ = ["tag_hash"]


def tag_hash(tag: str | None) -> int:
    """64-bit signed murmur3 of the tag; 0 for no tag (an empty tag counts as none).
    Pure and thread-safe."""
    if not tag:
        return 0
    return mmh3.hash64(tag, signed=True)[0]
