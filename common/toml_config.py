"""TOML configuration files read strictly: an unknown section, an unknown key or a value of the
wrong type is a ``ConfigError`` naming the file, the section and the key (every process's
config: replicas, brokers, the name server)."""

from __future__ import annotations

import re
import tomllib
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

__all__ = ["ConfigError", "read_section", "read_toml"]


class ConfigError(ValueError):
    """A configuration that cannot start a node; the message says what to fix."""


S = TypeVar("S", bound=msgspec.Struct)


def read_toml(path: Path, sections: Iterable[str]) -> dict[str, Any]:
    """The TOML document at ``path``; a top-level key other than ``sections`` is refused."""
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from None
    known = list(sections)
    for key in doc:
        if key not in known:
            names = ", ".join(f"[{k}]" for k in known)
            raise ConfigError(f"{path}: unknown section [{key}] (known: {names})")
    return doc


def read_section(path: Path, doc: dict[str, Any], name: str, schema: type[S]) -> S:
    """``doc[name]`` checked against ``schema``: unknown keys and wrong types are refused
    with the file, the section and the key."""
    table = doc.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: {name} must be a section ([{name}]), not a value")
    try:
        return msgspec.convert(table, schema)
    except msgspec.ValidationError as e:
        text = str(e)
        unknown = re.fullmatch(r"Object contains unknown field `(.+?)`( - at `\$(.*)`)?", text)
        if unknown:
            inner = unknown.group(3) or ""
            where = f"{name}{inner}"
            fields = ", ".join(_fields_at(schema, inner.strip(".").split(".") if inner else []))
            raise ConfigError(f"{path}: [{where}] has no key {unknown.group(1)!r} "
                              f"(the keys of [{where}] are: {fields})") from None
        located = re.fullmatch(r"(.*) - at `\$\.?(.*)`", text)
        if located:
            raise ConfigError(f"{path}: {name}.{located.group(2)}: {located.group(1)}") from None
        raise ConfigError(f"{path}: [{name}]: {text}") from None


def _fields_at(schema: type[msgspec.Struct], keys: list[str]) -> tuple[str, ...]:
    """The keys of the table at ``keys`` inside ``schema`` (a nested Struct, optional or not)."""
    for key in keys:
        hint = typing.get_type_hints(schema).get(key)
        nested = [t for t in typing.get_args(hint) or (hint,)
                  if isinstance(t, type) and issubclass(t, msgspec.Struct)]
        if not nested:
            return ()
        schema = nested[0]
    return tuple(schema.__struct_fields__)
