"""Stream-stream join bounds besides `within`: an interval on both sides (`between`), a bound from a column of the
left side (`until`), and equal tumbling windows (`sameWindow`). Each output is checked against the pairs a
reference computes from the same rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from rows import at, compile_rows, run, sorted_rows, table, timed_source, unique

from sluice.api.validation import PipelineInvalid

pytestmark = pytest.mark.spark

SECOND = 1000
Record = dict[str, Any]  # id and times as ms after T0


def source(name: str, watermark: str, extra: str = "") -> dict[str, Any]:
    """`extra`: more schema fields, each after a comma."""
    return timed_source(name, f"id INT{extra}", watermark)


def as_json(records: list[Record]) -> list[dict[str, Any]]:
    return [{k: (at(v / SECOND) if k in ("ts", "expires") else v) for k, v in r.items()} for r in records]


def joined(join: dict[str, Any], table_name: str, watermark: str = "1h", extra: str = "") -> dict[str, Any]:
    return {
        "nodes": [
            source("reqs", watermark, extra),
            source("resps", watermark),
            {"name": "pairs", "inputs": ["reqs", "resps"], "join": {"condition": "reqs.id = resps.id", **join}},
            {"name": "out", "inputs": ["pairs"], "toMemory": {"table": table_name}},
        ]
    }


SELECT = ["reqs.id AS id", "reqs.ts AS req_ts", "resps.ts AS resp_ts"]


def inner_pairs(reqs: list[Record], resps: list[Record], holds: Callable[[Record, Record], bool]) -> list[Record]:
    return sorted_rows(
        [
            {"id": q["id"], "req_ts": q["ts"], "resp_ts": p["ts"]}
            for q in reqs
            for p in resps
            if q["id"] == p["id"] and holds(q, p)
        ]
    )


# Responses at these offsets (s) from their request: each bound below takes some, ends included.
OFFSETS = [-6, -5, -0.001, 0, 4, 10, 10.001, 25, 31]


# Each request's expiry (s after it): id 7's response (25 s) comes after it.
EXPIRES = [60, 60, 60, 60, 60, 60, 60, 20, 60]


def requests_and_responses(expires: bool = False) -> tuple[list[Record], list[Record]]:
    reqs, resps = [], []
    for i, offset in enumerate(OFFSETS):
        req: Record = {"id": i, "ts": 100 * SECOND + i * SECOND}
        if expires:
            req["expires"] = req["ts"] + EXPIRES[i] * SECOND
        reqs.append(req)
        resps.append({"id": i, "ts": req["ts"] + round(offset * SECOND)})
    resps.append({"id": 99, "ts": 100 * SECOND})  # no request
    return reqs, resps


def test_between_bounds_the_right_event_time_on_both_sides_of_the_left(spark_session, rows, tmp_path):
    name = unique("between")
    reqs, resps = requests_and_responses()
    rows.batch("reqs", as_json(reqs)).batch("resps", as_json(resps))
    run(spark_session, joined({"between": ["-5s", "10s"], "select": SELECT}, name), rows, tmp_path / "cp")
    expected = inner_pairs(reqs, resps, lambda q, p: q["ts"] - 5 * SECOND <= p["ts"] <= q["ts"] + 10 * SECOND)
    assert table(spark_session, name) == expected
    assert len(expected) == 5


def test_until_bounds_the_right_event_time_by_a_left_column_and_at_most(spark_session, rows, tmp_path):
    name = unique("until")
    reqs, resps = requests_and_responses(expires=True)
    rows.batch("reqs", as_json(reqs)).batch("resps", as_json(resps))
    join = {"until": {"column": "expires", "atMost": "30s"}, "select": SELECT}
    run(spark_session, joined(join, name, extra=", expires TIMESTAMP"), rows, tmp_path / "cp")
    expected = inner_pairs(
        reqs, resps, lambda q, p: q["ts"] <= p["ts"] <= q["expires"] and p["ts"] - q["ts"] <= 30 * SECOND
    )
    assert table(spark_session, name) == expected
    assert [r["id"] for r in expected] == [3, 4, 5, 6]  # 7: after its expiry; 8: after atMost


def test_same_window_left_outer_join_matches_equal_windows_and_emits_the_rest_once_closed(
    spark_session, rows, tmp_path
):
    name = unique("same_window")
    reqs = [{"id": 1, "ts": 1 * SECOND}, {"id": 2, "ts": 9_999}, {"id": 3, "ts": 12 * SECOND}, {"id": 4, "ts": 25_000}]
    resps = [
        {"id": 1, "ts": 9 * SECOND},
        {"id": 2, "ts": 10 * SECOND},
        {"id": 3, "ts": 19_999},
        {"id": 5, "ts": 21_000},
    ]
    closing = [{"id": 100, "ts": 60 * SECOND}]  # moves the watermark past every window above
    rows.batch("reqs", as_json(reqs)).batch("resps", as_json(resps))
    rows.batch("reqs", as_json(closing)).batch("resps", as_json(closing))
    run(spark_session, joined({"sameWindow": "10s", "type": "leftOuter"}, name, watermark="1s"), rows, tmp_path / "cp")

    def window(ms: int) -> int:
        return ms // (10 * SECOND) * 10 * SECOND

    expected = []
    for q in [*reqs, *closing]:
        matches = [p for p in [*resps, *closing] if p["id"] == q["id"] and window(p["ts"]) == window(q["ts"])]
        for p in matches or [{"id": None, "ts": None}]:
            start = window(q["ts"])
            expected.append(
                {
                    "window_start": start,
                    "window_end": start + 10 * SECOND,
                    "id": q["id"],
                    "ts": q["ts"],
                    "resps_id": p["id"],
                    "resps_ts": p["ts"],
                }
            )
    assert table(spark_session, name) == sorted_rows(expected)
    assert [r["id"] for r in expected if r["resps_id"] is None] == [2, 4]


@pytest.mark.parametrize(
    ("join", "message"),
    [
        ({"until": {"column": "deadline", "atMost": "1m"}}, "join.until.column: unknown column 'deadline'"),
        ({"until": {"column": "id", "atMost": "1m"}}, "join.until.column: 'id' is of type int, not a timestamp"),
    ],
)
def test_an_until_column_that_is_no_timestamp_of_the_left_is_refused_at_its_path(spark_session, rows, join, message):
    with pytest.raises(PipelineInvalid) as refused:
        compile_rows(spark_session, joined(join, "t_refused"), rows)
    [problem] = [str(p) for p in refused.value.problems]
    assert problem.startswith(f"nodes[2].{message}"), problem


def test_a_bound_without_watermarks_is_refused_at_the_bound(spark_session, rows):
    pipeline = joined({"between": ["-1s", "1s"]}, "t_refused")
    del pipeline["nodes"][1]["fromKafka"]["watermark"]
    with pytest.raises(PipelineInvalid) as refused:
        compile_rows(spark_session, pipeline, rows)
    assert [str(p) for p in refused.value.problems] == [
        "nodes[2].join.between: input 'resps' needs an event time with a watermark (set eventTime and watermark on "
        "its source)"
    ]
