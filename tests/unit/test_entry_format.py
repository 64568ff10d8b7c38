"""The CommitLog record format: round trips, padding, blanks, rejected headers."""

from __future__ import annotations

import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dledger.storage.entry_format import (
    ALIGN,
    HEADER,
    HEADER_SIZE,
    MAGIC_BLANK,
    MAGIC_ENTRY,
    MAGIC_ENTRY_V2,
    MAX_BODY,
    EntryKind,
    FormatError,
    decode_entry,
    decode_header,
    encode_blank,
    encode_entry,
    record_size,
)


def test_header_layout_is_32_big_endian_bytes() -> None:
    record = encode_entry(0x0102030405060708, 9, EntryKind.RAFT, b"abc")
    assert HEADER.size == HEADER_SIZE == 32
    assert record[:4] == bytes.fromhex("d1ed6e02")
    assert struct.unpack(">I", record[4:8])[0] == len(record) == 40
    assert record[8:16] == bytes.fromhex("0102030405060708")
    assert record[24] == EntryKind.RAFT
    assert record[25] == 5  # padding bytes
    assert record[26:28] == b"\0\0"
    assert struct.unpack(">I", record[28:32])[0] == zlib.crc32(record[8:28] + b"abc")
    assert record[32:35] == b"abc" and record[35:] == bytes(5)


@pytest.mark.parametrize(("body_len", "size"), [(0, 32), (1, 40), (8, 40), (9, 48), (16, 48)])
def test_record_size_is_aligned(body_len: int, size: int) -> None:
    assert record_size(body_len) == size
    assert len(encode_entry(1, 1, EntryKind.DATA, b"x" * body_len)) == size


@pytest.mark.parametrize("kind", list(EntryKind))
def test_round_trip_every_kind(kind: EntryKind) -> None:
    body = b"" if kind == EntryKind.NOOP else b"payload\0\0"  # trailing zeros are kept
    record = encode_entry(7, 3, kind, body)
    header = decode_header(record)
    assert (header.magic, header.index, header.term, header.kind) == (MAGIC_ENTRY_V2, 7, 3, kind)
    assert header.body_len == len(body) and not header.is_blank
    entry = decode_entry(record, 0, position=4096)
    assert (entry.index, entry.term, entry.kind, entry.body, entry.position) == (
        7, 3, kind, body, 4096)


def test_decode_at_offset() -> None:
    buf = encode_entry(1, 1, EntryKind.DATA, b"a") + encode_entry(2, 1, EntryKind.DATA, b"bb")
    assert decode_entry(buf, record_size(1)).body == b"bb"
    assert decode_header(buf, record_size(1)).index == 2


@given(index=st.integers(1, 2**63 - 1), term=st.integers(0, 2**63 - 1),
       kind=st.sampled_from(list(EntryKind)), body=st.binary(max_size=300))
def test_encode_decode_property(index: int, term: int, kind: EntryKind, body: bytes) -> None:
    record = encode_entry(index, term, kind, body)
    header = decode_header(record)
    assert (header.index, header.term, header.kind) == (index, term, kind)
    assert header.size == len(record) == record_size(len(body))
    assert header.size % ALIGN == 0
    assert header.crc == zlib.crc32(record[8:28] + body)
    assert header.crc == zlib.crc32(record[32:32 + header.body_len], header.seed)
    assert decode_entry(record).body == body


@pytest.mark.parametrize("size", [8, 16, 24, 32, 40, 4096])
def test_blank(size: int) -> None:
    prefix = encode_blank(size)
    assert len(prefix) == min(size, HEADER_SIZE)
    header = decode_header(prefix)
    assert header.is_blank and header.magic == MAGIC_BLANK and header.size == size
    assert header.body_len == 0
    assert prefix[8:] == bytes(len(prefix) - 8)


@pytest.mark.parametrize("size", [0, 4, 12, 33])
def test_blank_rejects_bad_sizes(size: int) -> None:
    with pytest.raises(ValueError):
        encode_blank(size)


def _patched(record: bytes, offset: int, value: bytes) -> bytes:
    return record[:offset] + value + record[offset + len(value):]


GOOD = encode_entry(5, 2, EntryKind.DATA, b"hello")


@pytest.mark.parametrize(("buf", "message"), [
    (GOOD[:7], "short header"),
    (GOOD[:20], "short header"),
    (bytes(32), "zero bytes"),
    (_patched(GOOD, 0, b"\xde\xad\xbe\xef"), "bad magic"),
    (_patched(GOOD, 4, struct.pack(">I", 41)), "bad record size"),
    (_patched(GOOD, 4, struct.pack(">I", 24)), "bad record size"),
    (_patched(GOOD, 4, struct.pack(">I", record_size(MAX_BODY) + 8)), "bad record size"),
    (_patched(GOOD, 24, b"\x07"), "unknown entry kind"),
    (_patched(GOOD, 25, b"\x08"), "bad padding"),
    (_patched(GOOD, 26, b"\x00\x01"), "reserved"),
    (_patched(GOOD, 0, struct.pack(">II", MAGIC_BLANK, 12)), "blank record with bad size"),
])
def test_decode_header_rejects(buf: bytes, message: str) -> None:
    with pytest.raises(FormatError, match=message):
        decode_header(buf)


def test_decode_entry_rejects_crc_mismatch_and_short_body() -> None:
    with pytest.raises(FormatError, match="CRC mismatch"):
        decode_entry(_patched(GOOD, 33, b"X"))
    with pytest.raises(FormatError, match="short record"):
        decode_entry(GOOD[:-1])
    with pytest.raises(FormatError, match="blank"):
        decode_entry(encode_blank(64))


def test_encode_rejects_out_of_range() -> None:
    with pytest.raises(ValueError):
        encode_entry(0, 1, EntryKind.DATA, b"")
    with pytest.raises(ValueError):
        encode_entry(1, -1, EntryKind.DATA, b"")
    with pytest.raises(ValueError):
        encode_entry(1, 1, 9, b"")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode_entry(1, 1, EntryKind.DATA, bytes(MAX_BODY + 1))
    assert issubclass(FormatError, ValueError)


def test_the_checksum_covers_the_header_fields() -> None:
    """Index, term, kind and padding are under the CRC (MAGIC_ENTRY_V2): a flipped bit in
    any of them is a CRC mismatch, not a different entry."""
    for offset, value in ((8, (6).to_bytes(8, "big")), (16, (3).to_bytes(8, "big")), (24, b"\x02")):
        with pytest.raises(FormatError, match="CRC mismatch"):
            decode_entry(_patched(GOOD, offset, value))


def test_a_legacy_record_with_a_body_only_crc_still_reads() -> None:
    """Records written before MAGIC_ENTRY_V2 (CRC of the body only) stay readable."""
    body = b"hello"
    legacy = HEADER.pack(MAGIC_ENTRY, 40, 5, 2, EntryKind.DATA, 3, 0, zlib.crc32(body)) + body + bytes(3)
    entry = decode_entry(legacy)
    assert (entry.index, entry.term, entry.body) == (5, 2, body)
    assert decode_header(legacy).seed == 0


def test_index_and_term_beyond_a_signed_64_bit_integer_are_rejected() -> None:
    with pytest.raises(FormatError, match="out of range"):
        decode_header(_patched(GOOD, 16, b"\x80" + bytes(7)))
    with pytest.raises(FormatError, match="out of range"):
        decode_header(_patched(GOOD, 8, b"\xff" * 8))
    with pytest.raises(ValueError):
        encode_entry(1, 1 << 63, EntryKind.DATA, b"")


def test_decode_entry_rejects_non_zero_padding() -> None:
    record = bytearray(encode_entry(7, 1, EntryKind.DATA, b"abc"))  # 3-byte body, 5 pad bytes
    record[-1] = 0x01
    with pytest.raises(FormatError, match="padding"):
        decode_entry(bytes(record))
