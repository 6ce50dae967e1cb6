"""Dead letters are exactly what Spark dropped as late (issue #14 §1), on real Kafka and Spark.

Records are produced in phases, each once the pipeline has processed the previous one: stragglers sit just
before, at and after the watermark Spark applies to their batch (the previous batch's). Every input record
must then be either counted in the result or in the dead letters as late: never both, never neither.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers import BASE_MS, iso, wait_for, watermark_of
from kafka_output import read_committed
from pyspark.sql import SparkSession

from sluice.api.validation import document_from
from sluice.pipelines.checkpoints import OffsetLog, running_query_at
from sluice.pipelines.local.kafka_io import produce
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.pipelines.queries import JOIN_STATE_FORMAT

DELAY_MS, WINDOW_MS = 2_000, 5_000
_tables = itertools.count()


@dataclass(frozen=True)
class Event:
    id: str
    ms: int
    source: str = "events"  # the source node (one topic each)
    kind: str = "event"

    def value(self) -> bytes:
        return json.dumps({"id": self.id, "kind": self.kind, "ts": iso(self.ms)}).encode()


def reference_late(
    phases: Sequence[Sequence[Event]], counts: Callable[[Event], bool], late: Callable[[int, int], bool]
) -> set[Event]:
    """The records Spark drops, phase by phase: the watermark of a phase is min over sources of (max event time
    of the records that reach the stateful operation in earlier phases - delay); late(event ms, watermark)."""
    maxima: dict[str, int] = {}
    dropped = set()
    for phase in phases:
        watermark = min(maxima.values()) - DELAY_MS if maxima else None
        dropped |= {e for e in phase if counts(e) and watermark is not None and late(e.ms, watermark)}
        for e in phase:
            if counts(e):
                maxima[e.source] = max(maxima.get(e.source, e.ms), e.ms)
    return dropped


def window_closed(ms: int, watermark: int) -> bool:
    return ms - ms % WINDOW_MS + WINDOW_MS <= watermark


@dataclass
class LateRun:
    spark: SparkSession
    bootstrap: str
    topics: dict[str, str]  # source node -> topic
    tmp_path: Path

    def run(self, pipeline: dict[str, Any], phases: Sequence[Sequence[Event]], query: str) -> PipelineRun:
        """Runs the phases (each produced once the previous was processed and, when the watermark moves,
        `query` reports the new one); returns the stopped run."""
        run = PipelineRun.from_document(
            self.spark,
            document_from(pipeline, "test"),
            checkpoint_root=str(self.tmp_path / "checkpoints"),
            bootstrap_servers=self.bootstrap,
        ).start()
        try:
            for phase in phases:
                for i, event in enumerate(phase):  # keys spread a phase over both partitions
                    produce(self.bootstrap, self.topics[event.source], [(str(i).encode(), event.value())])
                run.wait_until_caught_up(240)
                wait_for(lambda: watermark_of(run, query) is not None, 240, lambda: "no watermark", run.raise_if_failed)
                previous = None
                while watermark_of(run, query) != previous:  # the no-data batch that moves it has run
                    previous = watermark_of(run, query)
                    run.wait_until_caught_up(240)
                run.raise_if_failed()
        finally:
            run.stop()
        return run


def late_dead_letters(bootstrap: str, topic: str) -> list[tuple[str, str]]:
    """(source, id) of each dead letter; every dead letter here must be a late one."""
    out = []
    for record in read_committed(bootstrap, topic):
        headers = {k: (v or b"").decode() for k, v in record.headers}
        assert headers["sluice.error"].startswith("late: "), headers["sluice.error"]
        out.append((headers["sluice.source"], json.loads(record.value or b"{}")["id"]))
    return out


def dropped_by_watermark(run: PipelineRun, query: str) -> int:
    """Spark's numRowsDroppedByWatermark over the query's batches."""
    return sum(
        op.get("numRowsDroppedByWatermark", 0)
        for q in run.queries
        if q.name == query
        for progress in q.recentProgress
        for op in progress.get("stateOperators", [])
    )


def assert_partition(inputs: set[tuple[str, str]], counted: list[tuple[str, str]], dead: list[tuple[str, str]]):
    assert len(counted) == len(set(counted)), "a record counted twice"
    assert len(dead) == len(set(dead)), "a record dead-lettered twice"
    assert not set(counted) & set(dead), f"counted and dead-lettered: {sorted(set(counted) & set(dead))}"
    assert set(counted) | set(dead) == inputs, f"neither counted nor dead: {sorted(inputs - set(counted) - set(dead))}"


def test_windowed_aggregation_behind_a_filter(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """A filter that does not touch the event time runs below Spark's watermark: left-out records move neither
    Spark's watermark nor the dead letters'. Late: the window has closed (window end <= watermark)."""
    topic, dead_topic = new_topic(partitions=2), new_topic(partitions=1)
    table = f"late_counts_{next(_tables)}"
    pipeline = {
        "trigger": {"processingTime": "500ms"},
        "nodes": [
            {
                "name": "events",
                "fromKafka": {
                    "topic": topic,
                    "format": "json",
                    "schema": "id STRING, kind STRING, ts TIMESTAMP",
                    "eventTime": "ts",
                    "watermark": "2s",
                },
            },
            {"name": "kept", "inputs": ["events"], "filter": "kind = 'event'"},
            {
                "name": "counts",
                "inputs": ["kept"],
                "aggregate": {"groupBy": ["id"], "window": {"tumbling": "5s"}, "aggregations": {"n": "count(*)"}},
            },
            {"name": "out", "inputs": ["counts"], "toMemory": {"table": table}},
        ],
        "deadLetter": {"toKafka": {"topic": dead_topic}, "lateRecords": True},
    }
    w1 = BASE_MS + 10_000  # the watermark after the first phase: a window boundary
    w2 = w1 + WINDOW_MS
    first = [Event(f"a{i}", BASE_MS + i * 1000) for i in range(13)]  # max BASE + 12s: watermark w1
    first.append(Event("noise-ahead", BASE_MS + 3_600_000, kind="noise"))  # would move the watermark if counted

    def stragglers(name: str, watermark: int) -> list[Event]:
        at = [-WINDOW_MS, -WINDOW_MS + 1, -1, 0, 1, DELAY_MS]  # none ahead of the max event time so far
        return [Event(f"{name}{i}", watermark + d) for i, d in enumerate(at)] + [
            Event(f"{name}-noise", watermark - WINDOW_MS, kind="noise")
        ]

    phases = [
        first,
        stragglers("b", w1),
        [Event("advance", w2 + DELAY_MS)],
        stragglers("c", w2),
        [Event("flush", BASE_MS + 120_000)],
    ]
    run = LateRun(spark_session, kafka_bootstrap, {"events": topic}, tmp_path).run(pipeline, phases, table)

    def reaches(e: Event) -> bool:
        return e.kind == "event"

    late = reference_late(phases, reaches, window_closed)
    assert {e.id for e in late} == {"b0", "b1", "b2", "c0", "c1", "c2"}  # window end at or before the watermark
    counted = [("events", r["id"]) for r in spark_session.table(table).collect()]
    assert all(r["n"] == 1 for r in spark_session.table(table).collect())
    dead_ids = late_dead_letters(kafka_bootstrap, dead_topic)
    assert sorted(dead_ids) == sorted(("events", e.id) for e in late)
    # Every record that reached the aggregation, but the one whose window is still open, is in one of the two.
    inputs = {("events", e.id) for phase in phases for e in phase if reaches(e) and e.id != "flush"}
    assert_partition(inputs, counted, dead_ids)
    # Spark's own count: one dropped row per late record (each its own group after the partial aggregation).
    assert dropped_by_watermark(run, table) == len(late)


def test_join_of_two_sources(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """Spark's watermark is the lower of the two sources' (min policy): a source ahead of the other does not
    make its stragglers late. Late: event time at or before the watermark, on either side."""
    topics = {"requests": new_topic(partitions=2), "responses": new_topic(partitions=2)}
    pairs, dead_topic = f"late_pairs_{next(_tables)}", new_topic(partitions=1)

    def source(topic: str) -> dict[str, Any]:
        schema = "id STRING, kind STRING, ts TIMESTAMP"
        return {"topic": topic, "format": "json", "schema": schema, "eventTime": "ts", "watermark": "2s"}

    pipeline = {
        "trigger": {"processingTime": "500ms"},
        "nodes": [
            {"name": "requests", "fromKafka": source(topics["requests"])},
            {"name": "responses", "fromKafka": source(topics["responses"])},
            {
                "name": "matched",
                "inputs": ["requests", "responses"],
                "join": {
                    "condition": "requests.id = responses.id",
                    "within": "1s",
                    "select": ["requests.id AS id", "requests.ts AS ts"],
                },
            },
            {"name": "out", "inputs": ["matched"], "toMemory": {"table": pairs}},
        ],
        "deadLetter": {"toKafka": {"topic": dead_topic}, "lateRecords": True},
    }

    def pair(name: str, ms: int) -> list[Event]:
        return [Event(name, ms, "requests"), Event(name, ms, "responses")]

    def stragglers(name: str, watermark: int) -> list[Event]:
        return [e for i, d in enumerate([-1000, -1, 0, 1, 500]) for e in pair(f"{name}{i}", watermark + d)]

    w1 = BASE_MS + 10_000
    phases = [
        [e for i in range(13) for e in pair(f"a{i}", BASE_MS + i * 1000)],  # both sources at BASE + 12s
        stragglers("b", w1),
        [Event("ahead", w1 + 20_000, "requests")],  # requests' own watermark moves, Spark's (the min) does not
        stragglers("c", w1),
        [Event("ahead", w1 + 20_000, "responses")],  # now both: Spark's watermark w1 + 18s
        stragglers("d", w1 + 18_000),
    ]
    run = LateRun(spark_session, kafka_bootstrap, topics, tmp_path).run(pipeline, phases, pairs)

    late = reference_late(phases, lambda _: True, lambda ms, watermark: ms <= watermark)
    assert {e.id for e in late} == {f"{x}{i}" for x in "bcd" for i in (0, 1, 2)}
    counted = [(side, r["id"]) for r in spark_session.table(pairs).collect() for side in ("requests", "responses")]
    dead_ids = late_dead_letters(kafka_bootstrap, dead_topic)
    assert sorted(dead_ids) == sorted((e.source, e.id) for e in late)
    assert_partition({(e.source, e.id) for phase in phases for e in phase}, counted, dead_ids)
    assert dropped_by_watermark(run, pairs) == len(late)  # the join drops late rows of either side one by one
    # The join's state in one RocksDB store per partition (sluice's default; Spark keeps a checkpoint's first).
    first_batch = (tmp_path / "checkpoints" / "out" / "offsets" / "0").read_text().splitlines()
    assert json.loads(first_batch[1])["conf"][JOIN_STATE_FORMAT] == "3", first_batch[1]


def test_offset_log_and_running_query(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """What the dead-letter query reads of a sink query: its offset log entries (end offsets per Kafka
    partition, watermark) and whether it runs, on a plain Spark query."""
    topic = new_topic(partitions=2)
    produce(kafka_bootstrap, topic, [(str(i).encode(), b"x") for i in range(7)])
    per_partition: dict[int, int] = {}
    for record in read_committed(kafka_bootstrap, topic):
        per_partition[record.partition] = per_partition.get(record.partition, 0) + 1
    checkpoint = str(tmp_path / "plain")
    stream = (
        spark_session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        stream.writeStream.format("memory")
        .queryName(f"plain_{next(_tables)}")
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        query.processAllAvailable()
        assert running_query_at(spark_session, checkpoint)
        assert not running_query_at(spark_session, str(tmp_path / "other"))
    finally:
        query.stop()
    assert not running_query_at(spark_session, checkpoint)
    log = OffsetLog(spark_session, checkpoint)
    assert log.ids() == [0]
    assert log.entry(0) == (0, {(topic, p): per_partition.get(p, 0) for p in (0, 1)})
