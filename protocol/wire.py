"""Typed frame contents: the base of the one class per request and per response body.

A class's fields are the frame's ext fields, in declaration order, named on the wire in
camelCase (``queue_id`` -> ``queueId``); the field named by ``BODY``, if any, is the
frame's body instead -- the bytes as they are when it is typed ``bytes``, else msgpack of
its type. The classes are msgspec ``Struct``s (frozen); msgspec validates what is decoded::

    encode (Request.to_frame, Response.reply)      decode (from_frame)
    ---------------------------------------------  -------------------------------------------
    a field None whose default is None: no key     no key, or nil: the field's default
    a field None without a default: nil            nil for a field that may be None: None
    the body None: an empty body                   an empty body: None (the body's default)
    other values as they are                       a wrong type or range, a missing required
                                                   field: FrameError(INVALID_ARGUMENT)
                                                   naming the field; unknown keys are ignored

So a class encodes to exactly the frame a hand-built dict gave (same keys, same order,
same body bytes), and nil still counts as absent, as it always did on this wire.
Ext values are what a frame carries: str, int, bool, bytes, nil or a flat list of them.
"""

from __future__ import annotations

import functools
import operator
import types
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import msgspec

from protocol.remoting import ExtValue, Frame, FrameError, RequestCode, ResponseCode

__all__ = ["EmptyResponse", "NotLeaderResponse", "Request", "Response", "WireBody"]

_ENCODER = msgspec.msgpack.Encoder()


@dataclass(frozen=True, slots=True)
class _Field:
    attr: str
    key: str
    omit_none: bool  # its default is None: None is sent as no key at all


@dataclass(frozen=True, slots=True)
class _Body:
    attr: str
    key: str
    raw: bool  # typed bytes: the body is the value itself
    optional: bool  # it has a default: the class can be built without it
    decoder: msgspec.msgpack.Decoder[Any] | None


@dataclass(frozen=True, slots=True)
class _Spec:
    ext: tuple[_Field, ...]
    nullable: frozenset[str]  # keys whose type holds None: a nil is kept, not dropped
    body: _Body | None


_SPECS: dict[type, _Spec] = {}


def _spec(cls: type[WireBody]) -> _Spec:
    spec = _SPECS.get(cls)
    if spec is None:
        spec = _SPECS[cls] = _make_spec(cls)
    return spec


def _make_spec(cls: type[WireBody]) -> _Spec:
    ext, nullable, body = [], set(), None
    for f in msgspec.structs.fields(cls):
        inner, holds_none = _unwrap(f.type)
        if f.name == cls.BODY:
            raw = inner is bytes
            body = _Body(f.name, f.encode_name, raw, not f.required,
                         None if raw else msgspec.msgpack.Decoder(inner))
            continue
        ext.append(_Field(f.name, f.encode_name, f.default is None))
        if holds_none:
            nullable.add(f.encode_name)
    if cls.BODY is not None and body is None:
        raise TypeError(f"{cls.__name__}.BODY names no field: {cls.BODY!r}")
    return _Spec(tuple(ext), frozenset(nullable), body)


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """(``tp`` without ``None``, whether ``tp`` holds ``None``)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(rest) < len(typing.get_args(tp)):
            return functools.reduce(operator.or_, rest), True
    return tp, False


class WireBody(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The ext fields and body of one frame (module docstring)."""

    #: The field carried in the frame's body (None: the frame has no body).
    BODY: ClassVar[str | None] = None

    def to_ext(self) -> dict[str, ExtValue]:
        """The frame's ext fields, in declaration order."""
        out: dict[str, ExtValue] = {}
        for f in _spec(type(self)).ext:
            value = getattr(self, f.attr)
            if value is None and f.omit_none:
                continue
            out[f.key] = value
        return out

    def to_body(self) -> bytes:
        """The frame's body: b"" without one."""
        body = _spec(type(self)).body
        if body is None:
            return b""
        value = getattr(self, body.attr)
        if value is None:
            return b""
        return value if body.raw else _ENCODER.encode(value)

    @classmethod
    def from_frame(cls, frame: Frame) -> Self:
        """The typed contents of ``frame``. Raises FrameError(INVALID_ARGUMENT), naming the
        field, when a field is missing, of a wrong type or out of its range."""
        spec = _spec(cls)
        body = spec.body
        ext = {k: v for k, v in frame.ext.items() if v is not None or k in spec.nullable}
        if body is not None:
            ext.pop(body.key, None)  # the body comes from the body, never from an ext field
        if body is None or not frame.body:
            return cls._convert(frame, ext, spec)  # an absent body: its default, or "required"
        try:
            value = frame.body if body.decoder is None else body.decoder.decode(frame.body)
        except Exception as e:  # msgspec's errors, and UnicodeDecodeError from a bad str
            raise _invalid(frame, f"the body ({body.attr}) is malformed: {_lower(_what(e))}") from None
        # the body's decoder checked it: a long one is not walked a second time by convert
        if not spec.ext:
            return cls(**{body.attr: value})
        if body.optional:
            return msgspec.structs.replace(cls._convert(frame, ext, spec), **{body.attr: value})
        ext[body.key] = value
        return cls._convert(frame, ext, spec)

    @classmethod
    def _convert(cls, frame: Frame, fields: dict[str, Any], spec: _Spec) -> Self:
        try:
            return msgspec.convert(fields, cls)
        except msgspec.ValidationError as e:
            raise _invalid(frame, _field_error(str(e), spec.body)) from None


class Request(WireBody, frozen=True):
    """A request's contents; ``CODE`` says which request it is."""

    CODE: ClassVar[RequestCode]

    def to_frame(self, opaque: int, oneway: bool = False) -> Frame:
        """The request frame with this ``opaque`` (a oneway one gets no response)."""
        return Frame.request(self.CODE, opaque, self.to_ext(), self.to_body(), oneway)


class Response(WireBody, frozen=True):
    """A response's contents (the code and remark are the frame's)."""

    def reply(self, request: Frame, code: int = ResponseCode.SUCCESS, remark: str = "") -> Frame:
        """The response frame to ``request`` carrying these contents."""
        return request.response(code, self.to_ext(), self.to_body(), remark)


def _invalid(frame: Frame, message: str) -> FrameError:
    return FrameError(ResponseCode.INVALID_ARGUMENT, message, opaque=frame.opaque, flags=frame.flags)


def _field_error(text: str, body: _Body | None) -> str:
    """msgspec's message, naming the ext field (or the body) the way this wire does."""
    what, _, where = text.partition(" - at `$")
    if not where and what.startswith("Object missing required field `"):
        key = what.removeprefix("Object missing required field `").rstrip("`")
        if body is not None and key == body.key:
            return f"the body ({body.attr}) is required"
        return f"ext field {key!r} is required"
    key, _, inner = where.rstrip("`").lstrip(".").partition("[")
    path = f"[{inner}" if inner else ""
    if body is not None and key == body.key:
        return f"the body ({body.attr}){' at ' + path if path else ''}: {_lower(what)}"
    return f"ext field {key!r}{' at ' + path if path else ''}: {_lower(what)}"


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]


def _what(error: BaseException) -> str:
    return str(error) or type(error).__name__


class EmptyResponse(Response, frozen=True):
    """A SUCCESS answer that carries nothing (HEARTBEAT, UNREGISTER_CLIENT)."""


class NotLeaderResponse(Response, frozen=True):
    """Any request's NOT_LEADER answer: the leader this replica knows of (node name and
    client address), nil when it knows none."""

    leader: str | None
    leader_address: str | None
