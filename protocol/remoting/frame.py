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

This module holds the layout, ``Frame`` (which checks every field on creation, so every
instance is valid), ``FrameError`` and the checks; bytes become a ``Frame`` only through
``protocol.remoting.frame_decoder.decode_frame``.
"""

from __future__ import annotations

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
        if not (is_int(self.version) and self.version == VERSION and is_int(self.code)
                and 0 <= self.code <= MAX_CODE and is_opaque(self.opaque)
                and is_flags(self.flags) and isinstance(self.remark, str)
                and isinstance(self.body, bytes)):
            self._refuse()
        object.__setattr__(self, "code", int(self.code))  # plain ints, whatever enum built them
        object.__setattr__(self, "flags", int(self.flags))
        object.__setattr__(self, "ext", MappingProxyType(_checked_ext(self.ext)))

    def _refuse(self) -> None:
        """Raise FrameError naming the first field that is wrong."""
        require(is_int(self.version) and self.version == VERSION,
                 f"unsupported frame version {short_repr(self.version)}; this broker speaks {VERSION}")
        require(is_int(self.code) and 0 <= self.code <= MAX_CODE,
                 f"code must be an int in 0..{MAX_CODE}, got {short_repr(self.code)}")
        require(is_opaque(self.opaque),
                 f"opaque must be an int in 0..{MAX_OPAQUE}, got {short_repr(self.opaque)}")
        require(is_flags(self.flags),
                 f"flags must be 0, 1 (RESPONSE) or 2 (ONEWAY), got {short_repr(self.flags)}")
        require(isinstance(self.remark, str), f"remark must be a str, got {type_name(self.remark)}")
        require(isinstance(self.body, bytes), f"body must be bytes, got {type_name(self.body)}")

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


# -- field checks (those without an underscore are frame_decoder's too) -------------

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
    require(isinstance(ext, Mapping), f"ext must be a map, got {type_name(ext)}")
    require(len(ext) <= MAX_EXT_ITEMS, f"ext has {len(ext)} fields; at most {MAX_EXT_ITEMS}")
    checked: dict[str, ExtValue] = {}
    for key, value in ext.items():
        require(isinstance(key, str), f"ext keys must be str, got {type_name(key)} {short_repr(key)}")
        checked[key] = _checked_ext_value(key, value)
    return checked


def _checked_ext_value(key: str, value: Any) -> ExtValue:
    if _is_ext_scalar(value):
        require(not is_int(value) or _INT_MIN <= value <= _INT_MAX,
                 f"ext field {key!r} holds an int outside msgpack's 64-bit range")
        return value
    require(isinstance(value, list | tuple),
             f"ext field {key!r} has unsupported type {type_name(value)}; allowed: str, int, bool, "
             "bytes, nil, or a flat list of those")
    require(len(value) <= MAX_EXT_ITEMS,
             f"ext field {key!r} holds {len(value)} items; at most {MAX_EXT_ITEMS}")
    for item in value:
        require(_is_ext_scalar(item),
                 f"ext field {key!r} holds a {type_name(item)} in its list; list items are str, int, "
                 "bool, bytes or nil (no nesting)")
        require(not is_int(item) or _INT_MIN <= item <= _INT_MAX,
                 f"ext field {key!r} holds an int outside msgpack's 64-bit range")
    return tuple(value)


def _is_ext_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | bytes)  # bool is an int


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_opaque(value: Any) -> bool:
    return is_int(value) and 0 <= value <= MAX_OPAQUE


def is_flags(value: Any) -> bool:
    return is_int(value) and value in _VALID_FLAGS


def require(ok: bool, what: str) -> None:
    if not ok:
        raise malformed(what)


def malformed(what: str) -> FrameError:
    return FrameError(ResponseCode.MALFORMED_FRAME, f"malformed frame: {what}")


def type_name(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, Mapping):
        return "map"
    if isinstance(value, list | tuple):
        return "list"
    return type(value).__name__


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def error_text(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
