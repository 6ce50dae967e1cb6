"""The pipeline spec: `spec.pipeline` of a StreamingApp.

This model is the single source of truth: it validates manifests, its JSON schema becomes the CRD's
OpenAPI schema, and the compiler reads it. Field names are camelCase as in every Kubernetes manifest.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from .spec_types import DNS_LABEL, Strict, cel, list_map
from .times import Duration, SignedDuration, duration_ms, signed_duration_ms

SqlExpr = Annotated[
    str,
    StringConstraints(min_length=1),
    Field(description="A Spark SQL expression, e.g. upper(word) or price * qty AS revenue."),
]
IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
Identifier = Annotated[str, StringConstraints(pattern=IDENTIFIER_PATTERN)]
NodeName = Annotated[str, DNS_LABEL, Field(description="Unique node name (DNS label: lower case, digits, '-').")]


def _one_of(*fields: str) -> str:
    return f"[{', '.join(f'has(self.{f})' for f in fields)}].exists_one(x, x)"


# --------------------------------------------------------------------------------------- sources

KAFKA_METADATA_COLUMNS = ("key", "timestamp", "headers", "topic", "partition", "offset")
# A task reads offsets that exist, yet near a live topic's end each poll took the consumer's fetch.max.wait.ms
# (500 ms by default): a paced topic's micro-batches read in 252-328 ms instead of 65-124 ms (make
# bench-source-fetch). A source's options."kafka.fetch.max.wait.ms" overrides it.
SOURCE_FETCH_MAX_WAIT_MS = 10
# A micro-batch task's consumer asks the broker for the partition's offset range twice after every poll (Spark's
# InternalKafkaConsumer.fetch): with the Java client's 500 records a poll, two round trips per 500 records read.
# A source's options."kafka.max.poll.records" overrides it.
SOURCE_MAX_POLL_RECORDS = 10_000


# Kafka client settings that carry a credential: given in an option they would be copied into every object the
# spec is (the app, its revisions, the SparkApplication); spec.kafka.authentication reads them from Secrets.
CREDENTIAL_OPTION = re.compile(r"(?i)password|secret|jaas|(^|\.)ssl\.(keystore\.key|key\.pem|key\.location)$")


def credential_options(options: dict[str, str]) -> dict[str, str]:
    """The options refused as credentials, as the error says it."""
    refused = sorted(k for k in options if CREDENTIAL_OPTION.search(k))
    if refused:
        raise ValueError(
            f"options {', '.join(refused)}: credentials are not options (they would be copied into the app's "
            "objects): set spec.kafka.authentication and spec.kafka.tls, which read them from Secrets"
        )
    return options


class FromKafka(Strict):
    """Read a Kafka topic (or topics matching a pattern) as a stream."""

    model_config = cel(
        ("has(self.topic) != has(self.pattern)", "set exactly one of 'topic' or 'pattern'"),
        ("self.format == 'text' || has(self.schema)", "json and csv need 'schema'"),
        ("!has(self.watermark) || has(self.eventTime)", "'watermark' needs 'eventTime'"),
        ("!has(self.eventTimeExpr) || has(self.eventTime)", "'eventTimeExpr' needs 'eventTime'"),
    )

    topic: str | None = Field(None, description="Topic name (or a comma-separated list).")
    pattern: str | None = Field(None, description="Java regex of topics to subscribe to.")
    format: Literal["text", "json", "csv"] = Field("text", description="How record values are parsed.")
    schema_: str | None = Field(
        None, alias="schema", description="Spark DDL of the value for json/csv, e.g. 'id STRING, ts TIMESTAMP'."
    )
    csvDelimiter: str = Field(",", min_length=1, max_length=1, description="format csv: the field separator.")
    metadata: list[Literal["key", "timestamp", "headers", "topic", "partition", "offset"]] = Field(
        default_factory=list,
        description="Kafka record fields to keep, as columns kafka_<field> (kafka_key, kafka_timestamp, ...).",
    )
    eventTime: str | None = Field(
        None,
        description="Column holding event time: a schema field, kafka_timestamp, or the column eventTimeExpr computes.",
    )
    eventTimeExpr: SqlExpr | None = Field(
        None,
        description="Spark SQL expression computing the event time from the record's fields, kept as column "
        "eventTime: a nested field (payload.ts), timestamp_millis(try_cast(ts AS BIGINT)), ... A TIMESTAMP, or "
        "a STRING or DATE cast to one; a record whose event time is null or unparseable is malformed.",
    )
    watermark: Duration | None = Field(None, description="How late events may arrive (needs eventTime).")
    startingOffsets: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a query without a checkpoint starts reading (a checkpoint's offsets win)."
    )
    isolationLevel: Literal["readCommitted", "readUncommitted"] = Field(
        "readCommitted",
        description="readCommitted: only records of committed Kafka transactions (an "
        "exactly-once sink's output once its batch is complete); readUncommitted: also open and aborted ones.",
    )
    maxRecordsPerTrigger: int | None = Field(None, ge=1, description="At most this many records a micro-batch.")
    minPartitions: int | None = Field(None, ge=1, description="Split Kafka partitions into more Spark tasks.")
    bootstrapServers: str | None = Field(None, description="Overrides the app's Kafka for this source.")
    options: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark Kafka source options (kafka.* go to the consumers; sluice sets "
        f"kafka.fetch.max.wait.ms to {SOURCE_FETCH_MAX_WAIT_MS} and kafka.max.poll.records to "
        f"{SOURCE_MAX_POLL_RECORDS}; credentials come from spec.kafka).",
    )
    _no_credentials = field_validator("options")(credential_options)

    @model_validator(mode="after")
    def _check(self) -> FromKafka:
        if (self.topic is None) == (self.pattern is None):
            raise ValueError("set exactly one of 'topic' or 'pattern'")
        if self.format in ("json", "csv") and not self.schema_:
            raise ValueError(f"format {self.format} needs 'schema' (Spark DDL, e.g. 'id STRING, ts TIMESTAMP')")
        if self.watermark and not self.eventTime:
            raise ValueError("'watermark' needs 'eventTime'")
        if self.eventTimeExpr is not None:
            if not self.eventTime:
                raise ValueError("'eventTimeExpr' needs 'eventTime' (the name of the column it computes)")
            if self.eventTime == "kafka_timestamp" or not re.fullmatch(IDENTIFIER_PATTERN, self.eventTime):
                raise ValueError(
                    f"eventTime {self.eventTime!r}: with eventTimeExpr, eventTime names the column it computes "
                    "(letters, digits, _; not kafka_timestamp)"
                )
        return self


# ------------------------------------------------------------------------------------ transforms


class Explode(Strict):
    """One output row per element of an array expression; other columns are kept."""

    column: Identifier = Field(description="Name of the new column holding each element.")
    from_: SqlExpr = Field(alias="from", description="Array expression, e.g. split(value, ' ').")
    drop: list[str] = Field(default_factory=list, description="Columns to drop afterwards.")
    outer: bool = Field(False, description="Keep rows whose array is empty or null.")


class Sliding(Strict):
    """Windows of `size`, one starting every `slide`."""

    size: Duration
    slide: Duration


class Window(Strict):
    """An event-time window; exactly one of tumbling, sliding or session."""

    model_config = cel(
        _one_of("tumbling", "sliding", "session"), "set exactly one of 'tumbling', 'sliding' or 'session'"
    )

    tumbling: Duration | None = None
    sliding: Sliding | None = Field(None, description="Windows of `size` starting every `slide`.")
    session: Duration | None = Field(None, description="Session gap.")
    timeColumn: str | None = Field(None, description="Event-time column (default: the input's event time).")

    @model_validator(mode="after")
    def _one_kind(self) -> Window:
        kinds = [k for k in ("tumbling", "sliding", "session") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("set exactly one of 'tumbling', 'sliding' or 'session'")
        return self


class Aggregate(Strict):
    """Group-by aggregation, optionally over event-time windows (adds window_start, window_end, window_time)."""

    groupBy: list[SqlExpr] = Field(default_factory=list, description="Grouping keys: SQL expressions.")
    window: Window | None = None
    aggregations: dict[Identifier, SqlExpr] = Field(
        min_length=1,
        description="Output column -> aggregate expression: count(*), sum(x), avg(x), "
        "min(x), max(x), approx_count_distinct(x), percentile_approx(x, 0.99), ...",
    )


class Until(Strict):
    """The right side's event time lies between the left's and a timestamp column of the left side."""

    column: str = Field(description="A TIMESTAMP column of the left input, e.g. expires.")
    atMost: Duration = Field(
        description="And at most this after the left's event time: how long a left row is kept in the join's state."
    )


JOIN_BOUNDS = ("within", "between", "until", "sameWindow")


class Join(Strict):
    """Stream-stream join of the node's two inputs, bounded in event time by one of the four bounds."""

    model_config = cel(_one_of(*JOIN_BOUNDS), "set exactly one of 'within', 'between', 'until' or 'sameWindow'")

    condition: SqlExpr = Field(description="Join condition; refer to the inputs by node name: req.id = resp.id.")
    within: Duration | None = Field(None, description="The right side's event time lies within this after the left's.")
    between: list[SignedDuration] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="[lower, upper]: the right side's event time lies between the left's + lower and the "
        "left's + upper (both included), e.g. [-5s, 10s].",
    )
    until: Until | None = None
    sameWindow: Duration | None = Field(
        None,
        description="Both sides' event times fall in the same tumbling window of this size "
        "(the output gets its window_start, window_end).",
    )
    type: Literal["inner", "leftOuter", "rightOuter"] = Field(
        "inner", description="outer joins emit a row without its match once the watermark passes its bound."
    )
    select: list[SqlExpr] = Field(
        default_factory=list, description="Output columns (default: all, clashes prefixed with the node name)."
    )

    @field_validator("between")
    @classmethod
    def _ordered(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and signed_duration_ms(value[0]) > signed_duration_ms(value[1]):
            raise ValueError(f"the lower bound {value[0]} is after the upper bound {value[1]}")
        return value

    @model_validator(mode="after")
    def _one_bound(self) -> Join:
        bounds = [k for k in JOIN_BOUNDS if getattr(self, k) is not None]
        if len(bounds) != 1:
            found = ", ".join(bounds) if bounds else "none"
            raise ValueError(f"set exactly one of 'within', 'between', 'until' or 'sameWindow' (found {found})")
        return self

    @property
    def bound(self) -> str:
        return next(k for k in JOIN_BOUNDS if getattr(self, k) is not None)

    def span_ms(self) -> int:
        """How far apart in event time two joined rows may lie (how long a row may wait in the state)."""
        if self.between is not None:
            return max(signed_duration_ms(self.between[1]), -signed_duration_ms(self.between[0]), 0)
        if self.until is not None:
            return duration_ms(self.until.atMost)
        return duration_ms(self.within or self.sameWindow or "0s")


class Lookup(Strict):
    """Stream-static join: enrich the stream from a table read from files once at start."""

    path: str = Field(description="Where the table is (a path or a Hadoop URI), read once when the query starts.")
    format: Literal["csv", "json", "parquet"] = Field("csv", description="The table's file format.")
    schema_: str | None = Field(None, alias="schema", description="Spark DDL (csv/json; default: inferred).")
    keys: list[Identifier] = Field(min_length=1, description="Join columns present in both stream and table.")
    type: Literal["inner", "left"] = Field("left", description="left: a record without a match goes on, with nulls.")
    broadcast: bool = Field(True, description="Send the table to every executor (small tables).")


class Dedupe(Strict):
    """Drop duplicate rows by key within the input's watermark."""

    keys: list[str] = Field(min_length=1, description="Columns whose values make a record a duplicate.")


class Union(Strict):
    """Union of all inputs by column name."""

    allowMissingColumns: bool = Field(False, description="Inputs may lack columns of the others (nulls).")


class TopN(Strict):
    """The first `limit` rows per group (default: per window) after a windowed aggregation, or all tied rows."""

    limit: int = Field(ge=1, description="Rows kept per group.")
    orderBy: list[SqlExpr] = Field(min_length=1, description="e.g. ['revenue DESC']")
    partitionBy: list[str] = Field(
        default_factory=lambda: ["window_start", "window_end"], description="The top N is kept per these columns."
    )
    ties: bool = Field(
        False,
        description="Keep every row ranked within limit, ties included (SQL RANK: may keep more than limit "
        "rows); default: exactly limit rows, ties broken arbitrarily (ROW_NUMBER).",
    )


class PythonTransform(Strict):
    """Escape hatch: `module:function` taking (DataFrame, **args) and returning a DataFrame."""

    function: Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")] = Field(
        description="module:function in the image, called with the DataFrame and args."
    )
    args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the function.")


# ----------------------------------------------------------------------------------------- sinks


class SinkBase(Strict):
    outputMode: Literal["append", "update", "complete"] | None = Field(
        None,
        description="Default: append, or update for aggregations without a window and with trigger.realTime.",
    )


class ToKafka(SinkBase):
    """Writes each row as a Kafka record (key, value and headers from SQL expressions)."""

    topic: str = Field(description="The output topic.")
    key: SqlExpr | None = Field(None, description="Key expression (default: no key).")
    value: SqlExpr = Field("to_json(struct(*))", description="Value expression (default: the row as JSON).")
    headers: SqlExpr | None = Field(None, description="array<struct<key: string, value: binary>> expression.")
    delivery: Literal["exactlyOnce", "atLeastOnce"] = Field(
        "exactlyOnce",
        description="exactlyOnce: each micro-batch is committed once in Kafka transactions, also "
        "when a restart replays it (consumers read with isolation.level=read_committed); atLeastOnce: Spark's "
        "Kafka sink, a replayed batch is written again.",
    )
    writers: Literal["auto", "driver", "executors"] = Field(
        "auto",
        description="exactlyOnce: where the transactions are written. driver: the micro-batch's records are "
        "collected and written by the driver, whose producers live as long as the query (the output must fit in "
        "the driver's memory); executors: one Spark task per Kafka partition. auto: driver when the rows are "
        "an aggregation's groups (a batch holds the groups it changed); for other rows, the driver after a batch "
        "of at most 100,000 records, the executors for a run's first batch and after a larger one.",
    )
    bootstrapServers: str | None = Field(None, description="Overrides the app's Kafka for this sink.")
    options: dict[str, str] = Field(
        default_factory=dict,
        description="Kafka client settings prefixed kafka. "
        "(atLeastOnce: Java client and Spark sink options; exactlyOnce: librdkafka "
        "settings, e.g. kafka.transactional.id as the prefix; credentials come from spec.kafka).",
    )
    _no_credentials = field_validator("options")(credential_options)

    @model_validator(mode="after")
    def _client_options(self) -> ToKafka:
        spark_only = sorted(k for k in self.options if not k.startswith("kafka."))
        if self.delivery == "exactlyOnce" and spark_only:
            raise ValueError(
                f"options {', '.join(spark_only)}: with delivery exactlyOnce, options are Kafka client "
                "settings prefixed kafka. (Spark's sink options apply to atLeastOnce only)"
            )
        if self.delivery == "atLeastOnce" and self.writers != "auto":
            raise ValueError("writers: applies to delivery exactlyOnce only (Spark's sink writes from executors)")
        return self


class ToConsole(SinkBase):
    """Prints each micro-batch in the driver's log (for trying a pipeline)."""

    numRows: int = Field(20, ge=1, description="Rows printed per batch.")
    truncate: bool = Field(False, description="Cut long values.")


class ToFiles(SinkBase):
    """Writes files, exactly once per batch (Spark's file sink and its log)."""

    path: str = Field(description="The output folder (a path or a Hadoop URI).")
    format: Literal["parquet", "json", "csv"] = Field("parquet", description="The files' format.")
    partitionBy: list[str] = Field(default_factory=list, description="Columns that name subfolders.")


class ToMemory(SinkBase):
    """An in-memory table of the driver (for tests)."""

    table: Identifier = Field(description="The table's name.")


# ------------------------------------------------------------------------------------------ nodes

SOURCE_OPS = ("fromKafka",)
TRANSFORM_OPS = (
    "select",
    "filter",
    "withColumns",
    "explode",
    "aggregate",
    "join",
    "lookup",
    "dedupe",
    "union",
    "topN",
    "python",
)
SINK_OPS = ("toKafka", "toConsole", "toFiles", "toMemory")
OPERATIONS = SOURCE_OPS + TRANSFORM_OPS + SINK_OPS


class Node(Strict):
    """One step of the DAG: a name, its inputs (none for sources) and exactly one operation."""

    model_config = cel(
        (_one_of(*OPERATIONS), "a node needs exactly one operation key"),
        ("!has(self.fromKafka) || !has(self.inputs) || size(self.inputs) == 0", "a source takes no inputs"),
    )

    name: NodeName
    inputs: list[str] | None = Field(None, description="Names of upstream nodes (absent for sources).")

    fromKafka: FromKafka | None = None

    select: list[SqlExpr] | None = Field(None, min_length=1, description="Projection, e.g. ['upper(w) AS w'].")
    filter: SqlExpr | None = Field(None, description="Keep rows where this SQL condition is true.")
    withColumns: dict[Identifier, SqlExpr] | None = Field(
        None, min_length=1, description="Columns added or replaced: name -> SQL expression."
    )
    explode: Explode | None = None
    aggregate: Aggregate | None = None
    join: Join | None = None
    lookup: Lookup | None = None
    dedupe: Dedupe | None = None
    union: Union | None = None
    topN: TopN | None = None
    python: PythonTransform | None = None

    toKafka: ToKafka | None = None
    toConsole: ToConsole | None = None
    toFiles: ToFiles | None = None
    toMemory: ToMemory | None = None

    # How many inputs each operation takes: (min, max); None = unbounded.
    ARITY: ClassVar[dict[str, tuple[int, int | None]]] = {
        **{op: (0, 0) for op in SOURCE_OPS},
        **{op: (1, 1) for op in TRANSFORM_OPS},
        "join": (2, 2),
        "union": (2, None),
        **{op: (1, 1) for op in SINK_OPS},
    }

    @model_validator(mode="after")
    def _exactly_one_operation(self) -> Node:
        present = self.operations()
        if len(present) != 1:
            found = ", ".join(present) if present else "none"
            raise ValueError(f"a node needs exactly one operation key ({', '.join(OPERATIONS)}); found {found}")
        return self

    def operations(self) -> list[str]:
        return [op for op in OPERATIONS if getattr(self, op) is not None]

    @property
    def operation(self) -> str:
        return self.operations()[0]

    @property
    def config(self) -> Any:
        return getattr(self, self.operation)

    @property
    def kind(self) -> Literal["source", "transform", "sink"]:
        if self.operation in SOURCE_OPS:
            return "source"
        return "sink" if self.operation in SINK_OPS else "transform"


class ProcessingTime(Strict):
    """When micro-batches run: every processingTime, once (availableNow), or continuously (realTime)."""

    model_config = cel(
        "[has(self.processingTime), has(self.availableNow) && self.availableNow, has(self.realTime)].exists_one(x, x)",
        "set exactly one of 'processingTime', 'availableNow' or 'realTime'",
    )

    processingTime: Duration | None = None
    availableNow: bool | None = Field(None, description="Process what is there, then stop (a batch run).")
    realTime: Duration | None = Field(
        None,
        description="Spark real-time mode (Spark >= 4.1), with this checkpoint interval: records are processed as "
        "they arrive; stateless pipelines only, toKafka with delivery atLeastOnce or toConsole, a task slot per "
        "Kafka partition read.",
    )

    @model_validator(mode="after")
    def _one(self) -> ProcessingTime:
        set_ = [k for k in ("processingTime", "availableNow", "realTime") if getattr(self, k)]
        if len(set_) != 1:
            raise ValueError("set exactly one of 'processingTime', 'availableNow' or 'realTime'")
        return self

    @property
    def interval_ms(self) -> int | None:
        """The processing-time interval, or real-time mode's batch length; None for availableNow."""
        interval = self.processingTime or self.realTime
        return duration_ms(interval) if interval else None


class DeadLetter(Strict):
    """Where malformed records (and, if asked, late records) go, with the error and the original bytes."""

    model_config = cel(
        _one_of("toKafka", "toFiles", "toConsole", "toMemory"),
        "set exactly one of toKafka, toFiles, toConsole, toMemory",
    )

    toKafka: ToKafka | None = None
    toFiles: ToFiles | None = None
    toConsole: ToConsole | None = None
    toMemory: ToMemory | None = None
    lateRecords: bool = Field(
        False, description="Also send the records Spark dropped as later than the watermark of their micro-batch."
    )

    @model_validator(mode="after")
    def _one_sink(self) -> DeadLetter:
        sinks = [k for k in SINK_OPS if getattr(self, k) is not None]
        if len(sinks) != 1:
            raise ValueError(f"set exactly one of {', '.join(SINK_OPS)}")
        return self

    @property
    def sink_operation(self) -> str:
        return next(k for k in SINK_OPS if getattr(self, k) is not None)


class PipelineSpec(Strict):
    """A streaming DAG: sources, transforms and sinks, compiled to Spark Structured Streaming."""

    nodes: list[Node] = Field(
        min_length=1,
        max_length=256,
        json_schema_extra=list_map("name"),
        description="The DAG's nodes: sources, operations and sinks, each named and wired by its inputs.",
    )
    trigger: ProcessingTime = Field(default_factory=lambda: ProcessingTime(processingTime="1s"))
    deadLetter: DeadLetter | None = None
