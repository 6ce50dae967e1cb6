"""toKafka with delivery atLeastOnce: Spark's own Kafka sink. A batch replayed after a restart is written
again. Also the record shapes every Kafka sink writes."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from sluice.api.kafka_clients import client_at
from sluice.api.pipeline import ToKafka

from .base import Sink, SinkContext


def kafka_record(rows: DataFrame, config: ToKafka) -> DataFrame:
    """The key/value/headers columns of a Kafka record, from the sink's expressions."""
    columns = [F.expr(config.value).alias("value")]
    if config.key:
        columns.append(F.expr(config.key).alias("key"))
    if config.headers:
        columns.append(F.expr(config.headers).alias("headers"))
    out = rows.select(*columns)
    casts = {c: F.col(c).cast("string") for c, t in out.dtypes if c in ("key", "value") and t != "binary"}
    return out.withColumns(casts) if casts else out


def dead_letter_record(rows: DataFrame) -> DataFrame:
    """Original key and value bytes, with the error and the record's origin in headers."""

    def header(name: str, column: str):
        return F.struct(F.lit(name).alias("key"), F.col(column).cast("string").cast("binary").alias("value"))

    return rows.select(
        "key",
        "value",
        F.array(
            header("sluice.error", "error"),
            header("sluice.source", "source"),
            header("sluice.topic", "topic"),
            header("sluice.partition", "partition"),
            header("sluice.offset", "offset"),
        ).alias("headers"),
    )


class KafkaRecords(Sink):
    """What every Kafka sink shares: the target, and rows shaped as Kafka records."""

    config: ToKafka
    skips_empty_batches = True

    def __init__(self, config: ToKafka, context: SinkContext) -> None:
        super().__init__(config, context)
        kafka = client_at(context.kafka, config.bootstrapServers)
        if not kafka.bootstrap:
            raise ValueError(f"sink {context.query}: no Kafka bootstrap servers")
        self.kafka = kafka

    def records(self, rows: DataFrame) -> DataFrame:
        return dead_letter_record(rows) if self.context.dead_letters else kafka_record(rows, self.config)


class KafkaSink(KafkaRecords):
    """delivery: atLeastOnce."""

    @property
    def options(self) -> dict[str, str]:
        """Spark's Kafka sink options, the same for the streaming and the per-batch writer."""
        return {"topic": self.config.topic, **self.kafka.spark_options(), **self.config.options}

    def stream_writer(self, records: DataFrame) -> DataStreamWriter:
        return records.writeStream.format("kafka").options(**self.options)

    def write_batch(self, records: DataFrame, batch_id: int) -> None:
        records.write.format("kafka").options(**self.options).save()
