"""Small Kafka client helpers (confluent-kafka) used by tests, the demo and benchmarks."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

Record = tuple[bytes | None, bytes | None]


def _config(bootstrap: str, **settings: object) -> dict[str, Any]:
    """A client's settings; librdkafka's own log says errors only (its info lines, such as the queue purged when
    a client goes, would land in the demo's terminal): failures reach the caller as exceptions."""
    return {"bootstrap.servers": bootstrap, "log_level": 3, **settings}


class ConsumedRecord(NamedTuple):
    key: bytes | None
    value: bytes | None
    partition: int
    offset: int
    timestamp_ms: int
    headers: tuple[tuple[str, str | bytes | None], ...] = ()  # as confluent_kafka gives them (it reads bytes)


def create_topic(
    bootstrap: str, name: str, partitions: int = 1, replicas: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = AdminClient(_config(bootstrap))
    futures = admin.create_topics([NewTopic(name, partitions, replicas, config=config or {})])
    for future in futures.values():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                raise


def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete topics that exist (others are ignored) and wait until they are gone."""
    admin = AdminClient(_config(bootstrap))
    existing = [n for n in names if n in admin.list_topics(timeout=10).topics]
    for future in admin.delete_topics(existing).values() if existing else []:
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while existing and time.monotonic() < deadline:
        if not set(existing) & set(admin.list_topics(timeout=10).topics):
            return
        time.sleep(0.2)


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[Record | bytes],
    *,
    timestamps_ms: Iterable[int] | None = None,
    partition: int | None = None,
) -> int:
    """Produce records (value or (key, value)) and flush; returns how many were delivered."""
    producer = Producer(
        _config(
            bootstrap, **{"linger.ms": 20, "batch.size": 1 << 20, "compression.type": "lz4", "enable.idempotence": True}
        )
    )
    errors: list[str] = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(str(err))

    stamps = iter(timestamps_ms) if timestamps_ms is not None else None
    count = 0
    for record in records:
        key, value = record if isinstance(record, tuple) else (None, record)
        extra: dict[str, Any] = {} if stamps is None else {"timestamp": next(stamps)}
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
    """Each partition's end for read_committed consumers (librdkafka's default): its last stable offset, which
    moves past a transaction's records when it commits."""
    consumer = Consumer(_config(bootstrap, **{"group.id": "sluice-offsets", "enable.auto.commit": False}))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def consume_all(
    bootstrap: str, topic: str, *, expected: int | None = None, timeout_s: float = 120.0
) -> list[ConsumedRecord]:
    """Every committed record of a topic from the beginning: up to the end offsets at call time (the last
    stable offsets: before any transaction still open), or, with `expected`, until that many records arrived
    (waiting up to timeout_s for them)."""
    # The end of a partition comes as an event: an exactly-once writer's last offset is a transaction marker,
    # which no consumer is given, so the last record's offset + 1 stays short of the end offset.
    consumer = Consumer(
        _config(
            bootstrap,
            **{
                "group.id": f"sluice-read-{time.time_ns()}",
                "enable.auto.commit": False,
                "fetch.max.bytes": 52428800,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            },
        )
    )
    out: list[ConsumedRecord] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        position = dict.fromkeys(partitions, 0)
        deadline = time.monotonic() + timeout_s

        def done() -> bool:
            if expected is not None:
                return len(out) >= expected
            return all(position[p] >= ends[p] for p in partitions)

        while not done() and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=10_000, timeout=0.5):
                error = msg.error()
                if error and error.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(error)
                partition, offset, headers = msg.partition(), msg.offset(), msg.headers()
                assert partition is not None and offset is not None  # a fetched record or end has both
                if error:  # the end of a partition
                    position[partition] = max(position[partition], offset)
                    continue
                position[partition] = offset + 1
                out.append(
                    ConsumedRecord(
                        msg.key(),
                        msg.value(),
                        partition,
                        offset,
                        msg.timestamp()[1],
                        tuple(headers.items() if isinstance(headers, dict) else headers or ()),
                    )
                )
        if expected is None and not done():
            raise TimeoutError(
                f"{topic}: not read to its end offsets {ends} within {timeout_s:.0f}s (reached {position})"
            )
    finally:
        consumer.close()
    return out
