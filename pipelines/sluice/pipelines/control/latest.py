"""The source topics' end offsets now, asked of Kafka when the control API answers /v1/status.

A query's last progress only tells the latest offsets it saw when its last batch began: while a long batch
runs, what arrives meanwhile shows nowhere. So the driver asks Kafka (read_committed: the last stable offset)
with a short timeout, and keeps the answer for a second so frequent callers do not hammer the brokers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from sluice.api.kafka_clients import KafkaClient

from .backlog import TopicPartition as Partition

AdminFactory = Callable[[KafkaClient], AdminClient]


class LatestOffsetsUnavailable(Exception):
    """Kafka did not tell the end offsets in time."""


def admin_client(kafka: KafkaClient) -> AdminClient:
    return AdminClient({**kafka.librdkafka(), "client.id": "sluice-control"})


class LatestOffsets:
    """End offsets by bootstrap servers and partition, cached for `ttl` seconds. `kafka`: the app's login, used
    at every bootstrap asked."""

    def __init__(
        self,
        kafka: KafkaClient | None = None,
        timeout: float = 1.5,
        ttl: float = 1.0,
        admin: AdminFactory = admin_client,
    ) -> None:
        self.kafka = kafka or KafkaClient("")
        self.timeout = timeout
        self.ttl = ttl
        self._admin = admin
        self._clients: dict[str, AdminClient] = {}
        self._cached: tuple[float, frozenset[tuple[str, Partition]], dict[Partition, int]] | None = None
        self._lock = threading.Lock()

    def get(self, partitions: Mapping[str, Iterable[Partition]]) -> dict[Partition, int]:
        """The end offset of each partition (grouped by the bootstrap servers that hold them); raises
        LatestOffsetsUnavailable when any of them cannot be had within the timeout."""
        wanted = frozenset((bootstrap, p) for bootstrap, ps in partitions.items() for p in ps)
        with self._lock:  # one request at a time: concurrent callers share its answer
            now = time.monotonic()
            if self._cached is not None and self._cached[1] == wanted and now - self._cached[0] < self.ttl:
                return dict(self._cached[2])
            offsets: dict[Partition, int] = {}
            for bootstrap, ps in partitions.items():
                offsets |= self._ask(bootstrap, ps)
            self._cached = (now, wanted, offsets)
            return dict(offsets)

    def close(self) -> None:
        with self._lock:
            self._clients.clear()  # a client closes when the last reference goes

    def _ask(self, bootstrap: str, partitions: Iterable[Partition]) -> dict[Partition, int]:
        request = {TopicPartition(topic, partition): OffsetSpec.latest() for topic, partition in partitions}
        if not request:
            return {}
        client = self._clients.get(bootstrap) or self._clients.setdefault(
            bootstrap, self._admin(self.kafka.at(bootstrap))
        )
        deadline = time.monotonic() + self.timeout
        try:
            futures = client.list_offsets(
                request, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=self.timeout
            )
            return {
                (tp.topic, tp.partition): future.result(timeout=max(0.0, deadline - time.monotonic())).offset
                for tp, future in futures.items()
            }
        except Exception as exc:  # whatever the client raises, the caller falls back to progress
            raise LatestOffsetsUnavailable(f"Kafka {bootstrap}: {exc or type(exc).__name__}") from exc
