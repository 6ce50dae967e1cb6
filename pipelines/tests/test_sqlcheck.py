"""The pure-Python SQL checks (sluice.api.sqlcheck) against Spark's own parser.

The corpus is every SQL expression and DDL schema of the examples, the docs' manifests, the pipelines the
tests write (node dicts and YAML in their sources) and a tour of Spark's expression syntax. Spark's parser
decides what is valid: the static check must accept all of it (no false rejection), and it must reject the
syntax errors users make.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import EXAMPLES, REPO_ROOT

from sluice.api.pipeline import OPERATIONS, Node
from sluice.api.sqlcheck import static_ddl_parser, static_sql_parser
from sluice.api.validation import load_documents, node_expressions

DOCS = [REPO_ROOT / "README.md", REPO_ROOT / "pipelines" / "README.md", REPO_ROOT / "charts" / "sluice" / "README.md"]
SOURCES = [
    p
    for d in ("pipelines/tests", "pipelines/bench", "operator/tests", "e2e/tests", "e2e/sluice/testbed")
    for p in sorted((REPO_ROOT / d).rglob("*.py"))
]

# Spark syntax the corpus may not show yet, so a future pipeline using it is not refused by the operator.
SYNTAX_TOUR = [
    "transform(arr, x -> x + 1)",
    "aggregate(arr, 0, (acc, x) -> acc + x)",
    "exists(arr, x -> x > 1)",
    "x::int",
    "a <=> b",
    "x RLIKE '^a'",
    '"a double-quoted string"',
    "try_cast(x AS INT)",
    "cast(x AS DECIMAL(10, 2))",
    "CASE WHEN a > 1 THEN 'x' ELSE 'y' END",
    "CASE a WHEN 1 THEN 'one' END",
    "IF(a, 1, 2)",
    "window.start",
    "x IS DISTINCT FROM y",
    "x IS NOT NULL",
    "a.b.c",
    "x IN (1, 2)",
    "x NOT IN ('a')",
    "'a' || 'b'",
    "-x",
    "~x",
    "x & y | z ^ w",
    "x >> 2",
    "x % 2",
    "x DIV 2",
    "count(DISTINCT x)",
    "count(*) FILTER (WHERE x > 1)",
    "percentile(x, array(0.5, 0.9))",
    "first(x, true)",
    "max_by(x, y)",
    "x LIKE ANY ('a%', 'b%')",
    "x NOT LIKE 'a%' ESCAPE '/'",
    "x ILIKE 'a%'",
    "*",
    "t.*",
    "stack(2, a, b) AS (x, y)",
    "INTERVAL 5 SECONDS",
    "INTERVAL '5' SECOND",
    "ts + INTERVAL 1 DAY",
    "timestamp'2020-01-01 00:00:00'",
    "DATE'2020-01-01'",
    "array(named_struct('key', 'a', 'value', cast(x AS binary)))",
    "struct(*)",
    "to_json(struct(*))",
    "m['k']",
    "arr[0]",
    "x BETWEEN 1 AND 2",
    "NOT x",
    "current_timestamp()",
    "current_date",
    "date_format(ts, 'yyyy')",
    "1e10",
    "1.5BD",
    "10L",
    "2Y",
    "3S",
    "X'1F'",
    "named_struct('a', 1).a",
    "`a b`",
    "a AS `b c`",
    "a.`b-c`",
    "x = 'it\\'s'",
    "position('a' IN b)",
    "extract(YEAR FROM ts)",
    "trim(BOTH 'x' FROM y)",
    "substring(s FROM 1 FOR 2)",
    "sum(x) OVER (PARTITION BY a ORDER BY b ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)",
    "row_number() OVER (PARTITION BY `window_start` ORDER BY revenue DESC)",
    "collect_list(x)",
    "from_json(value, 'a INT, b STRING')",
    "value:a.b",
    "upper(word) word_upper",
    "(a + b) * c AS total",
    "coalesce(a, b, 'none')",
    "nvl2(a, 1, 0)",
    "typeof(x)",
    "x IS TRUE",
    "map('a', 1)",
    "array_contains(arr, 'x')",
]
SYNTAX_TOUR_DDL = [
    "a INT NOT NULL COMMENT 'x', b ARRAY<STRING>",
    "m MAP<STRING, INT>, s STRUCT<a: INT, b: STRING>",
    "d DECIMAL(10,2), t TIMESTAMP_NTZ, c CHAR(3), v VARCHAR(10), b BYTE, s SHORT, l LONG, r REAL, x BINARY",
    "`a b` INT, `select` STRING",
    "id string, ts timestamp",
    "i INTERVAL DAY TO SECOND, y INTERVAL YEAR",
]
# Mistakes as users make them: each is refused by Spark and must be refused here too.
SYNTAX_ERRORS = [
    "word != '' AND (",
    "price * ",
    "count(*",
    "upper(word",
    "a = = b",
    "'unterminated",
    "x.",
    "a AND (b",
    "1 2 3",
    "cast(x AS)",
    "CASE WHEN a THEN 1",
    "a IN (1, 2",
]
DDL_ERRORS = ["id STRING ts TIMESTAMP", "id", "id STRING, ts", "id ARRAY<STRING", "id DECIMAL(10,"]


def _node_sql(data: Any) -> Iterator[tuple[str, str]]:
    """('sql' | 'ddl', text) of every node found in a nested structure."""
    if isinstance(data, list):
        for item in data:
            yield from _node_sql(item)
    elif isinstance(data, dict):
        if "name" in data and any(op in data for op in OPERATIONS):
            try:
                node = Node.model_validate(data)
            except ValueError:
                node = None
            if node is not None:
                yield from (("sql", expression) for _, expression in node_expressions(node))
                for op in ("fromKafka", "lookup"):
                    schema = getattr(node.config, "schema_", None) if node.operation == op else None
                    if schema:
                        yield "ddl", schema
        for value in data.values():
            yield from _node_sql(value)


def _yaml_documents(text: str) -> Iterator[Any]:
    try:
        yield from yaml.safe_load_all(text)
    except yaml.YAMLError:
        return


def _source_values(path: Path) -> Iterator[Any]:
    """Dict literals and YAML strings of a Python source."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            try:
                yield ast.literal_eval(node)
            except ValueError:
                continue
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "nodes:" in node.value:
            yield from _yaml_documents(node.value)


def corpus() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {"sql": set(SYNTAX_TOUR), "ddl": set(SYNTAX_TOUR_DDL)}
    values: list[Any] = [document.pipeline for p in sorted(EXAMPLES.glob("*.yaml")) for document in load_documents(p)]
    for doc in DOCS:
        for block in re.findall(r"```ya?ml\n(.*?)```", doc.read_text(), re.DOTALL):
            values.extend(_yaml_documents(block))
    for source in SOURCES:
        values.extend(_source_values(source))
    for kind, text in _node_sql(values):
        found[kind].add(text)
    return found


def test_the_corpus_covers_examples_docs_and_tests() -> None:
    found = corpus()
    assert "split(lower(value), '[^a-z0-9]+')" in found["sql"]  # the word count example and the README
    assert len(found["sql"]) > len(SYNTAX_TOUR) + 30 and len(found["ddl"]) > len(SYNTAX_TOUR_DDL) + 3


def test_syntax_errors_are_refused_with_where_they_are() -> None:
    assert static_sql_parser("word != '' AND (") == "syntax error at line 1, column 16 near '('"
    assert static_ddl_parser("id STRING ts TIMESTAMP") == "syntax error at line 1, column 12 near 'ts'"
    assert static_ddl_parser("id STRING, `at` TIMESTAMP") == ["id", "at"]
    assert static_sql_parser("SELECT 1") == "a SELECT statement, not an expression"
    assert static_sql_parser("value:a.b") is None  # a variant path: sqlglot cannot read it, Spark will
    assert static_sql_parser("':' || (") is not None


@pytest.mark.spark
def test_no_false_rejection_against_sparks_parser(spark_session) -> None:
    from sluice.pipelines.plancheck import spark_ddl_parser, spark_sql_parser

    spark_sql, spark_ddl = spark_sql_parser(spark_session), spark_ddl_parser(spark_session)
    found = corpus()
    valid_sql = [e for e in sorted(found["sql"]) if spark_sql(e) is None]
    valid_ddl = [d for d in sorted(found["ddl"]) if isinstance(spark_ddl(d), list)]
    false_sql = {e: static_sql_parser(e) for e in valid_sql if static_sql_parser(e) is not None}
    false_ddl = {d: static_ddl_parser(d) for d in valid_ddl if not isinstance(static_ddl_parser(d), list)}
    wrong_fields = {
        d: static_ddl_parser(d) for d in valid_ddl if d not in false_ddl and static_ddl_parser(d) != spark_ddl(d)
    }
    print(
        f"\nsqlcheck: {len(found['sql'])} expressions ({len(valid_sql)} valid for Spark), {len(found['ddl'])} "
        f"schemas ({len(valid_ddl)} valid); false rejections: {len(false_sql)} + {len(false_ddl)}"
    )
    assert false_sql == {}
    assert false_ddl == {}
    assert wrong_fields == {}


@pytest.mark.spark
def test_the_syntax_errors_users_make_are_refused_by_both(spark_session) -> None:
    from sluice.pipelines.plancheck import spark_ddl_parser, spark_sql_parser

    spark_sql, spark_ddl = spark_sql_parser(spark_session), spark_ddl_parser(spark_session)
    assert [e for e in SYNTAX_ERRORS if spark_sql(e) is None] == []  # the reference refuses them
    assert [d for d in DDL_ERRORS if isinstance(spark_ddl(d), list)] == []
    assert {e: static_sql_parser(e) for e in SYNTAX_ERRORS if static_sql_parser(e) is None} == {}
    assert {d: static_ddl_parser(d) for d in DDL_ERRORS if isinstance(static_ddl_parser(d), list)} == {}


def test_called_functions_are_found_through_comments_and_case_but_not_in_strings() -> None:
    from sluice.api.sqlcheck import called_functions

    assert "java_method" in called_functions("JAVA_METHOD /* why */ ('java.lang.Math', 'random') > 0")
    assert {"upper", "reflect"} <= called_functions("upper(reflect('a', 'b'))")
    assert "reflect" not in called_functions("value = 'reflect(x)'"), "a string is not a call"
    assert "try_reflect" in called_functions("value:a.b = try_reflect('a', 'b')"), "what sqlglot cannot read"
