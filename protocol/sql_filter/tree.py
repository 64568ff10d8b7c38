"""The SQL92 filter's syntax tree: one node class per predicate, each testing a message's properties.

``protocol.sql_filter.parser`` builds these nodes; ``SqlFilter.matches`` calls the root's
``test``. How a property's text is read as a number or a boolean, and why an absent or
mistyped property makes a comparison False, is the package's docstring.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["And", "Between", "Compare", "In", "IsNull", "Node", "Not", "Or", "Value"]

_NUMERIC_PROPERTY = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "<>": operator.ne, ">": operator.gt,
    ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}

Value = int | float | str | bool

def _as_number(raw: str) -> int | float | None:
    m = _NUMERIC_PROPERTY.fullmatch(raw)
    if m is None:
        return None
    if m.group(1) or m.group(2):
        return float(raw)
    try:
        return int(raw)
    except ValueError:  # more digits than int() converts; a float still orders it
        return float(raw)


def _as_bool(raw: str) -> bool | None:
    return {"true": True, "false": False}.get(raw.lower())


def _lookup(properties: Mapping[str, str], name: str) -> str | None:
    raw = properties.get(name)
    return raw if raw is None or isinstance(raw, str) else str(raw)


@dataclass(frozen=True, slots=True)
class Compare:
    name: str
    op: str
    value: Value

    def test(self, properties: Mapping[str, str]) -> bool:
        raw = _lookup(properties, self.name)
        if raw is None:
            return False
        left: Value | None
        if isinstance(self.value, bool):
            left = _as_bool(raw)
        elif isinstance(self.value, str):
            left = raw
        else:
            left = _as_number(raw)
        return left is not None and _COMPARE[self.op](left, self.value)


@dataclass(frozen=True, slots=True)
class Between:
    name: str
    low: int | float
    high: int | float
    negated: bool

    def test(self, properties: Mapping[str, str]) -> bool:
        raw = _lookup(properties, self.name)
        number = None if raw is None else _as_number(raw)
        return number is not None and (self.low <= number <= self.high) != self.negated


@dataclass(frozen=True, slots=True)
class In:
    name: str
    values: frozenset[str]
    negated: bool

    def test(self, properties: Mapping[str, str]) -> bool:
        raw = _lookup(properties, self.name)
        return raw is not None and (raw in self.values) != self.negated


@dataclass(frozen=True, slots=True)
class IsNull:
    name: str
    negated: bool

    def test(self, properties: Mapping[str, str]) -> bool:
        return (_lookup(properties, self.name) is None) != self.negated


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node

    def test(self, properties: Mapping[str, str]) -> bool:
        return not self.operand.test(properties)


@dataclass(frozen=True, slots=True)
class And:
    operands: tuple[Node, ...]

    def test(self, properties: Mapping[str, str]) -> bool:
        return all(node.test(properties) for node in self.operands)


@dataclass(frozen=True, slots=True)
class Or:
    operands: tuple[Node, ...]

    def test(self, properties: Mapping[str, str]) -> bool:
        return any(node.test(properties) for node in self.operands)


Node = Compare | Between | In | IsNull | Not | And | Or
