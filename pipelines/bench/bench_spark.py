"""Spark side of the frequency-count benchmark: the job as a sluice pipeline and hand-written in plain
PySpark, run either to completion (availableNow) or live, with every micro-batch's progress recorded."""

from __future__ import annotations

import copy
import json
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from bench_workload import PartitionTimes, timestamps_between
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from sluice.api.times import duration_ms, parse_time
from sluice.api.validation import document_from, load_documents
from sluice.pipelines.local.kafka_io import create_topic
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.testbed.common import REPO_ROOT

EXAMPLE = REPO_ROOT / "pipelines" / "examples" / "frequency-count.yaml"


@dataclass(frozen=True)
class Trigger:
    """availableNow (run what is there, then stop) or a processing-time interval such as '1s'."""

    available_now: bool = False
    interval: str | None = None

    def spec(self) -> dict[str, Any]:
        return {"availableNow": True} if self.available_now else {"processingTime": self.interval}


@dataclass
class Started:
    query: StreamingQuery  # the query writing the counts
    stop: Callable[[], None]


class Job(Protocol):
    name: str

    def start(self, source: str, sink: str, checkpoint: str, trigger: Trigger) -> Started: ...


# ----------------------------------------------------------------------------------- the two jobs


class SluiceJob:
    """An example pipeline (default: pipelines/examples/frequency-count.yaml) as it is, run by sluice's
    PipelineRun; only its topics, Kafka address, trigger and, when given, the delivery of its Kafka sinks
    are set by the benchmark. A dead-letter sink writes to the topic `<sink>-dead-letters`."""

    def __init__(
        self, spark: SparkSession, bootstrap: str, manifest: Path = EXAMPLE, delivery: str | None = None
    ) -> None:
        self.spark = spark
        self.bootstrap = bootstrap
        self.delivery = delivery
        self.name = f"sluice {delivery}" if delivery else "sluice"
        self.source = str(manifest.relative_to(REPO_ROOT) if manifest.is_relative_to(REPO_ROOT) else manifest)
        loaded = load_documents(manifest)[0].manifest
        assert loaded is not None, f"{manifest} must hold a StreamingApp"
        self.manifest: dict[str, Any] = loaded

    @property
    def default_interval(self) -> str:
        trigger = self.manifest["spec"]["pipeline"].get("trigger") or {}
        return trigger.get("processingTime", "1s")

    def start(self, source: str, sink: str, checkpoint: str, trigger: Trigger) -> Started:
        manifest = copy.deepcopy(self.manifest)
        pipeline = manifest["spec"]["pipeline"]
        pipeline["trigger"] = trigger.spec()
        for node in pipeline["nodes"]:
            if "fromKafka" in node:
                node["fromKafka"]["topic"] = source
            if "toKafka" in node:
                node["toKafka"]["topic"] = sink
                sink_node = node["name"]
        dead_letters = (pipeline.get("deadLetter") or {}).get("toKafka")
        if dead_letters is not None:
            dead_letters["topic"] = f"{sink}-dead-letters"
            create_topic(self.bootstrap, dead_letters["topic"])
        for kafka_sink in [n["toKafka"] for n in pipeline["nodes"] if "toKafka" in n] + [dead_letters]:
            if kafka_sink is not None and self.delivery:
                kafka_sink["delivery"] = self.delivery
        run = PipelineRun.from_document(
            self.spark,
            document_from(manifest, self.source),
            checkpoint_root=checkpoint,
            bootstrap_servers=self.bootstrap,
        ).start()
        return Started(next(q for q in run.queries if q.name == sink_node), run.stop)


class HandWrittenJob:
    """The same job written directly against PySpark, as a user would without sluice: the example's
    source options, grouping, aggregation, sink key/value and output mode, nothing else."""

    name = "hand-written"

    def __init__(self, spark: SparkSession, bootstrap: str) -> None:
        self.spark = spark
        self.bootstrap = bootstrap

    def start(self, source: str, sink: str, checkpoint: str, trigger: Trigger) -> Started:
        words = (
            self.spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("minPartitions", 4)
            .load()
            .select(F.col("value").cast("string").alias("word"))
        )
        counts = words.groupBy("word").count()
        records = counts.select(F.col("word").alias("key"), F.to_json(F.struct("word", "count")).alias("value"))
        writer = (
            records.writeStream.format("kafka")
            .option("kafka.bootstrap.servers", self.bootstrap)
            .option("topic", sink)
            .option("checkpointLocation", checkpoint)
            .outputMode("update")
        )
        if trigger.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=f"{duration_ms(trigger.interval or '1s')} milliseconds")
        query = writer.start()
        return Started(query, query.stop)


# ------------------------------------------------------------------------------------- progress


class ProgressLog(StreamingQueryListener):
    """Every progress event of every query, by query id (add it to the session once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_query: dict[str, list[dict[str, Any]]] = {}

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = json.loads(event.progress.json)
        with self._lock:
            self._by_query.setdefault(progress["id"], []).append(progress)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass

    def batches(self, query: StreamingQuery) -> list[dict[str, Any]]:
        """The query's micro-batches that read data, in order."""
        with self._lock:
            found = list(self._by_query.get(query.id, []))
        return [p for p in found if p.get("numInputRows")]

    def wait_for(
        self, query: StreamingQuery, done: Callable[[list[dict[str, Any]]], bool], timeout: float, what: str
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            batches = self.batches(query)
            if done(batches):
                return batches
            error = query.exception()
            if error is not None:
                raise RuntimeError(f"query {query.name} failed: {error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout:.0f}s")
            time.sleep(0.1)


def rows_read(batches: list[dict[str, Any]]) -> int:
    return sum(b["numInputRows"] for b in batches)


def processed_rows_per_second(batches: list[dict[str, Any]]) -> float:
    """Spark's own figure over the whole run: rows read / time spent in triggers."""
    busy_ms = sum(b["durationMs"]["triggerExecution"] for b in batches)
    return rows_read(batches) * 1000 / busy_ms if busy_ms else 0.0


def committed_offsets(batches: list[dict[str, Any]], topic: str) -> dict[int, int]:
    if not batches:
        return {}
    return {int(p): o for p, o in _offsets(batches[-1]["sources"][0]["endOffset"], topic).items()}


def batch_ranges(batch: dict[str, Any], topic: str) -> tuple[float, dict[int, tuple[int, int]]]:
    """When the micro-batch committed (epoch ms) and the offset range it read from each partition."""
    committed_ms = parse_time(batch["timestamp"]) * 1000 + batch["batchDuration"]
    source = batch["sources"][0]
    start, end = _offsets(source.get("startOffset"), topic), _offsets(source["endOffset"], topic)
    return committed_ms, {int(p): (start.get(p, 0), e) for p, e in end.items()}


def _offsets(value: Any, topic: str) -> dict[str, int]:
    if value is None:
        return {}  # the first batch: from the beginning of the topic
    if isinstance(value, str):
        value = json.loads(value)
    return value.get(topic, {})


# --------------------------------------------------------------------------------------- running


@dataclass
class CompletedRun:
    seconds: float  # from asking for the query until it ended
    batches: list[dict[str, Any]]


def run_to_completion(
    job: Job, progress: ProgressLog, source: str, sink: str, checkpoint: str, records: int, timeout: float
) -> CompletedRun:
    """Process everything in the topic with trigger availableNow; wall time from start to the end."""
    started_at = time.perf_counter()
    started = job.start(source, sink, checkpoint, Trigger(available_now=True))
    try:
        if not started.query.awaitTermination(timeout):
            raise TimeoutError(f"{job.name} did not finish {records} records within {timeout:.0f}s")
        seconds = time.perf_counter() - started_at
        if started.query.exception() is not None:
            raise RuntimeError(f"{job.name} failed: {started.query.exception()}")
    finally:
        started.stop()
    batches = progress.wait_for(
        started.query, lambda b: rows_read(b) >= records, 30, f"progress of {job.name} did not report {records} rows"
    )
    return CompletedRun(seconds, batches)


def run_live(
    job: Job,
    progress: ProgressLog,
    source: str,
    sink: str,
    checkpoint: str,
    trigger: Trigger,
    produce: Callable[[], dict[int, int]],
    timeout: float,
) -> list[dict[str, Any]]:
    """Start the job, let `produce` write the topic (returns its end offsets), wait until every record
    is in a committed micro-batch; returns those batches."""
    started = job.start(source, sink, checkpoint, trigger)
    try:
        _wait_until_waiting_for_data(started.query, timeout=120)
        ends = produce()

        def caught_up(batches: list[dict[str, Any]]) -> bool:
            done = committed_offsets(batches, source)
            return all(done.get(p, 0) >= end for p, end in ends.items())

        return progress.wait_for(started.query, caught_up, timeout, f"{job.name} did not catch up")
    finally:
        started.stop()


def _wait_until_waiting_for_data(query: StreamingQuery, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while query.status["message"] != "Waiting for data to arrive":
        if query.exception() is not None or not query.isActive:
            raise RuntimeError(f"query {query.name} ended before data arrived: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"query {query.name} not ready within {timeout:.0f}s")
        time.sleep(0.1)


def batch_latencies(
    batches: list[dict[str, Any]], topic: str, times: dict[int, PartitionTimes], since_ms: float
) -> array:
    """Per record produced at or after since_ms: when its micro-batch committed - its producer timestamp."""
    latencies = array("d")
    for batch in batches:
        committed_ms, ranges = batch_ranges(batch, topic)
        for partition, (start, end) in ranges.items():
            stamps = timestamps_between(times[partition], start, end)
            latencies.extend(committed_ms - ts for ts in stamps if ts >= since_ms)
    return latencies
