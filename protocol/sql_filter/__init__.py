"""RocketMQ's SQL92 message filter, evaluated over a message's properties.

A consumer may subscribe with an SQL92 condition (``MessageSelector.bySql``)
instead of a tag list; the broker compiles it once with :func:`compile_filter`
and tests each message's properties with :meth:`SqlFilter.matches`.

Grammar (keywords are case-insensitive; whitespace separates tokens)::

    expression  = or_expr ;
    or_expr     = and_expr , { "OR" , and_expr } ;
    and_expr    = not_expr , { "AND" , not_expr } ;
    not_expr    = "NOT" , not_expr | primary ;
    primary     = "(" , or_expr , ")" | identifier , predicate ;
    predicate   = compare_op , value
                | [ "NOT" ] , "BETWEEN" , number , "AND" , number
                | [ "NOT" ] , "IN" , "(" , string , { "," , string } , ")"
                | "IS" , [ "NOT" ] , "NULL" ;
    compare_op  = "=" | "<>" | ">" | ">=" | "<" | "<=" ;
    value       = number | string | "TRUE" | "FALSE" ;
    number      = [ "-" ] , digits , [ "." , digits ] , [ ( "e" | "E" ) , [ "+" | "-" ] , digits ] ;
    string      = "'" , { any character but "'" | "''" } , "'" ;    (* '' is one quote *)
    identifier  = ( letter | "_" | "$" ) , { letter | digit | "_" | "." | "$" } ;   (* ASCII *)

So NOT binds tighter than AND, and AND tighter than OR; the AND of a BETWEEN
belongs to the BETWEEN (``a BETWEEN 1 AND 2 AND b = 'x'`` is two conditions).

Type errors that can be seen in the text are refused at compile time:
``>``/``>=``/``<``/``<=`` and BETWEEN take numbers only, IN takes strings only,
TRUE/FALSE only go with ``=``/``<>``, and NULL is only written as ``IS [NOT] NULL``.

Semantics (every property value is a string):

* A *numeric* comparison (a number literal, or BETWEEN) reads the property as a
  number: ``[+-]digits[.digits][(e|E)[+-]digits]``, ASCII, nothing around it; an
  integer is compared exactly as an int, anything else as a float.
* A *string* comparison (``=``/``<>``/IN with string literals) compares the text
  exactly (case-sensitive).
* A *boolean* comparison (``= TRUE`` ...) reads ``true``/``false`` in any case.
* A comparison whose property is absent, or not of the literal's type, is False
  -- for the negated forms ``<>``, ``NOT BETWEEN`` and ``NOT IN`` too.
* NOT, AND and OR are plain two-valued logic over those results, so
  ``NOT (a > 1)`` is True when ``a`` is absent while ``a NOT IN ('x')`` is False.
* ``a IS NULL`` is True exactly when ``a`` is absent.

:meth:`SqlFilter.matches` never raises; compile errors are
:class:`FilterSyntaxError` with the 0-based offset of the offending token (for an
unterminated string, of its opening quote).

Why a hand-written parser (measured 2026-11-25, ``python scripts/bench_sql_filter.py``,
docs/BENCHMARKS.md): the same grammar on lark's LALR parser, building these same nodes,
compiled the test's 65 expressions 2.3-5x slower (115-210 us against 30-70 us an
expression; evaluation is the same tree, so the same speed), and in 134 lines against
the 214 of the tokenizer and parser here it put 50 of the test's 56 errors at the right
position and gave 17 the right message; the rest would need a table from lark's
expected-terminal sets to these messages. Slower and not yet equal, so not adopted.
"""


from protocol.sql_filter.parser import (
    MAX_EXPRESSION_LENGTH,
    MAX_NESTING,
    FilterSyntaxError,
    SqlFilter,
    compile_filter,
)
from protocol.sql_filter.tree import And, Between, Compare, In, IsNull, Node, Not, Or, Value

__all__ = [
    "MAX_EXPRESSION_LENGTH",
    "MAX_NESTING",
    "And",
    "Between",
    "Compare",
    "FilterSyntaxError",
    "In",
    "IsNull",
    "Node",
    "Not",
    "Or",
    "SqlFilter",
    "Value",
    "compile_filter",
]
