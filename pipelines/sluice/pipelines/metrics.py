"""Prometheus metrics of a running pipeline, fed by Spark's streaming query progress events."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQueryListener

from sluice.api.contract import TopicStatus
from sluice.api.graph import queries_of
from sluice.api.pipeline import PipelineSpec
from sluice.api.rollout.diff import DEAD_LETTER_SUFFIX
from sluice.api.times import parse_time

from .control.backlog import topic_backlogs
from .jvm_metrics import JvmCollector

OBSERVED_QUALITY = "sluice_quality"  # observe() name prefix for per-source record checks


@dataclass(frozen=True)
class QueryRecord:
    """What the progress events of one query told so far: the last one and sums since the driver started."""

    last_progress: dict[str, Any]
    batches: int = 0
    input_rows: int = 0
    busy_ms: int = 0
    source_rows: Mapping[str, int] = field(default_factory=dict)  # by source label (the topic)
    output_rows: int | None = 0  # None: the sink does not count (a foreachBatch sink says -1)
    run_batches: int = 0  # completed by the query's current run (a restart or a hot swap is a new run)

    def add(self, progress: dict[str, Any]) -> QueryRecord:
        source_rows = dict(self.source_rows)
        for source in progress.get("sources", []):
            label = source_label(source.get("description", "?"))
            source_rows[label] = source_rows.get(label, 0) + int(source.get("numInputRows") or 0)
        written = (progress.get("sink") or {}).get("numOutputRows", -1)
        output_rows = None if self.output_rows is None or written < 0 else self.output_rows + written
        same_run = progress.get("runId") is not None and progress.get("runId") == self.last_progress.get("runId")
        return QueryRecord(
            progress,
            self.batches + 1,
            self.input_rows + int(progress.get("numInputRows") or 0),
            self.busy_ms + int((progress.get("durationMs") or {}).get("triggerExecution") or 0),
            source_rows,
            output_rows,
            self.run_batches + 1 if same_run else 1,
        )

    def last_batch_end(self) -> float | None:
        """Epoch seconds the last completed batch ended (its trigger's start + its triggerExecution)."""
        try:
            start = parse_time(self.last_progress["timestamp"])
        except (KeyError, TypeError, ValueError):
            return None
        return start + _number((self.last_progress.get("durationMs") or {}).get("triggerExecution")) / 1000


class RunningBatches:
    """Busy time that grows with wall time while a batch runs, not only when its progress arrives.

    No event marks a batch's start, so whoever watches the queries reports whether each one's trigger is
    active (`observe`, often: a poll every fraction of a second). A batch running now started when its trigger
    was first seen active, or when the query's previous batch ended if that is later (batches back to back
    never show an inactive trigger to a poll).
    """

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._reported: dict[str, int] = {}
        self._lock = threading.Lock()

    def observe(self, query: str, trigger_active: bool, now: float) -> None:
        with self._lock:
            if not trigger_active:
                self._since.pop(query, None)
            else:
                self._since.setdefault(query, now)

    def busy_ms(self, query: str, record: QueryRecord | None, now: float) -> tuple[int, int]:
        """(busy ms including the running batch, the running batch's ms so far). The busy time never
        decreases: a running batch's progress arrives a moment after its trigger stops looking active, and the
        time seen running meanwhile must not be taken back."""
        completed = record.busy_ms if record else 0
        with self._lock:
            since = self._since.get(query)
            ended = record.last_batch_end() if record else None
            start = since if since is None or ended is None else max(since, ended)
            running = 0 if start is None else max(0, int((now - start) * 1000))
            busy = max(self._reported.get(query, 0), completed + running)
            self._reported[query] = busy
        return busy, running


class PipelineMetrics:
    def __init__(self, app: str, registry: CollectorRegistry | None = None, spark: SparkSession | None = None) -> None:
        if registry is None:  # the runner's own: process_* (its RSS; process_start_time_seconds: driver restarts)
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)
            if spark is not None:  # and sluice_jvm_*: its JVM's
                registry.register(JvmCollector(spark))
        self.registry = registry
        self.app = app
        q = ["app", "query"]
        r = self.registry
        self.input_rate = Gauge("sluice_input_rows_per_second", "Input rows/s of the last batch", q, registry=r)
        self.processed_rate = Gauge(
            "sluice_processed_rows_per_second", "Processed rows/s of the last batch", q, registry=r
        )
        self.batch_duration = Gauge("sluice_batch_duration_seconds", "Duration of the last batch", q, registry=r)
        self.trigger_interval = Gauge(
            "sluice_trigger_interval_seconds", "The query's trigger interval (0: as fast as it can)", q, registry=r
        )
        self.input_rows = Counter("sluice_input_rows", "Rows read", q, registry=r)
        self.batches = Counter("sluice_batches", "Micro-batches completed", q, registry=r)
        self.lag = Gauge(
            "sluice_kafka_records_behind_latest",
            "Kafka records behind the latest offset (Spark's offsetsBehindLatest)",
            [*q, "source", "stat"],
            registry=r,
        )
        self.watermark = Gauge("sluice_watermark_timestamp_seconds", "Event-time watermark", q, registry=r)
        self.state_rows = Gauge("sluice_state_rows", "Rows held in state stores", q, registry=r)
        self.late_dropped = Counter(
            "sluice_late_records_dropped", "Rows dropped as later than the watermark", q, registry=r
        )
        self.malformed = Counter(
            "sluice_malformed_records", "Records that failed parsing or checks", [*q, "source"], registry=r
        )
        self.dead_letters = Counter(
            "sluice_dead_letter_records", "Records written to the dead-letter sink", ["app", "source"], registry=r
        )
        self.executors = Gauge("sluice_executors", "Live Spark executors", ["app"], registry=r)
        self.up = Gauge("sluice_query_active", "1 while the query runs", q, registry=r)
        self.backlog = Gauge(
            "sluice_kafka_backlog_records",
            "Records of a source topic not yet read by the query furthest behind on it",
            ["app", "topic"],
            registry=r,
        )
        self._queries: dict[str, QueryRecord] = {}
        self.running = RunningBatches()
        self._lock = threading.Lock()

    def queries(self) -> dict[str, QueryRecord]:
        """Each query's record, by query name (one consistent snapshot)."""
        with self._lock:
            return dict(self._queries)

    def topics(self) -> list[TopicStatus]:
        return topic_backlogs(record.last_progress for record in self.queries().values())

    def query_started(self, query: str, pipeline: PipelineSpec) -> None:
        """The counters of a query's now-and-then events start at 0, so a dashboard panel or an alert over them has
        a series before the first one: its sources' malformed records, or a dead-letter query's dead letters."""
        if query.endswith(DEAD_LETTER_SUFFIX):
            self.dead_letters.labels(app=self.app, source=query.removesuffix(DEAD_LETTER_SUFFIX))
            return
        member = queries_of(pipeline)
        for node in pipeline.nodes:
            if node.kind == "source" and query in member[node.name]:
                self.malformed.labels(app=self.app, query=query, source=node.name)

    def record_backlogs(self, topics: Iterable[TopicStatus]) -> None:
        for topic in topics:
            self.backlog.labels(app=self.app, topic=topic.topic).set(topic.backlog)

    def record_progress(self, progress: dict[str, Any]) -> None:
        name = progress.get("name") or progress.get("id", "?")
        with self._lock:
            self._queries[name] = self._queries.get(name, QueryRecord({})).add(progress)
        self.record_backlogs(self.topics())
        labels = {"app": self.app, "query": name}
        self.batches.labels(**labels).inc()
        self.input_rows.labels(**labels).inc(progress.get("numInputRows", 0) or 0)
        self.input_rate.labels(**labels).set(_number(progress.get("inputRowsPerSecond")))
        self.processed_rate.labels(**labels).set(_number(progress.get("processedRowsPerSecond")))
        self.batch_duration.labels(**labels).set(
            _number(progress.get("batchDuration", progress.get("durationMs", {}).get("triggerExecution"))) / 1000
        )
        for source in progress.get("sources", []):
            name = source_label(source.get("description", "?"))
            for stat in ("avg", "max", "min"):
                value = (source.get("metrics") or {}).get(f"{stat}OffsetsBehindLatest")
                if value is not None:
                    self.lag.labels(**labels, source=name, stat=stat).set(_number(value))
        watermark = (progress.get("eventTime") or {}).get("watermark")
        if watermark:
            self.watermark.labels(**labels).set(parse_time(watermark))
        operators = progress.get("stateOperators", [])
        self.state_rows.labels(**labels).set(sum(op.get("numRowsTotal", 0) for op in operators))
        self.late_dropped.labels(**labels).inc(sum(op.get("numRowsDroppedByWatermark", 0) for op in operators))
        for name, values in (progress.get("observedMetrics") or {}).items():
            if name.startswith(OBSERVED_QUALITY + "_"):
                source = name.removeprefix(OBSERVED_QUALITY + "_")
                malformed = values[0] if isinstance(values, list) and values else (values or {})
                if isinstance(malformed, dict):
                    malformed = malformed.get("malformed")
                self.malformed.labels(**labels, source=source).inc(_number(malformed))


def source_label(description: str) -> str:
    """'KafkaV2[Subscribe[lines]]' -> 'lines'; other descriptions unchanged."""
    match = re.search(r"Subscribe(?:Pattern)?\[(.*)\]\]", description)
    return match.group(1) if match else description


def _number(value: Any) -> float:
    try:
        result = float(value)
    except (TypeError, ValueError):
        return 0.0
    return 0.0 if result != result else result  # NaN from Spark means "no rate yet"


class ProgressListener(StreamingQueryListener):
    """Forwards every query progress (as the JSON dict Spark logs) to the callbacks."""

    def __init__(
        self, *callbacks: Callable[[dict[str, Any]], None], ignored: Callable[[dict[str, Any]], bool] | None = None
    ) -> None:
        self.callbacks = callbacks
        self.ignored = ignored

    def onQueryStarted(self, event) -> None:
        pass

    def onQueryProgress(self, event) -> None:
        progress = json.loads(event.progress.json)
        if self.ignored is not None and self.ignored(progress):
            return
        for callback in self.callbacks:
            callback(progress)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        pass
