"""Real-time mode (trigger.realTime): which pipelines may run in it (validation, pure), the task-slot check,
and a real run from Kafka to Kafka on local Spark with its latency measured."""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from test_validation import assert_problems, problems_of

from sluice.pipelines.local.kafka_io import consume_all, create_topic, produce
from sluice.pipelines.realtime import query_sources, slot_problems
from sluice.pipelines.runtime import PipelineRun
from sluice.pipelines.spec import PipelineSpec
from sluice.pipelines.validation import PipelineInvalid, document_from, validate

PREFIX = "spec.pipeline"
SCHEMA = "id INT, item STRING, qty INT"


def source(name: str, topic: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "fromKafka": {"topic": topic, "format": "json", "schema": SCHEMA, **extra}}


def stateless(lookup_path: str, out_topic: str, orders: str = "orders", refunds: str = "refunds") -> dict[str, Any]:
    """Every kind of node real-time mode takes: two sources, a union, a filter, an explode, a lookup, a
    projection, a Kafka sink (and a console sink in the validation test)."""
    return {
        "trigger": {"realTime": "60s"},
        "nodes": [
            source("orders", orders, metadata=["timestamp"]),
            source("refunds", refunds, metadata=["timestamp"]),
            {"name": "all", "inputs": ["orders", "refunds"], "union": {}},
            {"name": "some", "inputs": ["all"], "filter": "qty > 0"},
            {"name": "units", "inputs": ["some"], "explode": {"column": "unit", "from": "sequence(1, qty)"}},
            {"name": "named", "inputs": ["units"], "lookup": {"path": lookup_path, "keys": ["item"]}},
            {
                "name": "rows",
                "inputs": ["named"],
                "select": ["id", "item", "unit", "label", "unix_millis(kafka_timestamp) AS sent"],
            },
            {"name": "out", "inputs": ["rows"], "toKafka": {"topic": out_topic, "delivery": "atLeastOnce"}},
        ],
    }


# ------------------------------------------------------------------------------- validation


def test_a_stateless_pipeline_is_valid_in_real_time_mode() -> None:
    data = stateless("items.csv", "out")
    data["nodes"].append({"name": "shown", "inputs": ["rows"], "toConsole": {"outputMode": "update"}})
    assert validate(data, PREFIX).trigger.realTime == "60s"


def everything_refused() -> dict[str, Any]:
    """A pipeline valid with a processingTime trigger, where each node but one source and a filter keeps it
    from real-time mode."""
    return {
        "trigger": {"realTime": "5s"},
        "nodes": [
            {"name": "a", "fromKafka": {"topic": "a", "format": "json", "schema": "id STRING, ts TIMESTAMP",
                                        "eventTime": "ts", "watermark": "5s", "maxRecordsPerTrigger": 100,
                                        "minPartitions": 4}},
            {"name": "b", "fromKafka": {"topic": "b", "format": "json", "schema": "id STRING, ts TIMESTAMP",
                                        "eventTime": "ts", "watermark": "5s"}},
            {"name": "joined", "inputs": ["a", "b"], "join": {"condition": "a.id = b.id", "within": "10s"}},
            {"name": "counts", "inputs": ["joined"],
             "aggregate": {"groupBy": ["id"], "window": {"tumbling": "5s"}, "aggregations": {"c": "count(*)"}}},
            {"name": "top", "inputs": ["counts"], "topN": {"limit": 3, "orderBy": ["c DESC"]}},
            {"name": "top-out", "inputs": ["top"], "toFiles": {"path": "/tmp/top"}},
            {"name": "unique", "inputs": ["b"], "dedupe": {"keys": ["id"]}},
            {"name": "py", "inputs": ["unique"], "python": {"function": "transforms:identity"}},
            {"name": "py-out", "inputs": ["py"], "toMemory": {"table": "t"}},
            {"name": "kept", "inputs": ["a"], "filter": "id IS NOT NULL"},
            {"name": "enriched", "inputs": ["kept"], "lookup": {"path": "t.csv", "keys": ["id"], "broadcast": False}},
            {"name": "eo", "inputs": ["enriched"], "toKafka": {"topic": "out"}},
            {"name": "shown", "inputs": ["enriched"], "toConsole": {"outputMode": "append"}},
            {"name": "al", "inputs": ["kept"], "toKafka": {"topic": "o2", "delivery": "atLeastOnce",
                                                          "outputMode": "complete"}},
        ],
        "deadLetter": {"toKafka": {"topic": "dead", "delivery": "atLeastOnce"}},
    }  # fmt: skip


def test_every_node_that_prevents_real_time_mode_is_reported_at_its_path() -> None:
    data = everything_refused()
    at = f"{PREFIX}.nodes"
    not_supported = "not supported in real-time mode (trigger.realTime): "
    assert_problems(
        problems_of(data),
        [
            (f"{at}[0].fromKafka.maxRecordsPerTrigger", not_supported + "a batch reads what arrives during"),
            (f"{at}[0].fromKafka.minPartitions", not_supported + "one task reads each Kafka partition"),
            (f"{at}[2].join", not_supported + "a stream-stream join keeps state"),
            (f"{at}[3].aggregate", not_supported + "an aggregation keeps state"),
            (f"{at}[4].topN", not_supported + "topN runs once per micro-batch"),
            (f"{at}[5].toFiles", not_supported + "Spark's file sink is not one of real-time mode's sinks"),
            (f"{at}[6].dedupe", not_supported + "dedupe keeps state"),
            (f"{at}[7].python", not_supported + "a python transform cannot be proven stateless"),
            (f"{at}[8].toMemory", not_supported + "Spark's memory sink is not one of real-time mode's sinks"),
            (f"{at}[10].lookup.broadcast", "a lookup in real-time mode (trigger.realTime) must be broadcast"),
            (f"{at}[11].toKafka.delivery", "set delivery: atLeastOnce: in real-time mode"),
            (f"{at}[12].toConsole.outputMode", "in real-time mode (trigger.realTime) the output mode is update"),
            (f"{at}[13].toKafka.outputMode", "in real-time mode (trigger.realTime) the output mode is update"),
            (f"{PREFIX}.deadLetter", not_supported + "the dead-letter query runs per micro-batch"),
        ],
    )


def test_the_rules_hold_for_real_time_mode_only() -> None:
    data = everything_refused()
    data["trigger"] = {"processingTime": "5s"}
    validate(data, PREFIX)


# ------------------------------------------------------------------------------ task slots


def test_each_query_needs_a_slot_per_partition_of_its_sources() -> None:
    data = copy.deepcopy(stateless("items.csv", "out"))
    data["nodes"].append({"name": "shown", "inputs": ["orders"], "toConsole": {}})
    spec = PipelineSpec.model_validate(data)
    assert query_sources(spec) == {"out": [0, 1], "shown": [0]}
    partitions = {0: 3, 1: 2}.get  # out reads 3 + 2 partitions, shown 3 more: 8 tasks
    assert slot_problems(spec, PREFIX, 8, partitions) == []
    [problem] = slot_problems(spec, PREFIX, 7, partitions)
    assert problem.path == f"{PREFIX}.trigger.realTime"
    assert "8 tasks (partitions by source: orders (spec.pipeline.nodes[0]): 3, refunds" in problem.message
    assert "but Spark has 7 task slots" in problem.message
    data["trigger"] = {"processingTime": "1s"}
    assert slot_problems(PipelineSpec.model_validate(data), PREFIX, 1, partitions) == []
