"""Validation of pipeline specs: each class of error is reported at its exact path in the manifest, and
every problem of a manifest is reported at once. Pure unit tests, except the SQL/DDL checks that need
Spark's parsers (marked spark)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import EXAMPLE_NAMES, EXAMPLES, REPO_ROOT, load_manifest

from sluice.api.pipeline import Join, PipelineSpec
from sluice.api.validation import (
    DdlParser,
    PipelineInvalid,
    SqlParser,
    document_from,
    load_documents,
    validate,
)
from sluice.testbed.manifests import kafka_bodies

PREFIX = "spec.pipeline"
VALID: dict[str, Any] = {
    "nodes": [
        {
            "name": "events",
            "fromKafka": {
                "topic": "in",
                "format": "json",
                "schema": "id STRING, ts TIMESTAMP",
                "eventTime": "ts",
                "watermark": "5s",
            },
        },
        {"name": "upper", "inputs": ["events"], "select": ["upper(id) AS id", "ts"]},
        {"name": "out", "inputs": ["upper"], "toKafka": {"topic": "out", "key": "id"}},
    ],
}
DELETE = object()
APPEND = -1


def edited(*changes: tuple[str, Any]) -> dict[str, Any]:
    """A copy of VALID with changes ('nodes[0].fromKafka.watermark', value); value DELETE removes the key,
    index [-1] appends to a list."""
    data = copy.deepcopy(VALID)
    for path, value in changes:
        parts: list[str | int] = [
            int(p[1:-1]) if p.startswith("[") else p for p in re.findall(r"\[-?\d+\]|[A-Za-z_]\w*", path)
        ]
        parent: Any = data
        for part in parts[:-1]:
            parent = parent[part]
        last = parts[-1]
        if value is DELETE:
            del parent[last]
        elif last == APPEND:
            parent.append(value)
        else:
            parent[last] = value
    return data


def problems_of(
    data: Any, prefix: str = PREFIX, sql: SqlParser | None = None, ddl: DdlParser | None = None
) -> list[str]:
    """The lines of the error message: 'path: message', one per problem."""
    with pytest.raises(PipelineInvalid) as info:
        validate(data, prefix, sql=sql, ddl=ddl)
    lines = str(info.value).splitlines()
    assert lines == [str(p) for p in info.value.problems]
    return lines


def assert_problems(lines: list[str], expected: list[tuple[str, str]]) -> None:
    """Exactly the expected problems (any order): each line is `path: message...`, path exact."""
    assert len(lines) == len(expected), "\n".join(lines)
    unmatched = list(lines)
    for path, message in expected:
        found = next((line for line in unmatched if line.startswith(f"{path}: {message}")), None)
        assert found is not None, f"no problem '{path}: {message}...' in:\n" + "\n".join(lines)
        unmatched.remove(found)


def unused(i: int, name: str) -> tuple[str, str]:
    return f"{PREFIX}.nodes[{i}]", f"the output of '{name}' is not used by any node (connect it to a sink)"


AUDIT = {"name": "audit", "inputs": ["events"], "filter": "id IS NOT NULL"}


def joining(join: dict[str, Any]) -> list[tuple[str, Any]]:
    """Changes making nodes[1] a join of the base source and a second source, with this body."""
    more = {"name": "more", "fromKafka": {"topic": "more"}}
    return [("nodes[1]", {"name": "upper", "inputs": ["events", "more"], "join": join}), ("nodes[-1]", more)]


# error class -> (changes to VALID, the problems expected at their paths)
CASES: dict[str, tuple[list[tuple[str, Any]], list[tuple[str, str]]]] = {
    "unknown-keys": (
        [("nodes[1].colour", "red"), ("nodes[2].toKafka.partition", 3)],
        [
            (f"{PREFIX}.nodes[1].colour", "unknown key 'colour'"),
            (f"{PREFIX}.nodes[2].toKafka.partition", "unknown key 'partition'"),
        ],
    ),
    "no-operation": (
        [("nodes[1].select", DELETE)],
        [(f"{PREFIX}.nodes[1]", "a node needs exactly one operation key (fromKafka, select, ")],
    ),
    "two-operations": (
        [("nodes[1].filter", "id IS NOT NULL")],
        [(f"{PREFIX}.nodes[1]", "a node needs exactly one operation key")],
    ),
    "duplicate-names": (
        [("nodes[-1]", {"name": "out", "inputs": ["upper"], "toConsole": {}})],
        [(f"{PREFIX}.nodes[3].name", "duplicate node name 'out' (also nodes[2])")],
    ),
    "unknown-input": (
        [("nodes[2].inputs[0]", "uper")],
        [(f"{PREFIX}.nodes[2].inputs[0]", "unknown node 'uper'"), unused(1, "upper")],
    ),
    "cycle": (
        [
            ("nodes[1]", {"name": "upper", "inputs": ["events", "audit"], "union": {}}),
            ("nodes[-1]", {"name": "audit", "inputs": ["upper"], "filter": "true"}),
        ],
        [(f"{PREFIX}.nodes[3].inputs", "cycle: audit -> upper -> audit")],
    ),
    "sink-without-input": (
        [("nodes[2].inputs", DELETE)],
        [(f"{PREFIX}.nodes[2].inputs", "toKafka needs 1 input(s), got 0"), unused(1, "upper")],
    ),
    "sink-as-input": (
        [("nodes[-1]", {"name": "more", "inputs": ["out"], "toConsole": {}})],
        [(f"{PREFIX}.nodes[3].inputs[0]", "'out' is a sink and has no output")],
    ),
    "unused-node": ([("nodes[-1]", AUDIT)], [unused(3, "audit")]),
    "no-sink": (
        [("nodes[2]", {"name": "out", "inputs": ["upper"], "filter": "true"})],
        [(f"{PREFIX}.nodes", "the pipeline has no sink"), unused(2, "out")],
    ),
    "bad-durations": (
        [("nodes[0].fromKafka.watermark", "5 seconds"), ("trigger", {"processingTime": "1min"})],
        [
            (f"{PREFIX}.nodes[0].fromKafka.watermark", "invalid duration '5 seconds': use a number and a unit"),
            (f"{PREFIX}.trigger.processingTime", "invalid duration '1min'"),
        ],
    ),
    "wrong-types": (
        [("nodes[1].select", "upper(id)"), ("nodes[2].toKafka.topic", 42)],
        [
            (f"{PREFIX}.nodes[1].select", "Input should be a valid list (got 'upper(id)')"),
            (f"{PREFIX}.nodes[2].toKafka.topic", "Input should be a valid string (got 42)"),
        ],
    ),
    "source-with-inputs": (
        [
            ("nodes[-1]", {"name": "more", "inputs": ["events"], "fromKafka": {"topic": "t2"}}),
            ("nodes[1]", {"name": "upper", "inputs": ["events", "more"], "union": {}}),
        ],
        [(f"{PREFIX}.nodes[3].inputs", "a source (fromKafka) takes no inputs")],
    ),
    "join-with-one-input": (
        [("nodes[1]", {"name": "upper", "inputs": ["events"], "join": {"condition": "a.id = b.id", "within": "1s"}})],
        [(f"{PREFIX}.nodes[1].inputs", "join needs 2 input(s), got 1")],
    ),
    "top-n-ties-not-a-flag": (
        [("nodes[1]", {"name": "upper", "inputs": ["events"], "topN": {"limit": 1, "orderBy": ["id"], "ties": "all"}})],
        [(f"{PREFIX}.nodes[1].topN.ties", "Input should be a valid boolean")],
    ),
    "watermark-without-event-time": (
        [("nodes[0].fromKafka.eventTime", DELETE)],
        [(f"{PREFIX}.nodes[0].fromKafka", "'watermark' needs 'eventTime'")],
    ),
    "json-without-schema": (
        [("nodes[0].fromKafka.schema", DELETE)],
        [(f"{PREFIX}.nodes[0].fromKafka", "format json needs 'schema'")],
    ),
    "text-with-field-event-time": (
        [("nodes[0].fromKafka.format", "text"), ("nodes[0].fromKafka.schema", DELETE)],
        [(f"{PREFIX}.nodes[0].fromKafka.eventTime", "text records have no fields; use eventTime: kafka_timestamp")],
    ),
    "event-time-expr-without-event-time": (
        [
            ("nodes[0].fromKafka.eventTime", DELETE),
            ("nodes[0].fromKafka.watermark", DELETE),
            ("nodes[0].fromKafka.eventTimeExpr", "payload.ts"),
        ],
        [(f"{PREFIX}.nodes[0].fromKafka", "'eventTimeExpr' needs 'eventTime' (the name of the column it computes)")],
    ),
    "event-time-expr-into-kafka-timestamp": (
        [("nodes[0].fromKafka.eventTime", "kafka_timestamp"), ("nodes[0].fromKafka.eventTimeExpr", "ts")],
        [
            (
                f"{PREFIX}.nodes[0].fromKafka",
                "eventTime 'kafka_timestamp': with eventTimeExpr, eventTime names the column it computes",
            )
        ],
    ),
    "join-with-two-bounds": (
        joining({"condition": "events.id = more.id", "within": "1s", "between": ["0s", "1s"]}),
        [
            (
                f"{PREFIX}.nodes[1].join",
                "set exactly one of 'within', 'between', 'until' or 'sameWindow' (found within, between)",
            )
        ],
    ),
    "join-without-bound": (
        joining({"condition": "events.id = more.id"}),
        [(f"{PREFIX}.nodes[1].join", "set exactly one of 'within', 'between', 'until' or 'sameWindow' (found none)")],
    ),
    "join-between-out-of-order": (
        joining({"condition": "events.id = more.id", "between": ["5s", "-5s"]}),
        [(f"{PREFIX}.nodes[1].join.between", "the lower bound 5s is after the upper bound -5s")],
    ),
    "join-between-bad-duration": (
        joining({"condition": "events.id = more.id", "between": ["-5 s", "1s"]}),
        [(f"{PREFIX}.nodes[1].join.between[0]", "invalid duration '-5 s': use a number and a unit")],
    ),
    "join-between-three-durations": (
        joining({"condition": "events.id = more.id", "between": ["-5s", "1s", "2s"]}),
        [(f"{PREFIX}.nodes[1].join.between", "List should have at most 2 items")],
    ),
    "join-until-incomplete": (
        joining({"condition": "events.id = more.id", "until": {"column": "expires"}}),
        [(f"{PREFIX}.nodes[1].join.until.atMost", "required")],
    ),
}


def test_event_time_expr_computes_a_new_column_also_of_text_records() -> None:
    source = {"topic": "in", "eventTime": "at", "eventTimeExpr": "substring_index(value, ' ', 1)", "watermark": "1s"}
    spec = validate(edited(("nodes[0].fromKafka", source)), PREFIX)
    assert spec.nodes[0].fromKafka is not None and spec.nodes[0].fromKafka.eventTimeExpr == source["eventTimeExpr"]


def test_the_base_pipeline_is_valid() -> None:
    spec = validate(edited(), PREFIX)
    assert isinstance(spec, PipelineSpec)
    assert [n.name for n in spec.nodes] == ["events", "upper", "out"]


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_error_is_reported_at_its_path(case: str) -> None:
    changes, expected = CASES[case]
    assert_problems(problems_of(edited(*changes)), expected)


def test_every_problem_is_reported_at_once() -> None:
    """Problems of the model (several nodes), of the DAG and of the trigger all come in one report,
    sorted by path. (A model's own cross-field checks, like json-without-schema, run only once its fields
    are valid: the combined cases touch different models.)"""
    combined = ("unknown-keys", "wrong-types", "json-without-schema", "unknown-input", "unused-node")
    changes = [change for case in combined for change in CASES[case][0]]
    expected = [problem for case in combined for problem in CASES[case][1]]
    changes.append(("trigger", {"processingTime": "soon"}))
    expected.append((f"{PREFIX}.trigger.processingTime", "invalid duration 'soon'"))
    lines = problems_of(edited(*changes))
    assert_problems(lines, expected)
    assert len(lines) >= 9
    paths = [line.split(": ")[0] for line in lines]
    natural = [[int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)] for p in paths]
    assert natural == sorted(natural)


def test_paths_of_a_bare_pipeline_have_no_prefix() -> None:
    assert_problems(
        problems_of(edited(("nodes[1].colour", "red")), prefix=""), [("nodes[1].colour", "unknown key 'colour'")]
    )


def test_invalid_yaml_is_reported_with_its_line(tmp_path: Path) -> None:
    manifest = tmp_path / "app.yaml"
    manifest.write_text("kind: StreamingApp\nspec:\n  pipeline: [unclosed\n")
    with pytest.raises(PipelineInvalid) as info:
        load_documents(manifest)
    assert str(info.value).startswith(f"{manifest}:line 4: not valid YAML")


# ------------------------------------------------------------------------------------ examples


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_is_valid_and_declares_its_topics(name: str) -> None:
    document = load_documents(EXAMPLES / f"{name}.yaml")[0]
    validate(document.pipeline, document.prefix)
    manifest = load_manifest(name)
    declared = {t["name"] for t in manifest["spec"]["topics"]}
    used = {t for body in kafka_bodies(manifest["spec"]["pipeline"]) for t in body["topic"].split(",")}
    assert used <= declared, f"topics used but not in spec.topics: {used - declared}"
    for node in manifest["spec"]["pipeline"]["nodes"]:
        if "lookup" in node:
            assert (REPO_ROOT / node["lookup"]["path"]).is_file(), node["lookup"]["path"]


# ------------------------------------------------------------------------- SQL and DDL (Spark)


@pytest.fixture
def parsers(spark_session) -> tuple[SqlParser, DdlParser]:
    from sluice.pipelines.plancheck import spark_ddl_parser, spark_sql_parser

    return spark_sql_parser(spark_session), spark_ddl_parser(spark_session)


@pytest.mark.spark
def test_bad_sql_is_reported_at_its_path(parsers: tuple[SqlParser, DdlParser]) -> None:
    sql, ddl = parsers
    data = edited(
        ("nodes[1].select[0]", "upper(id AS id"),
        (
            "nodes[-1]",
            {
                "name": "counts",
                "inputs": ["events"],
                "aggregate": {
                    "groupBy": ["id"],
                    "window": {"tumbling": "10s"},
                    "aggregations": {"total": "count(*", "last": "max(ts)"},
                },
            },
        ),
        (
            "nodes[-1]",
            {"name": "top", "inputs": ["counts"], "topN": {"limit": 3, "orderBy": ["total DESC NULLS LAST", "id ASC"]}},
        ),
        ("nodes[-1]", {"name": "top-out", "inputs": ["top"], "toKafka": {"topic": "t", "key": "id ||"}}),
    )
    assert_problems(
        problems_of(data, sql=sql, ddl=ddl),
        [
            (f"{PREFIX}.nodes[1].select[0]", "bad SQL expression 'upper(id AS id': "),
            (f"{PREFIX}.nodes[3].aggregate.aggregations.total", "bad SQL expression 'count(*': "),
            (f"{PREFIX}.nodes[5].toKafka.key", "bad SQL expression 'id ||': "),
        ],
    )  # the sort orders of topN (DESC, NULLS LAST) are no error


@pytest.mark.spark
def test_bad_schema_is_reported_at_its_path(parsers: tuple[SqlParser, DdlParser]) -> None:
    sql, ddl = parsers
    data = edited(("nodes[0].fromKafka.schema", "id STRING, ts TIMESTAMPP"))
    assert_problems(problems_of(data, sql=sql, ddl=ddl), [(f"{PREFIX}.nodes[0].fromKafka.schema", "bad schema: ")])


@pytest.mark.spark
def test_event_time_must_be_a_schema_field(parsers: tuple[SqlParser, DdlParser]) -> None:
    sql, ddl = parsers
    data = edited(("nodes[0].fromKafka.eventTime", "time"))
    assert_problems(
        problems_of(data, sql=sql, ddl=ddl),
        [(f"{PREFIX}.nodes[0].fromKafka.eventTime", "'time' is not a schema field (id, ts) nor kafka_timestamp")],
    )


@pytest.mark.spark
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_sql_and_schemas_parse(name: str, parsers: tuple[SqlParser, DdlParser]) -> None:
    sql, ddl = parsers
    document = document_from(load_manifest(name), name)
    assert validate(document.pipeline, document.prefix, sql=sql, ddl=ddl).nodes


@pytest.mark.spark
def test_a_bad_event_time_expression_is_reported_at_its_path(parsers: tuple[SqlParser, DdlParser]) -> None:
    sql, ddl = parsers
    data = edited(("nodes[0].fromKafka.eventTime", "at"), ("nodes[0].fromKafka.eventTimeExpr", "timestamp_millis(ts"))
    assert_problems(
        problems_of(data, sql=sql, ddl=ddl),
        [(f"{PREFIX}.nodes[0].fromKafka.eventTimeExpr", "bad SQL expression 'timestamp_millis(ts': ")],
    )


@pytest.mark.parametrize(
    ("bound", "span_ms"),
    [
        ({"within": "10s"}, 10_000),
        ({"between": ["-5s", "10s"]}, 10_000),
        ({"between": ["-30s", "10s"]}, 30_000),
        ({"between": ["-3s", "-2s"]}, 3_000),
        ({"until": {"column": "expires", "atMost": "1h"}}, 3_600_000),
        ({"sameWindow": "1m"}, 60_000),
    ],
)
def test_a_joins_span_is_the_farthest_apart_two_joined_event_times_lie(bound: dict[str, Any], span_ms: int) -> None:
    """What the operator rewinds a new checkpoint by (sluice.api.rollout) for a join."""
    assert Join.model_validate({"condition": "a.id = b.id", **bound}).span_ms() == span_ms
