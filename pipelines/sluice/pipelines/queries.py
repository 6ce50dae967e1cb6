"""Start the compiled queries: sinks, triggers, checkpoints, per-batch steps and late records."""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from sluice.api.kafka_clients import KafkaClient
from sluice.api.pipeline import ProcessingTime
from sluice.api.times import duration_to_spark

from .callbacks import noting_connection
from .checkpoints import OffsetLog, delete_folder, running_query_at
from .compiler import QueryPlan
from .late_rules import LateRule, reach_column
from .plancheck import error_summary, java_message
from .session import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER, STATELESS_POOL
from .sinks import Sink, SinkContext, create_sink

log = logging.getLogger(__name__)

# Spark 4.2: the per-operator watermark simulation (PropagateWatermarkSimulator, run on the executed plan after
# each batch) stops at a ReusedExchangeExec (a leaf), so a stateful operator reading its inputs through one gets
# watermark 0: it drops no late rows and evicts no state (issue #14 §2). Exchange reuse turns the second of two
# identical shuffles of one query into one, e.g. when one node's output feeds several stateful paths. Every query
# sluice starts runs without it; the query keeps its own copy of the session's conf (StreamExecution clones the
# session in start()), so the session is changed only around start().
STREAMING_QUERY_CONF: dict[str, str] = {"spark.sql.exchange.reuse": "false"}
POOL_PROPERTY = "spark.scheduler.pool"
DEFAULT_POOL = "default"  # Spark's name for the pool of jobs that name none
JOIN_STATE_FORMAT = "spark.sql.streaming.join.stateFormatVersion"
_CONF_LOCK = threading.Lock()  # queries start from several threads at once (a hot swap's pool)
_warned: set[str] = set()


def minor_version(spark_version: str) -> tuple[int, int]:
    major, minor = (int(x) for x in spark_version.split(".")[:2])
    return major, minor


def streaming_query_conf(session_conf: Mapping[str, str], spark_version: str) -> dict[str, str]:
    """What a streaming query starts with, given what the session sets: STREAMING_QUERY_CONF, and where the
    state is in RocksDB and the app left the join's state format to sluice, format 3 (Spark 4.1 on): a
    stream-stream join keeps its state in one store per partition instead of four (pipelines/README.md, state
    stores). Spark keeps a checkpoint's first format."""
    conf = dict(STREAMING_QUERY_CONF)
    rocksdb = session_conf.get(STATE_STORE_PROVIDER) == ROCKSDB_PROVIDER
    if rocksdb and JOIN_STATE_FORMAT not in session_conf and minor_version(spark_version) >= (4, 1):
        conf[JOIN_STATE_FORMAT] = "3"
    return conf


@contextmanager
def query_conf(spark: SparkSession) -> Iterator[None]:
    """streaming_query_conf set on the session for the start of one query, then restored (unset when it was not
    set). Decided under the lock: another thread's start changes the session meanwhile."""
    with _CONF_LOCK:
        before = spark.conf.getAll  # only what is set (the app's sparkConf, conf.set), not defaults
        conf = streaming_query_conf(before, spark.version)
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
        if minor_version(spark_version) < (4, 1):
            raise UnsupportedTrigger(
                f"trigger.realTime needs Spark >= 4.1 (this is Spark {spark_version}); use processingTime"
            )
        # pyspark's overloads of trigger() leave realTime out (its implementation takes it)
        return writer.trigger(realTime=duration_to_spark(trigger.realTime))  # type: ignore[call-overload]
    return writer.trigger(processingTime=duration_to_spark(trigger.processingTime or "1s"))


class LateTracker:
    """Marks the rows of a dead-letter batch that a stateful query dropped as late.

    Spark plans batch N of a query by writing `offsets/N` (the source offsets it reads up to, and the batch's
    watermark), and drops the rows of batch N against the watermark of batch N-1 (0 for batch 0). So a record
    is late for a query when the rule of its first stateful operation fails against the watermark of the
    batch before the one whose offset range holds the record. The tracker waits until every query has planned
    past the batch's records; a record late for several queries names the first.
    """

    POLL_S = 0.2
    WAIT_S = 1800.0  # a query's batch may take long: its next plan comes after it
    IDLE_S = 30.0  # a query not running for this long (failed, stopped, removed) plans nothing more

    def __init__(self, spark: SparkSession, checkpoint_of: Callable[[str], str], rules: tuple[LateRule, ...]) -> None:
        self.spark = spark  # the app's session: a batch's own (a clone per query) lists no queries
        self.checkpoint_of = checkpoint_of  # asked each time: a migrated query's checkpoint moves
        self.rules = rules
        self._logs: dict[str, OffsetLog] = {}

    def mark(self, batch: DataFrame, batch_id: int) -> DataFrame:
        extents = {
            (row["topic"], row["partition"]): (row["first"], row["last"])
            for row in batch.where(F.col("error").isNull())
            .groupBy("topic", "partition")
            .agg(F.min("offset").alias("first"), F.max("offset").alias("last"))
            .collect()
        }
        marked = batch
        if extents:
            spark = batch.sparkSession
            for i, rule in enumerate(self.rules):
                ranges = self._ranges(spark, rule.query, extents, batch_id)
                marked = self._apply(marked, rule, reach_column(i) if rule.filters else None, ranges)
        helpers = ["_event_time", *(reach_column(i) for i in range(len(self.rules)))]
        return marked.where(F.col("error").isNotNull()).drop(*helpers)

    def _log(self, spark: SparkSession, query: str) -> OffsetLog:
        checkpoint = self.checkpoint_of(query)
        if checkpoint not in self._logs:
            self._logs[checkpoint] = OffsetLog(spark, checkpoint)
        return self._logs[checkpoint]

    def _planned(
        self, spark: SparkSession, query: str, extents: dict[tuple[str, int], tuple[int, int]], batch_id: int
    ) -> int:
        """The id of the query's latest planned batch once it reads past every record (waits for it)."""
        log = self._log(spark, query)
        start = idle_since = time.monotonic()
        while True:
            ids = log.ids()
            if ids:
                ends = log.entry(ids[-1])[1]
                if all(ends.get(key, -1) > last for key, (_, last) in extents.items()):
                    return ids[-1]
            now = time.monotonic()
            if running_query_at(self.spark, self.checkpoint_of(query)):
                idle_since = now
            if now - idle_since > self.IDLE_S or now - start > self.WAIT_S:
                behind = {f"{t}/{p}": last for (t, p), (_, last) in extents.items()}
                raise TimeoutError(
                    f"dead letters of batch {batch_id}: query {query} has not read up to the offsets {behind} "
                    f"(it {'is not running' if now - idle_since > self.IDLE_S else 'took too long'}); "
                    "the batch runs again when the query restarts"
                )
            time.sleep(self.POLL_S)

    def _ranges(
        self, spark: SparkSession, query: str, extents: dict[tuple[str, int], tuple[int, int]], batch_id: int
    ) -> list[tuple[str, int, int, int, int, int]]:
        """(topic, partition, from offset, until offset, watermark ms, batch) of the query's batches that
        read the records, newest first."""
        log = self._log(spark, query)
        planned = self._planned(spark, query, extents, batch_id)
        known = set(log.ids())
        ranges = []
        pending = set(extents)
        for n in range(planned, -1, -1):
            if not pending:
                break
            ends = log.entry(n)[1]
            if n - 1 in known:
                watermark, starts = log.entry(n - 1)
            else:  # batch 0 (Spark's watermark for it is 0), or an entry Spark purged (not late: unknown)
                if n > 0:
                    log_missing(query, n - 1)
                watermark, starts = 0, {}
            for key in list(pending):
                start, end = starts.get(key, 0), ends.get(key, 0)
                if end > start:
                    ranges.append((key[0], key[1], start, end, watermark, n))
                if start <= extents[key][0]:
                    pending.discard(key)
            if n - 1 not in known:
                break
        return ranges

    @staticmethod
    def _apply(
        batch: DataFrame, rule: LateRule, reaches: str | None, ranges: list[tuple[str, int, int, int, int, int]]
    ) -> DataFrame:
        spark = batch.sparkSession
        table = spark.createDataFrame(
            ranges, "_topic STRING, _partition INT, _from LONG, _until LONG, _watermark LONG, _batch LONG"
        )
        joined = batch.join(
            F.broadcast(table),
            (F.col("topic") == F.col("_topic"))
            & (F.col("partition") == F.col("_partition"))
            & (F.col("offset") >= F.col("_from"))
            & (F.col("offset") < F.col("_until")),
            "left",
        )
        event_us = F.unix_micros("_event_time")
        if rule.slide_ms:  # the record's latest window
            slide = rule.slide_ms * 1000
            bound = F.floor(event_us / slide) * slide + rule.window_ms * 1000
        else:
            bound = event_us + rule.window_ms * 1000
        late = F.col("error").isNull() & (bound <= F.col("_watermark") * 1000)
        if reaches is not None:
            late = late & F.col(reaches)
        message = F.concat(
            F.lit("late: event time "),
            F.col("_event_time").cast("string"),
            F.lit(" is behind the watermark "),
            F.timestamp_millis(F.col("_watermark")).cast("string"),
            F.lit(f" of query {rule.query}, batch "),
            F.col("_batch").cast("string"),
        )
        return joined.withColumn("error", F.when(late, message).otherwise(F.col("error"))).drop(*table.columns)


_missing_logged: set[tuple[str, int]] = set()


def log_missing(query: str, batch_id: int) -> None:
    if (query, batch_id) not in _missing_logged:
        _missing_logged.add((query, batch_id))
        log.warning(
            "offset log entry %s of query %s is gone: its watermark is unknown, its records count as not late",
            batch_id,
            query,
        )


def start_query(
    plan: QueryPlan,
    *,
    checkpoint_root: str,
    trigger: ProcessingTime,
    kafka: KafkaClient | None,
    spark_version: str,
    on_dead_letters: Callable[[str, int], None] | None = None,
    app_id: str | None = None,
    checkpoint_of: Callable[[str], str] | None = None,
    gate_ms: int | None = None,
) -> StreamingQuery:
    """Start one query. `app_id` names the app across the Kafka cluster (namespace/app; default: the app's
    name): exactly-once Kafka sinks derive their transactional ids from it. `checkpoint_of`: a query's
    checkpoint by name (default `<checkpoint_root>/<name>`). `gate_ms`: the output gate of a query that took
    over its output from another checkpoint: rows final before it (plan.final_time) are left out."""
    checkpoint_of = checkpoint_of or functools.partial(default_checkpoint, checkpoint_root)
    checkpoint = checkpoint_of(plan.name)
    if gate_ms is not None:
        plan = dataclasses.replace(plan, batch_steps=(output_gate(plan, gate_ms), *plan.batch_steps))
    sink = create_sink(
        plan.sink_op,
        plan.sink,
        SinkContext(
            plan.name,
            checkpoint,
            kafka,
            app_id or plan.app,
            dead_letters=plan.dead_letter_source is not None,
            grouped=plan.grouped,
            shuffled=plan.shuffled,
        ),
    )
    if plan.dead_letter_source is None and not plan.batch_steps:
        writer, query_name = sink.stream_writer(sink.records(plan.df)), sink.query_name
    else:
        writer, query_name = (
            plan.df.writeStream.foreachBatch(
                noting_connection(_batch_handler(plan, sink, checkpoint_of, on_dead_letters))
            ),
            plan.name,
        )
    writer = writer.queryName(query_name).outputMode(plan.output_mode).option("checkpointLocation", checkpoint)
    writer = apply_trigger(writer, trigger, spark_version)
    spark = plan.df.sparkSession
    with query_conf(spark), scheduler_pool(spark, pool_of(plan)):
        return writer.start()


def pool_of(plan: QueryPlan) -> str:
    """The scheduler pool a query's jobs run in: the batches of a query without a shuffle (a stage each) are
    short and take the next free core first (session.STATELESS_POOL); the others run in Spark's default pool,
    dead-letter queries too (they wait for the queries they check anyway)."""
    return STATELESS_POOL if not plan.shuffled and plan.dead_letter_source is None else DEFAULT_POOL


@contextmanager
def scheduler_pool(spark: SparkSession, pool: str) -> Iterator[None]:
    """Queries started meanwhile from this thread run their jobs in `pool`: a query's thread inherits the local
    properties of the thread that starts it (set even for the default pool, so that a query never inherits a
    pool its starting thread had); the thread's own pool is restored after."""
    context = spark.sparkContext
    before = context.getLocalProperty(POOL_PROPERTY)
    context.setLocalProperty(POOL_PROPERTY, pool)
    try:
        yield
    finally:
        context.setLocalProperty(POOL_PROPERTY, before)  # type: ignore[arg-type]  # None unsets it


WARM_UP_QUERY_PREFIX = "sluice-warm-up-"


def start_warm_up_query(plan: QueryPlan, checkpoint: str) -> StreamingQuery:
    """The plan's streaming query into Spark's noop sink, on a checkpoint of its own, over what its sources
    hold as it starts (then it stops): the same code paths as its real first batch (state stores included)
    without writing anything."""
    writer = (
        plan.df.writeStream.format("noop")
        .trigger(availableNow=True)
        .queryName(f"{WARM_UP_QUERY_PREFIX}{plan.name}")
        .outputMode(plan.output_mode)
        .option("checkpointLocation", checkpoint)
    )
    with query_conf(plan.df.sparkSession):
        return writer.start()


WARM_UP_TIMEOUT_S = 60.0  # for all the warm-up queries


def warm_up(spark: SparkSession, plans: Sequence[QueryPlan], folder: str) -> None:
    """What a cold driver's first batch pays (class loading, code generation, state stores, the executors'
    Kafka consumers and Python workers: 18-30 s per query on the local cluster against 4-5 s warm), paid on
    standby: each plan (compiled over its sources' latest records) runs as a stream into Spark's noop sink, on
    a checkpoint of its own under `folder` (deleted after); and a task on every executor slot starts a Python
    worker with the sinks imported. Nothing is written and the app's checkpoints are not touched; a plan that
    fails here is logged and left to its first batch."""
    began = time.monotonic()
    warming: list[StreamingQuery] = []
    for plan in plans:
        try:
            warming.append(start_warm_up_query(plan, f"{folder}/{plan.name}"))
        except Exception as exc:  # best effort: the query's first batch pays instead
            log.warning("warm-up of query %s failed: %s", plan.name, error_summary(java_message(exc)))
    deadline = time.monotonic() + WARM_UP_TIMEOUT_S
    for query in warming:
        with suppress(Exception):  # a query that failed raises here: told below, as it failed
            if not query.awaitTermination(max(deadline - time.monotonic(), 0.001)):  # type: ignore[arg-type]  # seconds: a float works
                query.stop()
        failure = query.exception()
        if failure is not None:
            name = str(query.name).removeprefix(WARM_UP_QUERY_PREFIX)
            log.warning("warm-up of query %s failed: %s", name, error_summary(str(failure)))
    delete_folder(spark, folder)
    slots = max(spark.sparkContext.defaultParallelism, 1)
    try:
        spark.sparkContext.parallelize(range(slots), slots).map(_import_sinks).collect()
    except Exception as exc:
        log.warning("warm-up of the executors' Python workers failed: %s", error_summary(java_message(exc)))
    log.info("warm-up of %d queries in %.1f s", len(plans), time.monotonic() - began)


def _import_sinks(_: int) -> int:
    """On an executor's Python worker: what the sinks' first batch would import."""
    import sluice.pipelines.sinks.kafka_eos  # noqa: F401

    return 0


def output_gate(plan: QueryPlan, cut_ms: int) -> Callable[[DataFrame], DataFrame]:
    """A per-batch step leaving out the rows final before `cut_ms` (windows that closed at or before it). Per
    micro-batch, on its output: on the streaming plan Spark pushes a filter on a window below the aggregation,
    where it would not reach the windows already in the state."""
    final_time = plan.final_time
    if final_time is None:
        raise ValueError(f"query {plan.name}: an output gate needs rows final by event time (a window)")
    cut = F.timestamp_millis(F.lit(cut_ms))
    return lambda df: df.where(F.col(final_time) >= cut)


def default_checkpoint(checkpoint_root: str, query: str) -> str:
    return f"{checkpoint_root.rstrip('/')}/{query}"


def _batch_handler(
    plan: QueryPlan,
    sink: Sink,
    checkpoint_of: Callable[[str], str],
    on_dead_letters: Callable[[str, int], None] | None,
) -> Callable[[DataFrame, int], None]:
    """Per micro-batch work: top-N and what follows it, or the dead letters (late marking, counting)."""
    source = plan.dead_letter_source
    tracker = LateTracker(plan.df.sparkSession, checkpoint_of, plan.late_rules) if plan.late_rules else None

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        # Read the source once when the batch runs several jobs (dead letters: marked, counted, written); a
        # persisted batch costs the block managers' pools a request each way.
        several_jobs = source is not None or tracker is not None
        cached = batch.persist() if several_jobs else batch
        try:
            out = tracker.mark(cached, batch_id) if tracker else cached
            for step in plan.batch_steps:
                out = step(out)
            dead = out.count() if source else 0
            if dead or not source or not sink.skips_empty_batches:  # most batches have no dead letters
                sink.write_batch(sink.records(out), batch_id)
            if source and on_dead_letters:
                on_dead_letters(source, dead)
        finally:
            if several_jobs:
                cached.unpersist()

    return each_batch
