"""fromKafka.eventTimeExpr: the event time computed from the record (a nested field, an epoch-millis string, a
text line's prefix). Records whose event time is null or unparseable are malformed: dead letters and the
malformed counter, as records without an event-time field are."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from rows import T0, at, compile_rows, run, sorted_rows, table, unique

from sluice.api.validation import PipelineInvalid
from sluice.pipelines.metrics import OBSERVED_QUALITY

pytestmark = pytest.mark.spark

SECOND = 1000
WINDOW_MS = 10 * SECOND


def counted(source: dict[str, Any], out: str, dead: str) -> dict[str, Any]:
    """Counts per 10 s tumbling window of the source's event time; malformed records to `dead`."""
    return {
        "nodes": [
            source,
            {
                "name": "counts",
                "inputs": ["events"],
                "aggregate": {"window": {"tumbling": "10s"}, "aggregations": {"n": "count(*)"}},
            },
            {"name": "out", "inputs": ["counts"], "toMemory": {"table": out}},
        ],
        "deadLetter": {"toMemory": {"table": dead}},
    }


def json_source(schema: str, expression: str) -> dict[str, Any]:
    return {
        "name": "events",
        "fromKafka": {
            "topic": "events",
            "format": "json",
            "schema": schema,
            "eventTime": "ts",
            "eventTimeExpr": expression,
            "watermark": "1s",
        },
    }


def window_counts(event_ms: list[int]) -> list[dict[str, Any]]:
    """The reference: count per 10 s tumbling window (ms after T0; window_time: its last instant in whole ms) of
    the windows the final watermark (the newest event time - 1 s) closes: availableNow ends with a batch that
    runs with it."""
    counts: dict[int, int] = {}
    for ms in event_ms:
        start = (ms // WINDOW_MS) * WINDOW_MS
        counts[start] = counts.get(start, 0) + 1
    closed = max(event_ms) - SECOND
    return sorted_rows(
        [
            {"window_start": s, "window_end": s + WINDOW_MS, "window_time": s + WINDOW_MS - 1, "n": n}
            for s, n in counts.items()
            if s + WINDOW_MS <= closed
        ]
    )


def malformed_count(queries: list[Any]) -> int:
    return sum(
        int(metrics["malformed"] or 0)
        for query in queries
        for progress in query.recentProgress
        for name, metrics in progress.observedMetrics.items()
        if name == f"{OBSERVED_QUALITY}_events"
    )


def dead_values(spark, name: str) -> list[tuple[str, str]]:
    def text(value: Any) -> str:
        return value if isinstance(value, str) else bytes(value).decode()  # a text source's value is a string

    return sorted((text(row["value"]), row["error"]) for row in table(spark, name))


def epoch_millis(text: str) -> int | None:
    return int(text) - T0 if text.isdigit() else None


def test_event_time_from_an_epoch_millis_string_in_a_nested_field(spark_session, rows, tmp_path):
    out, dead = unique("epoch"), unique("epoch_dead")
    stamps = [str(T0 + 1_234), str(T0 + 9_999), "soon", str(T0 + 10_000), str(T0 + 12_500), "", str(T0 + 31_000)]
    values = [{"id": i, "payload": {"ts": text}} for i, text in enumerate(stamps)]
    values.append({"id": 99, "payload": None})
    rows.batch("events", values[:4]).batch("events", values[4:])
    rows.batch("events", [{"id": 100, "payload": {"ts": str(T0 + 40_000)}}])  # closes the windows up to 31 s
    pipeline = counted(
        json_source("id INT, payload STRUCT<ts: STRING>", "timestamp_millis(try_cast(payload.ts AS BIGINT))"),
        out,
        dead,
    )
    queries = run(spark_session, pipeline, rows, tmp_path / "cp")

    parsed = [ms for ms in map(epoch_millis, [*stamps, str(T0 + 40_000)]) if ms is not None]
    assert table(spark_session, out) == window_counts(parsed)
    bad = [json.dumps(v) for v in values if v["payload"] is None or epoch_millis(v["payload"]["ts"]) is None]
    assert dead_values(spark_session, dead) == sorted((text, "missing or invalid event time 'ts'") for text in bad)
    assert malformed_count(queries) == len(bad) == 3


def test_event_time_from_a_nested_timestamp_field_is_kept_as_a_column(spark_session, rows, tmp_path):
    name = unique("nested")
    seconds = [0.5, 3, 7.25]
    rows.batch("events", [{"id": i, "payload": {"ts": at(s)}} for i, s in enumerate(seconds)])
    source = json_source("id INT, payload STRUCT<ts: TIMESTAMP>", "payload.ts")
    pipeline = {
        "nodes": [
            source,
            {"name": "picked", "inputs": ["events"], "select": ["id", "ts"]},
            {"name": "out", "inputs": ["picked"], "toMemory": {"table": name}},
        ]
    }
    run(spark_session, pipeline, rows, tmp_path / "cp")
    assert table(spark_session, name) == [{"id": i, "ts": int(s * SECOND)} for i, s in enumerate(seconds)]


def test_event_time_of_a_text_record_from_a_string_cast_to_a_timestamp(spark_session, rows, tmp_path):
    out, dead = unique("text"), unique("text_dead")
    lines = [f"{at(1)} a", f"{at(4)} b", "yesterday c", f"{at(15)} d", f"{at(26)} e"]
    rows.batch("events", lines).batch("events", [f"{at(40)} z"])
    source = {
        "name": "events",
        "fromKafka": {
            "topic": "events",
            "eventTime": "ts",
            "eventTimeExpr": "substring_index(value, ' ', 1)",
            "watermark": "1s",
        },
    }
    queries = run(spark_session, counted(source, out, dead), rows, tmp_path / "cp")

    def parse(line: str) -> int | None:
        try:
            stamp = datetime.fromisoformat(line.split(" ")[0])
        except ValueError:
            return None
        return round(stamp.astimezone(UTC).timestamp() * 1000) - T0

    parsed = [parse(line) for line in lines]
    valid = [ms for ms in parsed if ms is not None]
    assert table(spark_session, out) == window_counts([*valid, 40 * SECOND])
    assert dead_values(spark_session, dead) == [
        (line, "missing or invalid event time 'ts'") for line, ms in zip(lines, parsed, strict=True) if ms is None
    ]
    assert malformed_count(queries) == 1


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (
            "try_cast(payload.ts AS BIGINT)",
            "'try_cast(payload.ts AS BIGINT)' is of type bigint, not a timestamp: convert it, e.g. timestamp_millis(x)",
        ),
        ("payload.stamp", "[FIELD_NOT_FOUND]"),
        ("stamp", "[UNRESOLVED_COLUMN.WITH_SUGGESTION]"),
    ],
)
def test_an_event_time_expression_that_is_no_timestamp_is_refused_at_its_path(spark_session, rows, expression, message):
    pipeline = {
        "nodes": [
            json_source("id INT, payload STRUCT<ts: STRING>", expression),
            {"name": "out", "inputs": ["events"], "toMemory": {"table": "t_refused"}},
        ]
    }
    with pytest.raises(PipelineInvalid) as refused:
        compile_rows(spark_session, pipeline, rows)
    [problem] = [str(p) for p in refused.value.problems]
    assert problem.startswith(f"nodes[0].fromKafka.eventTimeExpr: {message}"), problem
