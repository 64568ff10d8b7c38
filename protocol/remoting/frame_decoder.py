"""Bytes to a ``Frame`` (``protocol.remoting.frame``: the layout), bounded against hostile input.

``decode_frame`` is the only way bytes become a ``Frame`` and raises nothing but
``FrameError``. msgpack's unpacker limits bound what a hostile frame can make the
decoder allocate: strings and binaries cannot outgrow the frame, arrays and maps
hold at most ``MAX_EXT_ITEMS`` items (msgpack preallocates arrays by their
declared length), nesting deeper than msgpack's stack is refused, and ext values
are never nested beyond one flat list.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import msgpack

from protocol.remoting.codes import ResponseCode
from protocol.remoting.frame import (
    DEFAULT_MAX_FRAME,
    MAX_EXT_ITEMS,
    VERSION,
    Frame,
    FrameError,
    error_text,
    is_flags,
    is_int,
    is_opaque,
    malformed,
    require,
    short_repr,
    type_name,
)

__all__ = ["decode_frame"]

_FIELDS = 7
_PEEK_BYTES = 64  # enough for the array header, version, code, opaque and flags


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
        raise FrameError(ResponseCode.MALFORMED_FRAME, f"undecodable frame: {error_text(e)}",
                         opaque=head.opaque, flags=head.flags) from None


@dataclass(slots=True)
class _Head:
    """What decoding has learnt so far about the frame, for the error it may raise."""

    opaque: int | None = None
    flags: int | None = None


def _decode(data: bytes, limit: int, head: _Head) -> Frame:
    size = _byte_size(data)
    require(size > 0, "frame is empty")
    if size > limit:
        _peek_head(data, head)
        raise FrameError(ResponseCode.MESSAGE_TOO_LARGE,
                         f"frame of {size} bytes exceeds the {limit}-byte limit")
    unpacker = _unpacker(data, size, limit)
    count, code, opaque, flags = _read_head(unpacker, head)
    if count != _FIELDS:
        raise malformed(f"frame has {count} fields; expected {_FIELDS}")
    remark, ext, body = (_next(unpacker, name) for name in ("remark", "ext", "body"))
    trailing = size - unpacker.tell()
    if trailing:
        raise malformed(f"{trailing} trailing byte{'s' if trailing > 1 else ''} after the frame")
    require(isinstance(ext, dict), f"ext must be a map, got {type_name(ext)}")
    return Frame(code, opaque, flags, remark, ext, body)


def _read_head(unpacker: msgpack.Unpacker, head: _Head) -> tuple[int, Any, Any, Any]:
    """Read the array header, version, code, opaque and flags (raw), noting in ``head``
    the opaque and flags that are valid; returns (field count, code, opaque, flags)."""
    try:
        count = unpacker.read_array_header()
    except msgpack.OutOfData:
        raise malformed("frame ends inside its array header") from None
    except Exception as e:
        raise malformed(f"a frame is a msgpack array ({error_text(e)})") from None
    require(count >= 1, "frame is an empty array")
    version = _next(unpacker, "version")
    code = _next(unpacker, "code") if count > 1 else None
    opaque = _next(unpacker, "opaque") if count > 2 else None
    head.opaque = opaque if is_opaque(opaque) else None
    flags = _next(unpacker, "flags") if count > 3 else None
    head.flags = flags if is_flags(flags) else None
    # checked after the opaque and flags are known: a frame of another version is answered
    require(is_int(version) and version == VERSION,
             f"unsupported frame version {short_repr(version)}; this broker speaks {VERSION}")
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
        raise malformed(f"frame ends inside field {name!r}") from None
    except Exception as e:
        raise malformed(f"cannot read field {name!r}: {error_text(e)}") from None


def _byte_size(data: Any) -> int:
    try:
        return memoryview(data).nbytes
    except TypeError:
        raise malformed(f"a frame is bytes, got {type_name(data)}") from None
