"""toConsole: rows printed by the driver."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql.streaming import DataStreamWriter

from .base import Sink


class ConsoleSink(Sink):
    def stream_writer(self, records: DataFrame) -> DataStreamWriter:
        return (
            records.writeStream.format("console")
            .option("numRows", self.config.numRows)
            .option("truncate", str(self.config.truncate).lower())
        )

    def write_batch(self, records: DataFrame, batch_id: int) -> None:
        records.show(self.config.numRows, truncate=self.config.truncate)
