"""JSON as RocketMQ's fastjson 1.2.x writes and reads it, for frame headers and bodies.

What a Java peer sends and expects differs from standard JSON in ways that matter:

* a bean's fields are written in name order (fastjson sorts a JavaBean's properties), null
  fields left out;
* a ``HashMap``/``HashSet`` is written in Java's iteration order: by bucket, which is the
  key's ``hashCode`` spread (``h ^ h >>> 16``) masked by the table size (16, doubled while
  more than 3/4 full), then insertion order within a bucket (``java_order``);
* a map with ``Long``/``Integer`` keys has them bare: ``{0:"127.0.0.1:10911"}``. fastjson
  and the Go client (which splits that text itself) read only this form; clients of
  4.9.4 and later ask the name server for standard JSON instead (``standard=True``: keys
  quoted, map keys sorted, non-ASCII as ``\\uXXXX``, fastjson's ``BrowserCompatible``);
* control characters as ``\\u00XX`` (upper-case hex) except ``\\b \\t \\n \\f \\r``.

``loads`` reads either form (bare integer keys become strings). A value is written as a
``Bean`` (fields by name), a ``JavaMap`` (iteration order computed), a ``list``/``tuple``
(order kept), ``str``, ``bool``, ``int``, ``None`` (only inside lists; beans skip it).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Bean", "JavaMap", "ObjectKeyMap", "dumps", "java_hash", "java_order", "loads"]

_MAX_INT = 2**31


@functools.lru_cache(maxsize=8192)
def java_hash(key: str | int) -> int:
    """``String.hashCode`` (UTF-16 code units) or ``Long.hashCode`` as a signed 32-bit int."""
    if isinstance(key, int):
        h = (key ^ ((key & 0xFFFFFFFFFFFFFFFF) >> 32)) & 0xFFFFFFFF
    else:
        h = 0
        units = key.encode("utf-16-be")
        for i in range(0, len(units), 2):
            h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
    return h - 2**32 if h >= _MAX_INT else h


def java_order(keys: Iterable[str | int]) -> list[str | int]:
    """The order a ``java.util.HashMap`` (default capacity and load factor) that had
    ``keys`` put in this order iterates them."""
    keys = list(dict.fromkeys(keys))
    capacity = 16
    while len(keys) > capacity * 3 // 4:
        capacity *= 2

    def bucket(key: str | int) -> int:
        h = java_hash(key) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(keys, key=bucket)  # stable: insertion order within a bucket


@dataclass(frozen=True, slots=True)
class Bean:
    """A Java object: its non-null fields, written in name order."""

    fields: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class JavaMap:
    """A ``HashMap`` (or, with ``items`` of keys only, a ``HashSet`` via ``JavaMap.set``)
    whose entries were put in ``items``' order."""

    items: Mapping[str | int, Any]
    is_set: bool = False
    sorted_keys: bool = field(default=False)

    @classmethod
    def set(cls, members: Iterable[str | int]) -> JavaMap:
        return cls(dict.fromkeys(members), is_set=True)


@dataclass(frozen=True, slots=True)
class ObjectKeyMap:
    """A map whose keys are objects (``HashMap<MessageQueue, ...>``): fastjson writes each key
    as its JSON object, ``{{"brokerName":..}:{..}}``; entries in the order given."""

    pairs: tuple[tuple[Bean, Any], ...]


def dumps(value: Any, *, standard: bool = False) -> str:
    """``value`` as fastjson writes it (``standard``: as with BrowserCompatible,
    QuoteFieldNames and MapSortField)."""
    out: list[str] = []
    _write(value, out, standard)
    return "".join(out)


def _write(value: Any, out: list[str], standard: bool) -> None:
    if isinstance(value, Bean):
        out.append("{")
        first = True
        for name in sorted(value.fields):
            item = value.fields[name]
            if item is None:
                continue
            if not first:
                out.append(",")
            first = False
            out.append(_string(name, standard))
            out.append(":")
            _write(item, out, standard)
        out.append("}")
    elif isinstance(value, JavaMap):
        keys = list(value.items)
        keys = sorted(keys, key=str) if standard else java_order(keys)
        if value.is_set:
            out.append("[")
            for i, key in enumerate(keys):
                if i:
                    out.append(",")
                _write(key, out, standard)
            out.append("]")
            return
        out.append("{")
        for i, key in enumerate(keys):
            if i:
                out.append(",")
            if isinstance(key, int) and not standard:
                out.append(str(key))
            else:
                out.append(_string(str(key), standard))
            out.append(":")
            _write(value.items[key], out, standard)
        out.append("}")
    elif isinstance(value, ObjectKeyMap):
        out.append("{")
        for i, (bean, item) in enumerate(value.pairs):
            if i:
                out.append(",")
            _write(bean, out, standard)
            out.append(":")
            _write(item, out, standard)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out, standard)
        out.append("]")
    elif isinstance(value, bool):
        out.append("true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(repr(value))
    elif isinstance(value, str):
        out.append(_string(value, standard))
    elif value is None:
        out.append("null")
    else:
        raise TypeError(f"cannot write a {type(value).__name__} as fastjson")


_SHORT = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


#: text written as it is: no control character, quote or backslash (standard: ASCII only)
_PLAIN = re.compile(r'[^\x00-\x1f"\\]*')
_PLAIN_ASCII = re.compile(r'[\x20\x21\x23-\x5b\x5d-\x7e]*')


def _string(text: str, standard: bool) -> str:
    if (_PLAIN_ASCII if standard else _PLAIN).fullmatch(text):
        return f'"{text}"'
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif code < 0x20 or (standard and code > 0x7E):
            for unit in _utf16_units(ch):
                out.append(f"\\u{unit:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _utf16_units(ch: str) -> list[int]:
    raw = ch.encode("utf-16-be")
    return [int.from_bytes(raw[i:i + 2], "big") for i in range(0, len(raw), 2)]


def loads(text: str | bytes) -> Any:
    """Parse fastjson's output (bare integer map keys allowed; they become strings).
    Raises ValueError on anything else that is not JSON."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return json.loads(_quote_bare_keys(text))


def _quote_bare_keys(text: str) -> str:
    """Quote integer keys written bare (``{0:"a",1:"b"}``), leaving strings untouched."""
    if ":" not in text:
        return text
    out: list[str] = []
    i, n = 0, len(text)
    expecting_key = False
    while i < n:
        ch = text[i]
        if ch == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            expecting_key = False
            continue
        if ch in "{,":
            expecting_key = True
            out.append(ch)
            i += 1
            continue
        if expecting_key and (ch == "-" or ch.isdigit()):
            j = i + 1
            while j < n and text[j].isdigit():
                j += 1
            k = j
            while k < n and text[k] in " \t\r\n":
                k += 1
            if k < n and text[k] == ":":
                out.append(f'"{text[i:j]}"')
                i = j
                expecting_key = False
                continue
        if not ch.isspace():
            expecting_key = False
        out.append(ch)
        i += 1
    return "".join(out)
