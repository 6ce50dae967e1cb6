"""Kafka as the tests see it: what a sink committed (as a read_committed consumer reads it), and where the
Java client's default partitioner puts a key.

Exactly-once sinks write in transactions, whose commit markers take offsets: the last record of a partition
sits before its end offset, so a reader cannot wait for a record at end-1. read_committed reads until
librdkafka reports the end of every partition (the last stable offset under read_committed).
"""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from sluice.pipelines.local.kafka_io import ConsumedRecord


def read_committed(
    bootstrap: str, topic: str, timeout_s: float = 120.0, isolation: str = "read_committed"
) -> list[ConsumedRecord]:
    """Every record of the topic from the beginning up to its end when called."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sluice-read-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "fetch.max.bytes": 52428800,
        }
    )
    out: list[ConsumedRecord] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {topic}: partitions {sorted(set(partitions) - at_end)} not read to "
                    f"their end within {timeout_s:.0f}s"
                )
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(message.error())
                at_end.add(message.partition())
                continue
            out.append(
                ConsumedRecord(
                    message.key(),
                    message.value(),
                    message.partition(),
                    message.offset(),
                    message.timestamp()[1],
                    tuple(message.headers() or ()),
                )
            )
    finally:
        consumer.close()
    return out
