"""RocketMQ's remoting frame (``RemotingCommand``) and both of its header serializations.

One frame on the TCP stream, big-endian::

    +--------------+-----------+------------------+--------------+------------+
    | total length | ser. type | header length    | header       | body       |
    | int32        | 1 byte    | 24 bits          | header length| the rest   |
    +--------------+-----------+------------------+--------------+------------+
    total length = 4 + header length + body length (itself not counted)
    ser. type    = 0 JSON, 1 ROCKETMQ (the binary layout below)

JSON header (fastjson; ``protocol.rocketmq.fastjson``): an object with the fields, in name
order, ``code``, ``extFields`` (string -> string, absent when null), ``flag``, ``language``
(the enum's name), ``opaque``, ``remark`` (absent when null),
``serializeTypeCurrentRPC`` (``"JSON"``), ``version``.

ROCKETMQ header (``RocketMQSerializable``)::

    +------+----------+---------+--------+------+--------------------+---------------------+
    | code | language | version | opaque | flag | remark             | extFields           |
    | i16  | u8       | i16     | i32    | i32  | i32 len + UTF-8    | i32 len + entries   |
    +------+----------+---------+--------+------+--------------------+---------------------+
    entry = i16 key len + UTF-8 key, i32 value len + UTF-8 value (a length of 0 reads as null)

Key order in extFields is free (a map); the encoder writes Java's (``_ordered_ext``) so
golden bytes compare equal. ``flag``: bit 0 a response, bit 1 oneway (``codes.FrameFlag``). ``opaque`` is the
request's id; its response carries it back. A peer answers in the serialization of the
request (``serialize_type``). ``version`` is the sender's release ordinal (4.9.7 sends
407); the name server's route encoding depends on it.

``decode_frame`` raises ``RocketFrameError`` only, whatever the bytes; lengths are checked
against the frame before anything is allocated (``MAX_HEADER_BYTES``; the frame limit is
the reader's: ``read_length``).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol.rocketmq import fastjson
from protocol.rocketmq.codes import FrameFlag, LanguageCode, SerializeType

__all__ = ["MAX_HEADER_BYTES", "RemotingFrame", "RocketFrameError", "decode_frame", "read_length"]

#: Largest header accepted (a message's properties are at most 32 KiB, escaped in JSON).
MAX_HEADER_BYTES = 256 * 1024
_LENGTHS = struct.Struct(">iI")
_FIXED = struct.Struct(">hBhii")  # code, language, version, opaque, flag
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


class RocketFrameError(ValueError):
    """Bytes that are not a frame this codec accepts; ``opaque`` when it could be read."""

    def __init__(self, message: str, opaque: int | None = None) -> None:
        super().__init__(message)
        self.opaque = opaque


@dataclass(frozen=True, slots=True)
class RemotingFrame:
    """One frame. ``ext`` is RocketMQ's ``extFields`` (None: absent, as Java's null)."""

    code: int
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext: Mapping[str, str] | None = None
    body: bytes = b""
    language: int = LanguageCode.JAVA
    version: int = 0
    serialize_type: SerializeType = SerializeType.JSON
    #: the order ``ext``'s keys were put in by the Java code that made them (HashMap order)
    ext_order: tuple[str, ...] = field(default=(), compare=False)

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FrameFlag.RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FrameFlag.ONEWAY)

    def response(self, code: int, ext: Mapping[str, str] | None = None, body: bytes = b"",
                 remark: str | None = None, ext_order: tuple[str, ...] = ()) -> RemotingFrame:
        """This request's answer: same opaque and serialization, the RESPONSE flag."""
        return RemotingFrame(code, self.opaque, FrameFlag.RESPONSE, remark, ext, body,
                             LanguageCode.JAVA, self.version, self.serialize_type, ext_order)

    def encode(self) -> bytes:
        """The frame's bytes on the stream, total length included."""
        if self.serialize_type == SerializeType.ROCKETMQ:
            header = self._binary_header()
        else:
            header = self._json_header()
        if len(header) > 0xFFFFFF:
            raise ValueError(f"a header of {len(header)} bytes does not fit in 24 bits")
        marked = (int(self.serialize_type) << 24) | len(header)
        return _LENGTHS.pack(4 + len(header) + len(self.body), marked) + header + self.body

    def _ordered_ext(self) -> list[str]:
        """JSON: the HashMap's iteration order of the keys put in ``ext_order``'s order;
        ROCKETMQ: ``ext_order`` as it is (4.9.7's Netty encoder writes a ``FastCodesHeader``'s
        fields first, in declaration order -- what a header's ``to_ext`` order is -- and a
        decoded frame keeps the order it came in), then any other key in HashMap order."""
        assert self.ext is not None
        listed = [k for k in self.ext_order if k in self.ext]
        rest = [k for k in self.ext if k not in listed]
        if self.serialize_type == SerializeType.ROCKETMQ:
            return listed + [str(k) for k in fastjson.java_order(rest)]
        return [str(k) for k in fastjson.java_order(listed + rest)]

    def _json_header(self) -> bytes:
        ext = None
        if self.ext is not None:
            ext = fastjson.JavaMap({k: self.ext[k] for k in self._ordered_ext()})
        fields = {"code": self.code, "extFields": ext, "flag": self.flag,
                  "language": _language_name(self.language), "opaque": self.opaque,
                  "remark": self.remark, "serializeTypeCurrentRPC": "JSON", "version": self.version}
        return fastjson.dumps(fastjson.Bean(fields)).encode("utf-8")

    def _binary_header(self) -> bytes:
        parts = [_FIXED.pack(self.code, self.language, self.version, self.opaque, self.flag)]
        remark = (self.remark or "").encode("utf-8")
        parts += [_I32.pack(len(remark)), remark]
        entries: list[bytes] = []
        if self.ext:
            for key in self._ordered_ext():
                k, v = key.encode("utf-8"), self.ext[key].encode("utf-8")
                entries += [_I16.pack(len(k)), k, _I32.pack(len(v)), v]
        ext = b"".join(entries)
        parts += [_I32.pack(len(ext)), ext]
        return b"".join(parts)


def read_length(prefix: bytes, max_frame_bytes: int) -> int:
    """The bytes that follow a frame's 4-byte total length ``prefix``; RocketFrameError
    when it is below the smallest frame or above ``max_frame_bytes``."""
    length: int = _I32.unpack(prefix)[0]
    if length < 4:
        raise RocketFrameError(f"frame length {length} is below the 4-byte minimum")
    if length > max_frame_bytes:
        raise RocketFrameError(f"frame of {length} bytes exceeds the {max_frame_bytes}-byte limit")
    return length


def decode_frame(payload: bytes) -> RemotingFrame:
    """A frame from the bytes after its total length (``read_length`` says how many)."""
    if len(payload) < 4:
        raise RocketFrameError("frame ends inside its header length")
    (marked,) = _I32.unpack_from(payload)
    kind, header_len = (marked >> 24) & 0xFF, marked & 0xFFFFFF
    if header_len > MAX_HEADER_BYTES or 4 + header_len > len(payload):
        raise RocketFrameError(f"header of {header_len} bytes does not fit the frame "
                               f"({len(payload) - 4} bytes) or the {MAX_HEADER_BYTES}-byte limit")
    header, body = payload[4:4 + header_len], bytes(payload[4 + header_len:])
    if kind == SerializeType.JSON:
        return _from_json(bytes(header), body)
    if kind == SerializeType.ROCKETMQ:
        return _from_binary(bytes(header), body)
    raise RocketFrameError(f"unknown header serialization {kind} (0 JSON, 1 ROCKETMQ)")


def _from_json(header: bytes, body: bytes) -> RemotingFrame:
    try:
        doc = json.loads(header)
    except (ValueError, UnicodeDecodeError) as e:
        raise RocketFrameError(f"JSON header is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise RocketFrameError("JSON header is not an object")
    opaque = _int_field(doc, "opaque", None)
    try:
        code = _int_field(doc, "code", opaque)
        ext_doc = doc.get("extFields")
        if ext_doc is not None and not isinstance(ext_doc, dict):
            raise RocketFrameError("extFields is not an object", opaque)
        ext = None if ext_doc is None else {str(k): _ext_text(v) for k, v in ext_doc.items()}
        remark = doc.get("remark")
        if remark is not None and not isinstance(remark, str):
            raise RocketFrameError("remark is not a string", opaque)
        return RemotingFrame(code, opaque, _int_field(doc, "flag", opaque, 0), remark, ext, body,
                             _language_code(doc.get("language", "JAVA")),
                             _int_field(doc, "version", opaque, 0), SerializeType.JSON,
                             tuple(ext or ()))
    except RocketFrameError as e:
        raise RocketFrameError(str(e), opaque) from None


def _from_binary(header: bytes, body: bytes) -> RemotingFrame:
    if len(header) < _FIXED.size + 8:
        raise RocketFrameError("ROCKETMQ header is shorter than its fixed fields")
    code, language, version, opaque, flag = _FIXED.unpack_from(header)
    at = _FIXED.size
    remark, at = _read_text(header, at, 4, opaque)
    (ext_len,) = _I32.unpack_from(header, at)
    at += 4
    if ext_len < 0 or at + ext_len != len(header):
        raise RocketFrameError(f"extFields length {ext_len} does not match the header", opaque)
    ext: dict[str, str] = {}
    while at < len(header):
        key, at = _read_text(header, at, 2, opaque)
        value, at = _read_text(header, at, 4, opaque)
        if key is not None and value is not None:
            ext[key] = value
    return RemotingFrame(code & 0xFFFF if code < 0 else code, opaque, flag, remark,
                         ext if ext_len else None, body, language, version, SerializeType.ROCKETMQ,
                         tuple(ext))


def _read_text(data: bytes, at: int, width: int, opaque: int) -> tuple[str | None, int]:
    if at + width > len(data):
        raise RocketFrameError("ROCKETMQ header ends inside a length", opaque)
    (n,) = (_I16 if width == 2 else _I32).unpack_from(data, at)
    at += width
    if n < 0 or at + n > len(data):
        raise RocketFrameError(f"a string of {n} bytes does not fit the ROCKETMQ header", opaque)
    if n == 0:
        return None, at
    try:
        return data[at:at + n].decode("utf-8"), at + n
    except UnicodeDecodeError:
        raise RocketFrameError("a string of the ROCKETMQ header is not UTF-8", opaque) from None


def _int_field(doc: dict[str, object], name: str, opaque: int | None,
               default: int | None = None) -> int:
    value = doc.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**31:
        raise RocketFrameError(f"{name} must be a 32-bit integer, got {value!r:.40}", opaque)
    return value


def _ext_text(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    raise RocketFrameError(f"an extFields value is a {type(value).__name__}, not text")


def _language_name(code: int) -> str:
    try:
        return LanguageCode(code).name
    except ValueError:
        return LanguageCode.OTHER.name


def _language_code(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value in LanguageCode.__members__:
        return LanguageCode[value].value
    return LanguageCode.OTHER
