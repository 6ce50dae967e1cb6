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
batch holds only the groups it changed or closed), the driver collects the batch, places its records itself (with
numpy, not in Spark SQL) and writes each partition's transaction, the partitions side by side; its producers
live as long as the query. Other rows: the driver writes a batch after one of at most SMALL_BATCH_RECORDS
records; Spark task p writes partition p, as above, after a larger one and in the first batch of a run. Both
use the same ids, markers and fencing.

Producers are kept in the Python worker (or the driver) between batches, with the partition's last commit:
what they read when they took the partition, then their own commits. That stays true until another producer takes the id
(a task of the same partition on another worker, a zombie): so a kept producer first sends one record and
flushes, which fails if it was fenced meanwhile; then it is replaced by a new one, which reads the log.

The package, one module a part: settings (constants), partitioner (where each record goes: Spark SQL and
Python), driver (ExactlyOnceKafkaSink: the batch, its placement, who writes), writer (one partition's
transaction, BatchWrite, its producers kept between batches), transactions (retries, metadata, the last
commit marker).
"""

from .driver import ExactlyOnceKafkaSink
from .partitioner import (
    PARTITION_COLUMN,
    UNROLLED_BLOCKS,
    kafka_partition,
    kafka_partitions,
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
    "kafka_partitions",
    "murmur2",
    "release_kept_clients",
    "routes",
    "spark_hash_int",
    "with_kafka_partition",
    "with_kafka_partition_in_driver",
    "with_kafka_partition_in_stream",
]
