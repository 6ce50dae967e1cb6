"""The side-by-side benchmark's workloads hand-written in PySpark (see peer_workloads.py for the contract).

`--variant defaults`: what a user writes with Spark's defaults — only the settings the job needs to run (the
Kafka connector's jars, local[cores]); no trigger (micro-batches back to back).
`--variant tuned`: the same queries with what a Spark expert would set for this machine: shuffle partitions =
cores, the in-memory state store, no empty micro-batches, Kryo, the Kafka consumer's fetch wait cut to 10 ms
(Java's 500 ms default holds every read at a live topic's end) and 10,000 records a poll (Spark's consumer asks
for the partition's offset range after each poll; PyFlink's job reads 10,000 a poll too).

Runs until SIGTERM.
"""

from __future__ import annotations

import signal
import threading

from peer_process import contract_parser
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sluice.pipelines.local.spark import spark_kafka_jars

TUNED_CONF = {
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.serializer": "org.apache.spark.serializer.KryoSerializer",
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
}
TUNED_SOURCE_OPTIONS = {
    "kafka.fetch.max.wait.ms": "10",
    "kafka.max.partition.fetch.bytes": str(8 << 20),
    "kafka.max.poll.records": "10000",
}


def session(variant: str, cores: int) -> SparkSession:
    builder = SparkSession.builder.appName(f"hand-written-{variant}").master(f"local[{cores}]")
    builder = builder.config("spark.jars", ",".join(str(jar) for jar in spark_kafka_jars()))
    if variant == "tuned":
        builder = builder.config("spark.sql.shuffle.partitions", str(cores))
        for key, value in TUNED_CONF.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def source(spark: SparkSession, variant: str, bootstrap: str, topic: str) -> DataFrame:
    reader = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if variant == "tuned":
        reader = reader.options(**TUNED_SOURCE_OPTIONS)
    return reader.load()


def frequency_count(records: DataFrame) -> DataFrame:
    counts = records.select(F.col("value").cast("string").alias("word")).groupBy("word").count()
    return counts.select(F.col("word").alias("key"), F.to_json(F.struct("word", "count")).alias("value"))


def windowed_word_count(records: DataFrame) -> DataFrame:
    words = records.select(
        F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"), F.col("timestamp")
    ).withWatermark("timestamp", "2 seconds")
    counts = words.groupBy(F.window("timestamp", "5 seconds"), "word").count()
    rows = counts.select(F.unix_millis(F.col("window.start")).alias("window_start"), "word", "count")
    return rows.select(F.col("word").alias("key"), F.to_json(F.struct("window_start", "word", "count")).alias("value"))


def filter_projection(records: DataFrame) -> DataFrame:
    word = F.col("value").cast("string")
    return records.where(F.length(word) >= 6).select("key", F.upper(word).alias("value"))


WORKLOADS = {
    "frequency-count": (frequency_count, "update"),
    "windowed-word-count": (windowed_word_count, "update"),
    "filter-projection": (filter_projection, "append"),
}


def main() -> None:
    parser = contract_parser(__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("defaults", "tuned"), required=True)
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args()

    spark = session(args.variant, args.cores)
    build, mode = WORKLOADS[args.workload]
    query = (
        build(source(spark, args.variant, args.bootstrap, args.source))
        .writeStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.sink)
        .option("checkpointLocation", args.checkpoint)
        .outputMode(mode)
        .start()
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):
        if not query.isActive:
            raise SystemExit(f"query ended: {query.exception()}")
    query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
