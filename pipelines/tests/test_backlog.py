"""Kafka backlog and the other figures /v1/status derives from query progress (pure functions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.api.contract import ExecutorStatus, TopicStatus
from sluice.api.pipeline import FromKafka, PipelineSpec, ProcessingTime
from sluice.pipelines.control.backlog import kafka_offsets, source_partitions, source_topics, topic_backlogs
from sluice.pipelines.control.executors import host_of, least_loaded
from sluice.pipelines.control.latest import LatestOffsets, LatestOffsetsUnavailable
from sluice.pipelines.control.status import partitions_by_bootstrap, source_tasks
from sluice.pipelines.metrics import PipelineMetrics, QueryRecord, RunningBatches
from sluice.testbed.common import free_port

WORDCOUNT = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "wordcount.yaml"


def kafka_source(
    end: dict[str, dict[str, int]] | None, latest: dict[str, dict[str, int]] | None, behind: int = 0
) -> dict[str, Any]:
    """A Kafka source of a progress event as Spark writes it (offset maps keyed topic -> partition)."""
    return {
        "description": "KafkaV2[Subscribe[t]]",
        "startOffset": None,
        "endOffset": end,
        "latestOffset": latest,
        "metrics": {"maxOffsetsBehindLatest": str(behind)},
    }


def progress(name: str, *sources: dict[str, Any], rows: int = 0, busy_ms: int = 0) -> dict[str, Any]:
    return {
        "name": name,
        "id": f"id-{name}",
        "batchId": 0,
        "numInputRows": rows,
        "sources": list(sources),
        "durationMs": {"triggerExecution": busy_ms},
    }


def test_a_topic_read_by_two_queries_counts_once_behind_the_slower_one():
    latest = {"lines": {"0": 100, "1": 80, "2": 50}}
    sink = progress("out", kafka_source({"lines": {"0": 90, "1": 80, "2": 40}}, latest))
    dead_letters = progress("dead", kafka_source({"lines": {"0": 95, "1": 70, "2": 50}}, latest))
    assert topic_backlogs([sink, dead_letters]) == [
        TopicStatus(topic="lines", partitions=3, latestOffsets=230, backlog=(100 - 90) + (80 - 70) + (50 - 40))
    ]


def test_backlog_sums_every_partition_not_the_worst_one():
    # Spark's maxOffsetsBehindLatest would say 5 here: the backlog is 4 partitions x 5.
    latest = {"t": {str(p): 10 for p in range(4)}}
    backlog = topic_backlogs([progress("q", kafka_source({"t": {str(p): 5 for p in range(4)}}, latest, behind=5))])
    assert [(t.topic, t.partitions, t.backlog) for t in backlog] == [("t", 4, 20)]


def test_each_topic_of_a_query_and_of_several_sources():
    joined = progress(
        "join",
        kafka_source({"requests": {"0": 3}}, {"requests": {"0": 10}}),
        kafka_source({"responses": {"0": 7, "1": 1}}, {"responses": {"0": 7, "1": 4}}),
    )
    assert {t.topic: t.backlog for t in topic_backlogs([joined])} == {"requests": 7, "responses": 3}


def test_missing_latest_offsets_leave_the_end_offsets():
    unknown_latest = progress("q", kafka_source({"t": {"0": 40}}, None))
    assert topic_backlogs([unknown_latest]) == [TopicStatus(topic="t", partitions=1, latestOffsets=40, backlog=0)]
    # Another query knows the latest offsets: they count against the slowest end offset.
    knows = progress("r", kafka_source({"t": {"0": 45}}, {"t": {"0": 50}}))
    assert topic_backlogs([unknown_latest, knows])[0].backlog == 10


def test_a_partition_no_query_has_read_counts_from_zero():
    grown = progress("q", kafka_source({"t": {"0": 10}}, {"t": {"0": 10, "1": 6}}))
    assert topic_backlogs([grown])[0] == TopicStatus(topic="t", partitions=2, latestOffsets=16, backlog=6)


def test_kafka_end_offsets_now_count_what_arrived_since_the_last_batch_began():
    # The last batch read everything it saw (end == latest): by progress alone nothing is behind.
    caught_up = progress("q", kafka_source({"t": {"0": 100, "1": 50}}, {"t": {"0": 100, "1": 50}}))
    assert topic_backlogs([caught_up])[0].backlog == 0
    now = {("t", 0): 160, ("t", 1): 70}
    assert topic_backlogs([caught_up], now) == [TopicStatus(topic="t", partitions=2, latestOffsets=230, backlog=80)]
    # Kafka's last stable offset below what a (read_uncommitted) query read: nothing behind, never negative.
    assert topic_backlogs([caught_up], {("t", 0): 90, ("t", 1): 50})[0].backlog == 0


def test_source_partitions_and_their_kafka_clusters():
    joined = progress(
        "join", kafka_source({"a": {"0": 1}}, {"a": {"0": 1, "1": 2}}), kafka_source(None, {"b": {"0": 3}})
    )
    assert source_partitions([joined]) == {("a", 0), ("a", 1), ("b", 0)}
    sources = [FromKafka(topic="a"), FromKafka(pattern="b.*", bootstrapServers="other:9092")]
    assert partitions_by_bootstrap(source_partitions([joined]), sources, "app:9092") == {
        "app:9092": [("a", 0), ("a", 1)],
        "other:9092": [("b", 0)],
    }


def test_kafka_that_does_not_answer_in_time_says_so():
    unused_port = free_port()
    latest = LatestOffsets(timeout=0.5)
    with pytest.raises(LatestOffsetsUnavailable, match=f"127.0.0.1:{unused_port}"):
        latest.get({f"127.0.0.1:{unused_port}": [("t", 0)]})
    assert latest.get({}) == {}  # no partitions known yet: nothing to ask


def batch(started: str, took_ms: int, rows: int = 10) -> dict[str, Any]:
    return {"name": "q", "timestamp": started, "numInputRows": rows, "durationMs": {"triggerExecution": took_ms}}


T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def test_busy_time_grows_while_a_batch_runs_and_never_goes_back():
    running = RunningBatches()
    record = QueryRecord({}).add(batch("2026-01-01T00:00:00.000Z", 2_000))  # 0 s to 2 s
    assert running.busy_ms("q", record, T0 + 5) == (2_000, 0)
    running.observe("q", True, T0 + 10)  # a 30 s batch begins
    assert running.busy_ms("q", record, T0 + 15) == (7_000, 5_000)
    assert running.busy_ms("q", record, T0 + 35) == (27_000, 25_000)
    running.observe("q", False, T0 + 40.2)  # ended; its progress is late
    assert running.busy_ms("q", record, T0 + 40.3) == (27_000, 0)
    done = record.add(batch("2026-01-01T00:00:10.000Z", 30_000))
    assert running.busy_ms("q", done, T0 + 41) == (32_000, 0)


def test_back_to_back_batches_count_from_the_previous_end_not_twice():
    running = RunningBatches()
    running.observe("q", True, T0)  # the trigger never looks inactive from here on
    first = QueryRecord({}).add(batch("2026-01-01T00:00:00.000Z", 30_000))
    assert running.busy_ms("q", first, T0 + 40) == (40_000, 10_000)
    second = first.add(batch("2026-01-01T00:00:30.000Z", 30_000))
    assert running.busy_ms("q", second, T0 + 65) == (65_000, 5_000)


def test_no_progress_and_non_kafka_sources_have_no_topics():
    rate = {"description": "RateStreamV2", "endOffset": 12, "latestOffset": 12}
    assert topic_backlogs([]) == []
    assert topic_backlogs([progress("q", rate), {"name": "first"}]) == []


def test_offsets_as_json_text_and_junk():
    assert kafka_offsets('{"t": {"1": 5, "0": 2}}') == {("t", 1): 5, ("t", 0): 2}
    assert kafka_offsets("not json") == {}
    assert kafka_offsets({"t": {"x": 1, "0": True, "1": 3}}) == {("t", 1): 3}
    assert source_topics(progress("q", kafka_source({"b": {"0": 1}}, {"a": {"0": 1}}))) == ["a", "b"]


def test_metrics_keep_totals_and_export_the_backlog_per_topic():
    metrics = PipelineMetrics("app")
    latest = {"lines": {"0": 30, "1": 30}}
    metrics.record_progress(progress("out", kafka_source({"lines": {"0": 10, "1": 10}}, latest), rows=20, busy_ms=7))
    metrics.record_progress(progress("out", kafka_source({"lines": {"0": 20, "1": 20}}, latest), rows=20, busy_ms=5))
    metrics.record_progress(progress("dead", kafka_source({"lines": {"0": 30, "1": 25}}, latest), rows=55))
    record = metrics.queries()["out"]
    assert (record.batches, record.input_rows, record.busy_ms) == (2, 40, 12)
    assert metrics.registry.get_sample_value("sluice_kafka_backlog_records", {"app": "app", "topic": "lines"}) == 20
    resident = metrics.registry.get_sample_value("process_resident_memory_bytes")
    assert resident is not None and resident > 0, "the runner's own memory (the soak's and the dashboard's)"
    assert metrics.registry.get_sample_value("process_start_time_seconds"), "what SluiceDriverRestarted reads"


def test_source_tasks_take_partitions_or_min_partitions():
    partitions = {"a": 4, "b": 2, "c1": 3, "c2": 1, "other": 8}
    sources = [
        FromKafka(topic="a"),
        FromKafka(topic="b", minPartitions=6),
        FromKafka(topic="a,b"),
        FromKafka(pattern="c[0-9]"),
        FromKafka(topic="not-read-yet"),
    ]
    assert source_tasks(sources, partitions) == 4 + 6 + 6 + 4 + 0


def test_trigger_interval():
    assert ProcessingTime(processingTime="2s").interval_ms == 2000
    assert ProcessingTime(realTime="5m").interval_ms == 300_000
    assert ProcessingTime(availableNow=True).interval_ms is None


def test_scale_down_stops_the_least_loaded_executors_newest_first():
    executors = [
        ExecutorStatus(id="1", activeTasks=2),
        ExecutorStatus(id="2", activeTasks=0),
        ExecutorStatus(id="3", activeTasks=0),
        ExecutorStatus(id="10", activeTasks=1),
    ]
    assert least_loaded(executors, 3) == ["3", "2", "10"]
    assert least_loaded(executors, 0) == []
    assert least_loaded(executors, -2) == []


def test_host_of_executor_addresses():
    assert host_of("10.1.2.3:40787") == "10.1.2.3"
    assert host_of("10.1.2.3") == "10.1.2.3"
    assert host_of("[::1]:4000") == "::1"
    assert host_of("::1") == "::1"


def test_a_started_query_s_malformed_and_dead_letter_counters_start_at_zero():
    pipeline = PipelineSpec.model_validate(yaml.safe_load(WORDCOUNT.read_text())["spec"]["pipeline"])
    metrics = PipelineMetrics("app")
    metrics.query_started("out", pipeline)
    metrics.query_started("lines-dead-letters", pipeline)
    sample = metrics.registry.get_sample_value
    assert sample("sluice_malformed_records_total", {"app": "app", "query": "out", "source": "lines"}) == 0
    assert sample("sluice_dead_letter_records_total", {"app": "app", "source": "lines"}) == 0
    dead_letter_query = {"app": "app", "query": "lines-dead-letters", "source": "lines"}
    assert sample("sluice_malformed_records_total", dead_letter_query) is None, "it does not parse the source"
