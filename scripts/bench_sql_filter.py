"""The SQL92 filter's parser on lark, as an experiment, measured against protocol/sql_filter.py.

    pip install lark            # not a dependency of RaftMQ: only this experiment uses it
    python scripts/bench_sql_filter.py

The experiment replaces only the tokenizer and parser: the grammar below on lark's LALR
parser, a transformer building the module's own nodes (Compare, Between, ...), and a
thin mapping of lark's errors to FilterSyntaxError. Before timing, the script checks
that both build equal trees for every expression of tests/unit/test_sql_filter.py's
operator table, and counts how many of its error cases get the same position and
message. Figures and the decision: docs/BENCHMARKS.md ("SQL92 filter").
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from protocol import sql_filter as hand  # noqa: E402
from protocol.sql_filter import (  # noqa: E402
    MAX_EXPRESSION_LENGTH,
    MAX_NESTING,
    And,
    Between,
    Compare,
    FilterSyntaxError,
    In,
    IsNull,
    Node,
    Not,
    Or,
    SqlFilter,
)
from protocol.sql_filter.parser import _ORDERING  # noqa: E402
from tests.unit.test_sql_filter import CASES, ERRORS  # noqa: E402

try:
    from lark import Lark, Token, Transformer, v_args
    from lark.exceptions import UnexpectedCharacters, UnexpectedToken, VisitError
except ImportError:
    sys.exit("this experiment needs lark: pip install lark")

# ---------------------------------------------------------------- the experiment (counted lines start)
GRAMMAR = r"""
?start: or_expr
?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: _NOT not_expr -> negation
         | primary
?primary: _LPAR or_expr _RPAR
        | IDENT OP value                                       -> compare
        | IDENT NOT? _BETWEEN value _AND value                 -> between
        | IDENT NOT? _IN _LPAR value (_COMMA value)* _RPAR     -> in_list
        | IDENT _IS NOT? _NULL                                 -> is_null
value: NUMBER | STRING | TRUE | FALSE | NULL_VALUE

_OR: "or"i
_AND: "and"i
_NOT: "not"i
NOT: "not"i
_BETWEEN: "between"i
_IN: "in"i
_IS: "is"i
_NULL: "null"i
NULL_VALUE: "null"i
TRUE: "true"i
FALSE: "false"i
IDENT: /[A-Za-z_$][A-Za-z0-9_.$]*/
NUMBER: /-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?(?![A-Za-z0-9_.$])/
STRING: /'(?:[^']|'')*'/
OP: "<>" | ">=" | "<=" | "=" | ">" | "<"
_LPAR: "("
_RPAR: ")"
_COMMA: ","
%ignore /[ \t\r\n\f\v]+/
"""

PARSER = Lark(GRAMMAR, parser="lalr", lexer="contextual")


class _TypeError(Exception):
    def __init__(self, token: Token, message: str) -> None:
        self.token, self.message = token, message


def _describe(token: Token) -> str:
    kinds = {"NUMBER": "number", "STRING": "string", "TRUE": "keyword", "FALSE": "keyword"}
    return f"{kinds[token.type]} {token}" if token.type in kinds else repr(str(token))


def _literal(token: Token) -> int | float | str | bool:
    if token.type == "NUMBER":
        number: int | float = float(token) if any(c in token for c in ".eE") else int(token)
        if isinstance(number, float) and math.isinf(number):
            raise _TypeError(token, f"number {token} is out of range")
        return number
    if token.type == "STRING":
        return token[1:-1].replace("''", "'")
    if token.type in ("TRUE", "FALSE"):
        return token.type == "TRUE"
    raise _TypeError(token, "compare with NULL using IS NULL or IS NOT NULL")


def _typed(token: Token, kind: str, message: str) -> Any:
    if token.type != kind:
        raise _TypeError(token, f"{message}, found {_describe(token)}")
    return _literal(token)


@v_args(inline=True)
class _Build(Transformer):  # type: ignore[type-arg]
    def value(self, token: Token) -> Token:
        return token

    def or_expr(self, *operands: Node) -> Node:
        return Or(operands)

    def and_expr(self, *operands: Node) -> Node:
        return And(operands)

    def negation(self, operand: Node) -> Node:
        return Not(operand)

    def compare(self, name: Token, op: Token, literal: Token) -> Node:
        if op in _ORDERING:
            return Compare(str(name), str(op), _typed(literal, "NUMBER", f"{str(op)!r} compares numbers"))
        return Compare(str(name), str(op), _literal(literal))

    def between(self, name: Token, *rest: Token) -> Node:
        low, high = (_typed(t, "NUMBER", "BETWEEN bounds must be numbers") for t in rest[-2:])
        return Between(str(name), low, high, rest[0].type == "NOT")

    def in_list(self, name: Token, *rest: Token) -> Node:
        negated = rest[0].type == "NOT"
        items = frozenset(_typed(t, "STRING", "IN list items must be strings") for t in rest[negated:])
        return In(str(name), items, negated)

    def is_null(self, name: Token, *rest: Token) -> Node:
        return IsNull(str(name), bool(rest))


def _nesting_error(expression: str) -> int | None:
    """Where parentheses and NOTs nest deeper than MAX_NESTING (the transformer recurses):
    open parentheses plus the NOTs in a row, an approximation of the module's rule."""
    if expression.count("(") + expression.upper().count("NOT") <= MAX_NESTING:
        return None
    parens = nots = 0
    for token in PARSER.lex(expression):
        parens += {"_LPAR": 1, "_RPAR": -1}.get(token.type, 0)
        nots = nots + 1 if token.type in ("_NOT", "NOT") else 0
        if parens + nots > MAX_NESTING:
            return token.start_pos
    return None


def compile_filter(expression: str) -> SqlFilter:
    """protocol.sql_filter.compile_filter on the lark grammar (errors: lark's terminal names)."""
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise FilterSyntaxError(expression, MAX_EXPRESSION_LENGTH,
                                f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        deep = _nesting_error(expression)
        if deep is not None:
            raise FilterSyntaxError(expression, deep, f"conditions nested more than {MAX_NESTING} deep")
        return SqlFilter(expression, _Build().transform(PARSER.parse(expression)))
    except UnexpectedCharacters as e:
        raise FilterSyntaxError(expression, e.pos_in_stream,
                                f"unexpected character {expression[e.pos_in_stream]!r}") from None
    except UnexpectedToken as e:
        end = e.token.type == "$END"
        found = "end of expression" if end else _describe(e.token)
        raise FilterSyntaxError(expression, len(expression) if end else e.token.start_pos,
                                f"expected {' or '.join(sorted(e.expected))}, found {found}") from None
    except VisitError as e:
        if isinstance(e.orig_exc, _TypeError):
            raise FilterSyntaxError(expression, e.orig_exc.token.start_pos, e.orig_exc.message) from None
        raise
# ---------------------------------------------------------------- the experiment (counted lines end)


def _best(fn: Callable[[], None], repeat: int = 7) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def _agreement() -> tuple[int, int, int]:
    for expression, _, _ in CASES:
        assert compile_filter(expression).root == hand.compile_filter(expression).root, expression
    positions = messages = 0
    for expression, position, fragment in ERRORS:
        try:
            compile_filter(expression)
        except FilterSyntaxError as e:
            positions += e.position == position
            messages += fragment in e.message
    return positions, messages, len(ERRORS)


def _counted_lines() -> tuple[int, int]:
    """(lark experiment, hand-written tokenizer + parser): physical lines of each."""
    mine = Path(__file__).read_text().splitlines()
    start = next(i for i, line in enumerate(mine) if "(counted lines start)" in line)
    end = next(i for i, line in enumerate(mine) if "(counted lines end)" in line)
    theirs = (ROOT / "protocol" / "sql_filter.py").read_text().splitlines()
    tokens = next(i for i, line in enumerate(theirs) if line.startswith("# ---") and "tokens" in line)
    nodes = next(i for i, line in enumerate(theirs) if line.startswith("# ---") and "syntax tree" in line)
    parser = next(i for i, line in enumerate(theirs) if line.startswith("# ---") and "parser" in line)
    api = next(i for i, line in enumerate(theirs) if line.startswith("# ---") and "API" in line)
    return end - start - 1, (nodes - tokens - 1) + (api - parser - 1)


def main() -> None:
    expressions = [*sorted({e for e, _, _ in CASES}), " AND ".join(f"p{i} = '{i}'" for i in range(200))]
    positions, messages, errors = _agreement()
    lark_lines, hand_lines = _counted_lines()
    started = time.perf_counter()
    Lark(GRAMMAR, parser="lalr", lexer="contextual")
    grammar_ms = 1e3 * (time.perf_counter() - started)
    print(f"{len(CASES)} operator-table cases: equal trees; {errors} error cases: same position "
          f"{positions}, same message {messages}")
    print(f"lines: lark experiment {lark_lines}, hand-written tokenizer + parser {hand_lines}; "
          f"building the lark parser: {grammar_ms:.0f} ms")
    for name, compile_one in (("hand-written", hand.compile_filter), ("lark LALR", compile_filter)):
        compiled = [(compile_one(e), p) for e, p, _ in CASES]

        def compile_all(compile_one: Callable[[str], SqlFilter] = compile_one) -> None:
            for _ in range(20):
                for e in expressions:
                    compile_one(e)

        def match_all(compiled: list[tuple[SqlFilter, dict[str, str]]] = compiled) -> None:
            for _ in range(200):
                for f, p in compiled:
                    f.matches(p)

        compile_s, match_s = _best(compile_all), _best(match_all)
        print(f"{name:13} compile {1e6 * compile_s / (20 * len(expressions)):6.1f} us/expression   "
              f"matches {1e6 * match_s / (200 * len(compiled)):5.2f} us/call   "
              f"({len(expressions)} expressions, {len(compiled)} (expression, properties) pairs)")


if __name__ == "__main__":
    main()
