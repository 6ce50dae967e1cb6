"""The exactly-once Kafka sink's constants and record types."""

from __future__ import annotations

import logging
from typing import TypeVar

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
# writers auto, rows that are not an aggregation's groups: the driver writes a batch after one of at most this many
# records (the filter + projection at 50k records/s: 0.35 s a batch, against 1.8 s from the executors)
SMALL_BATCH_RECORDS = 100_000
DRIVER_WRITE_ATTEMPTS = 4  # per partition and batch, as spark.task.maxFailures for a task
# Records converted from Arrow and handed to the producer at once: at most this many wait in memory twice.
ENQUEUED_AT_ONCE = 10_000
MAX_FENCED = 5  # new producers in a row fenced by another one before a task gives up

Header = tuple[str, str | bytes | None]  # as confluent_kafka takes and gives them (it reads bytes)
KafkaRecord = tuple[str | bytes | None, str | bytes | None, list[Header] | None]  # key, value, headers
