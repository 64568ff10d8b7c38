"""Orderly consumers' queue locks: which client of a group consumes a queue (replicated state).

Taken and given back through the log (``LockQueue`` records, as RocketMQ's
``lockBatchMQ``): one client holds a queue's lock at a time; a lock not renewed for
LOCK_EXPIRY_MS of store time may be taken by another client (RocketMQ's 60 s; clients stop
consuming after 30 s without a renewal).

Checkpoint form: ``{"group\\0topic\\0queue id": [client id, store ms of its last lock]}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from broker.state.keys import GroupQueue, join_key, split_key
from broker.state.outcome import Kept, Outcome, kept
from broker.store.commands import LockQueue

__all__ = ["LOCK_EXPIRY_MS", "QueueLocks"]

LOCK_EXPIRY_MS = 60_000


class _Holder(NamedTuple):
    client_id: str
    renewed_ms: int


class QueueLocks:
    """Apply thread only."""

    def __init__(self, state: Mapping[str, list[Any]] | None = None) -> None:
        self._held: dict[GroupQueue, _Holder] = {
            GroupQueue(*split_key(text)): _Holder(client, ms) for text, (client, ms) in (state or {}).items()}

    def apply(self, cmd: LockQueue, stamp: int) -> Kept:
        """Take or give back a queue's consume lock, as of the entry's store time ``stamp``:
        DONE, or LOCKED naming the holder."""
        key = GroupQueue(cmd.group, cmd.topic, cmd.queue_id)
        held = self._held.get(key)
        if not cmd.lock:
            if held is not None and held.client_id == cmd.client_id:
                del self._held[key]
            return kept(Outcome.DONE, cmd.queue_id)
        if held is not None and held.client_id != cmd.client_id and held.renewed_ms >= stamp - LOCK_EXPIRY_MS:
            return kept(Outcome.LOCKED, cmd.queue_id, reason=(
                f"locked by {held.client_id} (renewed at {held.renewed_ms}, "
                f"expires {LOCK_EXPIRY_MS // 1000} s later)"))
        self._held[key] = _Holder(cmd.client_id, stamp)
        return kept(Outcome.DONE, cmd.queue_id)

    def forget_expired(self, now_ms: int) -> None:
        """Drop locks past LOCK_EXPIRY_MS: a lookup already treats them as free."""
        for key in [k for k, h in self._held.items() if h.renewed_ms < now_ms - LOCK_EXPIRY_MS]:
            del self._held[key]

    def forget_topic(self, topic: str) -> None:
        """Deleted means deleted: a topic created again under the name has no locks."""
        for key in [k for k in self._held if k.topic == topic]:
            del self._held[key]

    def state(self) -> dict[str, list[Any]]:
        return {join_key(k): [h.client_id, h.renewed_ms] for k, h in self._held.items()}
