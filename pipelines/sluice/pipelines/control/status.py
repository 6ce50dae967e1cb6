"""GET /v1/status: the driver's queries, source topics and executors as a DriverStatus."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StreamingQuery

from ..contract import DriverStatus, QueryStatus
from ..metrics import QueryRecord
from ..spec import FromKafka, ProcessingTime, duration_ms
from .backlog import source_topics, topic_backlogs
from .executors import Executors

if TYPE_CHECKING:
    from ..runtime import PipelineRun


def trigger_interval_ms(trigger: ProcessingTime) -> int | None:
    """The processing-time interval, or real-time mode's batch length; None for availableNow."""
    interval = trigger.processingTime or trigger.realTime
    return duration_ms(interval) if interval else None


def subscribed_topics(source: FromKafka, known_topics: Iterable[str]) -> list[str]:
    if source.topic:
        return [t.strip() for t in source.topic.split(",") if t.strip()]
    try:
        pattern = re.compile(source.pattern or "")
    except re.error:
        return []  # a Java-only regex: its topics are unknown here
    return [t for t in known_topics if pattern.fullmatch(t)]


def source_tasks(sources: Iterable[FromKafka], partitions: Mapping[str, int]) -> int:
    """Tasks a batch's Kafka reads split into: per source, its topics' partitions or minPartitions if more."""
    return sum(max(sum(partitions.get(t, 0) for t in subscribed_topics(source, partitions)),
                   source.minPartitions or 0)
               for source in sources)


def query_status(query: StreamingQuery, record: QueryRecord | None, trigger: ProcessingTime,
                 revision: str | None = None) -> QueryStatus:
    error = query.exception()
    progress = record.last_progress if record else {}
    duration = progress.get("batchDuration", (progress.get("durationMs") or {}).get("triggerExecution"))
    return QueryStatus(
        name=query.name, id=query.id, runId=query.runId, active=query.isActive,
        error=str(error).split("\n")[0] if error else None, batchId=progress.get("batchId"),
        batches=record.batches if record else 0, inputRows=record.input_rows if record else 0,
        busyMs=record.busy_ms if record else 0, revision=revision,
        inputRowsPerSecond=progress.get("inputRowsPerSecond"),
        processedRowsPerSecond=progress.get("processedRowsPerSecond"),
        lastBatchDurationMs=int(duration) if duration is not None else None,
        triggerIntervalMs=trigger_interval_ms(trigger), stateful=bool(progress.get("stateOperators")),
        topics=source_topics(progress))


def driver_status(run: PipelineRun, executors: Executors) -> DriverStatus:
    records = run.metrics.queries()
    topics = topic_backlogs(record.last_progress for record in records.values())
    live = executors.live()
    kafka_sources = [node.fromKafka for node in run.spec.nodes if node.fromKafka is not None]
    return DriverStatus(
        app=run.config.app, revision=run.config.revision,
        observedAt=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        queries=[query_status(q, records.get(q.name), run.spec.trigger, run.query_revisions.get(q.name))
                 for q in list(run.queries)],
        topics=topics, backlog=sum(t.backlog for t in topics), executors=live, executorTarget=executors.target,
        taskSlots=executors.task_slots(live),
        sourceTasks=source_tasks(kafka_sources, {t.topic: t.partitions for t in topics}),
        shufflePartitions=int(run.spark.conf.get("spark.sql.shuffle.partitions") or 0))
