"""Batches of rows instead of Kafka: each operation's test runs a real pipeline on real Spark, fast.

`Rows` keeps, per source node, one JSON-lines file per micro-batch holding Kafka records (key, value,
timestamp…); the compiler's `source_frames` seam reads them as a file stream with the Kafka source's
columns, one file per micro-batch, so everything after the Kafka read (parsing, malformed records, event
time, watermarks, dead letters) runs as it does on Kafka. Pipelines run with the availableNow trigger:
every batch is processed in order and the queries stop by themselves.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from sluice.api.pipeline import Node, PipelineSpec
from sluice.api.validation import validate
from sluice.pipelines.compiler import CompiledPipeline, compile_pipeline
from sluice.pipelines.plancheck import spark_ddl_parser, spark_sql_parser
from sluice.pipelines.queries import start_query
from sluice.pipelines.sinks import MemoryTables

T0 = 1_700_000_040_000  # epoch ms on a whole minute: event times in tests are T0 + offsets
_FILE_SCHEMA = "key STRING, value STRING, topic STRING, partition INT, offset LONG, timestamp LONG"
_unique = itertools.count()


def at(seconds: float) -> str:
    """An event time `seconds` after T0, as JSON records carry it (ISO 8601, UTC)."""
    return datetime.fromtimestamp(T0 / 1000 + seconds, UTC).isoformat(timespec="milliseconds")


def timed_source(name: str, schema: str, watermark: str = "1s") -> dict[str, Any]:
    """A json source node reading topic `name`: the `schema` fields and `ts TIMESTAMP`, its event time."""
    return {
        "name": name,
        "fromKafka": {
            "topic": name,
            "format": "json",
            "schema": f"{schema}, ts TIMESTAMP",
            "eventTime": "ts",
            "watermark": watermark,
        },
    }


def window_totals() -> list[dict[str, Any]]:
    """Scores (player, points, ts) and their totals per player in 10 s tumbling windows (node `totals`)."""
    return [
        timed_source("scores", "player STRING, points INT"),
        {
            "name": "totals",
            "inputs": ["scores"],
            "aggregate": {
                "groupBy": ["player"],
                "window": {"tumbling": "10s"},
                "aggregations": {"points": "sum(points)"},
            },
        },
    ]


def unique(name: str) -> str:
    """A memory table or query name no other test of the session uses."""
    return f"{name}_{os.getpid()}_{next(_unique)}"


class Rows:
    def __init__(self, spark: SparkSession, root: Path) -> None:
        self.spark = spark
        self.root = root
        self._batches: dict[str, int] = {}

    def batch(
        self,
        source: str,
        values: Iterable[Any],
        *,
        at: Iterable[int] | None = None,
        keys: Iterable[str | None] | None = None,
    ) -> Rows:
        """One micro-batch of `source`: values (a dict is written as JSON, None is a record without a value),
        their Kafka timestamps (ms after T0, default 0) and keys."""
        values = list(values)
        stamps = list(at) if at is not None else [0] * len(values)
        record_keys = list(keys) if keys is not None else [None] * len(values)
        index = self._batches.get(source, 0)
        self._batches[source] = index + 1
        folder = self.root / source
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"batch-{index:05d}.json"
        with path.open("w") as out:
            for offset, (value, stamp, key) in enumerate(zip(values, stamps, record_keys, strict=True)):
                text = json.dumps(value) if isinstance(value, dict) else value
                out.write(
                    json.dumps(
                        {
                            "key": key,
                            "value": text,
                            "topic": source,
                            "partition": 0,
                            "offset": index * 1000 + offset,
                            "timestamp": T0 + stamp,
                        }
                    )
                    + "\n"
                )
        # The file source takes files in modification-time order: one second apart, in batch order.
        os.utime(path, (1_000_000 + index, 1_000_000 + index))
        return self

    def frame(self, node: Node) -> DataFrame:
        """The compiler's source_frames seam."""
        folder = self.root / node.name
        folder.mkdir(parents=True, exist_ok=True)
        raw = self.spark.readStream.schema(_FILE_SCHEMA).option("maxFilesPerTrigger", 1).json(str(folder))
        return raw.select(
            F.col("key").cast("binary").alias("key"),
            F.col("value").cast("binary").alias("value"),
            "topic",
            "partition",
            "offset",
            F.timestamp_millis("timestamp").alias("timestamp"),
        )


def compile_rows(spark: SparkSession, pipeline: dict[str, Any], rows: Rows) -> tuple[PipelineSpec, CompiledPipeline]:
    """Validated with Spark's parsers and compiled as the runner does, on the rows instead of Kafka."""
    spec = validate(
        {"trigger": {"availableNow": True}, **pipeline}, sql=spark_sql_parser(spark), ddl=spark_ddl_parser(spark)
    )
    return spec, compile_pipeline(spark, spec, kafka=None, source_frames=rows.frame)


def run(
    spark: SparkSession, pipeline: dict[str, Any], rows: Rows, checkpoints: Path, timeout: float = 120
) -> list[Any]:
    """Runs every query to its end (availableNow) and returns them; a failed query raises its error."""
    spec, compiled = compile_rows(spark, pipeline, rows)
    queries = [
        start_query(
            plan, checkpoint_root=str(checkpoints), trigger=spec.trigger, kafka=None, spark_version=spark.version
        )
        for plan in compiled.queries
    ]
    try:
        for query in queries:
            query.awaitTermination(timeout)
            if query.exception() is not None:
                raise AssertionError(f"query {query.name} failed: {query.exception()}")
            assert not query.isActive, f"query {query.name} did not end within {timeout}s"
    finally:
        for query in queries:
            query.stop()
    return queries


def table(spark: SparkSession, name: str, order: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """A memory table's rows as dicts, timestamps as ms after T0, sorted by `order` (default: all columns)."""
    rows = spark.table(name).collect() if name not in MemoryTables._rows else MemoryTables._rows[name]
    return sorted_rows([plain(row) for row in rows], order)


def plain(row: Row) -> dict[str, Any]:
    return {k: (int(v.timestamp() * 1000) - T0 if isinstance(v, datetime) else v) for k, v in row.asDict().items()}


def sorted_rows(rows: list[dict[str, Any]], order: Iterable[str] | None = None) -> list[dict[str, Any]]:
    keys = list(order) if order is not None else None
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in (keys or sorted(r))))
