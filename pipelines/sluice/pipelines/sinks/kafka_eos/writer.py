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
    MAX_FENCED,
    MAX_KEPT_PRODUCERS,
    QUIET,
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
        started = fresh
        for _ in range(MAX_FENCED):
            if owner.committed is not None and owner.committed.covers(self.marker):
                return iter([PartitionResult(partition, 0, skipped=True, new_producer=started)])
            if self._began(owner, partition, head, probe=not fresh):
                break
            owner, fresh = self._owner(partition, replace=True)  # fenced: a newer producer took the id
            started = True
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
        return iter([PartitionResult(partition, written, skipped=False, new_producer=started)])

    def write_again_on_failure(self, partition: int, batches: list[pa.RecordBatch]) -> list[PartitionResult]:
        """`write`, tried again after a Kafka error as Spark tries a failed task again (in the driver nothing
        else would): the new attempt's producer fences the failed one and reads what it committed."""
        name = f"{self.topic}[{partition}], batch {self.batch_id}"
        return tried_again(DRIVER_WRITE_ATTEMPTS, lambda: list(self.write(partition, batches)), name)

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
