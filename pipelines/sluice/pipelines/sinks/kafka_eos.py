"""toKafka with delivery exactlyOnce: every micro-batch's records are committed to Kafka once, however often
a crash, a restart or a retried task makes Spark run the batch again.

How (per micro-batch B, in foreachBatch):
- The driver reads the topic's partition count N once. N is pinned per batch in the checkpoint folder
  (`sluice/kafka-partitions/<batch>`) when it changes, and the first batch of a run (the only one that can
  be a replay) uses the pinned N: a replayed batch sends every record where its first attempt did.
- Each record goes to partition murmur2(key) mod N, the Java client's default partitioner, so keys land
  where Spark's own Kafka sink (atLeastOnce) and Java producers put them; a record without a key is
  placed by its value (a topic of one partition: partition 0, no hash). The partition is computed in Spark
  SQL and the records are shuffled by the JVM so that Spark task p holds exactly partition p's records (one
  Python stage per batch: the writing, which reads the records as Arrow batches, column by column; a Row
  per record made that stage ~8x slower). A query without a shuffle writing one partition needs none: the
  task that reads the batch writes it.
- Task p owns partition p through a transactional producer with the stable id `sluice/<app>/<sink>/<p>`.
  Initialising it fences every older producer with that id (a task of a dead driver, a retried task's
  earlier attempt) and aborts or completes their open transaction.
- The new producer then reads the sink's last commit in partition p (read_committed, from the end
  backwards; transaction markers take offsets, so it reads to the end of the log rather than counting).
  The last record of every transaction carries a `sluice.commit` header: the sink, the query id of the
  checkpoint (batch ids count within one checkpoint) and the batch id. If B is there, the task skips the
  batch; otherwise it writes the partition's records in one transaction.
Spark replays a batch with the offsets recorded for it and the state of the batch before, so a replayed
batch holds the same records; non-deterministic pipelines (rand(), now()) are outside this promise.

Where the transactions are written (`writers`): by default, when the rows are an aggregation's groups (a
batch holds only the groups it changed or closed), the driver collects the batch, places its records itself (in
Python, not in Spark SQL) and writes each partition's transaction, the partitions side by side; its producers
live as long as the query. Otherwise Spark task p writes partition p, as above. Both use the same ids, markers
and fencing.

Producers are kept in the Python worker (or the driver) between batches, with the partition's last commit:
what they read when they took the partition, then their own commits. That stays true until another producer takes the id
(a task of the same partition on another worker, a zombie): so a kept producer first sends one record and
flushes, which fails if it was fenced meanwhile; then it is replaced by a new one, which reads the log.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from pyspark import TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import DataStreamWriter

from sluice.api.pipeline import ToKafka

from ..checkpoints import BatchFiles, checkpoint_query_id
from .base import SinkContext
from .kafka import KafkaRecords

log = logging.getLogger("sluice.sinks.kafka")
T = TypeVar("T")

COMMIT_HEADER = "sluice.commit"
DEFAULT_TRANSACTION_TIMEOUT_MS = 300_000  # a partition's share of a batch must be written within it
CLIENT_TIMEOUT_S = 60.0
# A query's start waits this long at most for its topic's partition count (without it, its batches find it).
STREAM_PLACEMENT_TIMEOUT_S = 5.0
MAX_KEPT_PRODUCERS = 256  # per Python worker or driver
# librdkafka logs errors only: its warnings are retries it makes by itself ("not coordinator: retrying" while a
# new broker loads its transaction log), and what fails reaches the sink as an exception.
QUIET = 3
MAX_DRIVER_WRITERS = 8  # partitions a driver writes at once
DRIVER_WRITE_ATTEMPTS = 4  # per partition and batch, as spark.task.maxFailures for a task
MAX_FENCED = 5  # new producers in a row fenced by another one before a task gives up

Header = tuple[str, str | bytes | None]  # as confluent_kafka takes and gives them (it reads bytes)
KafkaRecord = tuple[str | bytes | None, str | bytes | None, list[Header] | None]  # key, value, headers


# ------------------------------------------------------------------------- partitions (Spark SQL)

PARTITION_COLUMN = "_sluice_partition"
_M = 0x5BD1E995  # murmur2's multiplier


def _mul32(x: str) -> str:
    """x * m mod 2^32 in BIGINT arithmetic, for 0 <= x < 2^32: m < 2^31, so the product stays below 2^63 (as
    two 16-bit halves, the whole partition expression took 1.7x as long per record)."""
    return f"((({x}) * {_M}) & 4294967295)"


def _xorshift(x: str, bits: int) -> str:
    return f"(({x}) ^ shiftright({x}, {bits}))"


# murmur2's steps, shared by its two SQL forms: the seed for a length, a 4-byte block's mixing, the hash with a
# mixed block, and the final mixing.
def _seeded(length: str) -> str:
    return f"((2538058380 ^ {length}) & 4294967295)"


def _mixed(block: str) -> str:
    return _mul32(_xorshift(_mul32(block), 24))


def _with_block(hashed: str, mixed_block: str) -> str:
    return f"({_mul32(hashed)} ^ {mixed_block})"


def _finished(hashed: str) -> str:
    return _xorshift(_mul32(_xorshift(hashed, 13)), 15)


def _byte(at: str) -> str:
    """The byte at a 0-based position of _sluice_latin1 (the bytes read as ISO-8859-1: a character each)."""
    return f"cast(ascii(substring(_sluice_latin1, ({at}) + 1, 1)) as bigint)"


def _murmur2() -> str:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) of _sluice_latin1's bytes (_sluice_length
    of them) as a Spark SQL expression: 32-bit unsigned arithmetic on BIGINT, one lambda over the 4-byte blocks."""
    block = " + ".join(f"{_byte(f'4 * i + {o}')} * {1 << 8 * o}" for o in range(4))
    blocks = f"transform(IF(_sluice_length >= 4, sequence(0, _sluice_length div 4 - 1), array()), i -> {block})"
    base = "_sluice_length - _sluice_length % 4"
    tail = (
        f"h ^ IF(_sluice_length % 4 = 3, shiftleft({_byte(f'{base} + 2')}, 16), 0)"
        f" ^ IF(_sluice_length % 4 >= 2, shiftleft({_byte(f'{base} + 1')}, 8), 0) ^ {_byte(base)}"
    )
    final = _finished("t")  # on a lambda variable: copies of it are cheap
    with_tail = f"element_at(transform(array(IF(_sluice_length % 4 = 0, h, {_mul32(tail)})), t -> {final}), 1)"
    step = _with_block("h", _mixed("k"))
    return f"aggregate({blocks}, {_seeded('_sluice_length')}, (h, k) -> {step}, h -> {with_tail})"


def _let(name: str, value: str, body: str) -> str:
    """`body` with `name` bound to `value`, computed once per row (a lambda over a one-element array)."""
    return f"element_at(transform(array({value}), {name} -> {body}), 1)"


@functools.cache
def _kafka_partition_sql(placed_by: str, partitions: int) -> str:
    hashed = _let("_sluice_length", "length(_sluice_latin1)", f"pmod({_murmur2()} & 2147483647, {partitions})")
    latin1 = f"decode(CAST({placed_by} AS BINARY), 'ISO-8859-1')"
    return f"CAST({_let('_sluice_latin1', latin1, f'IF(_sluice_latin1 IS NULL, 0, {hashed})')} AS INT)"


def with_kafka_partition(records: DataFrame, partitions: int) -> DataFrame:
    """The records with the partition Kafka's default partitioner gives their key, murmur2(key) mod N (a record
    without a key: by its value), in PARTITION_COLUMN. Computed in the JVM (no Python stage before the shuffle),
    in one projection: each DataFrame step makes Spark analyse the micro-batch's whole plan again."""
    if partitions == 1:
        return records.withColumn(PARTITION_COLUMN, F.lit(0))
    placed_by = "coalesce(key, value)" if "key" in records.columns else "value"
    return records.withColumn(PARTITION_COLUMN, F.expr(_kafka_partition_sql(placed_by, partitions)))


UNROLLED_BLOCKS = 10  # keys (or unkeyed values) of up to 40 bytes, a UUID among them, are placed by compiled code


def _big_endian(position: str, count: int) -> str:
    """The big-endian value of `count` bytes of _sluice_bytes from a 0-based position (fewer at its end): one
    substring of the binary, not one per byte of a decoded string."""
    return f"cast(conv(hex(substring(_sluice_bytes, ({position}) + 1, {count})), 16, 10) as bigint)"


def _little_endian_block(index: int) -> str:
    value = _big_endian(str(4 * index), 4)
    return (
        f"((({value}) & 255) * 16777216 + (shiftright({value}, 8) & 255) * 65536"
        f" + (shiftright({value}, 16) & 255) * 256 + shiftright({value}, 24))"
    )


def with_kafka_partition_in_stream(records: DataFrame, partitions: int) -> DataFrame:
    """with_kafka_partition for a plan analysed once (a streaming query's): murmur2 unrolled over the first
    UNROLLED_BLOCKS 4-byte blocks, all compiled (the lambdas of the one-expression form run interpreted). 3M
    records on 2 cores: 11-byte keys 6.7 -> 2.7 s, UUIDs 16.9 -> 3.6 s. Longer keys take the one-expression
    form. Slower to analyse (~200-260 ms against ~30-40), so the per-batch paths keep with_kafka_partition.
    A topic of one partition needs no hash: its expression cost ~40 ms of executor CPU per task and batch (the
    stage is too large for whole-stage code, so each task generates its projection's code again)."""
    if partitions == 1:
        return with_kafka_partition(records, partitions)
    placed_by = "coalesce(key, value)" if "key" in records.columns else "value"
    columns = records.columns
    staged = records.select("*", F.expr(f"CAST({placed_by} AS BINARY)").alias("_sluice_bytes"))
    staged = staged.select("*", F.expr("length(_sluice_bytes)").alias("_sluice_length"))
    tail = _big_endian("(_sluice_length div 4) * 4", 3)  # the 0-3 bytes after the last block, big-endian
    little_endian_tail = (
        f"CASE _sluice_length % 4 WHEN 0 THEN 0 WHEN 1 THEN {tail}"
        f" WHEN 2 THEN (({tail} & 255) * 256 + shiftright({tail}, 8))"
        f" ELSE (({tail} & 255) * 65536 + ({tail} & 65280) + shiftright({tail}, 16)) END"
    )
    staged = staged.select(
        "*",
        F.expr(little_endian_tail).alias("_sluice_tail"),
        *(F.expr(_mixed(_little_endian_block(j))).alias(f"_sluice_block{j}") for j in range(UNROLLED_BLOCKS)),
    )
    # The hash after j blocks, for each j: the key's own block count picks one (the blocks after it are unused).
    after = [_seeded("_sluice_length")]
    for j in range(UNROLLED_BLOCKS):
        after.append(_with_block(after[-1], f"_sluice_block{j}"))
    blocks = "CASE _sluice_length div 4 " + " ".join(f"WHEN {j} THEN {h}" for j, h in enumerate(after)) + " END"
    hashed = f"IF(_sluice_length % 4 = 0, {blocks}, {_mul32(f'{blocks} ^ _sluice_tail')})"
    staged = staged.select("*", F.expr(hashed).alias("_sluice_hash"))
    final = _finished("_sluice_hash")
    partition = (
        f"CAST(IF(_sluice_bytes IS NULL, 0, IF(_sluice_length > {4 * UNROLLED_BLOCKS}, "
        f"{_kafka_partition_sql(placed_by, partitions)}, pmod({final} & 2147483647, {partitions}))) AS INT)"
    )
    return staged.select(*columns, F.expr(partition).alias(PARTITION_COLUMN))


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's hash() of an INT (Murmur3_x86_32.hashInt with Spark's seed 42), a signed 32-bit int."""

    def mul(x: int, m: int) -> int:
        return (x * m) & 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = mul(rotl(mul(value & 0xFFFFFFFF, 0xCC9E2D51), 15), 0x1B873593)
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4  # the input's length in bytes
    h1 = mul(h1 ^ (h1 >> 16), 0x85EBCA6B)
    h1 = mul(h1 ^ (h1 >> 13), 0xC2B2AE35)
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


@functools.cache
def routes(partitions: int) -> tuple[int, ...]:
    """Per partition p an INT that repartition(N, it) sends to Spark partition p (pmod(hash(it), N) = p):
    routed by them, Spark partition p holds exactly Kafka partition p's records. Computed here, not by a
    Spark job: a new query's first batch would wait for one per sink."""
    found: dict[int, int] = {}
    route = 0
    while len(found) < partitions:
        found.setdefault(spark_hash_int(route) % partitions, route)
        route += 1
    return tuple(found[p] for p in range(partitions))


# ----------------------------------------------------------------------------- partitions (Python)


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) as an unsigned 32-bit value."""
    mask = 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    end = len(data) & ~3
    for i in range(0, end, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * _M) & mask
        h = ((h * _M) & mask) ^ (((k ^ (k >> 24)) * _M) & mask)
    tail = len(data) & 3
    if tail == 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail:
        h = ((h ^ data[end]) * _M) & mask
    h = ((h ^ (h >> 13)) * _M) & mask
    return h ^ (h >> 15)


@functools.lru_cache(maxsize=1 << 16)
def kafka_partition(placed_by: str | bytes | None, partitions: int) -> int:
    """The partition the Java client's default partitioner gives a key (a str: its UTF-8 bytes); 0 for none.
    Kept per key: an aggregation's groups come back batch after batch."""
    if placed_by is None:
        return 0
    data = placed_by.encode() if isinstance(placed_by, str) else placed_by
    return (murmur2(data) & 0x7FFFFFFF) % partitions


def with_kafka_partition_in_driver(table: pa.Table, partitions: int) -> pa.Table:
    """with_kafka_partition for a batch the driver collected. Computed here, not in the plan: the SQL form's
    lambdas cannot be compiled, so the aggregation's last stage ran interpreted, and planning it took ~60 ms a
    batch (both measured on the windowed word count's batches)."""
    if partitions == 1:
        return table.append_column(PARTITION_COLUMN, pa.repeat(pa.scalar(0, pa.int32()), table.num_rows))
    values = table.column("value").to_pylist()
    keys = table.column("key").to_pylist() if "key" in table.column_names else [None] * table.num_rows
    placed = [kafka_partition(v if k is None else k, partitions) for k, v in zip(keys, values, strict=True)]
    return table.append_column(PARTITION_COLUMN, pa.array(placed, pa.int32()))


# ------------------------------------------------------------------------------------------ driver


class PartitionResult(NamedTuple):
    partition: int
    records: int
    skipped: bool  # the batch was already committed to this partition


RESULT_SCHEMA = pa.schema([("partition", pa.int32()), ("records", pa.int64()), ("skipped", pa.bool_())])
RESULT_TYPE = from_arrow_schema(RESULT_SCHEMA)


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
            "bootstrap.servers": self.bootstrap,
            "enable.sparse.connections": False,
            **options,
        }
        self._query_id: str | None = None
        self._transaction_timeout_ms: int | None = None
        self._pinned: tuple[int, int] | None = None  # (from batch, partitions) last pinned in this run
        self._lock = threading.Lock()
        self.from_driver = config.writers == "driver" or (config.writers == "auto" and context.grouped)
        self.last_results: list[PartitionResult] = []
        self._placed_in_stream: int | None = None  # the partition count the streaming plan places records for

    def stream_writer(self, records: DataFrame) -> DataStreamWriter:
        """The partition column is computed in the streaming plan, for the topic's partition count now: added
        per micro-batch, Spark analysed its expression again each time (~55 ms a batch). A batch for another
        count (the topic grew, or a replay pinned to the count it first had) is placed again in write_batch."""
        if self.from_driver:  # placed in the driver (with_kafka_partition_in_driver)
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
        table = self._collected(records, batch_id) if self.from_driver else None
        if table is not None:
            results = self._write_from_driver(job, with_kafka_partition_in_driver(table, job.partitions))
        else:
            placed = self._placed(records, job.partitions)
            written = self._by_partition(placed, job.partitions).mapInArrow(job.write_task, RESULT_TYPE).collect()
            results = [PartitionResult(*row) for row in written]
        self.last_results = sorted(results)
        skipped = [r.partition for r in results if r.skipped]
        if skipped:
            log.info(
                "%s: batch %d was already committed to %s partition(s) %s: not written again",
                self.context.query,
                batch_id,
                self.config.topic,
                skipped,
            )

    def _placed(self, records: DataFrame, partitions: int) -> DataFrame:
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
        metadata = self._new_admin().list_topics(self.config.topic, timeout=timeout).topics[self.config.topic]
        if metadata.error is not None:
            raise RuntimeError(
                f"output topic {self.config.topic} at {self.bootstrap}: {metadata.error.str()} "
                "(an exactly-once sink does not create its topic: declare it in spec.topics)"
            )
        return len(metadata.partitions)

    def _new_admin(self) -> AdminClient:
        """A client for one question: one kept beside a stopped query would reconnect to Kafka forever. It logs
        errors only: its info line when it goes (a purged queue) would land in `sluice run`'s terminal."""
        return AdminClient({"log_level": QUIET, **self.client_config, "allow.auto.create.topics": False})

    def _transaction_timeout(self) -> int:
        """The option when set, else the default capped at the brokers' transaction.max.timeout.ms."""
        if "transaction.timeout.ms" in self.client_config:
            return int(self.client_config["transaction.timeout.ms"])
        admin = self._new_admin()
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


# --------------------------------------------------------------------------------------- executors


@dataclass(frozen=True)
class Marker:
    """The `sluice.commit` header on the last record of every transaction."""

    writer: str
    query_id: str
    batch_id: int

    def header(self) -> Header:
        return COMMIT_HEADER, json.dumps(
            {"writer": self.writer, "query": self.query_id, "batch": self.batch_id}
        ).encode()

    @classmethod
    def of(cls, headers: Iterable[Header] | Mapping[str, str | bytes | None] | None) -> Marker | None:
        for name, value in headers.items() if isinstance(headers, Mapping) else headers or ():
            if name == COMMIT_HEADER and value:
                data = json.loads(value)
                return cls(data["writer"], data["query"], int(data["batch"]))
        return None

    def covers(self, other: Marker) -> bool:
        """Whether this commit already holds `other`'s batch (batch ids count within one checkpoint)."""
        return (self.writer, self.query_id) == (other.writer, other.query_id) and self.batch_id >= other.batch_id


@dataclass
class OwnedPartition:
    producer: Producer
    committed: Marker | None  # the sink's last commit in the partition: read at init, then its own


class _Workers:
    """What a Python worker (or the driver) keeps between batches: producers by transactional id, consumers by
    config."""

    producers: OrderedDict[str, OwnedPartition] = OrderedDict()
    consumers: dict[str, Consumer] = {}
    lock = threading.Lock()
    reading = threading.Lock()


def release_kept_clients(timeout: float = 10.0) -> None:
    """Close the clients this process keeps (the driver's, once its queries have stopped; an open transaction
    is aborted): left behind, they would reconnect to Kafka as long as the process lives. Closing waits for
    the brokers, so it runs beside the caller for at most `timeout` seconds (a transaction left open then is
    aborted by the next producer with its id, or times out)."""
    with _Workers.reading, _Workers.lock:
        closing: list[Callable[[], object]] = [owner.producer.close for owner in _Workers.producers.values()]
        closing += [consumer.close for consumer in _Workers.consumers.values()]
        _Workers.producers.clear()
        _Workers.consumers.clear()
    threads = [threading.Thread(target=close, name="sluice-close-kafka-client", daemon=True) for close in closing]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _values(batch: pa.RecordBatch, column: str) -> list:
    """The column's values as Python objects; None for each row when the batch has no such column."""
    return batch.column(column).to_pylist() if column in batch.schema.names else [None] * batch.num_rows


@dataclass(frozen=True)
class BatchWrite:
    """One micro-batch's write, shipped to the tasks: `write` runs per output partition."""

    topic: str
    writer: str
    query_id: str
    batch_id: int
    partitions: int
    client_config: dict[str, str | bool]
    transactional_prefix: str
    transaction_timeout_ms: int

    @property
    def marker(self) -> Marker:
        return Marker(self.writer, self.query_id, self.batch_id)

    def write_task(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """A Spark task's write (mapInArrow): Spark partition p holds Kafka partition p's records (routed by
        routes(), or the one partition of a batch written where it is read)."""
        context = TaskContext.get()
        assert context is not None  # in a Spark task
        for result in self.write(context.partitionId(), batches):
            yield pa.RecordBatch.from_pylist([result._asdict()], schema=RESULT_SCHEMA)

    def write(self, partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[PartitionResult]:
        """Write the partition's records (value, key?, headers?, PARTITION_COLUMN) in one transaction, unless the
        batch is committed there already."""
        records = self._records(partition, batches)
        head = [r for r in (next(records, None), next(records, None)) if r is not None]
        if not head:
            return iter(())
        owner, fresh = self._owner(partition)
        for _ in range(MAX_FENCED):
            if owner.committed is not None and owner.committed.covers(self.marker):
                return iter([PartitionResult(partition, 0, skipped=True)])
            if self._began(owner, partition, head, probe=not fresh):
                break
            owner, fresh = self._owner(partition, replace=True)  # fenced: a newer producer took the id
        else:
            raise RuntimeError(
                f"{self._transactional_id(partition)}: fenced {MAX_FENCED} times in a row: is "
                "another query writing with the same transactional ids?"
            )
        written = self._send_all(owner.producer, partition, head, records, probed=not fresh)
        try:
            retried(owner.producer.commit_transaction)
        except KafkaException as exc:
            self._forget_on(exc, partition, owner.producer)
            raise
        owner.committed = self.marker
        return iter([PartitionResult(partition, written, skipped=False)])

    def write_again_on_failure(self, partition: int, batches: list[pa.RecordBatch]) -> list[PartitionResult]:
        """`write`, tried again after a Kafka error as Spark tries a failed task again (in the driver nothing
        else would): the new attempt's producer fences the failed one and reads what it committed."""
        for wait in itertools.islice(backoff(first=0.5, most=5.0), DRIVER_WRITE_ATTEMPTS - 1):
            try:
                return list(self.write(partition, batches))
            except KafkaException as exc:
                log.warning("%s[%d], batch %d: %s; writing again", self.topic, partition, self.batch_id, exc)
            time.sleep(wait)
        return list(self.write(partition, batches))

    @staticmethod
    def _records(partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[KafkaRecord]:
        """The records of Arrow batches, column by column (no Row per record). Strings stay str: the producer
        encodes them as UTF-8."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            lowest, highest = (v.as_py() for v in pc.min_max(batch.column(PARTITION_COLUMN)).values())
            if lowest != partition or highest != partition:
                raise RuntimeError(
                    f"records of partitions {lowest}..{highest} reached the writer of partition "
                    f"{partition}: Spark's hash partitioning is not what routes() found"
                )
            keys, values, headers = (_values(batch, name) for name in ("key", "value", "headers"))
            for key, value, pairs in zip(keys, values, headers, strict=True):
                yield key, value, [(h["key"], h["value"]) for h in pairs] if pairs else None

    # ---------------------------------------------------------------------- ownership
    def _transactional_id(self, partition: int) -> str:
        return f"{self.transactional_prefix}/{partition}"

    def _owner(self, partition: int, replace: bool = False) -> tuple[OwnedPartition, bool]:
        """The kept producer for the partition, or a new one (True) that has fenced every older one."""
        transactional_id = self._transactional_id(partition)
        with _Workers.lock:
            kept = _Workers.producers.pop(transactional_id, None)
            if kept is not None and not replace:
                _Workers.producers[transactional_id] = kept  # now the most recently used
                return kept, False
        producer = Producer(
            {
                "linger.ms": 5,
                "log_level": QUIET,
                **self.client_config,
                "transactional.id": transactional_id,
                "transaction.timeout.ms": self.transaction_timeout_ms,
            }
        )
        # Brokers known first: a coordinator lookup sent while the bootstrap connection is being replaced
        # fails and is retried only 500 ms later.
        producer.list_topics(self.topic, timeout=CLIENT_TIMEOUT_S)
        retried(producer.init_transactions)
        with _Workers.reading:  # one consumer per process: the driver writes partitions side by side
            owner = OwnedPartition(producer, last_marker(self._consumer(), self.topic, partition, self.writer))
        with _Workers.lock:
            _Workers.producers[transactional_id] = owner
            while len(_Workers.producers) > MAX_KEPT_PRODUCERS:
                _Workers.producers.popitem(last=False)
        return owner, True

    def _began(self, owner: OwnedPartition, partition: int, head: list[KafkaRecord], probe: bool) -> bool:
        """Begin the transaction, False when fenced. A kept producer also sends the first record and waits for
        it: fenced meanwhile, it learns so now, before the batch is decided on what it read."""
        try:
            owner.producer.begin_transaction()
            if probe:
                self._send(owner.producer, partition, head[0], last=len(head) == 1)
                owner.producer.flush(CLIENT_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].fatal():
                return False
            self._forget_on(exc, partition, owner.producer)
            raise
        return True

    def _forget_on(self, exc: KafkaException, partition: int, producer: Producer) -> None:
        """After a failed send or commit: abort what can be aborted; a producer in doubt is not kept (the next
        attempt starts a new one, which aborts or completes this one's transaction)."""
        error: KafkaError = exc.args[0]
        if error.txn_requires_abort():
            producer.abort_transaction(CLIENT_TIMEOUT_S)
            return
        with _Workers.lock:
            _Workers.producers.pop(self._transactional_id(partition), None)

    def _consumer(self) -> Consumer:
        config = {
            "log_level": QUIET,
            **self.client_config,
            "group.id": "sluice-exactly-once",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 10,
        }
        key = json.dumps(config, sort_keys=True)
        with _Workers.lock:
            if key not in _Workers.consumers:
                _Workers.consumers[key] = Consumer(config)
            return _Workers.consumers[key]

    # ------------------------------------------------------------------------- writing
    def _send_all(
        self, producer: Producer, partition: int, head: list[KafkaRecord], rest: Iterator[KafkaRecord], probed: bool
    ) -> int:
        """Send the records (the first one already, when probed); the last one carries the marker. Each record
        is handed to the producer directly, `_send`'s waits and metadata refreshes only when that fails: per
        record they took 0.5 us of this loop's 1.6 us (without the producer's own time)."""
        records = itertools.chain(head[1:] if probed else head, rest)
        produce, topic = producer.produce, self.topic
        count = 1 if probed else 0
        try:
            held = next(records, None)  # held back until the next one comes: the last carries the marker
            if held is None:
                return count
            for record in records:
                key, value, headers = held
                try:
                    produce(topic, value, key, partition=partition, headers=headers)
                except (BufferError, KafkaException):  # the queue is full, or the metadata behind
                    self._send(producer, partition, held, last=False)
                held = record
                count += 1
            self._send(producer, partition, held, last=True)
        except KafkaException as exc:
            self._forget_on(exc, partition, producer)
            raise
        return count + 1

    def _send(self, producer: Producer, partition: int, record: KafkaRecord, last: bool) -> None:
        key, value, headers = record
        if last:
            headers = [*(headers or []), self.marker.header()]
        while True:
            try:
                with_fresh_metadata(
                    producer,
                    self.topic,
                    lambda: producer.produce(self.topic, value=value, key=key, headers=headers, partition=partition),
                )
                return
            except BufferError:
                producer.poll(0.05)


# Errors a client meets while a broker restarts or a topic grows: its metadata is behind, the next try works.
TRANSIENT = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


def transient(error: KafkaError) -> bool:
    return error.code() in TRANSIENT or (error.retriable() and not error.fatal())


def backoff(first: float = 0.02, most: float = 0.5) -> Iterator[float]:
    """Waits between tries, doubling up to `most`."""
    wait = first
    while True:
        yield wait
        wait = min(wait * 2, most)


def retried(call: Callable[[float], None]) -> None:
    """A transactional call (init_transactions, commit_transaction) made again while it fails with an error
    librdkafka marks retriable, for up to CLIENT_TIMEOUT_S: a coordinator moving with a restarted broker, or
    still writing the markers of the id's previous transaction (a partition's task moved to another Python
    worker right after a commit: CONCURRENT_TRANSACTIONS for a few milliseconds, so the first waits are short)."""
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    for wait in backoff():
        try:
            return call(CLIENT_TIMEOUT_S)
        except KafkaException as exc:
            if not exc.args[0].retriable() or time.monotonic() > deadline:
                raise
            log.info("%s: %s; trying again", call.__name__, exc.args[0].str())
        time.sleep(wait)


def with_fresh_metadata(client: Producer | Consumer, topic: str, action: Callable[[], T]) -> T:
    """Run the action; on a transient error (a partition the client does not know yet because the topic gained
    partitions since it last looked, a leader that moved with a restarted broker) refresh the client's
    metadata and run it again, for up to CLIENT_TIMEOUT_S."""
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while True:
        try:
            return action()
        except KafkaException as exc:
            if not transient(exc.args[0]) or time.monotonic() > deadline:
                raise
            log.info("%s: %s; trying again", topic, exc.args[0].str())
        time.sleep(0.5)
        try:
            client.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
        except KafkaException as exc:
            if not transient(exc.args[0]):
                raise


def last_marker(consumer: Consumer, topic: str, partition: int, writer: str) -> Marker | None:
    """The marker of the writer's last committed transaction in the partition, reading backwards from the end
    in growing steps (usually it is the last record: the first step finds it)."""
    low, end = with_fresh_metadata(
        consumer,
        topic,
        lambda: consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=CLIENT_TIMEOUT_S),
    )  # `end`: the last stable offset (read_committed)
    window, stop = 16, end
    while stop > low:
        start = max(low, stop - window)
        found = _last_marker_between(consumer, topic, partition, start, stop, writer)
        if found is not None:
            return found
        window, stop = window * 8, start
    return None


def _last_marker_between(
    consumer: Consumer, topic: str, partition: int, start: int, stop: int, writer: str
) -> Marker | None:
    consumer.assign([TopicPartition(topic, partition, start)])
    found: Marker | None = None
    try:
        while True:
            first = consumer.poll(CLIENT_TIMEOUT_S)
            if first is None:
                raise TimeoutError(
                    f"reading {topic}[{partition}] from offset {start}: nothing within {CLIENT_TIMEOUT_S:.0f}s"
                )
            # consume(n, timeout) would wait for n messages: take only what is already fetched
            for message in [first, *consumer.consume(num_messages=1000, timeout=0)]:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return found
                    if transient(error):  # the consumer fetches again by itself
                        continue
                    raise KafkaException(error)
                offset = message.offset()
                assert offset is not None  # a fetched record has one
                if offset >= stop:
                    return found
                marker = Marker.of(message.headers())
                if marker is not None and marker.writer == writer:
                    found = marker
    finally:
        consumer.unassign()
