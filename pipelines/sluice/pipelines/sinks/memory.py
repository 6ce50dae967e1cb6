"""toMemory: a temp view of every row written so far (tests, notebooks)."""

from __future__ import annotations

import threading
from typing import ClassVar

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming import DataStreamWriter

from .base import Sink


class MemoryTables:
    """Memory sinks fed per batch (after top-N) keep their rows here, as temp views."""

    _rows: ClassVar[dict[str, list[Row]]] = {}
    _lock = threading.Lock()

    @classmethod
    def append(cls, spark: SparkSession, table: str, batch: DataFrame) -> None:
        with cls._lock:
            rows = cls._rows.setdefault(table, [])
            rows.extend(batch.collect())
            spark.createDataFrame(rows, batch.schema).createOrReplaceTempView(table)


class MemorySink(Sink):
    @property
    def query_name(self) -> str:
        return self.config.table  # Spark's memory sink names its table after the query

    def stream_writer(self, records: DataFrame) -> DataStreamWriter:
        return records.writeStream.format("memory")

    def write_batch(self, records: DataFrame, batch_id: int) -> None:
        MemoryTables.append(records.sparkSession, self.config.table, records)
