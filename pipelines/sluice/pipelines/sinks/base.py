"""The seam every sink implements: shape the rows, write them as a stream, write one micro-batch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql.streaming import DataStreamWriter

from sluice.api.kafka_clients import KafkaClient

from ..callbacks import noting_connection


@dataclass(frozen=True)
class SinkContext:
    """What a sink knows about the query it ends."""

    query: str  # the query's name: the sink node, or "<source>-dead-letters"
    checkpoint: str  # the query's checkpoint folder (any Hadoop URI); sinks may keep state beside it
    kafka: KafkaClient | None  # the app's Kafka and login
    app_id: str  # names the app across a Kafka cluster (namespace/app); prefixes transactional ids
    dead_letters: bool = False  # rows are dead letters (source, error, topic, partition, offset, key, value)
    grouped: bool = False  # rows are an aggregation's groups: a batch holds those it changed or closed
    shuffled: bool = True  # a shuffle upstream (a stateful operation's: its last stage's tasks hold state)


class Sink(ABC):
    """One output of a query.

    A query without per-batch work streams through `stream_writer`; one with per-batch work (top-N,
    dead letters) calls `write_batch` from its own foreachBatch handler. Both get `records(rows)`.
    """

    # Whether a batch known to be empty may go unwritten (no Spark job for it); a memory sink's table must exist.
    skips_empty_batches = False

    def __init__(self, config: Any, context: SinkContext) -> None:
        self.config = config
        self.context = context

    def records(self, rows: DataFrame) -> DataFrame:
        """The rows as this sink writes them (a streaming or a batch DataFrame)."""
        return rows

    def stream_writer(self, records: DataFrame) -> DataStreamWriter:
        """The streaming writer; by default every micro-batch goes through write_batch."""
        return records.writeStream.foreachBatch(noting_connection(self.write_batch))

    @property
    def query_name(self) -> str:
        return self.context.query

    @abstractmethod
    def write_batch(self, records: DataFrame, batch_id: int) -> None:
        """Write one micro-batch. A replayed batch (same id, same rows) may come again after a restart."""
