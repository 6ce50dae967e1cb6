"""A fromKafka node's records as the compiler starts from them: the Spark Kafka source's options, and each
record parsed (json, csv or text) and checked, with why it is refused (`ERROR_COLUMN`: the dead-letter queue's
error) beside the good ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, StringType, TimestampNTZType, TimestampType

from sluice.api.kafka_clients import KafkaClient
from sluice.api.pipeline import SOURCE_FETCH_MAX_WAIT_MS, SOURCE_MAX_POLL_RECORDS, FromKafka, Node
from sluice.api.validation import PipelineInvalid

ERROR_COLUMN = "_sluice_error"
CORRUPT_COLUMN = "_sluice_corrupt"
RAW_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
ISOLATION_LEVELS = {"readCommitted": "read_committed", "readUncommitted": "read_uncommitted"}
# The problem at one of the node's fields (message, field): raised where a record cannot be read as asked.
FieldProblem = Callable[[str, str], PipelineInvalid]


@dataclass
class SourceRecords:
    """A Kafka source's rows with the parse result, before good and bad rows are split."""

    node: Node
    checked: DataFrame  # raw Kafka columns + parsed fields + ERROR_COLUMN
    fields: list[str]
    parsed: bool  # whether parsing or checks can reject a record that has a value


def kafka_source_options(
    src: FromKafka, kafka: KafkaClient, starting_offsets: str, since_ms: int | None = None
) -> dict[str, str]:
    """The Spark Kafka source's options for a fromKafka node: sluice's defaults under the node's own options.
    since_ms: the stream starts at the records of that time (a standby driver's warm-up), not at its offsets."""
    options = {
        **kafka.spark_options(),
        "kafka.isolation.level": ISOLATION_LEVELS[src.isolationLevel],
        "kafka.fetch.max.wait.ms": str(SOURCE_FETCH_MAX_WAIT_MS),
        "kafka.max.poll.records": str(SOURCE_MAX_POLL_RECORDS),
        "includeHeaders": str("headers" in src.metadata).lower(),
    }
    if since_ms is not None:  # a partition with no record that late starts at its end
        options |= {"startingTimestamp": str(since_ms), "startingOffsetsByTimestampStrategy": "latest"}
    else:
        options["startingOffsets"] = starting_offsets
    if src.maxRecordsPerTrigger:
        options["maxOffsetsPerTrigger"] = str(src.maxRecordsPerTrigger)
    options |= {"subscribe": src.topic} if src.topic else {"subscribePattern": str(src.pattern)}
    if src.minPartitions:
        options["minPartitions"] = str(src.minPartitions)
    return options | src.options


def checked_records(node: Node, src: FromKafka, raw: DataFrame, fail: FieldProblem) -> SourceRecords:
    """The source's raw Kafka rows (`raw`) parsed and checked: ERROR_COLUMN says why a record is refused."""
    text = F.col("value").cast("string")
    if src.format == "text":
        parsed, fields, malformed = raw.withColumn("value", text), ["value"], F.lit(False)
    else:
        schema = f"{src.schema_}, {CORRUPT_COLUMN} STRING"
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}
        if src.format == "json":
            parse = F.from_json(text, schema, options)
        else:
            parse = F.from_csv(text, schema, {**options, "sep": src.csvDelimiter})
        parsed = raw.withColumn("_sluice_parsed", parse)
        fields = [f for f in parsed.select("_sluice_parsed.*").columns if f != CORRUPT_COLUMN]
        parsed = parsed.select(*RAW_COLUMNS, *(["headers"] if "headers" in src.metadata else []), "_sluice_parsed.*")
        malformed = F.col(CORRUPT_COLUMN).isNotNull()
    if src.eventTimeExpr is not None:
        assert src.eventTime is not None  # validated: 'eventTimeExpr' needs 'eventTime'
        parsed = parsed.withColumn(src.eventTime, event_time_column(src.eventTimeExpr, parsed, fail))
        fields = [*fields, src.eventTime] if src.eventTime not in fields else fields
    error = F.when(F.col("value").isNull(), F.lit("record has no value")).when(
        malformed, F.lit(f"malformed {src.format}: does not match schema ({src.schema_})")
    )
    if src.eventTime and src.eventTime != "kafka_timestamp":
        error = error.when(F.col(src.eventTime).isNull(), F.lit(f"missing or invalid event time '{src.eventTime}'"))
    checked = parsed.withColumn(ERROR_COLUMN, error)
    return SourceRecords(
        node, checked, fields, parsed=src.format != "text" or src.eventTime not in (None, "kafka_timestamp")
    )


def event_time_column(expression: str, parsed: DataFrame, fail: FieldProblem) -> Column:
    """The event time computed from the record: a timestamp as is, a string or date cast (null when not
    parseable: the record is then malformed); any other type is refused."""
    column = F.expr(expression)
    try:
        kind = parsed.select(column).schema.fields[0].dataType
    except (AnalysisException, ParseException) as exc:
        raise fail(str(exc).split("\n")[0].strip(), "eventTimeExpr") from exc
    if isinstance(kind, TimestampType | TimestampNTZType):
        return column
    if isinstance(kind, StringType | DateType):
        return column.try_cast("timestamp")
    raise fail(
        f"{expression!r} is of type {kind.simpleString()}, not a timestamp: convert it, e.g. "
        "timestamp_millis(x) or timestamp_seconds(x) for epoch numbers, to_timestamp(x, 'pattern') for text",
        "eventTimeExpr",
    )
