"""Start the compiled queries: sinks, triggers, checkpoints, per-batch steps and late records."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from .compiler import LateRule, QueryPlan
from .sinks import Sink, SinkContext, create_sink
from .sinks.checkpoint_files import BatchFiles
from .spec import ProcessingTime, duration_to_spark

log = logging.getLogger(__name__)

# Spark 4.2: the per-operator watermark simulation (PropagateWatermarkSimulator, run on the executed plan after
# each batch) stops at a ReusedExchangeExec (a leaf), so a stateful operator reading its inputs through one gets
# watermark 0: it drops no late rows and evicts no state (issue #14 §2). Exchange reuse turns the second of two
# identical shuffles of one query into one, e.g. when one node's output feeds several stateful paths. Every query
# sluice starts runs without it; the query keeps its own copy of the session's conf (StreamExecution clones the
# session in start()), so the session is changed only around start().
STREAMING_QUERY_CONF: dict[str, str] = {"spark.sql.exchange.reuse": "false"}
_CONF_LOCK = threading.Lock()  # queries start from several threads at once (a hot swap's pool)
_warned: set[str] = set()


@contextmanager
def query_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """`conf` set on the session for the start of one query, then restored (unset when it was not set)."""
    with _CONF_LOCK:
        before = spark.conf.getAll  # only what is set (the app's sparkConf, conf.set), not defaults
        for key, value in conf.items():
            if key in before and before[key] != value and key not in _warned:
                _warned.add(key)
                log.warning(
                    "the session sets %s=%s; sluice starts its streaming queries with %s=%s (with it, Spark 4.2 "
                    "gives a stateful operator behind a reused exchange no watermark: no late rows dropped, no "
                    "state evicted)",
                    key,
                    before[key],
                    key,
                    value,
                )
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in conf:
                if key in before:
                    spark.conf.set(key, before[key])
                else:
                    spark.conf.unset(key)


class UnsupportedTrigger(ValueError):
    pass


def apply_trigger(writer: DataStreamWriter, trigger: ProcessingTime, spark_version: str) -> DataStreamWriter:
    if trigger.availableNow:
        return writer.trigger(availableNow=True)
    if trigger.realTime:
        major, minor = (int(x) for x in spark_version.split(".")[:2])
        if (major, minor) < (4, 1):
            raise UnsupportedTrigger(
                f"trigger.realTime needs Spark >= 4.1 (this is Spark {spark_version}); use processingTime"
            )
        # pyspark's overloads of trigger() leave realTime out (its implementation takes it)
        return writer.trigger(realTime=duration_to_spark(trigger.realTime))  # type: ignore[call-overload]
    return writer.trigger(processingTime=duration_to_spark(trigger.processingTime or "1s"))


class LateTracker:
    """Applies a LateRule per micro-batch of the dead-letter query.

    The max event time seen up to each batch is kept beside the query's checkpoint (one file per batch,
    sluice/late-records/<batch>), so the rule survives restarts and a replayed batch uses the max from
    before its first run.
    """

    KEPT_FILES = 10

    def __init__(self, checkpoint: str, rule: LateRule) -> None:
        self.folder = f"{checkpoint.rstrip('/')}/sluice/late-records"
        self.rule = rule
        self._known: dict[int, int | None] = {}  # batch id -> max event time (µs) up to it

    def late_condition(self, max_before_us: int):
        rule = self.rule
        watermark = F.lit(max_before_us - rule.delay_ms * 1000)
        event_us = F.unix_micros("_event_time")
        if rule.slide_ms:
            slide = rule.slide_ms * 1000
            bound = F.floor(event_us / slide) * slide + rule.window_ms * 1000
        else:
            bound = event_us + rule.window_ms * 1000
        message = F.concat(
            F.lit("late: event time "),
            F.col("_event_time").cast("string"),
            F.lit(" is behind the watermark "),
            F.timestamp_micros(watermark).cast("string"),
        )
        return F.col("error").isNull() & (bound <= watermark), message

    def _max_before(self, files: BatchFiles, batch_id: int) -> int | None:
        if batch_id - 1 in self._known:
            return self._known[batch_id - 1]
        latest = files.latest(before=batch_id)
        return None if latest is None else latest[1]["max"]

    def mark(self, batch: DataFrame, batch_id: int) -> DataFrame:
        files = BatchFiles(batch.sparkSession, self.folder)
        max_before = self._max_before(files, batch_id)
        marked = batch
        if max_before is not None:
            late, message = self.late_condition(max_before)
            marked = batch.withColumn("error", F.when(late, message).otherwise(F.col("error")))
        row = batch.where(F.col("error").isNull()).agg(F.max(F.unix_micros("_event_time"))).first()
        assert row is not None  # an aggregation without grouping has one row
        seen = row[0]
        known = [x for x in (max_before, seen) if x is not None]
        self._known = {batch_id: max(known) if known else None}
        files.write(batch_id, {"max": self._known[batch_id]})
        files.delete(batch_id - self.KEPT_FILES)
        return marked.where(F.col("error").isNotNull()).drop("_event_time")


def start_query(
    plan: QueryPlan,
    *,
    checkpoint_root: str,
    trigger: ProcessingTime,
    bootstrap: str | None,
    spark_version: str,
    on_dead_letters: Callable[[str, int], None] | None = None,
    app_id: str | None = None,
) -> StreamingQuery:
    """Start one query. `app_id` names the app across the Kafka cluster (namespace/app; default: the app's
    name): exactly-once Kafka sinks derive their transactional ids from it."""
    checkpoint = f"{checkpoint_root.rstrip('/')}/{plan.name}"
    sink = create_sink(
        plan.sink_op,
        plan.sink,
        SinkContext(
            plan.name, checkpoint, bootstrap, app_id or plan.app, dead_letters=plan.dead_letter_source is not None
        ),
    )
    if plan.dead_letter_source is None and not plan.batch_steps:
        writer, query_name = sink.stream_writer(sink.records(plan.df)), sink.query_name
    else:
        writer, query_name = plan.df.writeStream.foreachBatch(_batch_handler(plan, sink, on_dead_letters)), plan.name
    writer = writer.queryName(query_name).outputMode(plan.output_mode).option("checkpointLocation", checkpoint)
    writer = apply_trigger(writer, trigger, spark_version)
    with query_conf(plan.df.sparkSession, STREAMING_QUERY_CONF):
        return writer.start()


def _batch_handler(
    plan: QueryPlan, sink: Sink, on_dead_letters: Callable[[str, int], None] | None
) -> Callable[[DataFrame, int], None]:
    """Per micro-batch work: top-N and what follows it, or the dead letters (late marking, counting)."""
    source = plan.dead_letter_source
    tracker = LateTracker(sink.context.checkpoint, plan.late_rule) if plan.late_rule else None

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        cached = batch.persist()  # read the source once although this batch runs several jobs
        try:
            out = tracker.mark(cached, batch_id) if tracker else cached
            for step in plan.batch_steps:
                out = step(out)
            dead = out.count() if source else 0
            sink.write_batch(sink.records(out), batch_id)
            if source and on_dead_letters:
                on_dead_letters(source, dead)
        finally:
            cached.unpersist()

    return each_batch
