"""The topics table: name -> queue count and permission (replicated state).

Checkpoint form: ``{topic: [queues, perm]}``, by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from broker.store.commands import Perm
from protocol.names import DLQ_PREFIX, RETRY_PREFIX

__all__ = ["TopicConfig", "Topics"]

_READ_WRITE = int(Perm.READ_WRITE)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    queues: int
    perm: int


class Topics(Mapping[str, TopicConfig]):
    """The apply thread changes it; other threads read it as a mapping (a lookup is atomic;
    iterate over a copy, e.g. ``sorted(topics.items())``)."""

    def __init__(self, state: Mapping[str, list[int]] | None = None) -> None:
        self._configs: dict[str, TopicConfig] = {
            name: TopicConfig(int(queues), int(perm)) for name, (queues, perm) in (state or {}).items()}

    def __getitem__(self, name: str) -> TopicConfig:
        return self._configs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._configs)

    def __len__(self) -> int:
        return len(self._configs)

    def __contains__(self, name: object) -> bool:
        return name in self._configs

    def get(self, name: str, default: TopicConfig | None = None) -> TopicConfig | None:  # type: ignore[override]
        """As ``dict.get`` (no ``Mapping.get`` try/except)."""
        return self._configs.get(name, default)

    def create(self, name: str, queues: int, perm: int) -> None:
        """Create ``name`` or change its queue count and permission."""
        self._configs[name] = TopicConfig(queues, perm)

    def delete(self, name: str) -> bool:
        """False if there was no such topic."""
        return self._configs.pop(name, None) is not None

    def for_message(self, name: str) -> TopicConfig | None:
        """The topic a message to ``name`` is stored in: a group's retry and dead-letter
        topics are made on first use (one queue, read-write); None if there is none."""
        config = self._configs.get(name)
        if config is None and name.startswith((RETRY_PREFIX, DLQ_PREFIX)):
            config = self._configs[name] = TopicConfig(1, _READ_WRITE)
        return config

    def state(self) -> dict[str, list[int]]:
        return {name: [c.queues, c.perm] for name, c in sorted(self._configs.items())}
