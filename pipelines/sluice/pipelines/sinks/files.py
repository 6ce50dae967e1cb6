"""toFiles: parquet, json or csv files under a path (append mode only)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql.streaming import DataStreamWriter

from .base import Sink


class FilesSink(Sink):
    """Streaming, Spark's file sink commits every batch through its _spark_metadata log (exactly once);
    per batch (after top-N, dead letters) a batch replayed after a crash is appended again."""

    def stream_writer(self, records: DataFrame) -> DataStreamWriter:
        writer = records.writeStream.format(self.config.format).option("path", self.config.path)
        return writer.partitionBy(*self.config.partitionBy) if self.config.partitionBy else writer

    def write_batch(self, records: DataFrame, batch_id: int) -> None:
        writer = records.write.mode("append").format(self.config.format)
        (writer.partitionBy(*self.config.partitionBy) if self.config.partitionBy else writer).save(self.config.path)
