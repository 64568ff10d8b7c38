"""The SQL92 filter's tokenizer and recursive-descent parser, and the compiled ``SqlFilter``.

The grammar, the compile-time type rules and the semantics are the package's docstring
(``protocol.sql_filter``); the nodes the parser builds are ``protocol.sql_filter.tree``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from protocol.sql_filter.tree import And, Between, Compare, In, IsNull, Node, Not, Or, Value

__all__ = ["MAX_EXPRESSION_LENGTH", "MAX_NESTING", "FilterSyntaxError", "SqlFilter", "compile_filter"]

MAX_EXPRESSION_LENGTH = 4096
MAX_NESTING = 64  # parentheses and NOTs inside one another; keeps the parser's recursion bounded

_KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"})
_WHITESPACE = " \t\r\n\f\v"
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_.$]*")
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_OPERATORS = ("<>", ">=", "<=", "=", ">", "<")  # two-character ones first
_MISTAKES = {"!=": "'<>'", "==": "'='", "=<": "'<='", "=>": "'>='"}
_ORDERING = frozenset({">", ">=", "<", "<="})


class FilterSyntaxError(ValueError):
    """An expression that does not compile; ``position`` is the 0-based offset of the problem."""

    def __init__(self, expression: str, position: int, message: str) -> None:
        self.expression = expression
        self.position = position
        self.message = message
        start = max(0, position - 40)
        shown = expression[start:start + 80]
        prefix = "..." if start else ""
        shown = "".join(" " if ch in _WHITESPACE else ch for ch in shown)
        caret = " " * (len(prefix) + position - start) + "^"
        super().__init__(f"SQL92 filter error at position {position}: {message}\n"
                         f"    {prefix}{shown}\n    {caret}")


# ---------------------------------------------------------------- tokens

@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # "ident", "keyword", "number", "string", "op", "(", ")", ",", "end"
    text: str  # the source text; a keyword's is upper-cased
    pos: int
    value: Value | None = None

    def describe(self) -> str:
        if self.kind == "end":
            return "end of expression"
        if self.kind in ("number", "string", "keyword"):
            return f"{self.kind} {self.text}"
        if self.kind == "ident":
            return f"identifier {self.text!r}"
        return repr(self.text)


def _tokenize(expr: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(expr)
    while True:
        while i < n and expr[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append(_Token("end", "", n))
            return tokens
        ch = expr[i]
        if ch == "'":
            parts, j = [], i + 1
            while True:
                k = expr.find("'", j)
                if k < 0:
                    raise FilterSyntaxError(expr, i, "unterminated string literal")
                parts.append(expr[j:k])
                if expr.startswith("''", k):
                    parts.append("'")
                    j = k + 2
                else:
                    break
            tokens.append(_Token("string", expr[i:k + 1], i, "".join(parts)))
            i = k + 1
        elif ch in "(),":
            tokens.append(_Token(ch, ch, i))
            i += 1
        elif m := _IDENT.match(expr, i):
            word = m.group()
            if word.upper() in _KEYWORDS:
                tokens.append(_Token("keyword", word.upper(), i))
            else:
                tokens.append(_Token("ident", word, i))
            i = m.end()
        elif m := _NUMBER.match(expr, i):
            end = m.end()
            if end < n and (expr[end].isalnum() or expr[end] in "_.$"):
                raise FilterSyntaxError(expr, i, f"malformed number {expr[i:end + 1]!r}")
            text = m.group()
            value: int | float = float(text) if m.group(1) or m.group(2) else int(text)
            if isinstance(value, float) and math.isinf(value):
                raise FilterSyntaxError(expr, i, f"number {text} is out of range")
            tokens.append(_Token("number", text, i, value))
            i = end
        elif expr[i:i + 2] in _MISTAKES:
            raise FilterSyntaxError(expr, i, f"unknown operator {expr[i:i + 2]!r}; "
                                             f"use {_MISTAKES[expr[i:i + 2]]}")
        else:
            op = next((op for op in _OPERATORS if expr.startswith(op, i)), None)
            if op is None:
                raise FilterSyntaxError(expr, i, f"unexpected character {ch!r}")
            tokens.append(_Token("op", op, i))
            i += len(op)


# ---------------------------------------------------------------- parser

class _Parser:
    def __init__(self, expression: str) -> None:
        self.expression = expression
        self.tokens = _tokenize(expression)
        self.index = 0
        self.depth = 0

    def peek(self) -> _Token:
        return self.tokens[self.index]

    def advance(self) -> _Token:
        token = self.tokens[self.index]
        if token.kind != "end":
            self.index += 1
        return token

    def at_keyword(self, *words: str) -> bool:
        token = self.peek()
        return token.kind == "keyword" and token.text in words

    def error(self, token: _Token, message: str) -> FilterSyntaxError:
        return FilterSyntaxError(self.expression, token.pos, message)

    def expect(self, kind: str, text: str, context: str) -> _Token:
        token = self.peek()
        if token.kind != kind or token.text != text:
            raise self.error(token, f"expected {text!r} {context}, found {token.describe()}")
        return self.advance()

    def nest(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.error(token, f"conditions nested more than {MAX_NESTING} deep")

    def parse(self) -> Node:
        node = self.parse_or()
        token = self.peek()
        if token.kind != "end":
            raise self.error(token, f"unexpected {token.describe()} after a complete condition")
        return node

    def parse_or(self) -> Node:
        operands = [self.parse_and()]
        while self.at_keyword("OR"):
            self.advance()
            operands.append(self.parse_and())
        return operands[0] if len(operands) == 1 else Or(tuple(operands))

    def parse_and(self) -> Node:
        operands = [self.parse_not()]
        while self.at_keyword("AND"):
            self.advance()
            operands.append(self.parse_not())
        return operands[0] if len(operands) == 1 else And(tuple(operands))

    def parse_not(self) -> Node:
        if not self.at_keyword("NOT"):
            return self.parse_primary()
        self.nest(self.advance())
        operand = self.parse_not()
        self.depth -= 1
        return Not(operand)

    def parse_primary(self) -> Node:
        token = self.advance()
        if token.kind == "(":
            self.nest(token)
            node = self.parse_or()
            self.expect(")", ")", f"to close the '(' at position {token.pos}")
            self.depth -= 1
            return node
        if token.kind == "ident":
            return self.parse_predicate(token.text)
        raise self.error(token, f"expected a condition, found {token.describe()}")

    def parse_predicate(self, name: str) -> Node:
        token = self.peek()
        if token.kind == "op":
            self.advance()
            literal = self.parse_value(f"after {token.text!r}")
            if token.text in _ORDERING and literal.kind != "number":
                raise self.error(literal, f"{token.text!r} compares numbers, found {literal.describe()}")
            assert literal.value is not None
            return Compare(name, token.text, literal.value)
        if self.at_keyword("IS"):
            self.advance()
            negated = self.at_keyword("NOT")
            if negated:
                self.advance()
            self.expect("keyword", "NULL", "after IS NOT" if negated else "after IS")
            return IsNull(name, negated)
        negated = self.at_keyword("NOT")
        if negated:
            self.advance()
            if not self.at_keyword("BETWEEN", "IN"):
                raise self.error(self.peek(), f"expected BETWEEN or IN after NOT, found "
                                              f"{self.peek().describe()}")
        if self.at_keyword("BETWEEN"):
            self.advance()
            low = self.parse_number("as the lower BETWEEN bound")
            self.expect("keyword", "AND", "between the BETWEEN bounds")
            high = self.parse_number("as the upper BETWEEN bound")
            return Between(name, low, high, negated)
        if self.at_keyword("IN"):
            self.advance()
            self.expect("(", "(", "after IN")
            values = [self.parse_string()]
            while self.peek().kind == ",":
                self.advance()
                values.append(self.parse_string())
            self.expect(")", ")", "to close the IN list")
            return In(name, frozenset(values), negated)
        raise self.error(token, f"expected an operator after {name!r}, found {token.describe()}")

    def parse_value(self, context: str) -> _Token:
        token = self.peek()
        if token.kind in ("number", "string"):
            return self.advance()
        if token.kind == "keyword" and token.text in ("TRUE", "FALSE"):
            self.advance()
            return _Token("boolean", token.text, token.pos, token.text == "TRUE")
        if self.at_keyword("NULL"):
            raise self.error(token, "compare with NULL using IS NULL or IS NOT NULL")
        raise self.error(token, f"expected a value {context}, found {token.describe()}")

    def parse_number(self, context: str) -> int | float:
        token = self.parse_value(context)
        if token.kind != "number":
            raise self.error(token, f"BETWEEN bounds must be numbers, found {token.describe()}")
        assert isinstance(token.value, int | float)
        return token.value

    def parse_string(self) -> str:
        token = self.parse_value("in the IN list")
        if token.kind != "string":
            raise self.error(token, f"IN list items must be strings, found {token.describe()}")
        assert isinstance(token.value, str)
        return token.value


# ---------------------------------------------------------------- API

class SqlFilter:
    """A compiled SQL92 filter; :meth:`matches` tests one message's properties."""

    __slots__ = ("expression", "root")

    def __init__(self, expression: str, root: Node) -> None:
        self.expression = expression
        self.root = root

    def matches(self, properties: Mapping[str, str]) -> bool:
        """Whether a message with these properties passes; never raises (a non-str value is str()-ed)."""
        return self.root.test(properties)

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


def compile_filter(expression: str) -> SqlFilter:
    """Parse and type-check ``expression``; raises :class:`FilterSyntaxError` if it is not valid."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise FilterSyntaxError(expression, MAX_EXPRESSION_LENGTH,
                                f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    return SqlFilter(expression, _Parser(expression).parse())
