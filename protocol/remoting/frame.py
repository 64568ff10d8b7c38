"""The broker's wire frame: RocketMQ's RemotingCommand over one WebSocket per client.

Every binary WebSocket message is exactly one frame, in either direction, and a
frame is either a request or the response to one. Clients send requests to the
broker; the broker also sends requests to clients (transaction check-back,
consumer-list change notices). A frame is one msgpack array::

    +---------+------+--------+-------+--------+-----+------+
    | version | code | opaque | flags | remark | ext | body |
    +---------+------+--------+-------+--------+-----+------+

    version  int = 1        layout version; any other value is refused
    code     int            a RequestCode in a request, a ResponseCode in a response
                            (0 .. 2**31-1; an unknown request code still decodes)
    opaque   int            request id chosen by the sender (u32); the response echoes it
    flags    int            bit 0 RESPONSE, bit 1 ONEWAY (no response expected);
                            other bits, and RESPONSE|ONEWAY together, are refused
    remark   str            human-readable error text on error responses, "" otherwise
    ext      map            RocketMQ's extFields: str -> str | int | bool | bin | nil,
                            or a flat array of those (at most MAX_EXT_ITEMS entries/items)
    body     bin            the payload (encoded messages, ...)

Opaques are per sender: a response is matched against the requests *its
receiver* sent, so a peer never answers a response or a oneway request.

The codes themselves (``RequestCode``, ``ResponseCode``, ``RETRIABLE``) are
``protocol.remoting.codes``. What each request and response carries in
``ext`` and ``body`` is one typed class per request and per response
(``protocol.wire``; which class for which code: ``protocol.catalog``); nothing
outside ``protocol`` reads or builds them by hand.

``decode_frame`` is the only way bytes become a ``Frame`` and raises nothing but
``FrameError``. msgpack's unpacker limits bound what a hostile frame can make the
decoder allocate: strings and binaries cannot outgrow the frame, arrays and maps
hold at most ``MAX_EXT_ITEMS`` items (msgpack preallocates arrays by their
declared length), nesting deeper than msgpack's stack is refused, and ext values
are never nested beyond one flat list.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntFlag
from types import MappingProxyType
from typing import Any

import msgpack

from protocol.remoting.codes import RequestCode, ResponseCode

__all__ = [
    "DEFAULT_MAX_FRAME",
    "MAX_CODE",
    "MAX_EXT_ITEMS",
    "MAX_OPAQUE",
    "REFUSED_HEADER",
    "VERSION",
    "ExtScalar",
    "ExtValue",
    "Frame",
    "FrameError",
    "FrameFlag",
    "decode_frame",
]

VERSION = 1
#: Largest frame accepted by default: a 4 MiB body plus 64 KiB for the rest.
DEFAULT_MAX_FRAME = 4 * 1024 * 1024 + 64 * 1024
#: Most entries in ``ext`` and most items in one ext list (also msgpack's array/map limit).
MAX_EXT_ITEMS = 1024
MAX_OPAQUE = 2**32 - 1
MAX_CODE = 2**31 - 1
#: The HTTP header of a broker's 503 to a WebSocket upgrade it refused (a connection limit):
#: why, in words, for the client's error.
REFUSED_HEADER = "X-RaftMQ-Refused"

_FIELDS = 7
_PEEK_BYTES = 64  # enough for the array header, version, code, opaque and flags
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1  # what msgpack can carry

ExtScalar = str | int | bool | bytes | None
ExtValue = ExtScalar | tuple[ExtScalar, ...]



_REQUEST_CODES: dict[int, RequestCode] = {c.value: c for c in RequestCode}
_RESPONSE_CODES: dict[int, ResponseCode] = {c.value: c for c in ResponseCode}


class FrameFlag(IntFlag):
    RESPONSE = 1
    ONEWAY = 2


_VALID_FLAGS = frozenset({0, FrameFlag.RESPONSE, FrameFlag.ONEWAY})


class FrameError(ValueError):
    """A frame that cannot be accepted, or a request argument that is wrong.

    ``code`` is the ResponseCode to answer with (MALFORMED_FRAME or MESSAGE_TOO_LARGE
    from the decoder, INVALID_ARGUMENT from a typed body's ``from_frame``); ``opaque`` and
    ``flags`` are the offending frame's, when they could be read.
    """

    def __init__(self, code: ResponseCode, message: str, *, opaque: int | None = None,
                 flags: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.opaque = opaque
        self.flags = flags

    def response(self) -> Frame | None:
        """The error response to send back, or None when there is nobody to answer:
        the opaque or flags were unreadable, or the frame was a response or oneway."""
        if self.opaque is None or self.flags != 0:
            return None
        return Frame(self.code, self.opaque, FrameFlag.RESPONSE, remark=self.message)


@dataclass(frozen=True, slots=True)
class Frame:
    """One decoded or to-be-sent frame; every instance is valid (checked on creation).

    ``ext`` is stored as a read-only mapping whose lists are tuples, so a frame
    compares equal to its own round trip. Invalid fields raise FrameError
    (MALFORMED_FRAME).
    """

    code: int
    opaque: int
    flags: int = 0
    remark: str = ""
    ext: Mapping[str, ExtValue] = field(default_factory=dict)
    body: bytes = b""
    version: int = VERSION

    def __post_init__(self) -> None:
        # The common case is checked without building the messages (formatting them all
        # cost ~10 us a frame); only a frame that fails is checked again, item by item.
        if not (_is_int(self.version) and self.version == VERSION and _is_int(self.code)
                and 0 <= self.code <= MAX_CODE and _is_opaque(self.opaque)
                and _is_flags(self.flags) and isinstance(self.remark, str)
                and isinstance(self.body, bytes)):
            self._refuse()
        object.__setattr__(self, "code", int(self.code))  # plain ints, whatever enum built them
        object.__setattr__(self, "flags", int(self.flags))
        object.__setattr__(self, "ext", MappingProxyType(_checked_ext(self.ext)))

    def _refuse(self) -> None:
        """Raise FrameError naming the first field that is wrong."""
        _require(_is_int(self.version) and self.version == VERSION,
                 f"unsupported frame version {_show(self.version)}; this broker speaks {VERSION}")
        _require(_is_int(self.code) and 0 <= self.code <= MAX_CODE,
                 f"code must be an int in 0..{MAX_CODE}, got {_show(self.code)}")
        _require(_is_opaque(self.opaque),
                 f"opaque must be an int in 0..{MAX_OPAQUE}, got {_show(self.opaque)}")
        _require(_is_flags(self.flags),
                 f"flags must be 0, 1 (RESPONSE) or 2 (ONEWAY), got {_show(self.flags)}")
        _require(isinstance(self.remark, str), f"remark must be a str, got {_kind(self.remark)}")
        _require(isinstance(self.body, bytes), f"body must be bytes, got {_kind(self.body)}")

    @classmethod
    def request(cls, code: int, opaque: int, ext: Mapping[str, ExtValue] | None = None,
                body: bytes = b"", oneway: bool = False) -> Frame:
        """A request; a oneway one gets no response."""
        flags = FrameFlag.ONEWAY if oneway else 0
        return cls(code, opaque, flags, "", ext or {}, body)

    def response(self, code: int, ext: Mapping[str, ExtValue] | None = None, body: bytes = b"",
                 remark: str = "") -> Frame:
        """The response to this request (same opaque). Raises ValueError when this
        frame is a response or a oneway request: neither may be answered."""
        if self.flags != 0:
            raise ValueError(f"a {'response' if self.is_response else 'oneway request'} "
                             "cannot be answered")
        return Frame(code, self.opaque, FrameFlag.RESPONSE, remark, ext or {}, body)

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FrameFlag.RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flags & FrameFlag.ONEWAY)

    def request_code(self) -> RequestCode | None:
        """The RequestCode of a request; None for a response or an unknown code."""
        return None if self.is_response else _REQUEST_CODES.get(self.code)

    def response_code(self) -> ResponseCode | None:
        """The ResponseCode of a response; None for a request or an unknown code."""
        return _RESPONSE_CODES.get(self.code) if self.is_response else None

    def encode(self) -> bytes:
        """The frame's bytes (one WebSocket binary message). No size limit is applied."""
        return msgpack.packb(
            [self.version, self.code, self.opaque, self.flags, self.remark, dict(self.ext),
             self.body],
            use_bin_type=True)


def decode_frame(data: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME) -> Frame:
    """Decode one frame; raises only FrameError, whatever ``data`` is.

    Input longer than ``max_frame_bytes`` gives MESSAGE_TOO_LARGE (without decoding
    more than its first bytes); anything else that is not exactly one valid frame
    gives MALFORMED_FRAME. The error carries the frame's opaque and flags when they
    were readable, so the request can still be answered (``FrameError.response``).
    """
    head = _Head()
    try:
        return _decode(data, max_frame_bytes, head)
    except FrameError as e:
        raise FrameError(e.code, e.message, opaque=head.opaque, flags=head.flags) from None
    except Exception as e:  # the contract is FrameError only, whatever went wrong
        raise FrameError(ResponseCode.MALFORMED_FRAME, f"undecodable frame: {_describe(e)}",
                         opaque=head.opaque, flags=head.flags) from None


# -- decoding ---------------------------------------------------------------------

@dataclass(slots=True)
class _Head:
    """What decoding has learnt so far about the frame, for the error it may raise."""

    opaque: int | None = None
    flags: int | None = None


def _decode(data: bytes, limit: int, head: _Head) -> Frame:
    size = _byte_size(data)
    _require(size > 0, "frame is empty")
    if size > limit:
        _peek_head(data, head)
        raise FrameError(ResponseCode.MESSAGE_TOO_LARGE,
                         f"frame of {size} bytes exceeds the {limit}-byte limit")
    unpacker = _unpacker(data, size, limit)
    count, code, opaque, flags = _read_head(unpacker, head)
    if count != _FIELDS:
        raise _malformed(f"frame has {count} fields; expected {_FIELDS}")
    remark, ext, body = (_next(unpacker, name) for name in ("remark", "ext", "body"))
    trailing = size - unpacker.tell()
    if trailing:
        raise _malformed(f"{trailing} trailing byte{'s' if trailing > 1 else ''} after the frame")
    _require(isinstance(ext, dict), f"ext must be a map, got {_kind(ext)}")
    return Frame(code, opaque, flags, remark, ext, body)


def _read_head(unpacker: msgpack.Unpacker, head: _Head) -> tuple[int, Any, Any, Any]:
    """Read the array header, version, code, opaque and flags (raw), noting in ``head``
    the opaque and flags that are valid; returns (field count, code, opaque, flags)."""
    try:
        count = unpacker.read_array_header()
    except msgpack.OutOfData:
        raise _malformed("frame ends inside its array header") from None
    except Exception as e:
        raise _malformed(f"a frame is a msgpack array ({_describe(e)})") from None
    _require(count >= 1, "frame is an empty array")
    version = _next(unpacker, "version")
    code = _next(unpacker, "code") if count > 1 else None
    opaque = _next(unpacker, "opaque") if count > 2 else None
    head.opaque = opaque if _is_opaque(opaque) else None
    flags = _next(unpacker, "flags") if count > 3 else None
    head.flags = flags if _is_flags(flags) else None
    # checked after the opaque and flags are known: a frame of another version is answered
    _require(_is_int(version) and version == VERSION,
             f"unsupported frame version {_show(version)}; this broker speaks {VERSION}")
    return count, code, opaque, flags


def _peek_head(data: bytes, head: _Head) -> None:
    """Best effort: learn the opaque and flags from the first bytes of ``data``."""
    prefix = bytes(memoryview(data)[:_PEEK_BYTES])
    with contextlib.suppress(Exception):  # unreadable: the error will not carry the head
        _read_head(_unpacker(prefix, len(prefix), len(prefix)), head)


def _unpacker(data: bytes, size: int, limit: int) -> msgpack.Unpacker:
    unpacker = msgpack.Unpacker(
        raw=False, use_list=False, strict_map_key=True, max_buffer_size=max(size, 1),
        max_str_len=limit, max_bin_len=limit, max_array_len=MAX_EXT_ITEMS,
        max_map_len=MAX_EXT_ITEMS, max_ext_len=0)
    unpacker.feed(data)
    return unpacker


def _next(unpacker: msgpack.Unpacker, name: str) -> Any:
    try:
        return unpacker.unpack()
    except msgpack.OutOfData:
        raise _malformed(f"frame ends inside field {name!r}") from None
    except Exception as e:
        raise _malformed(f"cannot read field {name!r}: {_describe(e)}") from None


def _byte_size(data: Any) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        raise _malformed(f"a frame is bytes, got {_kind(data)}") from None


# -- field checks -----------------------------------------------------------------

def _checked_ext(ext: Any) -> dict[str, ExtValue]:
    """A private copy of ``ext`` with lists as tuples; FrameError if anything is off."""
    plain = _plain_ext(ext)
    return plain if plain is not None else _checked_ext_explained(ext)


def _plain_ext(ext: Any) -> dict[str, ExtValue] | None:
    """``_checked_ext``'s result for a valid ``ext``, without building any message; None
    when something is off (then ``_checked_ext_explained`` says what)."""
    if not isinstance(ext, Mapping) or len(ext) > MAX_EXT_ITEMS:
        return None
    checked: dict[str, ExtValue] = {}
    for key, value in ext.items():
        if type(key) is not str:
            return None
        kind = type(value)
        if kind in _PLAIN_SCALARS:
            checked[key] = value
        elif kind is int:
            if not _INT_MIN <= value <= _INT_MAX:
                return None
            checked[key] = value
        elif kind in (list, tuple) and len(value) <= MAX_EXT_ITEMS and all(
                type(item) in _PLAIN_SCALARS or (type(item) is int and _INT_MIN <= item <= _INT_MAX)
                for item in value):
            checked[key] = tuple(value)
        else:
            return None  # also a subclass of int, str or bytes: the explained path takes it
    return checked


_PLAIN_SCALARS = frozenset({str, bytes, bool, type(None)})


def _checked_ext_explained(ext: Any) -> dict[str, ExtValue]:
    _require(isinstance(ext, Mapping), f"ext must be a map, got {_kind(ext)}")
    _require(len(ext) <= MAX_EXT_ITEMS, f"ext has {len(ext)} fields; at most {MAX_EXT_ITEMS}")
    checked: dict[str, ExtValue] = {}
    for key, value in ext.items():
        _require(isinstance(key, str), f"ext keys must be str, got {_kind(key)} {_show(key)}")
        checked[key] = _checked_ext_value(key, value)
    return checked


def _checked_ext_value(key: str, value: Any) -> ExtValue:
    if _is_ext_scalar(value):
        _require(not _is_int(value) or _INT_MIN <= value <= _INT_MAX,
                 f"ext field {key!r} holds an int outside msgpack's 64-bit range")
        return value
    _require(isinstance(value, list | tuple),
             f"ext field {key!r} has unsupported type {_kind(value)}; allowed: str, int, bool, "
             "bytes, nil, or a flat list of those")
    _require(len(value) <= MAX_EXT_ITEMS,
             f"ext field {key!r} holds {len(value)} items; at most {MAX_EXT_ITEMS}")
    for item in value:
        _require(_is_ext_scalar(item),
                 f"ext field {key!r} holds a {_kind(item)} in its list; list items are str, int, "
                 "bool, bytes or nil (no nesting)")
        _require(not _is_int(item) or _INT_MIN <= item <= _INT_MAX,
                 f"ext field {key!r} holds an int outside msgpack's 64-bit range")
    return tuple(value)


def _is_ext_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | bytes)  # bool is an int


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_opaque(value: Any) -> bool:
    return _is_int(value) and 0 <= value <= MAX_OPAQUE


def _is_flags(value: Any) -> bool:
    return _is_int(value) and value in _VALID_FLAGS


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise _malformed(what)


def _malformed(what: str) -> FrameError:
    return FrameError(ResponseCode.MALFORMED_FRAME, f"malformed frame: {what}")


def _kind(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
