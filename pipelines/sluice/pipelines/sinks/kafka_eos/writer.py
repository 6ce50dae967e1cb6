"""One partition's share of a micro-batch written in one transaction (BatchWrite), by a task on an executor or
by the driver: the owned partition's producer, kept between batches, fenced and checked against the last
commit marker."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from pyspark import TaskContext
from pyspark.sql.pandas.types import from_arrow_schema

from .partitioner import PARTITION_COLUMN
from .settings import (
    CLIENT_TIMEOUT_S,
    DRIVER_WRITE_ATTEMPTS,
    ENQUEUED_AT_ONCE,
    MAX_FENCED,
    MAX_KEPT_PRODUCERS,
    QUIET,
    Header,
    KafkaRecord,
)
from .transactions import Marker, last_marker, retried, tried_again, with_fresh_metadata


class PartitionResult(NamedTuple):
    partition: int
    records: int
    skipped: bool  # the batch was already committed to this partition
    new_producer: bool = False  # a producer was started (and fenced its id's older ones) for this write


RESULT_SCHEMA = pa.schema(
    [("partition", pa.int32()), ("records", pa.int64()), ("skipped", pa.bool_()), ("new_producer", pa.bool_())]
)
RESULT_TYPE = from_arrow_schema(RESULT_SCHEMA)


@dataclass
class OwnedPartition:
    producer: Producer
    committed: Marker | None  # the sink's last commit in the partition: read at init, then its own


class _Workers:
    """What a Python worker (or the driver) keeps between batches: producers by transactional id, consumers and
    admin clients by config."""

    producers: OrderedDict[str, OwnedPartition] = OrderedDict()
    consumers: dict[str, Consumer] = {}
    admins: dict[str, AdminClient] = {}
    lock = threading.Lock()
    reading = threading.Lock()


def kept_admin(config: Mapping[str, str | bool | int]) -> AdminClient:
    """An admin client for `config`, kept between batches (a new one costs a connection, and with TLS and SASL a
    handshake and a login, before its first answer: a median 53 ms on the local broker's plain listener, against
    0.5 ms for a metadata request on a kept one) until release_kept_clients, when the driver drains or stops. As
    with the kept consumers, a sink a hot swap removed leaves its client until then: one per config, and every
    sink of an app has the app's Kafka config (a login change needs a new driver)."""
    key = json.dumps(config, sort_keys=True)
    with _Workers.lock:
        if key not in _Workers.admins:
            _Workers.admins[key] = AdminClient(dict(config))
        return _Workers.admins[key]


def release_kept_clients(timeout: float = 10.0) -> None:
    """Close the clients this process keeps (the driver's, once its queries have stopped; an open transaction
    is aborted): left behind, they would reconnect to Kafka as long as the process lives. Closing waits for
    the brokers, so it runs beside the caller for at most `timeout` seconds (a transaction left open then is
    aborted by the next producer with its id, or times out)."""
    with _Workers.reading, _Workers.lock:
        closing: list[Callable[[], object]] = [owner.producer.close for owner in _Workers.producers.values()]
        closing += [consumer.close for consumer in _Workers.consumers.values()]
        admins = list(_Workers.admins.values())  # no close(): destroyed with their last reference, in a thread
        closing.append(admins.clear)
        _Workers.producers.clear()
        _Workers.consumers.clear()
        _Workers.admins.clear()
    threads = [threading.Thread(target=close, name="sluice-close-kafka-client", daemon=True) for close in closing]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _values(batch: pa.RecordBatch, column: str) -> list:
    """The column's values as Python objects; None for each row when the batch has no such column."""
    return batch.column(column).to_pylist() if column in batch.schema.names else [None] * batch.num_rows


class Rows(NamedTuple):
    """A run of one partition's records as Python objects, column by column (no object per record)."""

    keys: list[str | bytes | None]
    values: list[str | bytes | None]
    headers: list[list[Header] | None] | None  # None: no record of the run has headers

    @classmethod
    def of(cls, batch: pa.RecordBatch) -> Rows:
        headers = None
        if "headers" in batch.schema.names and batch.column("headers").null_count < batch.num_rows:
            pairs_of = batch.column("headers").to_pylist()
            headers = [[(h["key"], h["value"]) for h in pairs] if pairs else None for pairs in pairs_of]
        return cls(_values(batch, "key"), _values(batch, "value"), headers)

    def __len__(self) -> int:
        return len(self.values)

    def record(self, index: int) -> KafkaRecord:
        return self.keys[index], self.values[index], self.headers[index] if self.headers is not None else None

    def between(self, start: int, stop: int | None = None) -> Rows:
        headers = self.headers[start:stop] if self.headers is not None else None
        return Rows(self.keys[start:stop], self.values[start:stop], headers)


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
        runs = self._rows(partition, batches)
        first = next(runs, None)
        if first is None:
            return iter(())
        second = next(runs, None)
        rest = runs if second is None else itertools.chain([second], runs)
        owner, fresh = self._owner(partition)
        started = fresh
        for _ in range(MAX_FENCED):
            if owner.committed is not None and owner.committed.covers(self.marker):
                return iter([PartitionResult(partition, 0, skipped=True, new_producer=started)])
            if self._began(owner, partition, first.record(0), only=len(first) == 1 and second is None, probe=not fresh):
                break
            owner, fresh = self._owner(partition, replace=True)  # fenced: a newer producer took the id
            started = True
        else:
            raise RuntimeError(
                f"{self._transactional_id(partition)}: fenced {MAX_FENCED} times in a row: is "
                "another query writing with the same transactional ids?"
            )
        probed = not fresh
        written = probed + self._send_all(owner.producer, partition, first.between(1) if probed else first, rest)
        try:
            retried(owner.producer.commit_transaction)
        except KafkaException as exc:
            self._forget_on(exc, partition, owner.producer)
            raise
        owner.committed = self.marker
        return iter([PartitionResult(partition, written, skipped=False, new_producer=started)])

    def write_again_on_failure(self, partition: int, batches: list[pa.RecordBatch]) -> list[PartitionResult]:
        """`write`, tried again after a Kafka error as Spark tries a failed task again (in the driver nothing
        else would): the new attempt's producer fences the failed one and reads what it committed."""
        name = f"{self.topic}[{partition}], batch {self.batch_id}"
        return tried_again(DRIVER_WRITE_ATTEMPTS, lambda: list(self.write(partition, batches)), name)

    @staticmethod
    def _rows(partition: int, batches: Iterable[pa.RecordBatch]) -> Iterator[Rows]:
        """The records of Arrow batches in runs of at most ENQUEUED_AT_ONCE, each run's columns converted at once.
        Strings stay str: the producer encodes them as UTF-8."""
        for batch in batches:
            if batch.num_rows == 0:
                continue
            lowest, highest = (v.as_py() for v in pc.min_max(batch.column(PARTITION_COLUMN)).values())
            if lowest != partition or highest != partition:
                raise RuntimeError(
                    f"records of partitions {lowest}..{highest} reached the writer of partition "
                    f"{partition}: Spark's hash partitioning is not what routes() found"
                )
            for start in range(0, batch.num_rows, ENQUEUED_AT_ONCE):
                yield Rows.of(batch.slice(start, ENQUEUED_AT_ONCE))

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

    def _began(self, owner: OwnedPartition, partition: int, first: KafkaRecord, only: bool, probe: bool) -> bool:
        """Begin the transaction, False when fenced. A kept producer also sends the first record (with the marker
        when it is the only one) and waits for it: fenced meanwhile, it learns so now, before the batch is decided
        on what it read."""
        try:
            owner.producer.begin_transaction()
            if probe:
                self._send(owner.producer, partition, first, last=only)
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
    def _send_all(self, producer: Producer, partition: int, first: Rows, rest: Iterator[Rows]) -> int:
        """Send the runs of records; the last record alone, with the marker."""
        count, held = 0, first  # held back until the next run comes: the last run ends with the marker
        try:
            for rows in rest:
                self._enqueue(producer, partition, held)
                count, held = count + len(held), rows
            if len(held):
                self._enqueue(producer, partition, held.between(0, -1))
                self._send(producer, partition, held.record(-1), last=True)
                count += len(held)
        except KafkaException as exc:
            self._forget_on(exc, partition, producer)
            raise
        return count

    def _enqueue(self, producer: Producer, partition: int, rows: Rows) -> None:
        """Hand a run of records to the producer: in one produce_batch call when they have no headers (it takes
        none; 0.5 us a record against 1 us for produce() and 1.6 us for the loop calling it), else one by one."""
        if rows.headers is not None:
            produce, topic = producer.produce, self.topic
            for key, value, headers in zip(rows.keys, rows.values, rows.headers, strict=True):
                try:
                    produce(topic, value, key, partition=partition, headers=headers)
                except (BufferError, KafkaException):  # the queue is full, or the metadata behind
                    self._send(producer, partition, (key, value, headers), last=False)
            return
        queued = 0
        while queued < len(rows):
            left = rows.between(queued) if queued else rows
            queued += with_fresh_metadata(producer, self.topic, partial(self._queued, producer, partition, left))
            if queued < len(rows):
                producer.poll(0.05)  # the queue is full: its delivered records leave it

    def _queued(self, producer: Producer, partition: int, rows: Rows) -> int:
        """Queue the records in one call: how many it took, fewer when the producer's queue filled up (librdkafka
        queues a run in order: after the first record it refuses, it refuses the rest)."""
        messages: list[dict[str, object]] = [
            {"key": key, "value": value} for key, value in zip(rows.keys, rows.values, strict=True)
        ]
        queued = producer.produce_batch(self.topic, messages, partition=partition)
        if queued == len(messages):
            return queued
        error = messages[queued]["_error"]
        assert isinstance(error, KafkaError)  # produce_batch marks each record it refused
        if error.code() == KafkaError._QUEUE_FULL:
            return queued
        if queued == 0:
            raise KafkaException(error)  # a transient error is tried again with fresh metadata
        raise KafkaException(  # not transient: tried again, the queued ones would be written twice
            KafkaError(KafkaError._FAIL, f"{self.topic}[{partition}]: {error.str()} after {queued} records queued")
        )

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
