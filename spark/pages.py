"""Decoded pages of a queue range: :class:`Columns` and ``decode_page`` -- Spark-free.

A PULL_MESSAGE answer's rows (``protocol.pull.PullRow``: one record each -- base queue
offset, CommitLog position, store ms, the record as stored) become columns in
``decode_page`` (what ``spark.arrow`` makes an Arrow batch of): each record decoded once,
column by column (``protocol.record_batch.record_columns``: no object per message, the
columns of a record sliced, not looped over), the messages outside the range asked for
and those a tag filter does not want dropped, and every record checked to be of the
range's queue. A record whose messages cannot be read (stored before leaders checked
them) is skipped with a WARNING naming its queue and offsets: its messages are listed in
``Columns.skipped``, not raised.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from protocol.pull import PullRow
from protocol.record_batch import MessageFormatError, read_header, record_columns
from spark.errors import RangeMismatchError
from spark.planning import QueueRange

__all__ = ["Columns", "decode_page"]

log = logging.getLogger("spark.raftmq")


@dataclass(slots=True)
class Columns:
    """Decoded messages of one queue, column by column (what becomes an Arrow batch). Born
    times are kept as each record's base and each message's delta, and ids as one block of
    16 bytes per message, so that ``spark.arrow`` adds and hex-encodes them in bulk."""

    topic: str
    group: str
    queue_id: int
    queue_offset: list[int] = field(default_factory=list)
    commit_log_offset: list[int] = field(default_factory=list)
    store_ms: list[int] = field(default_factory=list)
    msg_ids: bytearray = field(default_factory=bytearray)  # 16 bytes per message
    born_base_ms: list[int] = field(default_factory=list)
    born_delta_ms: list[int] = field(default_factory=list)
    keys: list[tuple[str, ...]] = field(default_factory=list)
    tags: list[str | None] = field(default_factory=list)
    properties: list[dict[str, str]] = field(default_factory=list)
    body: list[bytes] = field(default_factory=list)
    #: [first, end) queue offsets of messages skipped: their record could not be read
    skipped: list[tuple[int, int]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.queue_offset)

    @property
    def msg_id(self) -> list[str]:
        """Each message's id, 32 hex digits (a loop per row: for tests and ``rows``)."""
        ids = self.msg_ids.hex()
        return [ids[i:i + 32] for i in range(0, len(ids), 32)]

    @property
    def born_ms(self) -> list[int]:
        return [b + d for b, d in zip(self.born_base_ms, self.born_delta_ms, strict=True)]

    def skipped_count(self) -> int:
        return sum(end - first for first, end in self.skipped)

    def extend(self, other: Columns) -> None:
        self.queue_offset += other.queue_offset
        self.commit_log_offset += other.commit_log_offset
        self.store_ms += other.store_ms
        self.msg_ids += other.msg_ids
        self.born_base_ms += other.born_base_ms
        self.born_delta_ms += other.born_delta_ms
        self.keys += other.keys
        self.tags += other.tags
        self.properties += other.properties
        self.body += other.body
        self.skipped += other.skipped

    def rows(self) -> list[tuple[Any, ...]]:
        """Plain tuples in the source's column order (times still in ms)."""
        n = len(self)
        return list(zip([self.topic] * n, [self.group] * n, [self.queue_id] * n, self.queue_offset,
                        self.commit_log_offset, self.msg_id, self.store_ms, self.born_ms, self.keys,
                        self.tags, self.properties, self.body, strict=True))


def decode_page(rows: Sequence[PullRow], rng: QueueRange, wanted_tags: frozenset[str] | None,
                start: int = 0, end: int | None = None) -> Columns:
    """Columns of the messages of one PULL_MESSAGE answer's records with queue offsets in
    [``start``, ``end``); checks every record is of ``rng``'s queue."""
    cols = Columns(rng.topic, rng.group, rng.queue_id)
    stop = rng.end if end is None else end
    for row in rows:
        if row.offset >= stop:
            break
        try:
            h = read_header(row.record)
        except MessageFormatError as e:
            raise RangeMismatchError(f"{rng}: a replica returned bytes that are not records ({e})") from None
        if h.topic != rng.topic or h.queue_id != rng.queue_id:
            raise RangeMismatchError(f"{rng}: a replica returned a record of {h.topic!r} queue "
                                     f"{h.queue_id}")
        if row.offset + h.count <= start:
            continue  # wholly before the range (a page starts with the record holding its offset)
        first, last = max(0, start - row.offset), min(h.count, stop - row.offset)
        try:
            c = record_columns(row.record, h)
        except MessageFormatError as e:  # a header that is sound, messages that are not
            cols.skipped.append((row.offset + first, row.offset + last))
            log.warning("%s (topic %r queue %d): the record at queue offsets %d..%d (CommitLog position "
                        "%d) cannot be read (%s): %d messages skipped", rng, rng.topic, rng.queue_id,
                        row.offset + first, row.offset + last - 1, row.position, e, last - first)
            continue
        keep: Sequence[int] | range = range(first, last)
        if wanted_tags is not None:
            keep = [i for i in keep if c.tags[i] in wanted_tags]
        if row.selected is not None:  # an SQL92 filter: the broker named the messages it kept
            chosen = set(row.selected)
            keep = [i for i in keep if i in chosen]
        if isinstance(keep, range):  # every message of the slice: columns sliced, no loop per row
            cols.queue_offset += range(row.offset + first, row.offset + last)
            cols.commit_log_offset += range(row.position + first, row.position + last)
            cols.store_ms += [row.store_ms] * (last - first)
            cols.msg_ids += c.msg_ids[16 * first:16 * last]
            cols.born_base_ms += [c.born_base_ms] * (last - first)
            cols.born_delta_ms += c.born_deltas[first:last]
            cols.keys += c.keys[first:last]
            cols.tags += c.tags[first:last]
            cols.properties += c.properties[first:last]
            cols.body += c.bodies[first:last]
            continue
        # a filter kept some: a selection per message (filtered reads only)
        cols.queue_offset += [row.offset + i for i in keep]
        cols.commit_log_offset += [row.position + i for i in keep]
        cols.store_ms += [row.store_ms] * len(keep)
        cols.msg_ids += b"".join([c.msg_ids[16 * i:16 * i + 16] for i in keep])
        cols.born_base_ms += [c.born_base_ms] * len(keep)
        cols.born_delta_ms += [c.born_deltas[i] for i in keep]
        cols.keys += [c.keys[i] for i in keep]
        cols.tags += [c.tags[i] for i in keep]
        cols.properties += [c.properties[i] for i in keep]
        cols.body += [c.bodies[i] for i in keep]
    return cols
