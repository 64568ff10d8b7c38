"""On-disk record of one CommitLog entry (one Raft log entry), and segment padding.

An entry record is a 32-byte big-endian header, the body, then zero padding so
that the whole record (``size``) is a multiple of 8 bytes::

    ┌───────────┬──────────┬───────────┬──────────┬──────────┬─────────┬──────────┬───────────┐
    │ magic (4) │ size (4) │ index (8) │ term (8) │ kind (1) │ pad (1) │ zero (2) │ crc32 (4) │
    └───────────┴──────────┴───────────┴──────────┴──────────┴─────────┴──────────┴───────────┘
    ├──────────────────────────── header, 32 bytes ─────────────────────────────────────────┤
    ┌──────────────────────────┬─────────────────────┐
    │ body (size - 32 - pad)   │ pad zero bytes (<8) │
    └──────────────────────────┴─────────────────────┘

* ``magic`` is ``MAGIC_ENTRY_V2`` (records written before it: ``MAGIC_ENTRY``, still read);
  ``size`` covers header, body and padding;
* ``index`` / ``term`` are the Raft index and term (below 2**63); ``kind`` an ``EntryKind``;
* ``pad`` is the number of padding bytes (0-7), so the exact body length is
  ``size - 32 - pad``; the two bytes after it are reserved and zero; the padding
  bytes themselves must be zero (checked beside the CRC, which does not cover them);
* ``crc32`` is ``zlib.crc32(header[8:28] + body)`` -- index, term, kind, pad and the
  reserved bytes are under it, so a flipped bit there is a CRC mismatch, not another
  entry (``MAGIC_ENTRY`` records: ``zlib.crc32(body)`` only). ``magic`` and ``size`` are
  checked by their own rules (a known magic; aligned, bounded, contiguous records).

A blank record fills the unused end of a segment (a record never spans two
segments). Only its first 8 bytes are meaningful; it is at least 8 bytes long
because every record and every segment size is a multiple of 8::

    ┌───────────────────┬──────────────────────────────┬─────────────────────────────┐
    │ MAGIC_BLANK (4)   │ size = bytes to segment end  │ zeros up to the segment end │
    └───────────────────┴──────────────────────────────┴─────────────────────────────┘

All functions here are pure and thread-safe.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "ALIGN",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC_BLANK",
    "MAGIC_ENTRY",
    "MAGIC_ENTRY_V2",
    "MAX_BODY",
    "Entry",
    "EntryHeader",
    "EntryKind",
    "FormatError",
    "decode_entry",
    "decode_header",
    "encode_blank",
    "encode_entry",
    "record_damage",
    "record_size",
]

MAGIC_ENTRY = 0xD1ED6E01  # legacy: the CRC covers the body only
MAGIC_ENTRY_V2 = 0xD1ED6E02  # the CRC covers the header's fields after ``size`` and the body
MAGIC_PREFIX = MAGIC_ENTRY.to_bytes(4, "big")[:3]
"""The bytes every entry record starts with (both magics): what a scan for one looks for."""
MAGIC_BLANK = 0xD1ED6EFF
HEADER = struct.Struct(">IIQQBBHI")
HEADER_SIZE = 32
assert HEADER.size == HEADER_SIZE
ALIGN = 8
BLANK_MIN = 8
MAX_BODY = 64 * 1024 * 1024
"""Largest body accepted; recovery treats a bigger ``size`` as corruption."""

_MAX_FIELD = (1 << 63) - 1  # index and term are kept in signed 64-bit columns
_COVERED = slice(8, 28)  # the header bytes under a V2 record's CRC


class FormatError(ValueError):
    """Bytes that are not a well-formed record (bad magic, size, kind, padding or CRC)."""


class EntryKind(IntEnum):
    """What an entry's body is."""

    DATA = 0
    """A broker batch."""
    NOOP = 1
    """A Raft no-op (a new leader's first entry); empty body."""
    RAFT = 2
    """An opaque Raft-internal command."""


@dataclass(frozen=True, slots=True)
class EntryHeader:
    """A decoded header. For a blank record only ``magic`` and ``size`` are set."""

    magic: int
    size: int
    index: int
    term: int
    kind: EntryKind
    crc: int
    pad: int = 0
    seed: int = 0
    """The CRC of the header's covered fields (V2), which the body's CRC continues; 0 for
    a legacy record: ``zlib.crc32(body, seed) == crc`` checks either."""

    @property
    def is_blank(self) -> bool:
        return self.magic == MAGIC_BLANK

    @property
    def body_len(self) -> int:
        """Exact body length (0 for a blank record)."""
        return 0 if self.is_blank else self.size - HEADER_SIZE - self.pad


@dataclass(frozen=True, slots=True)
class Entry:
    """One log entry as read back: ``position`` is its record's absolute byte offset."""

    index: int
    term: int
    kind: EntryKind
    body: bytes
    position: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) & ~(ALIGN - 1)


def record_size(body_len: int) -> int:
    """Bytes one record with a ``body_len``-byte body occupies (a multiple of ``ALIGN``)."""
    if body_len < 0:
        raise ValueError(f"negative body length {body_len}")
    return HEADER_SIZE + _align(body_len)


def encode_entry(index: int, term: int, kind: EntryKind, body: bytes) -> bytes:
    """The full record (header, body, padding). Raises ValueError on out-of-range fields."""
    if not 0 < index <= _MAX_FIELD or not 0 <= term <= _MAX_FIELD:
        raise ValueError(f"index {index} / term {term} out of range")
    if len(body) > MAX_BODY:
        raise ValueError(f"body of {len(body)} bytes exceeds MAX_BODY ({MAX_BODY})")
    kind = EntryKind(kind)
    size = record_size(len(body))
    pad = size - HEADER_SIZE - len(body)
    header = HEADER.pack(MAGIC_ENTRY_V2, size, index, term, kind, pad, 0, 0)
    crc = zlib.crc32(body, zlib.crc32(header[_COVERED]))
    return b"".join((header[:28], crc.to_bytes(4, "big"), body, bytes(pad)))


def encode_blank(size: int) -> bytes:
    """The meaningful prefix of a blank record of ``size`` bytes.

    Returns ``min(size, HEADER_SIZE)`` bytes; the writer fills the rest of the
    segment with zeros (by extending the file). Raises ValueError if ``size`` is
    below 8 or not a multiple of ``ALIGN``.
    """
    if size < BLANK_MIN or size % ALIGN:
        raise ValueError(f"bad blank size {size}")
    prefix = HEADER.pack(MAGIC_BLANK, size, 0, 0, 0, 0, 0, 0)
    return prefix[: min(size, HEADER_SIZE)]


def decode_header(buf: bytes | bytearray | memoryview, offset: int = 0) -> EntryHeader:
    """Decode and sanity-check the header at ``buf[offset:]``.

    A blank record needs only 8 bytes; an entry header needs 32. Raises
    FormatError for a short buffer, unknown magic, a size that is not aligned or
    out of bounds, an unknown kind, bad padding or non-zero reserved bytes. The
    body is not checked (see ``decode_entry``).
    """
    avail = len(buf) - offset
    if avail < BLANK_MIN:
        raise FormatError(f"short header: {max(avail, 0)} bytes")
    magic, size = struct.unpack_from(">II", buf, offset)
    if magic == MAGIC_BLANK:
        if size < BLANK_MIN or size % ALIGN:
            raise FormatError(f"blank record with bad size {size}")
        return EntryHeader(MAGIC_BLANK, size, 0, 0, EntryKind.DATA, 0)
    if magic not in (MAGIC_ENTRY, MAGIC_ENTRY_V2):
        what = "zero bytes" if magic == 0 and size == 0 else f"bad magic 0x{magic:08x}"
        raise FormatError(what)
    if avail < HEADER_SIZE:
        raise FormatError(f"short header: {avail} of {HEADER_SIZE} bytes")
    _, _, index, term, kind, pad, reserved, crc = HEADER.unpack_from(buf, offset)
    if size < HEADER_SIZE or size % ALIGN or size > record_size(MAX_BODY):
        raise FormatError(f"bad record size {size}")
    if pad >= ALIGN or reserved or pad > size - HEADER_SIZE:
        raise FormatError(f"bad padding/reserved bytes ({pad}, {reserved})")
    if index > _MAX_FIELD or term > _MAX_FIELD:
        raise FormatError(f"index {index} / term {term} out of range")
    try:
        entry_kind = EntryKind(kind)
    except ValueError:
        raise FormatError(f"unknown entry kind {kind}") from None
    seed = 0
    if magic == MAGIC_ENTRY_V2:
        start = offset + _COVERED.start
        seed = zlib.crc32(bytes(buf[start:start + _COVERED.stop - _COVERED.start]))
    return EntryHeader(magic, size, index, term, entry_kind, crc, pad, seed)


def decode_entry(buf: bytes | bytearray | memoryview, offset: int = 0,
                 position: int = 0) -> Entry:
    """Decode the whole entry record at ``buf[offset:]``, verifying its CRC.

    ``position`` is only copied into the result. Raises FormatError for a bad
    header, a blank record, a short buffer or a CRC mismatch.
    """
    header = decode_header(buf, offset)
    if header.is_blank:
        raise FormatError("blank record where an entry was expected")
    if len(buf) - offset < header.size:
        raise FormatError(f"short record: {len(buf) - offset} of {header.size} bytes")
    start = offset + HEADER_SIZE
    problem = record_damage(header, buf[start:offset + header.size])
    if problem is not None:
        raise FormatError(problem)
    body = bytes(buf[start:start + header.body_len])
    return Entry(header.index, header.term, header.kind, body, position)


def record_damage(header: EntryHeader, after_header: bytes | bytearray | memoryview) -> str | None:
    """What is wrong with an entry record's bytes after its header (body and padding,
    ``header.size - HEADER_SIZE`` of them), or None: a CRC mismatch, or a padding byte
    that is not zero (the padding is outside the CRC, so it is checked here)."""
    body_len = header.body_len
    actual = zlib.crc32(after_header[:body_len], header.seed)
    if actual != header.crc:
        return f"CRC mismatch (stored 0x{header.crc:08x}, computed 0x{actual:08x})"
    if any(after_header[body_len:header.size - HEADER_SIZE]):
        return f"non-zero padding after the body of entry {header.index}"
    return None
