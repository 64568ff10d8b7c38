"""Fragment records and reading a chained message back from a real CommitLog."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.commands import RecordKind, record_kind
from broker.store.entry_batch import max_message_bytes, pack_entries, unpack_entry
from broker.store.fragments import (
    SLICE_BYTES,
    MessageGone,
    chain_payloads,
    encode_fragments,
    parse_fragment,
    read_message,
    read_message_at,
)
from dledger.config import MAX_ENTRY_BYTES
from dledger.storage.commitlog import CommitLog
from dledger.storage.entry_format import HEADER_SIZE, EntryKind
from protocol.message_format import MAX_MESSAGE_BYTES, Message, encode_message, peek_msg_id

ID = bytes(range(16))


@given(st.binary(min_size=1, max_size=3000), st.integers(1, 700))
def test_fragments_join_back_to_the_message(message: bytes, slice_bytes: int) -> None:
    records = encode_fragments(message, ID, slice_bytes)
    parsed = [parse_fragment(r) for r in records]
    assert all(record_kind(r) == RecordKind.FRAGMENT for r in records)
    assert [f.number for f in parsed] == list(range(len(records)))
    assert all(f.chain_id == ID and f.total == len(message) for f in parsed)
    assert b"".join(f.data for f in parsed) == message
    assert all(r[f.offset:] == f.data for r, f in zip(records, parsed, strict=True))  # slice ends it


def test_the_largest_message_makes_full_entries_under_the_limit() -> None:
    message = random.Random(1).randbytes(MAX_MESSAGE_BYTES)
    payloads = chain_payloads(message, ID, 2**62)
    assert len(payloads) == -(-MAX_MESSAGE_BYTES // SLICE_BYTES)
    assert all(len(p) <= MAX_ENTRY_BYTES for p in payloads)
    assert max(len(p) for p in payloads) > MAX_ENTRY_BYTES - 64  # little room wasted
    (record,) = unpack_entry(payloads[0]).messages
    assert len(record) <= max_message_bytes()
    with pytest.raises(ValueError):
        encode_fragments(message, ID, SLICE_BYTES + 1)
    with pytest.raises(ValueError):
        encode_fragments(message, b"short")


@pytest.mark.parametrize("record", [
    msgpack.packb([20, ID, 0, 10]),                      # no slice
    msgpack.packb([20, ID, 0, 10, b""]),                 # empty slice
    msgpack.packb([20, ID[:8], 0, 10, b"x"]),            # short chain id
    msgpack.packb([20, ID, -1, 10, b"x"]),               # negative number
    msgpack.packb([20, ID, 0, 0, b"x"]),                 # no total
    msgpack.packb([20, ID, 0, 2**31, b"x"]),             # total beyond a unit's size
    msgpack.packb([20, ID, True, 10, b"x"]),             # a bool is not a number
    msgpack.packb([1, ID, 0, 10, b"x"]),                 # not a fragment
    msgpack.packb([20, ID, 0, 10, b"x"]) + b"\x00",      # trailing byte
    b"\x95\x14",                                         # truncated
])
def test_malformed_fragments_are_refused(record: bytes) -> None:
    with pytest.raises(ValueError):
        parse_fragment(record)


def test_peek_msg_id_reads_only_the_head() -> None:
    m = Message("t", b"x" * 100_000)
    assert peek_msg_id(encode_message(m)[:80]) == m.msg_id
    assert peek_msg_id(b"\x93\x01\x02\x03") is None and peek_msg_id(b"") is None
    assert peek_msg_id(encode_message(m)[:60]) is None  # the id is not in these bytes


def test_read_message_across_entries_and_segments(tmp_path: Path) -> None:
    """Small segments: a chain spans several, with blank padding between them."""
    log = CommitLog(tmp_path, segment_size=150 * 1024)
    rnd = random.Random(7)
    large = encode_message(Message("t", rnd.randbytes(300_000), keys=("k",)))
    small = [encode_message(Message("t", f"s{i}".encode())) for i in range(3)]
    payloads = [*pack_entries(small[:2], 5), *chain_payloads(large, peek_msg_id(large) or ID, 6),
                *pack_entries(small[2:], 7)]
    positions = [log.append(i, 1, EntryKind.DATA, p) for i, p in enumerate(payloads, start=1)]
    assert len({info.start for info in log.segments()}) > 2
    first = log.entry(2)
    (record,) = unpack_entry(first.body).messages
    where = positions[1] + HEADER_SIZE + len(first.body) - len(parse_fragment(record).data)
    assert read_message(log, where, len(large)) == large
    assert read_message_at(log, where) == (large, where)
    body0 = log.entry(1).body
    at = positions[0] + HEADER_SIZE + body0.index(small[1])
    assert read_message(log, at, len(small[1])) == small[1] and read_message_at(log, at) == (small[1], at)
    last = log.entry(len(payloads)).body
    at = positions[-1] + HEADER_SIZE + last.index(small[2])
    assert read_message(log, at, len(small[2])) == small[2] and read_message_at(log, at) == (small[2], at)
    with pytest.raises(ValueError):
        read_message(log, where + 1, len(large) - 1)  # not where the message starts
    assert read_message_at(log, where + 1) == (large, where)  # message 1's position: its record
    with pytest.raises(ValueError):
        read_message_at(log, positions[0] + 4)  # inside the entry's header: no record
    with pytest.raises(ValueError):
        read_message(log, where, len(large) + 1)  # runs into the next entry's batch
    with pytest.raises(MessageGone):
        read_message_at(log, log.write_position + 64)
    log.close()
