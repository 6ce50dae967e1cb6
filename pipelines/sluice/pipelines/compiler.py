"""Compile a PipelineSpec into Spark Structured Streaming queries built from native SQL expressions.

Every sink becomes one streaming query. Built-in operations are Spark SQL only (no per-record Python).
Operations that Structured Streaming cannot run on an unbounded stream (top-N per window) run per
micro-batch inside foreachBatch, after the stateful part of the query.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import TimestampNTZType, TimestampType

from sluice.api.kafka_clients import KafkaClient, client_at
from sluice.api.pipeline import (
    SINK_OPS,
    DeadLetter,
    FromKafka,
    Join,
    Node,
    PipelineSpec,
)
from sluice.api.times import duration_ms, duration_to_spark, signed_duration_ms
from sluice.api.validation import PipelineInvalid, Problem, join_path

from .kafka_source import ERROR_COLUMN, SourceRecords, checked_records, kafka_source_options
from .late_rules import LateRule, late_rules, reach_column
from .metrics import OBSERVED_QUALITY
from .sinks.kafka import kafka_record

BatchStep = Callable[[DataFrame], DataFrame]
# Stands in for a source's Kafka stream (tests: batches of rows): a streaming DataFrame with the Kafka
# source's columns (key, value, topic, partition, offset, timestamp, and headers when asked for).
SourceFrames = Callable[[Node], DataFrame]
JOIN_WINDOW = "_sluice_window_start"  # each side's window in a sameWindow join
DEAD_LETTER_QUERY_SUFFIX = "-dead-letters"  # a source's dead letter query is named <source>-dead-letters
WINDOW_TIME = "window_time"  # a windowed aggregation's output column holding its event time


@dataclass(frozen=True)
class Stream:
    """A node's output while compiling, with what later operations need to know about it."""

    df: DataFrame
    event_time: str | None = None
    watermarked: bool = False
    windowed: bool = False  # output of a windowed aggregation: final rows per window (append mode)
    window_grid_ms: int | None = None  # its windows end on multiples of this (a tumbling size, a sliding step)
    tumbling: bool = False  # every window upstream is tumbling, over the records themselves: each record in one
    aggregated: bool = False  # a streaming aggregation without a window: needs update/complete mode
    grouped: bool = False  # an aggregation's groups (or fewer rows): a batch holds at most the groups it touched
    stateful: bool = False  # a stateful operation (aggregation, join, dedupe) upstream
    # A shuffle upstream: a stateful operation's, a lookup's without broadcast, or maybe a python step's.
    shuffled: bool = False
    batch_steps: tuple[BatchStep, ...] = ()  # applied per micro-batch (after top-N)

    def then(self, step: BatchStep, **changes: Any) -> Stream:
        """Apply a stateless step now, or per micro-batch once the stream has batch-only steps."""
        if self.batch_steps:
            return replace(self, batch_steps=(*self.batch_steps, step), **changes)
        return replace(self, df=step(self.df), **changes)


@dataclass
class QueryPlan:
    name: str
    df: DataFrame
    sink_op: str
    sink: Any
    output_mode: str
    batch_steps: tuple[BatchStep, ...] = ()
    late_rules: tuple[LateRule, ...] = ()  # a dead-letter query's: one per query that can drop the source's rows
    dead_letter_source: str | None = None  # set on a source's dead-letter query
    app: str = "app"
    grouped: bool = False  # the rows are an aggregation's groups (bounded per batch by the groups it touched)
    # The event-time column of rows that are final once the watermark passes it (a windowed aggregation's
    # window_time, in append mode): what a checkpoint migration's output gate compares with its cut.
    final_time: str | None = None
    final_grid_ms: int | None = None  # the windows behind final_time end on multiples of it (None: unknown)
    tumbling: bool = False  # final rows of tumbling windows only, each record in one (see Stream.tumbling)
    stateful: bool = False  # state of its own in the checkpoint (aggregation, join, dedupe)
    shuffled: bool = True  # a shuffle upstream (see Stream.shuffled)


@dataclass
class CompiledPipeline:
    queries: list[QueryPlan] = field(default_factory=list)
    sources: dict[str, FromKafka] = field(default_factory=dict)


class Compiler:
    def __init__(
        self,
        spark: SparkSession,
        spec: PipelineSpec,
        *,
        kafka: KafkaClient | None,
        prefix: str = "",
        app_name: str = "app",
        source_frames: SourceFrames | None = None,
        starting_offsets: Mapping[str, str] | None = None,
        since_ms: int | None = None,
        counted_before_ms: int | None = None,
    ) -> None:
        self.spark = spark
        self.since_ms = since_ms  # streams from the sources' records since then, not from their offsets (a warm-up)
        # Records of event time before it were counted in another query's windows (a migration's cut).
        self.counted_before_ms = counted_before_ms
        self.source_frames = source_frames
        self.starting_offsets = dict(starting_offsets or {})  # source node -> startingOffsets, over the spec's
        self.spec = spec
        self.kafka = kafka  # the app's Kafka and login
        self.prefix = prefix
        self.app_name = app_name
        self.index = {node.name: i for i, node in enumerate(spec.nodes)}
        self.nodes = {node.name: node for node in spec.nodes}
        self.streams: dict[str, Stream] = {}
        self.source_records: dict[str, SourceRecords] = {}

    # ---------------------------------------------------------------------------- entry point
    def compile(self) -> CompiledPipeline:
        compiled = CompiledPipeline()
        for node in self.spec.nodes:
            if node.kind == "sink":
                compiled.queries.append(self._guarded(node, functools.partial(self._sink, node)))
            elif node.fromKafka is not None:
                compiled.sources[node.name] = node.fromKafka
        if self.spec.deadLetter is not None:
            for name in compiled.sources:
                self.stream(name)  # make sure every source was compiled
                compiled.queries.append(self._dead_letter_query(self.source_records[name], self.spec.deadLetter))
        return compiled

    def stream(self, name: str) -> Stream:
        if name not in self.streams:
            node = self.nodes[name]
            self.streams[name] = self._guarded(node, lambda: self._build(node))
        return self.streams[name]

    def _guarded(self, node: Node, build: Callable[[], Any]) -> Any:
        """Turn Spark's analysis errors into a problem naming the node."""
        try:
            return build()
        except (AnalysisException, ParseException) as exc:
            message = str(exc).split("\n")[0].strip()
            raise PipelineInvalid([Problem(self.path(node, node.operation), message)]) from exc

    def path(self, node: Node, *parts: str | int) -> str:
        return join_path(self.prefix, "nodes", self.index[node.name], *parts)

    def fail(self, node: Node, message: str, *parts: str | int) -> PipelineInvalid:
        return PipelineInvalid([Problem(self.path(node, node.operation, *parts), message)])

    def _build(self, node: Node) -> Stream:
        if node.fromKafka is not None:
            return self._source(node, node.fromKafka)
        inputs = [self.stream(name) for name in node.inputs or []]
        return getattr(self, f"_op_{node.operation}")(node, node.config, *inputs)

    # -------------------------------------------------------------------------------- sources
    def _source(self, node: Node, src: FromKafka) -> Stream:
        records = self.source_records[node.name] = self._read_kafka(node, src)
        if records.parsed:
            # observe() ends whole-stage code generation, so it is paid only where parsing can fail.
            malformed = F.sum(F.when(F.col(ERROR_COLUMN).isNotNull(), 1).otherwise(0)).alias("malformed")
            observed = records.checked.observe(f"{OBSERVED_QUALITY}_{node.name}", malformed)
            good = observed.where(F.col(ERROR_COLUMN).isNull())
        else:  # plain text: only a record without a value (a tombstone) is left out
            good = records.checked.where(F.col("value").isNotNull())
        meta = [F.col(m).alias(f"kafka_{m}") for m in src.metadata]
        if src.eventTime == "kafka_timestamp" and "timestamp" not in src.metadata:
            meta.append(F.col("timestamp").alias("kafka_timestamp"))
        df = good.select(*records.fields, *meta)
        if src.watermark:
            assert src.eventTime is not None  # validated: 'watermark' needs 'eventTime'
            df = df.withWatermark(src.eventTime, duration_to_spark(src.watermark))
        return Stream(df, event_time=src.eventTime, watermarked=bool(src.watermark))

    def _kafka_frame(self, node: Node, src: FromKafka) -> DataFrame:
        kafka = client_at(self.kafka, src.bootstrapServers)
        if not kafka.bootstrap:
            raise self.fail(
                node,
                "no Kafka bootstrap servers: set spec.kafka.bootstrapServers, "
                "fromKafka.bootstrapServers or --bootstrap-servers",
                "bootstrapServers",
            )
        options = kafka_source_options(
            src,
            kafka,
            self.starting_offsets.get(node.name, src.startingOffsets),
            since_ms=self.since_ms,
        )
        return self.spark.readStream.format("kafka").options(**options).load()

    def _read_kafka(self, node: Node, src: FromKafka) -> SourceRecords:
        raw = self.source_frames(node) if self.source_frames is not None else self._kafka_frame(node, src)
        return checked_records(node, src, raw, lambda message, field: self.fail(node, message, field))

    # ----------------------------------------------------------------------------- transforms
    def _op_select(self, node: Node, exprs: list[str], stream: Stream) -> Stream:
        return self._stateless(stream, lambda df: df.selectExpr(*exprs))

    def _op_filter(self, node: Node, condition: str, stream: Stream) -> Stream:
        return self._stateless(stream, lambda df: df.where(condition))

    def _op_withColumns(self, node: Node, columns: dict[str, str], stream: Stream) -> Stream:
        return self._stateless(stream, lambda df: df.withColumns({k: F.expr(v) for k, v in columns.items()}))

    def _op_explode(self, node: Node, cfg, stream: Stream) -> Stream:
        explode = F.explode_outer if cfg.outer else F.explode

        def step(df: DataFrame) -> DataFrame:
            return df.withColumn(cfg.column, explode(F.expr(cfg.from_))).drop(*cfg.drop)

        return self._stateless(stream, step, grouped=False)  # one row becomes many

    def _op_python(self, node: Node, cfg, stream: Stream) -> Stream:
        module_name, function_name = cfg.function.split(":")
        try:
            function = getattr(importlib.import_module(module_name), function_name)
        except (ImportError, AttributeError) as exc:
            raise self.fail(node, f"cannot load {cfg.function}: {exc}", "function") from exc

        def step(df: DataFrame) -> DataFrame:
            out = function(df, **cfg.args)
            if not isinstance(out, DataFrame):
                raise self.fail(node, f"{cfg.function} returned {type(out).__name__}, not a DataFrame")
            return out

        # any number of rows per row, and any operation (a shuffle among them)
        return self._stateless(stream, step, grouped=False, shuffled=True)

    def _stateless(self, stream: Stream, step: BatchStep, **changes: Any) -> Stream:
        out = stream.then(step, **changes)
        if not out.batch_steps and out.event_time not in out.df.columns:
            out = replace(out, event_time=None, watermarked=False)  # the projection dropped it
        return out

    def _op_aggregate(self, node: Node, cfg, stream: Stream) -> Stream:
        if stream.batch_steps:
            raise self.fail(node, "an aggregation cannot follow topN")
        by_time = stream.windowed and stream.event_time in {k.strip().strip("`") for k in cfg.groupBy}
        self._check_chained(node, cfg, stream, by_time)
        keys: list[Column] = [F.expr(k) for k in cfg.groupBy]
        window = cfg.window
        if window is not None:
            on = window.timeColumn or stream.event_time
            if on is None:
                raise self.fail(
                    node, "needs an event-time column: set eventTime on the source or window.timeColumn", "window"
                )
            if window.tumbling:
                keys.insert(0, F.window(on, duration_to_spark(window.tumbling)).alias("window"))
                if self.counted_before_ms is not None:  # each record is in one window: counted there or here
                    since = F.timestamp_millis(F.lit(self.counted_before_ms))
                    stream = replace(stream, df=stream.df.where(F.col(on) >= since))
            elif window.sliding:
                keys.insert(
                    0,
                    F.window(on, duration_to_spark(window.sliding.size), duration_to_spark(window.sliding.slide)).alias(
                        "window"
                    ),
                )
            else:
                keys.insert(0, F.session_window(on, duration_to_spark(window.session)).alias("window"))
        aggregated = stream.df.groupBy(*keys).agg(*[F.expr(e).alias(n) for n, e in cfg.aggregations.items()])
        if window is None:
            if by_time:  # one group per window of the input: final once the watermark passes it
                return Stream(
                    aggregated,
                    event_time=stream.event_time,
                    watermarked=True,
                    windowed=True,
                    window_grid_ms=stream.window_grid_ms,
                    tumbling=stream.tumbling,
                    grouped=True,
                    stateful=True,
                    shuffled=True,
                )
            return Stream(aggregated, aggregated=True, grouped=True, stateful=True, shuffled=True)
        others = [c for c in aggregated.columns if c != "window"]
        # window_time (the window's last instant, end - 1µs) keeps the watermark: the event time of what follows.
        flat = aggregated.select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            F.window_time("window").alias(WINDOW_TIME),
            *others,
        )
        grid = window.tumbling or (window.sliding.slide if window.sliding else None)
        return Stream(
            flat,
            event_time=WINDOW_TIME,
            watermarked=stream.watermarked,
            windowed=stream.watermarked,
            window_grid_ms=duration_ms(grid) if grid else None,  # session windows end anywhere
            tumbling=bool(window.tumbling) and (stream.tumbling or not stream.stateful),
            aggregated=not stream.watermarked,
            grouped=True,
            stateful=True,
            shuffled=True,
        )

    def _check_chained(self, node: Node, cfg, stream: Stream, by_time: bool) -> None:
        """Spark runs an aggregation after another one only in append mode, with the first one's windows
        over a watermarked event time and the second grouping by time (a window, or the event time itself)."""
        if stream.aggregated:
            raise self.fail(
                node,
                "cannot aggregate the output of an aggregation without a watermarked window (it runs in update "
                "mode; Spark chains aggregations in append mode only): window the first one over an event time "
                "with a watermark",
            )
        if stream.windowed and cfg.window is None and not by_time:
            raise self.fail(
                node,
                f"an aggregation after a windowed aggregation needs a window (over its event time "
                f"{stream.event_time}) or {stream.event_time} in groupBy",
                "window",
            )

    def _op_join(self, node: Node, cfg: Join, left: Stream, right: Stream) -> Stream:
        left_name, right_name = node.inputs or []
        for side_name, side in ((left_name, left), (right_name, right)):
            if not (side.event_time and side.watermarked):
                raise self.fail(
                    node,
                    f"input '{side_name}' needs an event time with a watermark "
                    "(set eventTime and watermark on its source)",
                    cfg.bound,
                )
            if side.batch_steps:
                raise self.fail(node, f"input '{side_name}' comes after topN and cannot be joined")
        lq, rq = f"`{left_name}`", f"`{right_name}`"
        l_time, r_time = F.col(f"{lq}.`{left.event_time}`"), F.col(f"{rq}.`{right.event_time}`")
        left_df, right_df = left.df, right.df
        if cfg.sameWindow is not None:
            # Equal window starts (computed, not F.window: its column would be a second event time of the side),
            # and the range that implies, from which Spark derives when to evict each side's rows.
            assert left.event_time and right.event_time  # checked above
            left_df = left_df.withColumn(JOIN_WINDOW, _window_start(left.event_time, cfg.sameWindow))
            right_df = right_df.withColumn(JOIN_WINDOW, _window_start(right.event_time, cfg.sameWindow))
            size = _interval(cfg.sameWindow)
            bound = (
                (F.col(f"{lq}.{JOIN_WINDOW}") == F.col(f"{rq}.{JOIN_WINDOW}"))
                & (r_time > l_time - size)
                & (r_time < l_time + size)
            )
        elif cfg.between is not None:
            lower, upper = cfg.between
            bound = (r_time >= l_time + _interval(lower)) & (r_time <= l_time + _interval(upper))
        elif cfg.until is not None:
            self._timestamp_column(node, left.df, cfg.until.column, ("until", "column"))
            until = F.col(f"{lq}.`{cfg.until.column}`")
            # The last term bounds the left rows' stay in the state (Spark cannot from a column).
            bound = (r_time >= l_time) & (r_time <= until) & (r_time <= l_time + _interval(cfg.until.atMost))
        else:
            assert cfg.within is not None
            bound = (r_time >= l_time) & (r_time <= l_time + _interval(cfg.within))
        joined = left_df.alias(left_name).join(right_df.alias(right_name), F.expr(cfg.condition) & bound, cfg.type)
        window: list[Column] = []
        if cfg.sameWindow is not None:
            # An outer join's unmatched rows have only their own side's window.
            start = F.coalesce(F.col(f"{lq}.{JOIN_WINDOW}"), F.col(f"{rq}.{JOIN_WINDOW}"))
            window = [start.alias("window_start"), (start + _interval(cfg.sameWindow)).alias("window_end")]
        if cfg.select:
            out = (joined.select("*", *window) if window else joined).selectExpr(*cfg.select)
        else:
            window_names = {"window_start", "window_end"} if window else set()
            left_columns = [c for c in left.df.columns if c not in window_names]
            taken = set(left_columns) | window_names
            prefix = right_name.replace("-", "_")
            out = joined.select(
                *window,
                *[F.col(f"{lq}.`{c}`").alias(c) for c in left_columns],
                *[F.col(f"{rq}.`{c}`").alias(f"{prefix}_{c}" if c in taken else c) for c in right.df.columns],
            )
        event_time = left.event_time if left.event_time in out.columns else None
        return Stream(out, event_time=event_time, watermarked=event_time is not None, stateful=True, shuffled=True)

    def _timestamp_column(self, node: Node, df: DataFrame, column: str, path: tuple[str, ...]) -> None:
        kinds = {f.name: f.dataType for f in df.schema.fields}
        if column not in kinds:
            raise self.fail(node, f"unknown column '{column}' (the left input has {', '.join(df.columns)})", *path)
        if not isinstance(kinds[column], TimestampType | TimestampNTZType):
            raise self.fail(node, f"'{column}' is of type {kinds[column].simpleString()}, not a timestamp", *path)

    def _op_lookup(self, node: Node, cfg, stream: Stream) -> Stream:
        reader = self.spark.read.format(cfg.format)
        if cfg.format == "csv":
            reader = reader.option("header", "true")
        reader = reader.schema(cfg.schema_) if cfg.schema_ else reader.option("inferSchema", "true")
        try:
            table = reader.load(cfg.path)
        except AnalysisException as exc:
            raise self.fail(node, f"cannot read {cfg.path}: {str(exc).splitlines()[0]}", "path") from exc
        missing = [c for c in cfg.keys if c not in table.columns]
        if missing:
            raise self.fail(
                node,
                f"table {cfg.path} has no column(s) {', '.join(missing)} (it has {', '.join(table.columns)})",
                "keys",
            )
        table = F.broadcast(table) if cfg.broadcast else table
        joined = stream.then(lambda df: df.join(table, on=list(cfg.keys), how=cfg.type), grouped=False)  # 1:n
        return joined if cfg.broadcast else replace(joined, shuffled=True)

    def _op_dedupe(self, node: Node, cfg, stream: Stream) -> Stream:
        if not stream.watermarked or stream.batch_steps:
            raise self.fail(node, "needs a watermarked input (set eventTime and watermark on the source)")
        deduped = stream.df.dropDuplicatesWithinWatermark(list(cfg.keys))
        return replace(stream, df=deduped, stateful=True, shuffled=True)

    def _op_union(self, node: Node, cfg, *streams: Stream) -> Stream:
        if any(s.batch_steps for s in streams):
            raise self.fail(node, "inputs after topN cannot be unioned")
        df = functools.reduce(
            lambda a, b: a.unionByName(b, allowMissingColumns=cfg.allowMissingColumns), [s.df for s in streams]
        )
        times = {s.event_time for s in streams}
        event_time = times.pop() if len(times) == 1 else None
        return Stream(
            df,
            event_time=event_time,
            watermarked=event_time is not None and all(s.watermarked for s in streams),
            stateful=any(s.stateful for s in streams),
            shuffled=any(s.shuffled for s in streams),
        )

    def _op_topN(self, node: Node, cfg, stream: Stream) -> Stream:
        if not stream.windowed:
            raise self.fail(
                node, "needs a windowed aggregation with a watermark upstream (each window's rows are final only then)"
            )
        missing = [c for c in cfg.partitionBy if c not in stream.df.columns]
        if missing:
            raise self.fail(node, f"unknown column(s) {', '.join(missing)}", "partitionBy")
        # One SQL window expression: only in ORDER BY does Spark read "x DESC" as a sort order
        # (F.expr("x DESC") is x aliased as DESC, which would sort ascending).
        partition = ", ".join(f"`{c}`" for c in cfg.partitionBy)
        over = (f"PARTITION BY {partition} " if partition else "") + f"ORDER BY {', '.join(cfg.orderBy)}"
        rank = F.expr(f"{'rank' if cfg.ties else 'row_number'}() OVER ({over})")

        def top(df: DataFrame) -> DataFrame:
            return df.withColumn("_rank", rank).where(f"_rank <= {cfg.limit}").drop("_rank")

        top(self.spark.createDataFrame([], stream.df.schema))  # analyses the expressions now, not mid-stream
        return replace(stream, batch_steps=(*stream.batch_steps, top))

    # ---------------------------------------------------------------------------------- sinks
    def _sink(self, node: Node) -> QueryPlan:
        stream = self.stream((node.inputs or [""])[0])
        cfg = node.config
        mode = cfg.outputMode or ("update" if stream.aggregated or self.spec.trigger.realTime else "append")
        if node.operation == "toFiles" and mode != "append":
            raise self.fail(
                node,
                "file sinks take append mode only: aggregate over a window with a "
                "watermark so each window is written once",
                "outputMode",
            )
        if node.operation == "toKafka" and not stream.batch_steps:
            kafka_record(stream.df, cfg)  # Spark analyses the key/value/headers expressions now, not mid-stream
        return QueryPlan(
            node.name,
            stream.df,
            node.operation,
            cfg,
            mode,
            stream.batch_steps,
            app=self.app_name,
            grouped=stream.grouped and mode != "complete",  # complete mode: every group, every batch
            final_time=stream.event_time if stream.windowed and mode == "append" else None,
            final_grid_ms=stream.window_grid_ms if stream.windowed and mode == "append" else None,
            tumbling=stream.tumbling and stream.windowed and mode == "append",
            stateful=stream.stateful,
            shuffled=stream.shuffled,
        )

    def _dead_letter_query(self, records: SourceRecords, dead: DeadLetter) -> QueryPlan:
        src, name = records.node.fromKafka, records.node.name
        assert src is not None
        late = late_rules(self.spec, name) if dead.lateRecords and src.watermark else ()
        columns: list[Column | str] = [
            F.lit(name).alias("source"),
            F.col(ERROR_COLUMN).alias("error"),
            "topic",
            "partition",
            "offset",
            F.col("timestamp").alias("kafka_timestamp"),
            "key",
            "value",
        ]
        checked = records.checked
        if late:  # lateness is decided per batch, from the event time (a watermark implies one)
            assert src.eventTime is not None
            event_time = "timestamp" if src.eventTime == "kafka_timestamp" else src.eventTime
            columns.append(F.col(event_time).alias("_event_time"))
            # A record a filter leaves out never reaches the stateful operation: never late there.
            checked = checked.withColumns({f"kafka_{m}": F.col(m) for m in {*src.metadata, "timestamp"}})
            for i, rule in enumerate(late):
                if rule.filters:
                    kept = F.expr(" AND ".join(f"({c})" for c in rule.filters))
                    columns.append(F.coalesce(kept, F.lit(False)).alias(reach_column(i)))
        df = checked.select(*columns)
        if not late:
            df = df.where(F.col("error").isNotNull())
        sink_op = dead.sink_operation
        return QueryPlan(
            f"{name}{DEAD_LETTER_QUERY_SUFFIX}",
            df,
            sink_op,
            getattr(dead, sink_op),
            "append",
            late_rules=late,
            dead_letter_source=name,
            app=self.app_name,
            shuffled=False,
        )


def _interval(duration: str) -> Column:
    """A (signed) duration as a Spark day-time interval literal, which Spark's join state eviction reads."""
    return F.expr(f"INTERVAL {signed_duration_ms(duration)} MILLISECONDS")


def _window_start(event_time: str, size: str) -> Column:
    """The start of the tumbling window of `size` holding the event time (windows aligned on the epoch, as
    Spark's window())."""
    micros = F.unix_micros(F.col(f"`{event_time}`"))
    return F.timestamp_micros(micros - F.pmod(micros, F.lit(duration_ms(size) * 1000)))


def compile_pipeline(
    spark: SparkSession,
    spec: PipelineSpec,
    *,
    kafka: KafkaClient | None,
    prefix: str = "",
    app_name: str = "app",
    source_frames: SourceFrames | None = None,
    starting_offsets: Mapping[str, str] | None = None,
    since_ms: int | None = None,
    counted_before_ms: int | None = None,
) -> CompiledPipeline:
    """`starting_offsets`: source node name -> Spark's startingOffsets, instead of the spec's (a migrated query's
    first batch). `since_ms`: the Kafka streams start at the records of that time (a standby driver's warm-up).
    `counted_before_ms`: records of event time before it were counted in another query's windows (a
    migration's cut): tumbling windows leave them out, so the one straddling the cut counts only its records
    from the cut on (meant for a query whose plan is QueryPlan.tumbling: in one with a sliding or session window
    after a tumbling one, that window would miss them)."""
    return Compiler(
        spark,
        spec,
        kafka=kafka,
        prefix=prefix,
        app_name=app_name,
        source_frames=source_frames,
        starting_offsets=starting_offsets,
        since_ms=since_ms,
        counted_before_ms=counted_before_ms,
    ).compile()


__all__ = ["SINK_OPS", "CompiledPipeline", "Compiler", "QueryPlan", "compile_pipeline"]
