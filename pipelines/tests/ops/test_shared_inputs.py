"""One node's output feeding several stateful paths of one query (issue #14 §2): every stateful operator drops
the late rows and evicts its state.

Spark 4.2's exchange reuse reads the second path's shuffles through a ReusedExchange, where the per-operator
watermark simulation stops: that path's operator runs with watermark 0 (nothing dropped, nothing evicted).
sluice starts its queries with spark.sql.exchange.reuse=false (queries.STREAMING_QUERY_CONF).

Each shape: state from the first batch, the watermark moved to ~99 s (batch 1), a batch run with it (batch 2,
which evicts the first batch's state), then late rows (batch 3: Spark 4 judges late rows against the previous
batch's watermark, 99 s) that would each add an output row if an operator let them through.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from rows import at, run, sorted_rows, table, timed_source, unique

from sluice.pipelines import queries as sluice_queries
from sluice.pipelines.queries import query_conf

pytestmark = pytest.mark.spark

SECOND = 1000


def source(name: str, schema: str = "id INT") -> dict:
    return timed_source(name, schema)


def ids(*pairs: tuple[int, float]) -> list[dict]:
    return [{"id": i, "ts": at(seconds)} for i, seconds in pairs]


def words(*pairs: tuple[str, float]) -> list[dict]:
    return [{"word": w, "ts": at(seconds)} for w, seconds in pairs]


def two_joins(rows, name: str) -> tuple[dict, list[dict]]:
    """The same two sources joined once per order in time (a response after its request, or before), then a
    union: the second join's inputs are the first one's shuffles."""
    rows.batch("reqs", ids((1, 0), (2, 3))).batch("resps", ids((1, 2), (2, 1)))
    rows.batch("reqs", ids((10, 100))).batch("resps", ids((10, 100)))
    rows.batch("reqs", ids((11, 102))).batch("resps", ids((12, 102)))
    rows.batch("reqs", ids((3, 50), (4, 51))).batch("resps", ids((3, 51), (4, 50)))  # late: each pair would match

    def join(left: str, right: str, path: str) -> dict:
        return {
            "name": f"{left}-first",
            "inputs": [left, right],
            "join": {
                "condition": f"{left}.id = {right}.id",
                "within": "10s",
                "select": [f"{left}.id AS id", f"'{path}' AS path", f"{left}.ts AS ts"],
            },
        }

    pipeline = {
        "nodes": [
            source("reqs"),
            source("resps"),
            join("reqs", "resps", "request first"),
            join("resps", "reqs", "response first"),
            {"name": "both", "inputs": ["reqs-first", "resps-first"], "union": {}},
            {"name": "out", "inputs": ["both"], "toMemory": {"table": name}},
        ]
    }
    expected = [
        {"id": 1, "path": "request first", "ts": 0},
        {"id": 2, "path": "response first", "ts": 1 * SECOND},
        {"id": 10, "path": "request first", "ts": 100 * SECOND},
        {"id": 10, "path": "response first", "ts": 100 * SECOND},
    ]
    return pipeline, expected


def dedupe_and_join(rows, name: str) -> tuple[dict, list[dict]]:
    """One node deduplicated by id and joined on id: the dedupe's input is the join's shuffle of that node.
    (The filter holds what the join's condition implies, else the join's side would differ by inferred
    not-null filters and there would be nothing to reuse.)"""
    rows.batch("clicks", ids((1, 0), (1, 1), (2, 2))).batch("views", ids((1, 3)))
    rows.batch("clicks", ids((10, 100))).batch("views", ids((10, 100)))
    rows.batch("clicks", ids((11, 102))).batch("views", ids((12, 102)))
    rows.batch("clicks", ids((1, 50), (3, 51))).batch("views", ids((3, 52)))  # late: new ids to both
    pipeline = {
        "nodes": [
            source("clicks"),
            source("views"),
            {"name": "known", "inputs": ["clicks"], "filter": "id IS NOT NULL AND ts IS NOT NULL"},
            {
                "name": "viewed",
                "inputs": ["known", "views"],
                "join": {
                    "condition": "known.id = views.id",
                    "within": "10s",
                    "select": ["known.id AS id", "'viewed' AS path", "known.ts AS ts"],
                },
            },
            {"name": "unique", "inputs": ["known"], "dedupe": {"keys": ["id"]}},
            {"name": "firsts", "inputs": ["unique"], "select": ["id", "'first' AS path", "ts"]},
            {"name": "both", "inputs": ["viewed", "firsts"], "union": {}},
            {"name": "out", "inputs": ["both"], "toMemory": {"table": name}},
        ]
    }
    expected = [
        {"id": 1, "path": "viewed", "ts": 0},
        {"id": 1, "path": "viewed", "ts": 1 * SECOND},
        {"id": 10, "path": "viewed", "ts": 100 * SECOND},
        {"id": 1, "path": "first", "ts": 0},
        {"id": 2, "path": "first", "ts": 2 * SECOND},
        {"id": 10, "path": "first", "ts": 100 * SECOND},
        {"id": 11, "path": "first", "ts": 102 * SECOND},
    ]
    return pipeline, expected


def two_windowed_counts(rows, name: str) -> tuple[dict, list[dict]]:
    """The same windowed count twice, each kept for other windows (n >= 2, n < 2), then a union."""
    rows.batch("events", words(("a", 1), ("a", 2), ("b", 3)))
    rows.batch("events", words(("z", 100)))
    rows.batch("events", words(("z", 102)))  # run with watermark 99 s: [0 s, 10 s) closes
    rows.batch("events", words(("a", 5), ("a", 50), ("a", 51), ("b", 52)))  # late: their windows have closed

    def count(node: str) -> dict:
        return {
            "name": node,
            "inputs": ["events"],
            "aggregate": {"groupBy": ["word"], "window": {"tumbling": "10s"}, "aggregations": {"n": "count(*)"}},
        }

    pipeline = {
        "nodes": [
            source("events", "word STRING"),
            count("counts"),
            count("counts-again"),
            {"name": "many", "inputs": ["counts"], "filter": "n >= 2"},
            {"name": "few", "inputs": ["counts-again"], "filter": "n < 2"},
            {"name": "both", "inputs": ["many", "few"], "union": {}},
            {"name": "out", "inputs": ["both"], "toMemory": {"table": name}},
        ]
    }
    expected = [
        {"window_start": 0, "window_end": 10 * SECOND, "window_time": 10 * SECOND - 1, "word": "a", "n": 2},
        {"window_start": 0, "window_end": 10 * SECOND, "window_time": 10 * SECOND - 1, "word": "b", "n": 1},
    ]
    return pipeline, expected


SHAPES = {"two_joins": two_joins, "dedupe_and_join": dedupe_and_join, "two_windowed_counts": two_windowed_counts}
STATEFUL_OPERATORS = 2  # per shape


def per_operator(query: Any) -> list[dict[str, Any]]:
    """Each stateful operator's late rows dropped and state rows removed, summed over the query's batches."""
    progresses = [p for p in query.recentProgress if p.stateOperators]
    count = max(len(p.stateOperators) for p in progresses)
    totals = []
    for i in range(count):
        ops = [p.stateOperators[i] for p in progresses if len(p.stateOperators) > i]
        totals.append(
            {
                "operator": ops[0].operatorName,
                "dropped": sum(o.numRowsDroppedByWatermark for o in ops),
                "removed": sum(o.numRowsRemoved for o in ops),
            }
        )
    return totals


def executed_plan(query: Any) -> str:
    return query._jsq.streamingQuery().lastExecution().executedPlan().toString()


@pytest.mark.parametrize("shape", SHAPES)
def test_every_stateful_path_drops_late_rows_and_evicts_state(spark_session, rows, tmp_path, shape):
    name = unique(shape)
    pipeline, expected = SHAPES[shape](rows, name)
    (query,) = run(spark_session, pipeline, rows, tmp_path / "cp")
    assert "ReusedExchange" not in executed_plan(query)
    operators = per_operator(query)
    assert len(operators) == STATEFUL_OPERATORS, operators
    for operator in operators:
        assert operator["dropped"] > 0 and operator["removed"] > 0, operators
    assert table(spark_session, name) == sorted_rows(expected)
    assert spark_session.conf.get("spark.sql.exchange.reuse") == "true"  # the session's own setting is back


@pytest.mark.parametrize("shape", SHAPES)
def test_spark_loses_the_watermark_of_an_operator_behind_a_reused_exchange(
    spark_session, rows, tmp_path, shape, monkeypatch
):
    """Documents Spark 4.2's defect that sluice works around: with exchange reuse left on, the path read
    through the ReusedExchange drops no late rows and evicts no state. When this fails, Spark fixed it (and
    STREAMING_QUERY_CONF may go)."""
    monkeypatch.setattr(sluice_queries, "STREAMING_QUERY_CONF", {})
    name = unique(shape)
    pipeline, _ = SHAPES[shape](rows, name)
    (query,) = run(spark_session, pipeline, rows, tmp_path / "cp")
    assert "ReusedExchange" in executed_plan(query)
    operators = per_operator(query)
    assert len(operators) == STATEFUL_OPERATORS, operators
    assert any(op["dropped"] == 0 and op["removed"] == 0 for op in operators), operators


def test_the_setting_holds_for_a_query_start_only_and_overrides_the_session_with_a_warning(
    spark_session, monkeypatch, caplog
):
    monkeypatch.setattr(sluice_queries, "_warned", set())
    key = "spark.sql.exchange.reuse"
    spark_session.conf.set(key, "true")  # as an app's sparkConf would
    try:
        with caplog.at_level(logging.WARNING, logger=sluice_queries.__name__):
            for _ in range(2):
                with query_conf(spark_session):
                    assert spark_session.conf.get(key) == "false"
                assert spark_session.conf.get(key) == "true"
    finally:
        spark_session.conf.unset(key)
    assert [r.levelname for r in caplog.records if key in r.getMessage()] == ["WARNING"]  # once
    with query_conf(spark_session):
        pass
    assert key not in spark_session.conf.getAll  # unset again, as it was
