"""The SQL92 property filter: operator semantics, error positions, and a model-based property test."""

from __future__ import annotations

import random
import re
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.sql_filter import (
    MAX_EXPRESSION_LENGTH,
    MAX_NESTING,
    FilterSyntaxError,
    SqlFilter,
    compile_filter,
)

# ---------------------------------------------------------------- operator table

ABSENT = None
"""Among the values of ``a`` below: no property ``a`` at all."""

#: (expression, the values of property ``a`` alone it matches, those it does not match)
ON_A: list[tuple[str, list[str | None], list[str | None]]] = [
    # ordering: numbers only; the property is read as a number
    ("a > 1", ["2", "1.0001", "+2", "9" * 5000],  # more digits than int() converts
     [ABSENT, "1", "abc", "", " 2", "2 ", "NaN", "Infinity", "1_000", "0x10", ".5", "5.",
      "\u0662"]),  # a non-ASCII digit is not a number here
    ("a >= 1", ["1"], ["0.999"]),
    ("a < 1", ["0.5"], ["1"]),
    ("a <= 1", ["1.0"], ["1.5"]),
    ("a <= -1", ["-1"], []),
    ("a > -1.5", ["-1"], []),
    ("a < -1.5", ["-2"], []),
    ("a > 100", ["1e3"], ["1E-3"]),
    ("a > 1e2", ["101"], []),
    ("a > 9007199254740992", ["9007199254740993"], []),  # integers compare exactly
    # = and <> with a number literal: numeric
    ("a = 10", ["10", "10.0", "1e1", "010"], ["ten", ABSENT]),
    ("a = 0.1", ["0.1"], []),
    ("a = -0", ["0"], []),
    ("a <> 10", ["11"], ["10", "ten", ABSENT]),
    # = and <> with a string literal: exact text
    ("a = 'abc'", ["abc"], ["ABC", "abc ", ABSENT]),
    ("a = ''", [""], []),
    ("a = 'it''s'", ["it's"], []),
    ("a = ''''", ["'"], []),
    ("a = '1'", ["1"], ["1.0"]),
    ("a = ' x '", [" x "], []),
    ("a = 'caf\u00e9 AND b'", ["caf\u00e9 AND b"], []),
    ("a <> 'abc'", ["abd"], ["abc", ABSENT]),
    # booleans
    ("a = TRUE", ["true"], ["false", "1", "yes", ABSENT]),
    ("a = true", ["TRUE"], []),
    ("a = FALSE", ["False"], []),
    ("a <> TRUE", ["false"], ["true", "maybe"]),
    # BETWEEN / NOT BETWEEN: inclusive bounds, numbers only
    ("a BETWEEN 10 AND 100", ["10", "100", "50"], ["9.99", "100.01", "x", ABSENT]),
    ("a BETWEEN 5 AND 1", [], ["3"]),
    ("a BETWEEN -5 AND -1", ["-3"], []),
    ("a BETWEEN 0.5 AND 1.5", ["1.5"], []),
    ("a NOT BETWEEN 10 AND 100", ["9", "101"], ["10", "100", "x", ABSENT]),
    # IN / NOT IN: strings only
    ("a IN ('abc', 'def')", ["abc", "def"], ["ab", ABSENT]),
    ("a IN ('1')", [], ["1.0"]),
    ("a IN('x')", ["x"], []),
    ("a NOT IN ('abc', 'def')", ["x"], ["abc", ABSENT]),
    # IS NULL / IS NOT NULL: presence
    ("a IS NULL", [ABSENT], [""]),
    ("a IS NOT NULL", [""], [ABSENT]),
    # NOT is plain negation, even over a missing property
    ("NOT a > 1", [ABSENT], []),
    ("NOT (a > 1)", [], ["2"]),
    ("NOT a IN ('x')", [ABSENT], []),
    ("NOT a = TRUE", ["junk"], []),
    ("NOT NOT a = 1", ["1"], []),
    # identifiers are case-sensitive; spacing is free
    ("A = 1", [], ["1"]),
    ("a>1", ["2"], []),
    ("a<>-1", ["1"], []),
    ("\ta\n>\r\n1 ", ["2"], []),
    ("((a=1))", ["1"], []),
]

#: (expression, properties, whether it matches them): other properties than ``a`` alone
ON_PROPERTIES: list[tuple[str, dict[str, str], bool]] = [
    ("a > 1", {"b": "2"}, False),
    ("a IS NULL", {"b": "1"}, True),
    # precedence: NOT > AND > OR; BETWEEN owns its AND
    ("a = 1 OR b = 1 AND c = 1", {"a": "1"}, True),
    ("(a = 1 OR b = 1) AND c = 1", {"a": "1"}, False),
    ("NOT a = 1 AND b = 1", {"b": "2"}, False),
    ("NOT a = 1 OR b = 1", {"a": "1", "b": "1"}, True),
    ("a BETWEEN 1 AND 3 AND b = 'x'", {"a": "2", "b": "x"}, True),
    ("a BETWEEN 1 AND 3 AND b = 'x'", {"a": "2", "b": "y"}, False),
    ("a NOT BETWEEN 1 AND 3 OR b IS NULL", {"a": "2"}, True),
    ("a = 1 AND b = 2 AND c = 3", {"a": "1", "b": "2", "c": "3"}, True),
    ("a = 1 AND b = 2 AND c = 3", {"a": "1", "b": "2", "c": "4"}, False),
    ("a = 1 OR b = 2 OR c = 3", {"c": "3"}, True),
    ("a = 1 OR b = 2 OR c = 3", {}, False),
    # the RocketMQ documentation's examples
    ("a IS NOT NULL AND a > 100", {"a": "101"}, True),
    ("a IS NOT NULL AND (a = 'abc' OR a<>'def')", {"a": "xyz"}, True),
    ("a IS NOT NULL AND (a > 100) OR (b IS NULL)", {"a": "5"}, True),
    ("a IS NOT NULL AND (a > 100) OR (b IS NULL)", {"a": "5", "b": "x"}, False),
    ("(TAGS is not null and TAGS in ('TagA', 'TagB')) and (a is not null and a between 0 and 3)",
     {"TAGS": "TagB", "a": "3"}, True),
    ("(TAGS is not null and TAGS in ('TagA', 'TagB')) and (a is not null and a between 0 and 3)",
     {"TAGS": "TagC", "a": "3"}, False),
    # keywords are case-insensitive; identifiers take '.', '$' and '_'
    ("a between 1 And 3 oR b iS nOt NuLl", {"b": ""}, True),
    ("my.prop_$1 = 'x'", {"my.prop_$1": "x"}, True),
    ("$a = 1", {"$a": "1"}, True),
    ("_x IS NOT NULL", {"_x": ""}, True),
    ("NOTE = 1", {"NOTE": "1"}, True),  # a keyword prefix is still an identifier
]


def _shown(properties: dict[str, str]) -> str:
    """``properties`` in a test id: ``a='2'``, a long value cut, ``no properties`` for none."""
    shown = [f"{k}={v[:12]!r}" + ("..." if len(v) > 12 else "") for k, v in properties.items()]
    return ",".join(shown) or "no properties"


def operator_cases() -> list[Any]:
    """ON_A and ON_PROPERTIES as (expression, properties, expected), each with an id saying
    all three."""
    cases = [(expression, {} if value is ABSENT else {"a": value}, expected)
             for expression, matching, missing in ON_A
             for expected, values in ((True, matching), (False, missing)) for value in values]
    cases += ON_PROPERTIES
    return [pytest.param(*case, id=f"{case[0]} | {_shown(case[1])} | {'match' if case[2] else 'no match'}")
            for case in cases]


@pytest.mark.parametrize(("expression", "properties", "expected"), operator_cases())
def test_operator_semantics(expression: str, properties: dict[str, str], expected: bool) -> None:
    compiled = compile_filter(expression)
    assert isinstance(compiled, SqlFilter)
    assert compiled.expression == expression
    assert compiled.matches(properties) is expected


def test_a_long_flat_chain_compiles_and_matches() -> None:
    expression = " AND ".join(f"p{i} = '{i}'" for i in range(200))
    compiled = compile_filter(expression)
    properties = {f"p{i}": str(i) for i in range(200)}
    assert compiled.matches(properties)
    properties["p199"] = "x"
    assert not compiled.matches(properties)


# ---------------------------------------------------------------- syntax and type errors

ERRORS: list[tuple[str, int, str]] = [
    ("", 0, "expected a condition, found end of expression"),
    ("   ", 3, "expected a condition"),
    ("a > ", 4, "expected a value after '>'"),
    ("a >= 'x'", 5, "'>=' compares numbers, found string 'x'"),
    ("a > TRUE", 4, "'>' compares numbers"),
    ("a <= FALSE", 5, "'<=' compares numbers"),
    ("a < 'x'", 4, "'<' compares numbers"),
    ("(a = 1", 6, "expected ')' to close the '(' at position 0"),
    ("((a = 1)", 8, "expected ')' to close the '(' at position 0"),
    ("(a = 1 b", 7, "expected ')'"),
    ("a = 1)", 5, "unexpected ')' after a complete condition"),
    ("a = 'x", 4, "unterminated string literal"),
    ("a = 'it''s", 4, "unterminated string literal"),
    ("a IN ('x', 'y) OR b = 1", 11, "unterminated string literal"),
    ("a IN (1, 2)", 6, "IN list items must be strings, found number 1"),
    ("a IN ('x', 2)", 11, "IN list items must be strings"),
    ("a NOT IN ('x', TRUE)", 15, "IN list items must be strings"),
    ("a IN ()", 6, "expected a value in the IN list"),
    ("a IN ('x',)", 10, "expected a value in the IN list"),
    ("a IN 'x'", 5, "expected '(' after IN"),
    ("a IN ('x'", 9, "expected ')' to close the IN list"),
    ("a BETWEEN 'x' AND 2", 10, "BETWEEN bounds must be numbers, found string 'x'"),
    ("a BETWEEN 1 AND 'y'", 16, "BETWEEN bounds must be numbers"),
    ("a NOT BETWEEN TRUE AND 2", 14, "BETWEEN bounds must be numbers"),
    ("a BETWEEN 1 OR 2", 12, "expected 'AND' between the BETWEEN bounds"),
    ("a BETWEEN 1", 11, "expected 'AND'"),
    ("a", 1, "expected an operator after 'a', found end of expression"),
    ("a LIKE 'x'", 2, "expected an operator after 'a', found identifier 'LIKE'"),
    ("a = 1 b", 6, "unexpected identifier 'b' after a complete condition"),
    ("a = 1 AND", 9, "expected a condition"),
    ("a = 1 OR OR b = 1", 9, "expected a condition, found keyword OR"),
    ("AND a = 1", 0, "expected a condition, found keyword AND"),
    ("NOT", 3, "expected a condition"),
    ("()", 1, "expected a condition, found ')'"),
    ("1 = a", 0, "expected a condition, found number 1"),
    ("'a' = a", 0, "expected a condition, found string 'a'"),
    ("a == 1", 2, "unknown operator '=='; use '='"),
    ("a != 1", 2, "unknown operator '!='; use '<>'"),
    ("a => 1", 2, "use '>='"),
    ("a =< 1", 2, "use '<='"),
    ("a = = 1", 4, "expected a value after '='"),
    ("a = NULL", 4, "IS NULL or IS NOT NULL"),
    ("a <> null", 5, "IS NULL or IS NOT NULL"),
    ("a IS 1", 5, "expected 'NULL' after IS"),
    ("a IS NOT", 8, "expected 'NULL' after IS NOT"),
    ("a NOT = 1", 6, "expected BETWEEN or IN after NOT"),
    ("a NOT NULL", 6, "expected BETWEEN or IN after NOT"),
    ("a = 1 # x", 6, "unexpected character '#'"),
    ("a = - 1", 4, "unexpected character '-'"),
    ('a = "x"', 4, "unexpected character '\"'"),
    ("a = 1;", 5, "unexpected character ';'"),
    ("a = 1.", 4, "malformed number '1.'"),
    ("a = 1.2.3", 4, "malformed number"),
    ("a = 12abc", 4, "malformed number '12a'"),
    ("a = 1e999", 4, "out of range"),
    ("b = 1 AND 9a = 1", 10, "malformed number"),
]


@pytest.mark.parametrize(("expression", "position", "fragment"), ERRORS)
def test_syntax_and_type_errors(expression: str, position: int, fragment: str) -> None:
    with pytest.raises(FilterSyntaxError) as caught:
        compile_filter(expression)
    error = caught.value
    assert isinstance(error, ValueError)
    assert error.position == position
    assert error.expression == expression
    assert fragment in error.message
    text = str(error)
    assert text.startswith(f"SQL92 filter error at position {position}: ")
    lines = text.split("\n")
    assert len(lines) == 3
    assert lines[2].index("^") == 4 + position  # the caret sits under the offending character


def test_the_caret_follows_the_position_in_a_long_expression() -> None:
    expression = "a = 1 AND " * 30 + "b > 'x'"
    with pytest.raises(FilterSyntaxError) as caught:
        compile_filter(expression)
    position = caught.value.position
    assert position == expression.index("'x'")
    _, shown, caret = str(caught.value).split("\n")
    column = caret.index("^")
    assert shown.startswith("    ...")
    assert shown[column:column + 3] == "'x'"


def test_length_limit() -> None:
    longest = "a = '" + "x" * (MAX_EXPRESSION_LENGTH - 6) + "'"
    assert len(longest) == MAX_EXPRESSION_LENGTH
    assert compile_filter(longest).matches({"a": "x" * (MAX_EXPRESSION_LENGTH - 6)})
    with pytest.raises(FilterSyntaxError) as caught:
        compile_filter(longest + " ")
    assert caught.value.position == MAX_EXPRESSION_LENGTH
    assert "longer than 4096 characters" in caught.value.message


def test_nesting_limit() -> None:
    deepest = "(" * MAX_NESTING + "a = 1" + ")" * MAX_NESTING
    assert compile_filter(deepest).matches({"a": "1"})
    with pytest.raises(FilterSyntaxError) as caught:
        compile_filter("(" + deepest + ")")
    assert caught.value.position == MAX_NESTING
    assert compile_filter("NOT " * MAX_NESTING + "a = 1").matches({"a": "1"})
    with pytest.raises(FilterSyntaxError) as caught:
        compile_filter("NOT " * (MAX_NESTING + 1) + "a = 1")
    assert caught.value.position == 4 * MAX_NESTING
    # a thousand levels would exhaust the parser's stack without the limit
    with pytest.raises(FilterSyntaxError):
        compile_filter("(" * 1000 + "a = 1" + ")" * 1000)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab=<>!()'- ,.19NOTANDORISULBEWTRFx\t", max_size=40) | st.text(max_size=20))
def test_any_text_compiles_or_fails_with_a_position(expression: str) -> None:
    try:
        compiled = compile_filter(expression)
    except FilterSyntaxError as error:
        assert 0 <= error.position <= len(expression)
    else:
        assert isinstance(compiled.matches({"a": "1", "b": "x"}), bool)


# ---------------------------------------------------------------- model-based property test
#
# A generated condition is a tuple tree of its own, evaluated here by a reference that
# restates the documented semantics; the module only ever sees the rendered text.
#
#   literal  ("num", Fraction, text) | ("str", str) | ("bool", bool)
#   node     ("cmp", name, op, literal) | ("between", name, low, high, negated)
#            | ("in", name, (str, ...), negated) | ("isnull", name, negated)
#            | ("not", node) | ("and", node, node) | ("or", node, node)

NAMES = ("a", "b", "c")
ORDERING_OPS = (">", ">=", "<", "<=")
NUMERIC_TEXT = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


@st.composite
def numbers(draw: st.DrawFn) -> tuple[Fraction, str]:
    """A value on a coarse grid (so binary floats order it exactly) and one way of writing it."""
    value = Fraction(draw(st.integers(-30, 30)), draw(st.sampled_from([1, 2, 10])))
    plain = format(Decimal(value.numerator) / Decimal(value.denominator), "f")
    spellings = [plain, f"{value * 10}e-1" if (value * 10).denominator == 1 else plain]
    if value.denominator == 1:
        spellings += [f"{value}.0", f"{value}E0"]
    return value, draw(st.sampled_from(spellings))


number_literals = numbers().map(lambda pair: ("num", pair[0], pair[1]))
string_literals = st.text(alphabet="ab1' ", max_size=3).map(lambda s: ("str", s))
bool_literals = st.booleans().map(lambda b: ("bool", b))

comparisons = st.one_of(
    st.tuples(st.just("cmp"), st.sampled_from(NAMES), st.sampled_from((*ORDERING_OPS, "=", "<>")),
              number_literals),
    st.tuples(st.just("cmp"), st.sampled_from(NAMES), st.sampled_from(("=", "<>")),
              string_literals | bool_literals),
    st.tuples(st.just("between"), st.sampled_from(NAMES), number_literals, number_literals, st.booleans()),
    st.tuples(st.just("in"), st.sampled_from(NAMES),
              st.lists(string_literals.map(lambda lit: lit[1]), min_size=1, max_size=3).map(tuple),
              st.booleans()),
    st.tuples(st.just("isnull"), st.sampled_from(NAMES), st.booleans()),
)

conditions = st.recursive(
    comparisons,
    lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.just("and"), inner, inner),
        st.tuples(st.just("or"), inner, inner),
    ),
    max_leaves=8,
)

property_values = st.one_of(
    numbers().flatmap(lambda pair: st.sampled_from([pair[1], "+" + pair[1].lstrip("-")])),
    st.text(alphabet="ab1'.- ", max_size=4),
    st.sampled_from(["true", "false", "TRUE", "False", "yes"]),
)
property_maps = st.fixed_dictionaries({}, optional={name: property_values for name in NAMES})


def reference_number(raw: str) -> Fraction | None:
    return Fraction(raw) if NUMERIC_TEXT.fullmatch(raw) else None


def reference_compare(op: str, left: Any, right: Any) -> bool:
    if op == "=":
        return bool(left == right)
    if op == "<>":
        return bool(left != right)
    if op == ">":
        return bool(left > right)
    if op == ">=":
        return bool(left >= right)
    if op == "<":
        return bool(left < right)
    assert op == "<="
    return bool(left <= right)


def reference(node: tuple[Any, ...], properties: dict[str, str]) -> bool:
    kind = node[0]
    if kind == "not":
        return not reference(node[1], properties)
    if kind == "and":
        return reference(node[1], properties) and reference(node[2], properties)
    if kind == "or":
        return reference(node[1], properties) or reference(node[2], properties)
    raw = properties.get(node[1])
    if kind == "isnull":
        return (raw is None) != node[2]
    if raw is None:
        return False
    if kind == "in":
        return (raw in node[2]) != node[3]
    if kind == "between":
        number = reference_number(raw)
        if number is None:
            return False
        return (node[2][1] <= number <= node[3][1]) != node[4]
    assert kind == "cmp"
    op, literal = node[2], node[3]
    left: Any
    if literal[0] == "num":
        left = reference_number(raw)
    elif literal[0] == "bool":
        left = {"true": True, "false": False}.get(raw.lower())
    else:
        left = raw
    return left is not None and reference_compare(op, left, literal[1])


PRECEDENCE = {"or": 1, "and": 2, "not": 3}


def render(node: tuple[Any, ...], rnd: random.Random) -> str:
    """Write a condition as filter text with random keyword case, spacing and redundant parentheses."""
    def keyword(word: str) -> str:
        return rnd.choice([word.upper(), word.lower(), word.capitalize()])

    def gap() -> str:
        return rnd.choice([" ", " ", "  ", "\t", "\n"])

    def tight() -> str:
        return rnd.choice(["", " "])

    def literal(lit: tuple[Any, ...]) -> str:
        if lit[0] == "num":
            return str(lit[2])
        if lit[0] == "bool":
            return keyword("TRUE" if lit[1] else "FALSE")
        return "'" + lit[1].replace("'", "''") + "'"

    def child(sub: tuple[Any, ...], level: int) -> str:
        text = render(sub, rnd)
        if PRECEDENCE.get(sub[0], 4) < level or rnd.random() < 0.15:
            return "(" + tight() + text + tight() + ")"
        return text

    kind = node[0]
    if kind in ("and", "or"):
        return (gap() + keyword(kind) + gap()).join(child(sub, PRECEDENCE[kind]) for sub in node[1:])
    if kind == "not":
        return keyword("NOT") + gap() + child(node[1], PRECEDENCE["not"])
    name = node[1]
    negation = keyword("NOT") + gap() if node[-1] is True and kind != "cmp" else ""
    if kind == "cmp":
        return name + tight() + node[2] + tight() + literal(node[3])
    if kind == "between":
        return (name + gap() + negation + keyword("BETWEEN") + gap() + literal(node[2]) + gap()
                + keyword("AND") + gap() + literal(node[3]))
    if kind == "in":
        items = (tight() + "," + tight()).join(literal(("str", item)) for item in node[2])
        return name + gap() + negation + keyword("IN") + tight() + "(" + tight() + items + tight() + ")"
    assert kind == "isnull"
    return name + gap() + keyword("IS") + gap() + negation + keyword("NULL")


@settings(max_examples=300, deadline=None)
@given(conditions, st.randoms(use_true_random=False), st.lists(property_maps, min_size=1, max_size=6))
def test_matches_agrees_with_the_reference(condition: tuple[Any, ...], rnd: random.Random,
                                           samples: list[dict[str, str]]) -> None:
    text = render(condition, rnd)
    compiled = compile_filter(text)
    for properties in samples:
        assert compiled.matches(properties) == reference(condition, properties), (text, properties)


@settings(max_examples=300, deadline=None)
@given(conditions, st.randoms(use_true_random=False),
       st.dictionaries(st.sampled_from(NAMES), st.text(max_size=8)))
def test_rendered_conditions_always_compile(condition: tuple[Any, ...], rnd: random.Random,
                                            properties: dict[str, str]) -> None:
    text = render(condition, rnd)
    compiled = compile_filter(text)
    assert compiled.expression == text
    assert isinstance(compiled.matches(properties), bool)  # arbitrary values never make it raise
