"""A record's message section (``protocol.record_batch`` draws the whole record): one msgpack
array per message, the section compressed as one block::

    message section      msgpack [[born delta, flag, tags, properties, reconsume, body], ...]
    codec (header flags) 0 none, 1 zstd, 2 lz4; the header holds the section's raw length

Here: the rows as each reader decodes them (whole, as tuples for columns, up to the
properties, or bounded and checked as the leader accepts them), the block codecs, and
``MessageFormatError``, which every reader of a record raises. Pure; the codecs keep one
compressor per thread.
"""

from __future__ import annotations

import threading
from typing import Annotated, Any

import msgspec

__all__ = [
    "MAX_BASE_BORN_MS",
    "MAX_BORN_DELTA_MS",
    "PROPERTIES_ROWS",
    "ROWS",
    "ROW_TUPLES",
    "MessageFormatError",
    "PropertiesRow",
    "SectionRow",
    "checked_rows",
    "compress",
    "decode_rows",
    "inflate",
]


class MessageFormatError(ValueError):
    """Bytes that are not a record (or message) of this format."""


class SectionRow(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One message of the section, whole."""

    born_delta: int
    flag: int
    tags: str | None
    properties: dict[str, str]
    reconsume: int
    body: bytes


class PropertiesRow(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A message section row read up to its properties (the rest, body included, is skipped)."""

    born_delta: int
    flag: int
    tags: str | None
    properties: dict[str, str]


ROWS = msgspec.msgpack.Decoder(list[SectionRow])
ROW_TUPLES = msgspec.msgpack.Decoder(list[tuple[int, int, str | None, dict[str, str], int, bytes]])
PROPERTIES_ROWS = msgspec.msgpack.Decoder(list[PropertiesRow])
#: Born times the leader accepts (``check_messages``): a record's base within 2**53 ms of the
#: epoch, each message within 2**40 ms (~35 years) of it -- so a born time is always an int64
#: of milliseconds, and of microseconds too (Spark's TIMESTAMP).
MAX_BASE_BORN_MS = 2**53
MAX_BORN_DELTA_MS = 2**40
_Delta = Annotated[int, msgspec.Meta(ge=-MAX_BORN_DELTA_MS, le=MAX_BORN_DELTA_MS)]
_Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]
_Reconsume = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
#: The rows as consumers read them, bounded; bodies are views, not copies.
_CHECKED = msgspec.msgpack.Decoder(
    list[tuple[_Delta, _Int32, str | None, dict[str, str], _Reconsume, memoryview]])
_ROW_FIELDS = ("born delta", "flag", "tags", "properties", "reconsume", "body")
_local = threading.local()


def decode_rows(decoder: msgspec.msgpack.Decoder[Any], section: bytes | memoryview, count: int) -> list[Any]:
    """The section's rows as ``decoder`` reads them; MessageFormatError unless there are
    ``count`` of them."""
    try:
        rows: list[Any] = decoder.decode(section)
    except msgspec.DecodeError as e:
        raise MessageFormatError(f"malformed message section: {e}") from None
    if len(rows) != count:
        raise MessageFormatError(f"the message section has {len(rows)} messages, the header {count}")
    return rows


def checked_rows(section: bytes | memoryview, count: int) -> list[tuple[Any, ...]]:
    """The section's ``count`` rows of the right types, born deltas, flags and reconsume
    counts in range, bodies as views; MessageFormatError naming the message and field."""
    try:
        rows: list[tuple[Any, ...]] = _CHECKED.decode(section)
    except msgspec.ValidationError as e:
        raise MessageFormatError(_named(str(e))) from None
    except msgspec.DecodeError as e:
        raise MessageFormatError(f"malformed message section: {e}") from None
    if len(rows) != count:
        raise MessageFormatError(f"the message section has {len(rows)} messages, the header {count}")
    return rows


def _named(text: str) -> str:
    """msgspec's complaint about the section, with the message and field it is at
    (``... - at `$[2][5]``` -> ``message 2: body: ...``)."""
    what, _, where = text.partition(" - at `$[")
    what = what[:1].lower() + what[1:]
    if not where:
        return f"malformed message section: {what}"
    index, _, rest = where.partition("]")
    field = rest[1:].partition("]")[0] if rest.startswith("[") else ""
    name = _ROW_FIELDS[int(field)] if field.isdigit() and int(field) < len(_ROW_FIELDS) else ""
    return f"message {index}: {name + ': ' if name else ''}{what}"


def inflate(stored: memoryview, codec: int, raw_length: int) -> bytes | memoryview:
    """The section as stored, inflated if ``codec`` compressed it (``stored`` itself if not:
    no copy); MessageFormatError unless it inflates to exactly ``raw_length`` bytes."""
    if not codec:
        return stored
    try:
        out = _decompress(codec, bytes(stored), raw_length)
    except Exception as e:
        raise MessageFormatError(f"the message section does not decompress: {e}") from None
    if len(out) != raw_length:
        raise MessageFormatError(f"the message section inflates to {len(out)} bytes, not {raw_length}")
    return out


def compress(codec: int, data: bytes) -> bytes:
    """``data`` compressed by ``codec`` (1 zstd at level 1, 2 lz4 without its size)."""
    if codec == 1:
        compressor = getattr(_local, "zstd", None)
        if compressor is None:
            import zstandard
            compressor = _local.zstd = zstandard.ZstdCompressor(level=1)
        return bytes(compressor.compress(data))
    import lz4.block
    return bytes(lz4.block.compress(data, store_size=False))


def _decompress(codec: int, data: bytes, raw_length: int) -> bytes:
    if codec == 1:
        decompressor = getattr(_local, "unzstd", None)
        if decompressor is None:  # one per thread: a new one costs ~8 us, a record's decompression ~1
            import zstandard
            decompressor = _local.unzstd = zstandard.ZstdDecompressor()
        return bytes(decompressor.decompress(data, max_output_size=raw_length))
    import lz4.block
    return bytes(lz4.block.decompress(data, uncompressed_size=raw_length))
