"""Start the compiled queries: sink writers, triggers, checkpoints, per-batch steps and late records."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from .compiler import LateRule, QueryPlan, dead_letter_kafka_record, kafka_record
from .spec import ProcessingTime, duration_to_spark


class UnsupportedTrigger(ValueError):
    pass


def apply_trigger(writer: DataStreamWriter, trigger: ProcessingTime, spark_version: str) -> DataStreamWriter:
    if trigger.availableNow:
        return writer.trigger(availableNow=True)
    if trigger.realTime:
        major, minor = (int(x) for x in spark_version.split(".")[:2])
        if (major, minor) < (4, 1):
            raise UnsupportedTrigger(f"trigger.realTime needs Spark >= 4.1 (this is Spark {spark_version}); "
                                     "use processingTime")
        return writer.trigger(realTime=duration_to_spark(trigger.realTime))  # type: ignore[call-arg]
    return writer.trigger(processingTime=duration_to_spark(trigger.processingTime or "1s"))


class MemoryTables:
    """Memory sinks fed from foreachBatch (after top-N) keep their rows here, as temp views."""

    _rows: dict[str, list] = {}
    _lock = threading.Lock()

    @classmethod
    def append(cls, spark: SparkSession, table: str, batch: DataFrame) -> None:
        with cls._lock:
            rows = cls._rows.setdefault(table, [])
            rows.extend(batch.collect())
            spark.createDataFrame(rows, batch.schema).createOrReplaceTempView(table)


def kafka_sink_options(sink: Any, bootstrap: str | None) -> dict[str, str]:
    """Options of Spark's Kafka sink, the same for the streaming writer and the per-batch writer."""
    return {"topic": sink.topic, "kafka.bootstrap.servers": sink.bootstrapServers or bootstrap, **sink.options}


def _native_writer(df: DataFrame, plan: QueryPlan, bootstrap: str | None) -> DataStreamWriter:
    sink = plan.sink
    op = plan.sink_op
    if op == "toKafka":
        return df.writeStream.format("kafka").options(**kafka_sink_options(sink, bootstrap))
    if op == "toConsole":
        return (df.writeStream.format("console").option("numRows", sink.numRows)
                .option("truncate", str(sink.truncate).lower()))
    if op == "toFiles":
        writer = df.writeStream.format(sink.format).option("path", sink.path)
        return writer.partitionBy(*sink.partitionBy) if sink.partitionBy else writer
    return df.writeStream.format("memory").queryName(sink.table)


def write_batch(batch: DataFrame, plan: QueryPlan, bootstrap: str | None) -> None:
    sink, op = plan.sink, plan.sink_op
    if op == "toKafka":
        batch.write.format("kafka").options(**kafka_sink_options(sink, bootstrap)).save()
    elif op == "toConsole":
        batch.show(sink.numRows, truncate=sink.truncate)
    elif op == "toFiles":
        writer = batch.write.mode("append").format(sink.format)
        (writer.partitionBy(*sink.partitionBy) if sink.partitionBy else writer).save(sink.path)
    else:
        MemoryTables.append(batch.sparkSession, sink.table, batch)


class LateTracker:
    """Applies a LateRule per micro-batch of the dead-letter query. The max event time seen so far is
    kept in the query's checkpoint folder, so the rule survives restarts."""

    def __init__(self, state_file: Path, rule: LateRule) -> None:
        self.state_file = state_file
        self.rule = rule

    def _load(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {"batch_id": -1, "max": None, "previous_max": None}

    def late_condition(self, max_before_us: int):
        rule = self.rule
        watermark = F.lit(max_before_us - rule.delay_ms * 1000)
        event_us = F.unix_micros("_event_time")
        if rule.slide_ms:
            slide = rule.slide_ms * 1000
            bound = F.floor(event_us / slide) * slide + rule.window_ms * 1000
        else:
            bound = event_us + rule.window_ms * 1000
        message = F.concat(F.lit("late: event time "), F.col("_event_time").cast("string"),
                           F.lit(" is behind the watermark "), F.timestamp_micros(watermark).cast("string"))
        return F.col("error").isNull() & (bound <= watermark), message

    def mark(self, batch: DataFrame, batch_id: int) -> DataFrame:
        state = self._load()
        # A replayed batch (after a crash) must use the max from before its first run.
        max_before = state["previous_max"] if state["batch_id"] == batch_id else state["max"]
        marked = batch
        if max_before is not None:
            late, message = self.late_condition(max_before)
            marked = batch.withColumn("error", F.when(late, message).otherwise(F.col("error")))
        seen = batch.where(F.col("error").isNull()).agg(F.max(F.unix_micros("_event_time"))).first()[0]
        known = [x for x in (max_before, seen) if x is not None]
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        self.state_file.write_text(json.dumps({"batch_id": batch_id, "max": max(known) if known else None,
                                               "previous_max": max_before}))
        return marked.where(F.col("error").isNotNull()).drop("_event_time")


def start_query(plan: QueryPlan, *, checkpoint_root: str, trigger: ProcessingTime, bootstrap: str | None,
                spark_version: str, on_dead_letters: Callable[[str, int], None] | None = None) -> StreamingQuery:
    checkpoint = f"{checkpoint_root.rstrip('/')}/{plan.name}"
    if plan.dead_letter_source is None and not plan.batch_steps:
        writer = _native_writer(plan.df, plan, bootstrap)
        query_name = plan.sink.table if plan.sink_op == "toMemory" else plan.name
    else:
        handler = _batch_handler(plan, checkpoint, bootstrap, on_dead_letters)
        writer, query_name = plan.df.writeStream.foreachBatch(handler), plan.name
    writer = (writer.queryName(query_name).outputMode(plan.output_mode)
              .option("checkpointLocation", checkpoint))
    return apply_trigger(writer, trigger, spark_version).start()


def _batch_handler(plan: QueryPlan, checkpoint: str, bootstrap: str | None,
                   on_dead_letters: Callable[[str, int], None] | None) -> Callable[[DataFrame, int], None]:
    """Per micro-batch work: top-N and what follows it, or the dead letters (late marking, counting)."""
    source = plan.dead_letter_source
    tracker = LateTracker(Path(checkpoint) / "sluice-late-state.json", plan.late_rule) if plan.late_rule else None

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        cached = batch.persist()  # read the source once although this batch runs several jobs
        try:
            out = tracker.mark(cached, batch_id) if tracker else cached
            for step in plan.batch_steps:
                out = step(out)
            dead = out.count() if source else 0
            if plan.sink_op == "toKafka":
                out = dead_letter_kafka_record(out) if source else kafka_record(out, plan.sink)
            write_batch(out, plan, bootstrap)
            if source and on_dead_letters:
                on_dead_letters(source, dead)
        finally:
            cached.unpersist()

    return each_batch
