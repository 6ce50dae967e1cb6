"""Spark SQL syntax checks in pure Python (sqlglot's Spark dialect), for where no JVM runs: the operator,
its admission webhook and `sluice validate --no-spark`.

They are the validation layer's SqlParser and DdlParser, with Spark's own parsers (plancheck.spark_sql_parser,
spark_ddl_parser) as the reference: an expression or schema Spark parses must never be refused here
(pipelines/tests/test_sqlcheck.py measures that over every expression of the examples, tests and docs).
sqlglot is more lenient than Spark, so what it lets through is still parsed by Spark when the driver starts.
"""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, SqlglotError

from .validation import DdlParser, SqlParser

_DIALECT = "spark"
# What parses as SQL but is a statement, not an expression.
_STATEMENTS = (exp.Query, exp.DDL, exp.DML, exp.Command, exp.Drop, exp.Use, exp.Set, exp.Transaction)


_DDL_PREFIX = "CREATE TABLE t ("
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`[^`]*`")
_PATH_COLON = re.compile(r"[\w`\])]\s*:\s*[\w`\[]")


def _message(exc: SqlglotError, offset: int) -> str:
    """sqlglot's first error, placed in the text the user wrote (`offset`: characters put before it)."""
    if isinstance(exc, ParseError) and exc.errors:
        first = exc.errors[0]
        column = first["col"] - offset if first["line"] == 1 else first["col"]
        near = (first.get("highlight") or "").strip()
        return f"syntax error at line {first['line']}, column {column}" + (f" near {near!r}" if near else "")
    return "syntax error: cannot split it into SQL tokens (an unterminated string or quoted name?)"


def _parse(sql: str, offset: int = 0) -> exp.Expr | str:
    try:
        return sqlglot.parse_one(sql, read=_DIALECT)
    except SqlglotError as exc:
        return _message(exc, offset)


def static_sql_parser(expression: str) -> str | None:
    """None when `expression` is a Spark SQL expression, else why not."""
    parsed = _parse(expression)
    if isinstance(parsed, str):
        # sqlglot does not read Spark's variant/JSON paths (value:a.b): left to Spark at start.
        return None if _PATH_COLON.search(_QUOTED.sub("q", expression)) else parsed
    if isinstance(parsed, _STATEMENTS) and not isinstance(parsed, exp.Subquery):
        return f"a {parsed.key.upper()} statement, not an expression"
    return None


def static_ddl_parser(ddl: str) -> list[str] | str:
    """The top-level field names of a Spark DDL schema ('id STRING, ts TIMESTAMP'), or why it is not one."""
    parsed = _parse(f"{_DDL_PREFIX}{ddl}\n)", len(_DDL_PREFIX))  # the newline ends a trailing -- comment
    if isinstance(parsed, str):
        return parsed
    schema = parsed.this
    columns = schema.expressions if isinstance(schema, exp.Schema) else []
    if not columns:
        return "no fields"
    names = []
    for column in columns:
        if not isinstance(column, exp.ColumnDef) or column.args.get("kind") is None:
            return f"field {column.sql(_DIALECT)!r} has no type"
        names.append(column.name)
    return names


def strictest(spark_sql: SqlParser, spark_ddl: DdlParser) -> tuple[SqlParser, DdlParser]:
    """Spark's parsers, then these: `sluice validate` with Spark refuses all the operator refuses."""

    def sql(expression: str) -> str | None:
        return spark_sql(expression) or static_sql_parser(expression)

    def ddl(text: str) -> list[str] | str:
        fields = spark_ddl(text)
        static = static_ddl_parser(text)
        return static if isinstance(fields, list) and isinstance(static, str) else fields

    return sql, ddl


_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def called_functions(expression: str) -> set[str]:
    """The names (lower case) of every function `expression` calls: from the parse tree where sqlglot reads it
    (comments and spacing do not hide a call), and from the text outside quotes (what sqlglot cannot read)."""
    names = {name.lower() for name in _CALL.findall(_QUOTED.sub("''", expression))}
    parsed = _parse(expression)
    if not isinstance(parsed, str):
        for node in parsed.walk():
            if isinstance(node, exp.Anonymous):
                names.add(node.name.lower())
            elif isinstance(node, exp.Func):
                names.add(node.sql_name().lower())
    return names
