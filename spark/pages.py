"""Decoded pages of a queue range: :class:`Columns` and ``decode_page`` -- Spark-free.

A PULL_MESSAGE answer's rows (``protocol.pull.PullRow``: queue offset, CommitLog
position, store ms, the stored message; up to 256 of them) become columns in
``decode_page`` (what ``spark.arrow`` makes an Arrow batch of): each message decoded once
by ``protocol.message_format``, compressed bodies inflated, the messages a tag filter
does not want dropped, and every message checked to be of the range's queue.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from client.message import FLAG_COMPRESSED
from protocol.message_format import MessageFormatError, decode_records
from protocol.pull import PullRow
from spark.errors import RangeMismatchError
from spark.planning import QueueRange

__all__ = ["Columns", "decode_page"]


@dataclass(slots=True)
class Columns:
    """Decoded messages of one queue, column by column (what becomes an Arrow batch)."""

    topic: str
    group: str
    queue_id: int
    queue_offset: list[int] = field(default_factory=list)
    commit_log_offset: list[int] = field(default_factory=list)
    store_ms: list[int] = field(default_factory=list)
    msg_id: list[str] = field(default_factory=list)
    born_ms: list[int] = field(default_factory=list)
    keys: list[tuple[str, ...]] = field(default_factory=list)
    tags: list[str | None] = field(default_factory=list)
    properties: list[dict[str, str]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.queue_offset)

    def extend(self, other: Columns) -> None:
        self.queue_offset += other.queue_offset
        self.commit_log_offset += other.commit_log_offset
        self.store_ms += other.store_ms
        self.msg_id += other.msg_id
        self.born_ms += other.born_ms
        self.keys += other.keys
        self.tags += other.tags
        self.properties += other.properties
        self.body += other.body

    def rows(self) -> list[tuple[Any, ...]]:
        """Plain tuples in the source's column order (times still in ms)."""
        n = len(self)
        return list(zip([self.topic] * n, [self.group] * n, [self.queue_id] * n, self.queue_offset,
                        self.commit_log_offset, self.msg_id, self.store_ms, self.born_ms, self.keys,
                        self.tags, self.properties, self.body, strict=True))


def decode_page(rows: Sequence[PullRow], rng: QueueRange, wanted_tags: frozenset[str] | None) -> Columns:
    """Columns from one PULL_MESSAGE answer's rows; checks every message is of ``rng``'s queue."""
    cols = Columns(rng.topic, rng.group, rng.queue_id)
    if not rows:
        return cols
    try:
        msgs = decode_records([row.message for row in rows])
    except MessageFormatError as e:
        raise RangeMismatchError(f"{rng}: a replica returned bytes that are not messages ({e})") from None
    topics, qids = {m.topic for m in msgs}, {m.queue_id for m in msgs}
    if topics != {rng.topic} or qids != {rng.queue_id}:
        raise RangeMismatchError(f"{rng}: a replica returned messages of {sorted(topics)} "
                                 f"queue(s) {sorted(qids)}")
    if wanted_tags is not None and any(m.tags not in wanted_tags for m in msgs):
        kept = [(row, m) for row, m in zip(rows, msgs, strict=True) if m.tags in wanted_tags]
        rows, msgs = [row for row, _ in kept], [m for _, m in kept]
    cols.queue_offset = [row.offset for row in rows]
    cols.commit_log_offset = [row.position for row in rows]
    cols.store_ms = [row.store_ms for row in rows]
    cols.msg_id = [m.msg_id.hex() for m in msgs]
    cols.born_ms = [m.born_ts_ms for m in msgs]
    cols.keys = [m.keys for m in msgs]
    cols.tags = [m.tags for m in msgs]
    cols.properties = [m.properties for m in msgs]
    cols.body = [zlib.decompress(m.body) if m.flag & FLAG_COMPRESSED else m.body for m in msgs]
    return cols
