"""Messages larger than one entry: a chain of fragments in consecutive entries.

Every Raft entry must stay below ``MAX_ENTRY_BYTES`` (60 KiB: pysyncobj's chunked
transmission of larger entries is broken), but a message may be up to the
broker's ``max_message_bytes`` (4 MiB by default). The leader's WritePath cuts
the encoded bytes of a message that does not fit one entry into slices and
proposes them back to back as a *chain*: consecutive DATA entries, each an
ordinary entry batch (``broker.store.entry_batch``) whose only record is one
fragment (record kind 20, ``broker.store.commands``)::

    [ kind = 20,
      chain_id   bin(16)   the message's id (``msg_id``; a retry sends the same)
      number     uint      0, 1, 2, ... in log order
      total      uint      length of the whole encoded message, 1 .. 2**31-1
      slice      bin       the next bytes of the message (never empty) ]

The slice is the last field of the only record, so it ends where the entry body
ends. The message's bytes are the slices joined in order; its CommitLog position
(the ConsumeQueue unit's and the IndexFile's) is that of slice 0's first byte,
and its size is ``total``::

    entry i: fragment 0                   entry i+1: fragment 1          entry i+2: fragment 2
    ┌──────┬───────┬──────────┬────────┐  ┌──────┬───────┬──────────┬────────┐  ┌── ... ──┬──────┐
    │ hdr  │ batch │ 95 14 c4 │slice 0 │  │ hdr  │ batch │ 95 14 c4 │slice 1 │  │         │ sl 2 │
    │  32  │ head  │ 10 <id>..│        │  │  32  │ head  │ 10 <id>..│        │  │         │      │
    └──────┴───────┴──────────┴────────┘  └──────┴───────┴──────────┴────────┘  └── ... ──┴──────┘
                              ▲ unit position               size = total = |slice 0| + |slice 1| + |slice 2|

Apply (``broker.state.chain``, driven by ``broker.state.derived``), deterministic on every
replica:

* fragment 0 starts a chain (a pending chain is abandoned);
* fragment k > 0 continues the pending chain if it has the same chain id and
  total and the previous entry held fragment k - 1 of it; otherwise the pending
  chain is abandoned and the fragment's outcome is ABANDONED;
* any other entry -- a message batch, an admin record, a new leader's no-op --
  abandons a pending chain: nothing of it is stored (an idempotent producer's
  retry with the same sequence resends the whole message);
* when the slices add up to ``total``, the message is decoded from the joined
  bytes and applied exactly like a whole message (topic, permission, queue id,
  producer sequence). Its store time is the stamp of fragment 0's entry and its
  outcome is the result of the last fragment's entry (earlier fragments' entries
  give FRAGMENT). More bytes than ``total``: INVALID, nothing stored.

A pending chain lives only in memory: the checkpoint records the applied index
as the entry before the chain's fragment 0, so a restart re-applies the chain
from its start (no state changed in between).

Reading (through a ``dledger.log_reader.LogReader``): ``read_message(log, position, size)``
returns a record's bytes from its ConsumeQueue unit -- one read when they lie in one entry, else slice 0
and the slices of the following entries; ``read_message_at(log, position)``
finds the record holding a message's position (an IndexFile hit: the record's
position plus the message's index in it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgpack

from broker.store.commands import RecordKind, record_kind
from broker.store.entry_batch import locate_messages, max_message_bytes, pack_entries
from dledger.storage.entry_format import ALIGN, HEADER_SIZE, Entry, EntryKind, decode_header

if TYPE_CHECKING:
    from dledger.log_reader import LogReader

__all__ = [
    "MAX_TOTAL",
    "SLICE_BYTES",
    "Fragment",
    "MessageGone",
    "chain_payloads",
    "encode_fragments",
    "parse_fragment",
    "read_message",
    "read_message_at",
]

#: A ConsumeQueue unit's size is an i32.
MAX_TOTAL = (1 << 31) - 1
#: fixarray 1 + kind 1 + bin8 header 2 + id 16 + number <= 5 + total <= 5 + bin16 header 3
_RECORD_OVERHEAD = 33
#: Bytes of message per fragment: a fragment record then fits alone in one entry.
SLICE_BYTES = max_message_bytes() - _RECORD_OVERHEAD
_FIELDS = 5


class MessageGone(LookupError):
    """The position is not in the retained CommitLog (retention deleted it)."""


@dataclass(frozen=True, slots=True)
class Fragment:
    chain_id: bytes
    number: int
    total: int
    offset: int
    """Where ``data`` starts inside the record."""
    data: bytes


def encode_fragments(message: bytes, chain_id: bytes, slice_bytes: int = SLICE_BYTES) -> list[bytes]:
    """The fragment records of ``message``, in order. ValueError for a bad argument."""
    if not isinstance(chain_id, bytes) or len(chain_id) != 16:
        raise ValueError("a chain id is 16 bytes")
    if not 0 < len(message) <= MAX_TOTAL:
        raise ValueError(f"a chained message has 1..{MAX_TOTAL} bytes, not {len(message)}")
    if not 0 < slice_bytes <= SLICE_BYTES:
        raise ValueError(f"slice_bytes must be in 1..{SLICE_BYTES}")
    total = len(message)
    records = []
    for number, start in enumerate(range(0, total, slice_bytes)):
        records.append(msgpack.packb(
            [RecordKind.FRAGMENT, chain_id, number, total, message[start:start + slice_bytes]],
            use_bin_type=True))
    return records


def chain_payloads(message: bytes, chain_id: bytes, store_timestamp_ms: int,
                   slice_bytes: int = SLICE_BYTES) -> list[bytes]:
    """The entry payloads of ``message``'s chain: one fragment record each, in order."""
    payloads = []
    for record in encode_fragments(message, chain_id, slice_bytes):
        (payload,) = pack_entries([record], store_timestamp_ms)
        payloads.append(payload)
    return payloads


def parse_fragment(record: bytes) -> Fragment:
    """Decode a fragment record; ValueError if it is not a well-formed one."""
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(record) + 1)
    unpacker.feed(record)
    try:
        if unpacker.read_array_header() != _FIELDS or unpacker.unpack() != RecordKind.FRAGMENT:
            raise ValueError("not a fragment record")
        chain_id, number, total, data = (unpacker.unpack() for _ in range(4))
        end = unpacker.tell()
    except (msgpack.OutOfData, msgpack.UnpackException, msgpack.ExtraData) as e:
        raise ValueError(f"malformed fragment record: {e!r}") from None
    if end != len(record):
        raise ValueError("malformed fragment record: trailing bytes")
    if not (isinstance(chain_id, bytes) and len(chain_id) == 16 and type(number) is int
            and type(total) is int and isinstance(data, bytes)):
        raise ValueError("malformed fragment record: bad field types")
    if number < 0 or not 0 < total <= MAX_TOTAL or not data:
        raise ValueError(f"malformed fragment record: number {number}, total {total}, "
                         f"slice of {len(data)} bytes")
    return Fragment(chain_id, number, total, end - len(data), data)


def _only_fragment(entry: Entry) -> tuple[int, Fragment]:
    """(record offset in the body, fragment) of an entry holding one fragment alone."""
    if entry.kind != EntryKind.DATA:
        raise ValueError(f"entry {entry.index} is not a DATA entry")
    _, spans = locate_messages(entry.body)
    if len(spans) != 1:
        raise ValueError(f"entry {entry.index} holds {len(spans)} records, not one fragment")
    offset, length = spans[0]
    return offset, parse_fragment(entry.body[offset:offset + length])


def read_message(log: LogReader, position: int, size: int) -> bytes:
    """The ``size`` bytes of the message at ``position`` (a ConsumeQueue unit), whole.

    Only for applied messages. Raises MessageGone if the position is no longer
    retained, ValueError if the log there does not hold such a message.
    """
    found = log.entry_containing(position)
    if found is None:
        raise MessageGone(f"position {position} is not in the retained CommitLog")
    index, start = found
    record_end = start + log.record_size_of(index)
    if position + size <= record_end - (ALIGN - 1):  # padding is < ALIGN: inside the body
        return log.read_at(position, size)
    body_end = start + HEADER_SIZE + decode_header(log.read_at(start, HEADER_SIZE)).body_len
    if position + size <= body_end:
        return log.read_at(position, size)
    offset, first = _only_fragment(log.entry(index))
    if first.number != 0 or first.total != size or start + HEADER_SIZE + offset + first.offset != position:
        raise ValueError(f"no chained message of {size} bytes starts at position {position}")
    parts, got, number, following = [first.data], len(first.data), 0, index + 1
    while got < size:
        entries = log.entries(following, size - got)
        if not entries:
            raise ValueError(f"the message at position {position} runs past the end of the log")
        for entry in entries:
            _, fragment = _only_fragment(entry)
            number += 1
            if (fragment.chain_id, fragment.number, fragment.total) != (first.chain_id, number, size):
                raise ValueError(f"entry {entry.index} does not continue the message at {position}")
            parts.append(fragment.data)
            got += len(fragment.data)
            if got >= size:
                break
        following = entries[-1].index + 1
    if got != size:
        raise ValueError(f"the fragments of the message at {position} hold {got} bytes, not {size}")
    return b"".join(parts)


def read_message_at(log: LogReader, position: int) -> tuple[bytes, int]:
    """The record holding the message at ``position`` (an IndexFile hit, a send-back: a
    record's position plus the message's index in it), whole, and the record's position.

    Raises MessageGone if the position is no longer retained, ValueError if no record
    holds a message there.
    """
    found = log.entry_containing(position)
    if found is None:
        raise MessageGone(f"position {position} is not in the retained CommitLog")
    index, start = found
    entry = log.entry(index)
    if entry.kind == EntryKind.DATA:
        body_at = start + HEADER_SIZE
        rel = position - body_at
        _, spans = locate_messages(entry.body)
        for offset, length in spans:
            if offset <= rel < offset + length:
                record = entry.body[offset:offset + length]
                kind = record_kind(record)
                if kind == RecordKind.MESSAGE:
                    return record, body_at + offset
                if kind == RecordKind.FRAGMENT:
                    fragment = parse_fragment(record)
                    if fragment.number == 0 and offset + fragment.offset <= rel:
                        at = body_at + offset + fragment.offset
                        return read_message(log, at, fragment.total), at
                break
    raise ValueError(f"no message at position {position}")
