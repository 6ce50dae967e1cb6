"""The sink as Spark sees it (ExactlyOnceKafkaSink): per micro-batch, the partition count pinned in the
checkpoint, the records placed, and the transactions written by the executors' tasks or by the driver."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter

from sluice.api.pipeline import ToKafka

from ...checkpoints import BatchFiles, checkpoint_query_id
from ..base import SinkContext
from ..kafka import KafkaRecords
from .partitioner import (
    PARTITION_COLUMN,
    routes,
    with_kafka_partition,
    with_kafka_partition_in_driver,
    with_kafka_partition_in_stream,
)
from .settings import (
    CLIENT_TIMEOUT_S,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    MAX_DRIVER_WRITERS,
    QUIET,
    SMALL_BATCH_RECORDS,
    STREAM_PLACEMENT_TIMEOUT_S,
    log,
)
from .writer import RESULT_TYPE, BatchWrite, PartitionResult, kept_admin


class ExactlyOnceKafkaSink(KafkaRecords):
    """delivery: exactlyOnce."""

    def __init__(self, config: ToKafka, context: SinkContext) -> None:
        super().__init__(config, context)
        # Connections to every broker at once: with sparse connections (librdkafka's default) a new client's
        # first coordinator or metadata request often finds no connection up yet and is retried 500 ms later;
        # and producers are new whenever a partition's task lands on another Python worker.
        self.writer = f"{context.app_id}/{context.query}"
        options = {k.removeprefix("kafka."): v for k, v in config.options.items() if k.startswith("kafka.")}
        self.transactional_prefix = options.pop("transactional.id", f"sluice/{self.writer}")
        self.client_config: dict[str, str | bool] = {
            **self.kafka.librdkafka(),
            "enable.sparse.connections": False,
            **options,
        }
        self._query_id: str | None = None
        self._transaction_timeout_ms: int | None = None
        self._pinned: tuple[int, int] | None = None  # (from batch, partitions) last pinned in this run
        self._lock = threading.Lock()
        self.from_driver = config.writers == "driver" or (config.writers == "auto" and context.grouped)
        # auto, rows that are not groups: the driver writes a batch while the one before was small
        self.small_from_driver = config.writers == "auto" and not self.from_driver
        self._last_records: int | None = None  # written (or found written) by the last batch of this run
        self.last_results: list[PartitionResult] = []
        self._placed_in_stream: int | None = None  # the partition count the streaming plan places records for

    def stream_writer(self, records: DataFrame) -> DataStreamWriter:
        """For `writers: executors`, the partition column is computed in the streaming plan, for the topic's
        partition count now: added per micro-batch, Spark analysed its expression again each time (~55 ms a
        batch). A batch for another count (the topic grew, or a replay pinned to the count it first had) is
        placed again in write_batch. The driver places the batches it writes itself: in the plan, the compiled
        form cost every batch ~120 ms of planning (the filter + projection at 50k records/s)."""
        if self.from_driver or self.small_from_driver:  # placed per batch: by the driver, or for a large batch in SQL
            return super().stream_writer(records)
        try:
            self._placed_in_stream = self._topic_partitions(timeout=STREAM_PLACEMENT_TIMEOUT_S)
        except (KafkaException, RuntimeError, KeyError):  # no topic or no Kafka yet: the first batch says so
            return super().stream_writer(records)
        return super().stream_writer(with_kafka_partition_in_stream(records, self._placed_in_stream))

    def write_batch(self, records: DataFrame, batch_id: int) -> None:
        spark = records.sparkSession
        with self._lock:
            job = self._batch_write(spark, batch_id)
        table = self._collected(records, batch_id) if self._driver_writes() else None
        if table is not None:
            results = self._write_from_driver(job, with_kafka_partition_in_driver(table, job.partitions))
        else:
            placed = self._placed(records, job.partitions)
            written = self._by_partition(placed, job.partitions).mapInArrow(job.write_task, RESULT_TYPE).collect()
            results = [PartitionResult(*row) for row in written]
        self.last_results = sorted(results)
        self._last_records = sum(r.records for r in results)
        log.debug(
            "%s: batch %d: %d records to %d partition(s) of %s, %d new producer(s)",
            self.context.query,
            batch_id,
            sum(r.records for r in results),
            len(results),
            self.config.topic,
            sum(r.new_producer for r in results),
        )
        skipped = [r.partition for r in results if r.skipped]
        if skipped:
            log.info(
                "%s: batch %d was already committed to %s partition(s) %s: not written again",
                self.context.query,
                batch_id,
                self.config.topic,
                skipped,
            )

    def _driver_writes(self) -> bool:
        """Whether the driver writes this batch: always for `driver` (and `auto` on an aggregation's groups); for
        `auto` on other rows, while the batch before held at most SMALL_BATCH_RECORDS records. A small batch then
        costs what the driver's kept producers take, not a Spark stage and its tasks' producers (a task on
        another Python worker than last time needs a new one, which fences the old one and reads the
        partition's last commit); the first batch of a run, often a backlog, and the batch after a large one
        go to the executors, placed by the compiled form."""
        if self.from_driver:
            return True
        return self.small_from_driver and self._last_records is not None and self._last_records <= SMALL_BATCH_RECORDS

    def _placed(self, records: DataFrame, partitions: int) -> DataFrame:
        if self.small_from_driver:  # a large batch: compiled, worth its ~200 ms of planning
            return with_kafka_partition_in_stream(records, partitions)
        if self._placed_in_stream is None or PARTITION_COLUMN not in records.columns:
            return with_kafka_partition(records, partitions)
        if partitions == self._placed_in_stream:
            return records
        return with_kafka_partition(records.drop(PARTITION_COLUMN), partitions)

    def _by_partition(self, placed: DataFrame, partitions: int) -> DataFrame:
        """Spark partition p holding exactly Kafka partition p's records. Records for a topic of one partition,
        from a query without a shuffle, stay in the stage that reads them, in one task: one task a batch where
        the shuffle took one per source partition and one more (pipelines/README.md, delivery). After a shuffle
        the last stage keeps its tasks: they may hold state stores, or a parallelism the app asked for."""
        if partitions == 1 and not self.context.shuffled:
            return placed.coalesce(1)
        route = F.element_at(F.array(*map(F.lit, routes(partitions))), F.col(PARTITION_COLUMN) + 1)
        return placed.repartition(partitions, route)

    def _collected(self, records: DataFrame, batch_id: int) -> pa.Table | None:
        """The batch's records in the driver; None when they exceed spark.driver.maxResultSize (the tasks write
        that batch: both ways use the same ids and markers, so a batch may go either way)."""
        try:
            return records.toArrow()
        except Exception as exc:  # a Py4JJavaError or what pyspark converts it to
            if "spark.driver.maxResultSize" not in str(exc):
                raise
            log.warning(
                "%s: batch %d is larger than spark.driver.maxResultSize: written from the executors "
                "(set writers: executors for this sink if that is usual)",
                self.context.query,
                batch_id,
            )
            return None

    def _write_from_driver(self, job: BatchWrite, table: pa.Table) -> list[PartitionResult]:
        """Each partition's records in its own transaction, the partitions side by side. The producers stay in
        the driver as long as the query runs: no new producer (and its fencing round trips) per batch."""
        placed_in = table.column(PARTITION_COLUMN)
        by_partition = {p: table.filter(pc.equal(placed_in, p)).to_batches() for p in pc.unique(placed_in).to_pylist()}
        if not by_partition:
            return []
        with ThreadPoolExecutor(max_workers=min(len(by_partition), MAX_DRIVER_WRITERS)) as pool:
            written = pool.map(lambda p: job.write_again_on_failure(p, by_partition[p]), sorted(by_partition))
            return [result for results in written for result in results]

    def _batch_write(self, spark: SparkSession, batch_id: int) -> BatchWrite:
        if self._query_id is None:  # the first batch of this run
            if spark.sparkContext.getConf().get("spark.speculation", "false").lower() == "true":
                raise ValueError(f"sink {self.context.query}: delivery exactlyOnce needs spark.speculation=false")
            self._query_id = checkpoint_query_id(spark, self.context.checkpoint)
            self._transaction_timeout_ms = self._transaction_timeout()
        return BatchWrite(
            topic=self.config.topic,
            writer=self.writer,
            query_id=self._query_id,
            batch_id=batch_id,
            partitions=self._partitions(spark, batch_id),
            client_config=self.client_config,
            transactional_prefix=self.transactional_prefix,
            transaction_timeout_ms=self._transaction_timeout_ms or DEFAULT_TRANSACTION_TIMEOUT_MS,
        )

    # ------------------------------------------------------------------- partitions per batch
    def _partitions(self, spark: SparkSession, batch_id: int) -> int:
        history = BatchFiles(spark, f"{self.context.checkpoint.rstrip('/')}/sluice/kafka-partitions")
        if self._pinned is None:
            # Only the first batch of a run can replay one that ran before: it keeps that attempt's count.
            latest = history.latest(before=batch_id + 1)
            if latest is not None:
                self._pinned = (latest[0], int(latest[1]["partitions"]))
                return self._pinned[1]
        current = self._topic_partitions()
        if self._pinned is not None and current < self._pinned[1]:
            raise RuntimeError(
                f"topic {self.config.topic} has {current} partitions, fewer than the "
                f"{self._pinned[1]} this sink wrote to: was it re-created?"
            )
        if self._pinned is None or current != self._pinned[1]:
            history.write(batch_id, {"partitions": current})
            self._pinned = (batch_id, current)
        return current

    def _topic_partitions(self, timeout: float = CLIENT_TIMEOUT_S) -> int:
        """The topic's partition count as its brokers say now (a metadata request each batch: a topic that grew
        is written to whole from the next batch on)."""
        metadata = self._admin().list_topics(self.config.topic, timeout=timeout).topics[self.config.topic]
        if metadata.error is not None:
            raise RuntimeError(
                f"output topic {self.config.topic} at {self.kafka.bootstrap}: {metadata.error.str()} "
                "(an exactly-once sink does not create its topic: declare it in spec.topics)"
            )
        return len(metadata.partitions)

    def _admin(self) -> AdminClient:
        """The process's admin client for this Kafka (kept_admin: released with the driver's other clients when its
        queries stop). It logs errors only: its info line when it goes (a purged queue) would land in `sluice
        run`'s terminal."""
        return kept_admin({"log_level": QUIET, **self.client_config, "allow.auto.create.topics": False})

    def _transaction_timeout(self) -> int:
        """The option when set, else the default capped at the brokers' transaction.max.timeout.ms."""
        if "transaction.timeout.ms" in self.client_config:
            return int(self.client_config["transaction.timeout.ms"])
        admin = self._admin()
        try:
            broker = next(iter(admin.list_topics(timeout=CLIENT_TIMEOUT_S).brokers))
            resource = ConfigResource(ResourceType.BROKER, str(broker))
            configs = admin.describe_configs([resource])[resource].result(timeout=CLIENT_TIMEOUT_S)
            maximum = int(configs["transaction.max.timeout.ms"].value)
        except (KafkaException, KeyError, StopIteration, ValueError, TypeError) as exc:
            log.warning(
                "%s: cannot read the brokers' transaction.max.timeout.ms (%s); transactions time out after %d ms",
                self.context.query,
                exc,
                DEFAULT_TRANSACTION_TIMEOUT_MS,
            )
            return DEFAULT_TRANSACTION_TIMEOUT_MS
        return min(DEFAULT_TRANSACTION_TIMEOUT_MS, maximum)
