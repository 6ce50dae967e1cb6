"""Task slots for real-time mode (trigger.realTime), checked before any query starts.

In real-time mode each query runs one task per Kafka partition it reads, all at once, each for the whole
checkpoint interval. Spark does not refuse a query with fewer task slots than that: the tasks of the other
partitions wait for a slot, i.e. for the end of an interval, and their records with them. sluice refuses it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping

from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from sluice.api.kafka_clients import KafkaClient, client_at
from sluice.api.pipeline import PipelineSpec
from sluice.api.validation import Problem, join_path

log = logging.getLogger(__name__)

TopicPartitions = Callable[[KafkaClient], Mapping[str, int]]  # a cluster -> partitions by topic


def kafka_topic_partitions(kafka: KafkaClient, timeout: float = 10.0) -> dict[str, int]:
    metadata = AdminClient({**kafka.librdkafka(), "client.id": "sluice-realtime"}).list_topics(timeout=timeout)
    return {name: len(topic.partitions) for name, topic in metadata.topics.items() if topic.error is None}


def task_slots(spark: SparkSession) -> int:
    """Tasks that can run at once: local mode's cores, or the executors the app is given (they may not have
    registered yet when the queries start), over spark.task.cpus."""
    context = spark.sparkContext
    conf = context.getConf()
    per_task = max(int(conf.get("spark.task.cpus", "1") or 1), 1)
    if (context.master or "").startswith("local"):
        return context.defaultParallelism // per_task
    executors = int(conf.get("spark.executor.instances", "2") or 2)
    return executors * int(conf.get("spark.executor.cores", "1") or 1) // per_task


def query_sources(spec: PipelineSpec) -> dict[str, list[int]]:
    """Per sink node (one query each), the indices of the source nodes it reads."""
    index = {node.name: i for i, node in enumerate(spec.nodes)}

    def sources(name: str, seen: set[str]) -> set[int]:
        if name in seen or name not in index:
            return set()
        seen.add(name)
        node = spec.nodes[index[name]]
        if node.kind == "source":
            return {index[name]}
        return set().union(*(sources(upstream, seen) for upstream in node.inputs or []))

    return {node.name: sorted(sources(node.name, set())) for node in spec.nodes if node.kind == "sink"}


def slot_problems(
    spec: PipelineSpec, prefix: str, slots: int, partitions_of: Callable[[int], int | None]
) -> list[Problem]:
    """One problem when the queries read more Kafka partitions (each query its own) than Spark has task slots.
    `partitions_of(source index)`: the partitions that source reads (None: unknown, not counted)."""
    if not spec.trigger.realTime:
        return []
    queries = query_sources(spec).values()
    per_source = {i: partitions_of(i) for sources in queries for i in sources}
    needed = sum(per_source[i] or 0 for sources in queries for i in sources)
    if needed <= slots:
        return []
    reads = ", ".join(
        f"{spec.nodes[i].name} ({join_path(prefix, 'nodes', i)}): {n}" for i, n in per_source.items() if n
    )
    return [
        Problem(
            join_path(prefix, "trigger", "realTime"),
            f"real-time mode runs a task per Kafka partition read, each query its own, all at once for the whole "
            f"checkpoint interval: {needed} tasks (partitions by source: {reads}), but Spark has {slots} task "
            "slots; the tasks without a slot would wait an interval. Give the app more executor cores (or fewer "
            "partitions, or fewer sinks)",
        )
    ]


def real_time_slot_problems(
    spark: SparkSession,
    spec: PipelineSpec,
    prefix: str,
    kafka: KafkaClient | None,
    topic_partitions: TopicPartitions = kafka_topic_partitions,
) -> list[Problem]:
    """slot_problems with the partitions asked of Kafka (a source Kafka does not answer for is not counted)."""
    if not spec.trigger.realTime:
        return []
    listed: dict[str, Mapping[str, int]] = {}

    def partitions_of(i: int) -> int | None:
        src = spec.nodes[i].fromKafka
        assert src is not None
        client = client_at(kafka, src.bootstrapServers)
        servers = client.bootstrap
        if not servers:
            return None
        if servers not in listed:
            try:
                listed[servers] = topic_partitions(client)
            except Exception as exc:  # the query reports an unreachable Kafka itself
                log.warning("real-time mode: cannot list the topics of %s to count task slots: %s", servers, exc)
                listed[servers] = {}
        topics = listed[servers]
        if src.topic is not None:
            names = [t.strip() for t in src.topic.split(",")]
        else:
            names = [t for t in topics if re.fullmatch(src.pattern or "", t)]
        return sum(topics.get(name, 0) for name in names) or None

    return slot_problems(spec, prefix, task_slots(spark), partitions_of)
