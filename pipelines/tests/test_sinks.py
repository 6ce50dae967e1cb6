"""The exactly-once Kafka sink, batch by batch, on real Kafka and Spark: replays, zombies, fenced producers,
partition changes, and the partitions it gives keys (the same as the Java client's)."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewPartitions
from kafka_output import read_committed
from pydantic import ValidationError
from pyspark.sql import DataFrame, SparkSession

from sluice.api.kafka_clients import KafkaClient
from sluice.api.pipeline import ToKafka
from sluice.pipelines.local.kafka_io import ConsumedRecord, produce
from sluice.pipelines.sinks import SinkContext
from sluice.pipelines.sinks.kafka_eos import (
    COMMIT_HEADER,
    PARTITION_COLUMN,
    UNROLLED_BLOCKS,
    BatchWrite,
    ExactlyOnceKafkaSink,
    Marker,
    kafka_partition,
    kafka_partitions,
    routes,
    spark_hash_int,
    with_kafka_partition,
    with_kafka_partition_in_driver,
    with_kafka_partition_in_stream,
)
from sluice.pipelines.sinks.kafka_eos import driver as eos_driver
from sluice.pipelines.sinks.kafka_eos.writer import Rows, _Workers

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

KEYS = [f"key-{i}" for i in range(60)]


class Target:
    """One output topic and the checkpoint folder of the query writing it."""

    def __init__(self, spark: SparkSession, bootstrap: str, topic: str, tmp_path: Path, writers: str) -> None:
        self.spark, self.bootstrap, self.topic, self.writers = spark, bootstrap, topic, writers
        self.app_id = f"tests/{uuid.uuid4().hex[:8]}"
        self.checkpoint = self.new_checkpoint(tmp_path / "checkpoint")

    @staticmethod
    def new_checkpoint(folder: Path) -> str:
        """A folder holding what Spark writes when a query starts: its id."""
        folder.mkdir(parents=True)
        (folder / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
        return str(folder)

    def sink(self, checkpoint: str | None = None) -> ExactlyOnceKafkaSink:
        """A sink as one run of the query makes it (a new one = a restarted driver, without the producers the
        old driver kept: writers driver keeps them in this process)."""
        _Workers.producers.clear()
        config = ToKafka(topic=self.topic, key="k", value="v", writers=self.writers)
        return ExactlyOnceKafkaSink(
            config, SinkContext("out", checkpoint or self.checkpoint, KafkaClient(self.bootstrap), self.app_id)
        )

    def rows(self, sink: ExactlyOnceKafkaSink, tag: str, keys: list[str] = KEYS) -> DataFrame:
        frame = self.spark.createDataFrame([(k, f"{tag}:{k}") for k in keys], "k STRING, v STRING")
        return sink.records(frame)

    def partitions(self) -> int:
        topic = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(self.topic, timeout=30).topics
        return len(topic[self.topic].partitions)

    def output(self) -> list[ConsumedRecord]:
        return read_committed(self.bootstrap, self.topic)

    def values(self) -> Counter[str]:
        return Counter((r.value or b"").decode() for r in self.output())

    def batch_write(self, sink: ExactlyOnceKafkaSink, batch_id: int, partitions: int) -> BatchWrite:
        """What the sink ships to its tasks for a batch, to run one task here (an old driver's, another worker's)."""
        query_id = json.loads(Path(sink.context.checkpoint, "metadata").read_text())["id"]
        return BatchWrite(
            self.topic,
            sink.writer,
            query_id,
            batch_id,
            partitions,
            sink.client_config,
            sink.transactional_prefix,
            60_000,
        )


@pytest.fixture(autouse=True)
def no_kept_producers() -> Iterator[None]:
    """Tasks run here by a test keep their producers in this process like a Python worker: not past the test."""
    yield
    _Workers.producers.clear()
    for consumer in _Workers.consumers.values():
        consumer.close()
    _Workers.consumers.clear()


@pytest.fixture(params=["executors", "driver"])
def target(
    request: pytest.FixtureRequest,
    spark_session: SparkSession,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
) -> Target:
    """Where the sink writes its transactions: Spark tasks (Python workers) or the driver (this process)."""
    return Target(spark_session, kafka_bootstrap, new_topic(partitions=3), tmp_path, request.param)


def expected(tag: str, keys: list[str] = KEYS) -> Counter[str]:
    return Counter(f"{tag}:{k}" for k in keys)


def rows(tag: str, partition: int, partitions: int) -> list[tuple[str, str, int]]:
    """The rows (value, key, partition) of one partition of a batch, as the shuffle hands them to its task."""
    return [(f"{tag}:{k}", k, partition) for k in KEYS if kafka_partition(k.encode(), partitions) == partition]


def batches(tag: str, partition: int, partitions: int) -> list[pa.RecordBatch]:
    """rows() as the Arrow batch a task's write reads."""
    names = ["value", "key", PARTITION_COLUMN]
    columns = zip(*rows(tag, partition, partitions), strict=True)
    return [pa.RecordBatch.from_arrays([pa.array(c) for c in columns], names=names)]


# -------------------------------------------------------------------------------------- partitions


def test_keys_go_to_the_java_clients_partition(spark_session, kafka_bootstrap, new_topic) -> None:
    """Spark's own Kafka sink (the Java producer's default partitioner) and the exactly-once sink put every key
    in the same partition: switching delivery keeps a key's records in one partition. Keys of every length
    mod 4 and every byte value; a record without a key goes where its value would as a key. Every form: the
    streaming plan's unrolled one, past its UNROLLED_BLOCKS the one-expression form it falls back on, and the
    driver's (Python, on the collected batch)."""
    rng = random.Random(5)
    longest = 4 * UNROLLED_BLOCKS + 40
    keys = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, longest))) for _ in range(900)]
    frame = spark_session.createDataFrame([(bytearray(k), bytearray(b"v")) for k in keys], "key BINARY, value BINARY")
    topic = new_topic(partitions=7)
    frame.write.format("kafka").option("kafka.bootstrap.servers", kafka_bootstrap).option("topic", topic).save()
    by_java = {r.key: r.partition for r in read_committed(kafka_bootstrap, topic)}
    assert by_java == {k: kafka_partition(k, 7) for k in keys}
    unkeyed = spark_session.createDataFrame([(bytearray(k),) for k in keys], "value BINARY")
    texts = ["", "é", "日本語のキー", "key-ü-" * 3, "🙂" * 11, "x" * 41]  # STRING keys: their UTF-8 bytes
    strings = spark_session.createDataFrame([(t, "v") for t in texts], "key STRING, value STRING")
    for place in (with_kafka_partition, with_kafka_partition_in_stream):
        assert {bytes(r.key): r[PARTITION_COLUMN] for r in place(frame, 7).collect()} == by_java, place.__name__
        assert {bytes(r.value): r[PARTITION_COLUMN] for r in place(unkeyed, 7).collect()} == by_java, place.__name__
        by_text = {r.key: r[PARTITION_COLUMN] for r in place(strings, 7).collect()}
        assert by_text == {t: kafka_partition(t.encode(), 7) for t in texts}, place.__name__
    in_driver = [with_kafka_partition_in_driver(f.toArrow(), 7).to_pylist() for f in (frame, unkeyed, strings)]
    assert {r["key"]: r[PARTITION_COLUMN] for r in in_driver[0]} == by_java
    assert {r["value"]: r[PARTITION_COLUMN] for r in in_driver[1]} == by_java
    assert {r["key"]: r[PARTITION_COLUMN] for r in in_driver[2]} == {t: kafka_partition(t.encode(), 7) for t in texts}
    nothing = with_kafka_partition_in_driver(pa.table({"value": [None]}), 7)
    assert nothing.column(PARTITION_COLUMN).to_pylist() == [0]
    sliced = pa.chunked_array([pa.array(keys[:10], pa.binary()), pa.array(keys, pa.binary()).slice(10)])
    assert kafka_partitions(sliced, 7).tolist() == [by_java[k] for k in keys]


def test_a_topic_of_one_partition_takes_every_record_without_hashing(spark_session: SparkSession) -> None:
    """Every record in partition 0, and no murmur2 in the plan: its projection cost each task of a stream ~40 ms
    of executor CPU and a query's first batch ~0.6 s of planning (the e2e app's stateless query)."""
    keyed = spark_session.createDataFrame(
        [(b"k%d" % i, b"v") for i in range(50)] + [(None, b"v")], "key BINARY, value BINARY"
    )
    for place in (with_kafka_partition, with_kafka_partition_in_stream):
        placed = place(keyed, 1)
        assert [r[PARTITION_COLUMN] for r in placed.collect()] == [0] * 51, place.__name__
        assert placed.schema[PARTITION_COLUMN].dataType.simpleString() == "int", place.__name__
        plan = placed._jdf.queryExecution().analyzed().toString()
        assert "_sluice_bytes" not in plan and "ISO-8859-1" not in plan, plan
    in_driver = with_kafka_partition_in_driver(keyed.toArrow(), 1)
    assert in_driver.column(PARTITION_COLUMN).to_pylist() == [0] * 51
    assert in_driver.schema.field(PARTITION_COLUMN).type == pa.int32()


def test_a_query_without_a_shuffle_writes_a_topic_of_one_partition_from_the_stage_that_reads(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    """One task a batch and no shuffle for the records bound for one partition of a query without a shuffle (a
    shuffle took a task per source partition and one more to write); after a shuffle the last stage keeps its
    tasks (they may hold state stores). Either way every record is written once, with its batch's marker."""
    frame = spark_session.createDataFrame([(k, f"b0:{k}") for k in KEYS], "k STRING, v STRING").repartition(4)
    for shuffled in (False, True):
        target = Target(spark_session, kafka_bootstrap, new_topic(partitions=1), tmp_path / str(shuffled), "executors")
        config = ToKafka(topic=target.topic, key="k", value="v", writers="executors")
        context = SinkContext("out", target.checkpoint, KafkaClient(target.bootstrap), target.app_id, shuffled=shuffled)
        sink = ExactlyOnceKafkaSink(config, context)
        placed = sink._by_partition(with_kafka_partition(sink.records(frame), 1), 1)
        plan = placed._jdf.queryExecution().executedPlan().toString()
        assert placed.rdd.getNumPartitions() == 1
        assert ("Exchange SinglePartition" in plan) == shuffled, plan
        sink.write_batch(sink.records(frame), 0)
        assert [(r.partition, r.records, r.skipped) for r in sink.last_results] == [(0, len(KEYS), False)]
        assert target.values() == expected("b0"), shuffled
        assert [Marker.of(r.headers) for r in target.output()][-1] == Marker(sink.writer, sink._query_id or "", 0)


# ------------------------------------------------------------------------------------------ replays


def test_routes_are_what_spark_hash_partitioning_does(spark_session: SparkSession) -> None:
    """routes() and spark_hash_int() are computed in Python: they must be Spark's own hash and placement."""
    ints = [0, 1, -1, 7, 42, 2**31 - 1, -(2**31), *random.Random(3).sample(range(-(2**31), 2**31), 200)]
    frame = spark_session.createDataFrame([(i,) for i in ints], "i INT")
    assert {r.i: r.h for r in frame.selectExpr("i", "hash(i) AS h").collect()} == {i: spark_hash_int(i) for i in ints}
    for partitions in (1, 2, 3, 4, 7, 12, 16):
        placed = (
            spark_session.createDataFrame([(r,) for r in routes(partitions)], "route INT")
            .repartition(partitions, "route")
            .rdd.mapPartitionsWithIndex(lambda index, rows: [(row.route, index) for row in rows])
            .collect()
        )
        assert sorted(placed) == sorted(zip(routes(partitions), range(partitions), strict=True)), partitions


def test_a_replayed_batch_is_not_written_again(target: Target) -> None:
    sink = target.sink()
    sink.write_batch(target.rows(sink, "b0"), 0)
    assert not any(r.skipped for r in sink.last_results)
    replay = target.sink()  # a restarted driver replays batch 0
    replay.write_batch(target.rows(replay, "b0"), 0)
    assert [r.skipped for r in replay.last_results] == [True, True, True]
    replay.write_batch(target.rows(replay, "b1"), 1)
    assert target.values() == expected("b0") + expected("b1")
    markers = [Marker.of(r.headers) for r in target.output() if dict(r.headers).get(COMMIT_HEADER)]
    assert sorted(m.batch_id for m in markers if m) == [0, 0, 0, 1, 1, 1]  # one per transaction


def test_binary_keys_string_values_and_headers_reach_kafka_as_given(target: Target) -> None:
    """The records' columns of either type and their headers; the commit marker is one more header, on the last
    record of each transaction only."""
    headers = "array(named_struct('key', 'origin', 'value', cast(upper(k) as binary)))"
    config = ToKafka(topic=target.topic, key="cast(k as binary)", value="v", headers=headers, writers=target.writers)
    sink = ExactlyOnceKafkaSink(
        config, SinkContext("out", target.checkpoint, KafkaClient(target.bootstrap), target.app_id)
    )
    frame = target.spark.createDataFrame([(k, f"b0:{k}") for k in KEYS], "k STRING, v STRING")
    sink.write_batch(sink.records(frame), 0)
    out = target.output()
    assert sorted((r.key, r.value, [h for h in r.headers if h[0] != COMMIT_HEADER]) for r in out) == sorted(
        (k.encode(), f"b0:{k}".encode(), [("origin", k.upper().encode())]) for k in KEYS
    )
    assert sum(1 for r in out if dict(r.headers).get(COMMIT_HEADER)) == 3  # one transaction per partition


def test_values_alone_without_key_or_headers(target: Target) -> None:
    """A sink of values only: each record placed by its value, none lost or doubled."""
    config = ToKafka(topic=target.topic, value="v", writers=target.writers)
    sink = ExactlyOnceKafkaSink(
        config, SinkContext("out", target.checkpoint, KafkaClient(target.bootstrap), target.app_id)
    )
    frame = target.spark.createDataFrame([(k, f"b0:{k}") for k in KEYS], "k STRING, v STRING")
    sink.write_batch(sink.records(frame), 0)
    out = target.output()
    assert {r.key for r in out} == {None}
    assert target.values() == expected("b0")
    assert all(r.partition == kafka_partition(r.value or b"", 3) for r in out)


def test_a_record_routed_to_another_partitions_writer_is_refused() -> None:
    """Spark partition p must hold Kafka partition p's records only: anything else stops the batch."""
    with pytest.raises(RuntimeError, match=r"records of partitions 2\.\.2 reached the writer of partition 1"):
        list(BatchWrite._rows(1, batches("b0", 2, 3)))


def test_a_new_checkpoint_counts_batches_from_zero_again(target: Target, tmp_path: Path) -> None:
    sink = target.sink()
    sink.write_batch(target.rows(sink, "old"), 0)
    fresh = target.sink(Target.new_checkpoint(tmp_path / "new-checkpoint"))
    fresh.write_batch(target.rows(fresh, "new"), 0)
    assert target.values() == expected("old") + expected("new")


def test_records_of_other_writers_after_the_last_commit(target: Target) -> None:
    """The last commit is found however many records others appended since (the search backwards grows)."""
    sink = target.sink()
    sink.write_batch(target.rows(sink, "b0"), 0)
    for partition in range(3):
        produce(target.bootstrap, target.topic, [f"other-{i}".encode() for i in range(300)], partition=partition)
    replay = target.sink()
    replay.write_batch(target.rows(replay, "b0"), 0)
    assert all(r.skipped for r in replay.last_results)
    assert +(target.values() - Counter(f"other-{i}" for i in range(300) for _ in range(3))) == expected("b0")


def test_auto_writes_a_batch_of_other_rows_from_the_driver_after_a_small_one(
    spark_session: SparkSession,
    kafka_bootstrap: str,
    new_topic: Callable[..., str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """writers auto on rows that are not an aggregation's groups: the first batch of a run (often a backlog) and a
    batch after one of more than SMALL_BATCH_RECORDS records go to the executors; a batch after a small one is
    written by the driver, with the producers it keeps (here, in this process). Every record once either way."""
    monkeypatch.setattr(eos_driver, "SMALL_BATCH_RECORDS", 30)
    target = Target(spark_session, kafka_bootstrap, new_topic(partitions=3), tmp_path, "auto")
    sink = target.sink()
    assert not sink.from_driver
    few, tags = KEYS[:20], ["b0", "b1", "b2", "b3"]
    written_by_driver = []
    for batch_id, (tag, keys) in enumerate(zip(tags, [few, few, KEYS, KEYS], strict=True)):
        _Workers.producers.clear()
        sink.write_batch(target.rows(sink, tag, keys), batch_id)
        written_by_driver.append(bool(_Workers.producers))
    assert written_by_driver == [False, True, True, False]
    assert target.values() == expected("b0", few) + expected("b1", few) + expected("b2") + expected("b3")


# ------------------------------------------------------------------------------ zombies and fencing


def test_an_open_transaction_of_a_dead_driver_is_aborted(target: Target) -> None:
    """A task of the old driver sent its records but did not commit: the new driver's task fences it (its
    transaction is aborted, its commit fails) and writes the batch once."""
    sink = target.sink()
    zombie = Producer({"bootstrap.servers": target.bootstrap, "transactional.id": f"{sink.transactional_prefix}/1"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for value, key, _ in rows("b0", 1, 3):
        zombie.produce(target.topic, value=value, key=key, partition=1)
    zombie.flush(30)
    sink.write_batch(target.rows(sink, "b0"), 0)
    with pytest.raises(KafkaException):
        zombie.commit_transaction(30)
    assert target.values() == expected("b0")


def test_a_batch_committed_by_a_dead_driver_is_skipped(target: Target) -> None:
    """The old driver's task committed partition 1, then the driver died before Spark recorded the batch."""
    sink = target.sink()
    old_task = target.batch_write(sink, 0, 3)
    list(old_task.write(1, batches("b0", 1, 3)))
    _Workers.producers.clear()  # gone with the old driver
    sink.write_batch(target.rows(sink, "b0"), 0)
    assert [(r.partition, r.skipped) for r in sink.last_results] == [(0, False), (1, True), (2, False)]
    assert target.values() == expected("b0")


def test_a_kept_producer_fenced_by_another_worker(target: Target) -> None:
    """Producers stay in their Python worker between batches. When another worker took the partition
    meanwhile, the kept producer is fenced: it finds out before deciding, and a new one takes over."""
    sink = target.sink()

    def write(batch_id: int) -> list:
        return list(target.batch_write(sink, batch_id, 3).write(2, batches(f"b{batch_id}", 2, 3)))

    first = write(0)[0]
    assert first.records > 0 and first.new_producer  # this worker keeps its producer
    transactional_id = f"{sink.transactional_prefix}/2"
    kept = _Workers.producers.pop(transactional_id)
    taken = write(1)[0]
    assert not taken.skipped and taken.new_producer  # "another worker": a new producer, which fences the kept one
    _Workers.producers[transactional_id] = kept  # back on the first worker, its producer fenced
    replay = write(1)[0]
    assert replay.skipped and replay.new_producer  # a replay of batch 1 there: fenced, replaced, finds batch 1
    _Workers.producers[transactional_id] = kept
    assert not write(2)[0].skipped
    again = write(3)[0]  # the producer that replaced the fenced one, kept
    assert not again.skipped and not again.new_producer
    in_partition_2 = [k for k in KEYS if kafka_partition(k.encode(), 3) == 2]
    assert target.values() == sum((expected(f"b{b}", in_partition_2) for b in range(4)), Counter())


def test_records_keep_their_order_when_the_producers_queue_fills(target: Target) -> None:
    """Records are handed to the producer in runs: when its queue is full, the run's remaining records wait and
    follow in order (a queue of 100 records, a partition's share of 2,500 in one transaction)."""
    sink = target.sink()
    write = target.batch_write(sink, 0, 3)
    small_queue = replace(write, client_config={**write.client_config, "queue.buffering.max.messages": 100})
    values = [f"b0:{i:05d}" for i in range(2_500)]
    run = pa.RecordBatch.from_arrays(
        [pa.array(values), pa.array([None] * len(values), pa.binary()), pa.array([1] * len(values), pa.int32())],
        names=["value", "key", PARTITION_COLUMN],
    )
    result = list(small_queue.write(1, [run.slice(0, 1_200), run.slice(1_200)]))
    assert [(r.records, r.skipped) for r in result] == [(2_500, False)]
    out = target.output()
    assert [(r.value or b"").decode() for r in out] == values
    assert [r.partition for r in out] == [1] * len(values)
    assert [bool(dict(r.headers).get(COMMIT_HEADER)) for r in out] == [False] * 2_499 + [True]


def test_a_full_queue_leaves_the_runs_last_records_in_order() -> None:
    """librdkafka queues a run of records in order: after the first one its queue has no room for, it refuses the
    rest, a smaller one that would fit included; those wait for the next call, in their order."""
    write = BatchWrite("t", "w", "q", 0, 1, {"bootstrap.servers": "127.0.0.1:9"}, "p", 60_000)
    queued: list[bytes | None] = []  # the records the producer held, as its purge reports them, in its order
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:9",
            "queue.buffering.max.kbytes": 1,
            "log_level": 0,
            "on_delivery": lambda _error, message: queued.append(message.value()),
        }
    )
    values = [f"{i}" * 100 for i in range(5)] + ["b" * 900, "c"]
    assert write._queued(producer, 0, Rows([None] * 6 + [b"k"], values, None)) == 5
    producer.purge()
    producer.flush(5)
    assert queued == [value.encode() for value in values[:5]]


# -------------------------------------------------------------------------------------- partitions


def test_a_replayed_batch_keeps_the_partition_count_of_its_first_run(target: Target) -> None:
    """Partitions added between a batch and its replay do not move its keys; the batches after use them."""
    sink = target.sink()
    sink.write_batch(target.rows(sink, "b0"), 0)
    admin = AdminClient({"bootstrap.servers": target.bootstrap})
    admin.create_partitions([NewPartitions(target.topic, 5)])[target.topic].result(30)
    replay = target.sink()
    replay.write_batch(target.rows(replay, "b0"), 0)
    assert [r.skipped for r in replay.last_results] == [True, True, True]
    replay.write_batch(target.rows(replay, "b1"), 1)
    assert target.values() == expected("b0") + expected("b1")
    for record in target.output():
        batch, key = (record.value or b"").decode().split(":")
        assert record.partition == kafka_partition(key.encode(), 3 if batch == "b0" else 5)


def test_records_placed_in_the_stream_are_placed_again_for_another_partition_count(target: Target) -> None:
    """A streaming query's records come placed for the topic's partition count at its start (in the streaming
    plan; driver writers place them in the driver). A batch for another count is placed again: a replay pinned to
    the count it first had, or a batch after the topic grew."""
    admin = AdminClient({"bootstrap.servers": target.bootstrap})
    rows = target.spark.readStream.format("rate").load()
    rows = rows.selectExpr("CAST(value AS STRING) AS k", "CAST(value AS STRING) AS v")

    def started() -> tuple[ExactlyOnceKafkaSink, int]:
        """A run of the query: its sink, and the partition count its stream places records for."""
        sink = target.sink()
        sink.stream_writer(sink.records(rows))
        return sink, target.partitions()

    def as_streamed(sink: ExactlyOnceKafkaSink, tag: str, partitions: int) -> DataFrame:
        records = target.rows(sink, tag)
        return records if sink.from_driver else with_kafka_partition(records, partitions)

    sink, placed_for = started()
    sink.write_batch(as_streamed(sink, "b0", placed_for), 0)
    admin.create_partitions([NewPartitions(target.topic, 5)])[target.topic].result(30)
    sink, placed_for = started()  # restarted after the topic grew: its stream places for 5
    sink.write_batch(as_streamed(sink, "b0", placed_for), 0)  # a replay: written for 3 before
    assert [r.skipped for r in sink.last_results] == [True, True, True]
    sink.write_batch(as_streamed(sink, "b1", placed_for), 1)
    admin.create_partitions([NewPartitions(target.topic, 7)])[target.topic].result(30)
    sink.write_batch(as_streamed(sink, "b2", placed_for), 2)  # the topic grew while the query ran
    assert target.values() == expected("b0") + expected("b1") + expected("b2")
    counts = {"b0": 3, "b1": 5, "b2": 7}
    for record in target.output():
        batch, key = (record.value or b"").decode().split(":")
        assert record.partition == kafka_partition(key.encode(), counts[batch])


def test_a_batch_beyond_the_drivers_result_size_is_written_by_the_tasks(target: Target) -> None:
    """Spark refuses to collect more than spark.driver.maxResultSize: such a batch goes the executors' way (the
    same ids and markers), any other failure of the batch stays one."""

    class Refused:
        def __init__(self, message: str) -> None:
            self.message = message

        def toArrow(self) -> None:
            raise RuntimeError(self.message)

    sink = target.sink()
    too_large = "Total size of serialized results of 4 tasks (1100.0 MiB) is bigger than spark.driver.maxResultSize"
    assert sink._collected(Refused(too_large), 0) is None  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="executor lost"):
        sink._collected(Refused("executor lost"), 0)  # type: ignore[arg-type]


def test_the_topic_must_exist(target: Target, spark_session: SparkSession) -> None:
    sink = target.sink()
    sink.config = ToKafka(topic=f"missing-{uuid.uuid4().hex}", key="k", value="v")
    with pytest.raises(RuntimeError, match="does not create its topic"):
        sink.write_batch(target.rows(sink, "b0"), 0)


@pytest.mark.parametrize("delivery", ["exactlyOnce", "atLeastOnce"])
def test_exactly_once_options_are_kafka_client_settings(delivery: str) -> None:
    options = {"kafka.linger.ms": "20", "failOnDataLoss": "false"}
    if delivery == "atLeastOnce":
        assert ToKafka(topic="t", delivery=delivery, options=options).options == options
    else:
        with pytest.raises(ValidationError, match="failOnDataLoss: with delivery exactlyOnce"):
            ToKafka(topic="t", delivery=delivery, options=options)
