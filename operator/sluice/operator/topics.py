"""Kafka topics of an app managed through the Kafka Admin API (external clusters).

`plan_topics` decides (pure); `AdminTopics` carries the plan out with confluent-kafka. Topics only grow:
a request for fewer partitions is refused with a message, never applied.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sluice.api.kafka_clients import KafkaClient

from .model import TopicSpec

# librdkafka errors that are the login's, not the network's: the spec field whose setting Kafka refused.
LOGIN_ERRORS = {"_AUTHENTICATION": "spec.kafka.authentication", "_SSL": "spec.kafka.tls"}


class KafkaLoginRefused(RuntimeError):
    """Kafka refused the operator's login with the app's credentials (its message names the spec field)."""


@dataclass(frozen=True)
class ExistingTopic:
    partitions: int
    config: dict[str, str]


@dataclass
class TopicPlan:
    create: list[TopicSpec] = field(default_factory=list)
    grow: dict[str, int] = field(default_factory=dict)  # topic -> new partition count
    configure: dict[str, dict[str, str]] = field(default_factory=dict)  # topic -> changed settings
    refused: dict[str, str] = field(default_factory=dict)  # topic -> why

    @property
    def changes(self) -> bool:
        return bool(self.create or self.grow or self.configure)


def plan_topics(desired: list[TopicSpec], existing: dict[str, ExistingTopic]) -> TopicPlan:
    plan = TopicPlan()
    for topic in desired:
        current = existing.get(topic.name)
        if current is None:
            plan.create.append(topic)
            continue
        if topic.partitions > current.partitions:
            plan.grow[topic.name] = topic.partitions
        elif topic.partitions < current.partitions:
            plan.refused[topic.name] = (
                f"topic {topic.name} has {current.partitions} partitions; shrinking to "
                f"{topic.partitions} is not possible in Kafka (it would reorder keys)"
            )
        changed = {k: v for k, v in topic.config.items() if current.config.get(k) != v}
        if changed:
            plan.configure[topic.name] = changed
    return plan


class AdminTopics:
    """Reads and changes topics of one Kafka cluster through the Admin API."""

    def __init__(self, client: KafkaClient, timeout: float = 30.0) -> None:
        from confluent_kafka.admin import AdminClient

        self.bootstrap = client.bootstrap
        self.refused: str | None = None  # the login's error librdkafka reported, if any
        settings: dict[str, Any] = {**client.librdkafka(), "log_level": 3, "error_cb": self._on_error}
        self.admin = AdminClient(settings)
        self.timeout = timeout

    def _on_error(self, error: Any) -> None:
        field = LOGIN_ERRORS.get(error.name())
        if field and self.refused is None:
            self.refused = f"{field}: Kafka at {self.bootstrap} refused the login: {error.str()}"

    def existing(self, names: list[str]) -> dict[str, ExistingTopic]:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import ConfigResource, ResourceType

        try:
            metadata = self.admin.list_topics(timeout=self.timeout).topics
        except KafkaException:
            self.admin.poll(1)  # serves error_cb, where librdkafka tells why it could not connect
            if self.refused:
                raise KafkaLoginRefused(self.refused) from None
            raise
        present = [n for n in names if n in metadata and metadata[n].error is None]
        if not present:
            return {}
        resources = [ConfigResource(ResourceType.TOPIC, n) for n in present]
        configs = {}
        for resource, future in self.admin.describe_configs(resources).items():
            entries = future.result(timeout=self.timeout)
            configs[resource.name] = {k: e.value for k, e in entries.items() if e.value is not None}
        return {n: ExistingTopic(len(metadata[n].partitions), configs.get(n, {})) for n in present}

    def apply(self, plan: TopicPlan) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import (
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            NewPartitions,
            NewTopic,
            ResourceType,
        )

        futures: list[Future[Any]] = []
        if plan.create:
            new = [NewTopic(t.name, t.partitions, t.replicas or -1, config=dict(t.config)) for t in plan.create]
            futures += self.admin.create_topics(new).values()
        if plan.grow:
            futures += self.admin.create_partitions([NewPartitions(n, c) for n, c in plan.grow.items()]).values()
        if plan.configure:
            resources = [
                ConfigResource(
                    ResourceType.TOPIC,
                    name,
                    incremental_configs=[
                        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in changes.items()
                    ],
                )
                for name, changes in plan.configure.items()
            ]
            futures += self.admin.incremental_alter_configs(resources).values()
        for future in futures:
            try:
                future.result(timeout=self.timeout)
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise

    def delete(self, names: list[str]) -> None:
        present = list(self.existing(names))
        for future in self.admin.delete_topics(present).values() if present else []:
            future.result(timeout=self.timeout)
