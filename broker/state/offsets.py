"""Consumer offsets: the next offset a group consumes in each queue (replicated state).

Checkpoint form: ``{group: {topic: {queue id: committed offset}}}``.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.state.keys import GroupQueue

__all__ = ["ConsumerOffsets"]


class ConsumerOffsets:
    """The apply thread writes; any thread reads (each read is one atomic dict operation or
    works on a copy)."""

    def __init__(self, state: Mapping[str, Mapping[str, Mapping[int, int]]] | None = None) -> None:
        self._committed: dict[GroupQueue, int] = {}
        for group, by_topic in (state or {}).items():
            for topic, by_queue in by_topic.items():
                for queue_id, offset in by_queue.items():
                    self._committed[GroupQueue(group, topic, int(queue_id))] = offset

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConsumerOffsets) and self._committed == other._committed

    __hash__ = None  # type: ignore[assignment]

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self._committed[GroupQueue(group, topic, queue_id)] = offset

    def committed(self, group: str, topic: str, queue_id: int) -> int | None:
        return self._committed.get(GroupQueue(group, topic, queue_id))

    def groups(self) -> list[str]:
        """The groups with a committed offset, sorted."""
        return sorted({key.group for key in list(self._committed)})

    def of_group(self, group: str) -> dict[str, dict[int, int]]:
        """``group``'s committed offsets: topic -> queue id -> offset (a copy)."""
        out: dict[str, dict[int, int]] = {}
        for key, offset in list(self._committed.items()):
            if key.group == group:
                out.setdefault(key.topic, {})[key.queue_id] = offset
        return out

    def forget_topic(self, topic: str) -> None:
        """Deleted means deleted: no group keeps an offset of a topic that went."""
        for key in [k for k in self._committed if k.topic == topic]:
            del self._committed[key]

    def state(self) -> dict[str, dict[str, dict[int, int]]]:
        out: dict[str, dict[str, dict[int, int]]] = {}
        for key, offset in self._committed.items():
            out.setdefault(key.group, {}).setdefault(key.topic, {})[key.queue_id] = offset
        return out
