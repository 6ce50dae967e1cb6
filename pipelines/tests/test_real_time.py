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
from confluent_kafka import Producer
from test_validation import assert_problems, problems_of

from sluice.api.pipeline import PipelineSpec
from sluice.api.validation import PipelineInvalid, document_from, validate
from sluice.pipelines.local.kafka_io import consume_all, create_topic, produce
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.pipelines.realtime import query_sources, slot_problems

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


# --------------------------------------------------------------------------------- running

ITEMS = {"tea": "Green tea", "cake": "Carrot cake"}  # the lookup table; "jam" has no row
INTERVAL_S = 60  # the checkpoint interval: the whole test runs inside the first one
RECORDS = 3000
CHUNK = 50
PACE_S = 0.1  # one chunk every PACE_S: ~6 s of paced input


def order(i: int) -> dict[str, Any]:
    return {"id": i, "item": ("tea", "cake", "jam")[i % 3], "qty": i % 4}  # qty 0 is filtered out


def expected_rows(orders: list[dict[str, Any]]) -> list[tuple]:
    return sorted(
        (o["id"], o["item"], unit, ITEMS.get(o["item"]))
        for o in orders
        if o["qty"] > 0
        for unit in range(1, o["qty"] + 1)
    )


def start_real_time(spark, data: dict[str, Any], bootstrap: str, checkpoints: Path) -> PipelineRun:
    document = document_from(data, "realtime.yaml")
    return PipelineRun.from_document(spark, document, checkpoint_root=str(checkpoints), bootstrap_servers=bootstrap)


@pytest.mark.spark
def test_a_stateless_pipeline_runs_in_real_time_mode(spark_session, kafka_bootstrap, new_topic, tmp_path) -> None:
    """Two 1-partition topics (2 tasks: the session's 2 slots), union, filter, explode, lookup, projection, into
    Kafka with Spark's sink. Every record comes out once and while the first checkpoint interval still runs;
    latency from the input's Kafka timestamp (the producer's) to the output's (the broker's log-append time)."""
    items = tmp_path / "items.csv"
    items.write_text("item,label\n" + "".join(f"{k},{v}\n" for k, v in ITEMS.items()))
    orders_topic, refunds_topic = new_topic(partitions=1), new_topic(partitions=1)
    out_topic = f"rt-out-{time.time_ns()}"
    create_topic(kafka_bootstrap, out_topic, 1, config={"message.timestamp.type": "LogAppendTime"})
    data = stateless(str(items), out_topic, orders_topic, refunds_topic)
    data["trigger"] = {"realTime": f"{INTERVAL_S}s"}
    inputs = [order(i) for i in range(RECORDS)]
    want = expected_rows(inputs)

    run = start_real_time(spark_session, data, kafka_bootstrap, tmp_path / "checkpoints").start()
    try:
        [query] = run.queries
        # The first record out shows the tasks run; from then on records are paced in.
        produce(kafka_bootstrap, orders_topic, [json.dumps(order(1)).encode()])
        first = consume_all(kafka_bootstrap, out_topic, expected=1, timeout_s=60)
        assert first and json.loads(first[0].value or b"{}")["id"] == 1
        # One connected producer sending at once: a record's timestamp is taken as it is handed to the client.
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
        producer.list_topics(timeout=10)
        started = time.monotonic()
        for n, at in enumerate(range(0, RECORDS, CHUNK)):
            topic = orders_topic if n % 2 == 0 else refunds_topic
            for o in inputs[at : at + CHUNK]:
                producer.produce(topic, json.dumps(o).encode())
            producer.poll(0)
            time.sleep(max(0.0, started + (n + 1) * PACE_S - time.monotonic()))
        assert producer.flush(30) == 0
        records = consume_all(kafka_bootstrap, out_topic, expected=1 + len(want), timeout_s=30)[1:]
        assert query.isActive and query.exception() is None
        assert query.lastProgress is None, "a checkpoint interval ended before the records came out"
    finally:
        run.stop(boundary_timeout=0)

    got = [json.loads(r.value or b"{}") for r in records]
    assert sorted((g["id"], g["item"], g["unit"], g.get("label")) for g in got) == want
    latencies = sorted(r.timestamp_ms - g["sent"] for r, g in zip(records, got, strict=True))
    cuts = statistics.quantiles(latencies, n=100)
    p50, p99 = cuts[49], cuts[98]
    print(f"\nreal-time mode: {len(latencies)} records, latency p50 {p50:.0f} ms, p99 {p99:.0f} ms")
    assert p99 < INTERVAL_S * 1000 / 10  # well inside the interval, the latency of a micro-batch at that trigger


@pytest.mark.spark
def test_more_partitions_than_task_slots_is_refused_at_start(spark_session, kafka_bootstrap, new_topic, tmp_path):
    """The session has 2 task slots; a 3-partition topic needs 3 tasks at once."""
    data = stateless(str(tmp_path / "items.csv"), "unused", new_topic(partitions=3))
    data["nodes"] = [n for n in data["nodes"] if n["name"] not in ("refunds", "all", "named")]
    data["nodes"][1]["inputs"] = ["orders"]  # orders -> some -> units -> rows -> out
    data["nodes"][3]["inputs"] = ["units"]
    data["nodes"][3]["select"] = ["id", "unit"]
    run = start_real_time(spark_session, data, kafka_bootstrap, tmp_path / "checkpoints")
    with pytest.raises(PipelineInvalid) as info:
        run.start()
    [problem] = info.value.problems
    assert problem.path == "trigger.realTime"
    assert "3 tasks (partitions by source: orders (nodes[0]): 3), but Spark has 2 task slots" in problem.message
    assert run.queries == [] and spark_session.streams.active == []
