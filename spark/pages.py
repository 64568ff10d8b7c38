"""Decoded pages of a queue range: :class:`Columns` and ``decode_page`` -- Spark-free.

A PULL_MESSAGE answer's body is msgpack rows ``[queue_offset, commitlog_position,
store_ms, message_bytes]`` (up to 256 of them); ``decode_page`` turns them into columns
(what ``spark.arrow`` makes an Arrow batch of), inflating compressed bodies, dropping
the messages a tag filter does not want, and checking that every message is of the
range's queue.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from client.message import FLAG_COMPRESSED
from spark.errors import RangeMismatchError
from spark.planning import QueueRange

__all__ = ["Columns", "decode_page"]

_MESSAGE_FIELDS = 14


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


def decode_page(raw: list[Any], rng: QueueRange, wanted_tags: frozenset[str] | None) -> Columns:
    """Columns from one PULL_MESSAGE body's rows; checks every message is of ``rng``'s queue."""
    cols = Columns(rng.topic, rng.group, rng.queue_id)
    if not raw:
        return cols
    offsets, positions, stamps, datas = zip(*raw, strict=True)
    try:
        msgs = [msgpack.unpackb(d, use_list=False) for d in datas]
        (versions, ids, topics, qids, flags, tags, keys, props, born, _host, _pid, _seq, _re,
         bodies) = zip(*msgs, strict=True)
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise RangeMismatchError(f"{rng}: a replica returned bytes that are not messages ({e})") from None
    if set(versions) != {1} or set(map(len, msgs)) != {_MESSAGE_FIELDS}:
        raise RangeMismatchError(f"{rng}: a replica returned messages of an unknown format")
    if set(topics) != {rng.topic} or set(qids) != {rng.queue_id}:
        raise RangeMismatchError(f"{rng}: a replica returned messages of {sorted(set(topics))} "
                                 f"queue(s) {sorted(set(qids))}")
    if any(flags):
        bodies = tuple(zlib.decompress(b) if f & FLAG_COMPRESSED else b for b, f in zip(bodies, flags,
                                                                                        strict=True))
    if wanted_tags is not None:
        keep = [i for i, t in enumerate(tags) if t in wanted_tags]
        if len(keep) != len(tags):
            def pick(seq: Sequence[Any]) -> list[Any]:
                return [seq[i] for i in keep]
            offsets, positions, stamps, ids, born, keys, tags, props, bodies = (
                pick(offsets), pick(positions), pick(stamps), pick(ids), pick(born), pick(keys), pick(tags),
                pick(props), pick(bodies))
    cols.queue_offset = list(offsets)
    cols.commit_log_offset = list(positions)
    cols.store_ms = list(stamps)
    cols.msg_id = [i.hex() for i in ids]
    cols.born_ms = list(born)
    cols.keys = list(keys)
    cols.tags = list(tags)
    cols.properties = list(props)
    cols.body = list(bodies)
    return cols

