"""toKafka with delivery exactlyOnce: every micro-batch's records are committed to Kafka once, however often
a crash, a restart or a retried task makes Spark run the batch again.

How (per micro-batch B, in foreachBatch):
- The driver reads the topic's partition count N once. N is pinned per batch in the checkpoint folder
  (`sluice/kafka-partitions/<batch>`, with the ledger below) when it changes, and the first batch of a run (the
  only one that can be a replay) uses the pinned N and ledger: a replayed batch sends every record where its
  first attempt did, and checks the ledger its first attempt wrote.
- Each record goes to partition murmur2(key) mod N, the Java client's default partitioner, so keys land
  where Spark's own Kafka sink (atLeastOnce) and Java producers put them; a record without a key is
  placed by its value (a topic of one partition: partition 0, no hash). The executors compute the partition
  in Spark SQL, in the streaming plan; the driver in Python.
- A share of the batch is written in one transaction by a transactional producer with a stable id.
  Initialising it fences every older producer with that id (a task of a dead driver, a retried task's earlier
  attempt) and aborts or completes their open transaction. The new producer then reads the share's last
  commit (below); if B is there, the share is skipped, otherwise written. The last record of every
  transaction carries a `sluice.commit` header: the sink, the query id of the checkpoint (batch ids count
  within one checkpoint) and the batch id.
- Two ledgers, one per way of writing (`writers`):
  - task (the executors): Spark task t of the batch's last stage writes its own records, to whichever
    partitions they go, with the id `sluice/<app>/<sink>/task/<t>`: no shuffle, the stage that reads (or
    aggregates) the records writes them. The transaction also commits the marker as the offset metadata of
    the consumer group of the same name (partition 0 of the topic: Kafka's own transactional offset commit),
    which the new producer reads back stable. A replayed batch gives task t the same records: the same
    input offsets, and after a shuffle Spark's hash of the same keys.
  - partition (the driver): the driver collects the batch, places its records itself and writes each
    partition's records in a transaction of its own (`sluice/<app>/<sink>/<p>`, the partitions side by side;
    its producers live as long as the query); the marker is the last record's header in the partition, read
    back from the end. A batch too large for the driver, or the first batch after an upgrade from a sluice
    whose executors wrote this way, is shuffled so that Spark task p holds exactly partition p's records.
Spark replays a batch with the offsets recorded for it and the state of the batch before, so a replayed
batch holds the same records; non-deterministic pipelines (rand(), now()) are outside this promise.

By default (`writers: auto`) the driver writes when the rows are an aggregation's groups (a batch holds only
the groups it changed or closed), the executors otherwise.

Producers are kept in the Python worker (or the driver) between batches, with the share's last commit: what
they read when they took the id, then their own commits. That stays true until another producer takes the id
(a task of the same index on another worker, a zombie): so a kept producer first sends one record and
flushes, which fails if it was fenced meanwhile; then it is replaced by a new one, which reads the ledger.

The package, one module a part: settings (constants), partitioner (where each record goes: Spark SQL and
Python), driver (ExactlyOnceKafkaSink: the batch, its placement, who writes, the pin), writer (one share's transaction,
BatchWrite, its producers kept between batches), transactions (retries, metadata, the last commit marker in a
partition or a ledger).
"""

from .driver import ExactlyOnceKafkaSink
from .partitioner import (
    PARTITION_COLUMN,
    UNROLLED_BLOCKS,
    kafka_partition,
    murmur2,
    routes,
    spark_hash_int,
    with_kafka_partition,
    with_kafka_partition_in_driver,
    with_kafka_partition_in_stream,
)
from .settings import COMMIT_HEADER
from .transactions import Marker
from .writer import BatchWrite, release_kept_clients

__all__ = [
    "COMMIT_HEADER",
    "PARTITION_COLUMN",
    "UNROLLED_BLOCKS",
    "BatchWrite",
    "ExactlyOnceKafkaSink",
    "Marker",
    "kafka_partition",
    "murmur2",
    "release_kept_clients",
    "routes",
    "spark_hash_int",
    "with_kafka_partition",
    "with_kafka_partition_in_driver",
    "with_kafka_partition_in_stream",
]
