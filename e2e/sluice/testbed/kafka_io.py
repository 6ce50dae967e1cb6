"""Small Kafka client helpers (confluent-kafka) used by tests, the demo and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import NamedTuple

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

Record = tuple[bytes | None, bytes | None]


class ConsumedRecord(NamedTuple):
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp_ms: int


def create_topic(bootstrap: str, name: str, partitions: int = 1, replicas: int = 1,
                 config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, replicas, config=config or {})])
    for future in futures.values():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise


def produce(bootstrap: str, topic: str, records: Iterable[Record | bytes], *,
            timestamps_ms: Iterable[int] | None = None, partition: int | None = None) -> int:
    """Produce records (value or (key, value)) and flush; returns how many were delivered."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "compression.type": "lz4", "enable.idempotence": True})
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    stamps = iter(timestamps_ms) if timestamps_ms is not None else None
    count = 0
    for record in records:
        key, value = record if isinstance(record, tuple) else (None, record)
        extra = {} if stamps is None else {"timestamp": next(stamps)}
        if partition is not None:
            extra["partition"] = partition
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=on_delivery, **extra)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    if remaining or errors:
        raise RuntimeError(f"{remaining} records not delivered to {topic}; errors: {errors[:3]}")
    return count


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sluice-offsets",
                         "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in partitions}
    finally:
        consumer.close()


def consume_all(bootstrap: str, topic: str, *, expected: int | None = None, idle_s: float = 5.0,
                timeout_s: float = 120.0) -> list[ConsumedRecord]:
    """Read a topic from the beginning until `expected` records arrived or it stays idle for idle_s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sluice-read-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "fetch.max.bytes": 52428800})
    consumer.subscribe([topic])
    out: list[ConsumedRecord] = []
    deadline = time.monotonic() + timeout_s
    last_data = time.monotonic()
    try:
        while time.monotonic() < deadline:
            if expected is not None and len(out) >= expected:
                break
            if expected is None and time.monotonic() - last_data > idle_s:
                break
            batch = consumer.consume(num_messages=10_000, timeout=0.5)
            for msg in batch:
                if msg.error():
                    raise KafkaException(msg.error())
                out.append(ConsumedRecord(msg.key(), msg.value(), msg.partition(), msg.offset(),
                                          msg.timestamp()[1]))
            if batch:
                last_data = time.monotonic()
    finally:
        consumer.close()
    return out
