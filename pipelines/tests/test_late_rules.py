"""Which stateful step decides lateness for a source, per sink query (pure: no Spark)."""

from __future__ import annotations

from typing import Any

from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.late_rules import LateRule, late_rules

SOURCE = {
    "name": "events",
    "fromKafka": {
        "topic": "t",
        "format": "json",
        "schema": "id STRING, kind STRING, ts TIMESTAMP",
        "eventTime": "ts",
        "watermark": "2s",
    },
}


def rules(*nodes: dict[str, Any]) -> tuple[LateRule, ...]:
    spec = PipelineSpec.model_validate(
        {"nodes": [SOURCE, *nodes], "deadLetter": {"toConsole": {}, "lateRecords": True}}
    )
    return late_rules(spec, "events")


def sink(name: str, upstream: str) -> dict[str, Any]:
    return {"name": name, "inputs": [upstream], "toConsole": {}}


def test_each_sink_query_with_its_first_stateful_step_and_the_filters_before_it() -> None:
    sliding = {"sliding": {"size": "10s", "slide": "5s"}}
    got = rules(
        {"name": "kept", "inputs": ["events"], "filter": "kind = 'a'"},
        {"name": "real", "inputs": ["kept"], "filter": "id IS NOT NULL"},
        {
            "name": "per-id",
            "inputs": ["real"],
            "aggregate": {"groupBy": ["id"], "window": sliding, "aggregations": {"n": "count(*)"}},
        },
        sink("a", "per-id"),
        {"name": "shaped", "inputs": ["events"], "select": ["id", "kind", "ts"]},
        {"name": "late-filter", "inputs": ["shaped"], "filter": "kind = 'b'"},
        {"name": "unique", "inputs": ["late-filter"], "dedupe": {"keys": ["id"]}},
        sink("b", "unique"),
        {"name": "totals", "inputs": ["events"], "aggregate": {"groupBy": ["id"], "aggregations": {"n": "count(*)"}}},
        sink("c", "totals"),
        {"name": "by-time", "inputs": ["events"], "aggregate": {"groupBy": ["ts"], "aggregations": {"n": "count(*)"}}},
        sink("d", "by-time"),
        sink("e", "kept"),
    )
    assert got == (
        LateRule("a", 10_000, 5_000, filters=("kind = 'a'", "id IS NOT NULL")),
        LateRule("b"),  # the filter after the select cannot be read on the source's columns
        LateRule("d"),  # c: an aggregation without the event time in its keys drops nothing; e: stateless
    )


def test_tumbling_and_session_windows() -> None:
    def window(spec: dict[str, Any]) -> tuple[LateRule, ...]:
        return rules(
            {"name": "w", "inputs": ["events"], "aggregate": {"window": spec, "aggregations": {"n": "count(*)"}}},
            sink("out", "w"),
        )

    assert window({"tumbling": "5s"}) == (LateRule("out", 5_000, 5_000),)
    assert window({"session": "30s"}) == (LateRule("out", 30_000),)
