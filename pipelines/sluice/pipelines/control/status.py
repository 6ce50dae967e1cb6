"""GET /v1/status: the driver's queries, source topics and executors as a DriverStatus."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from pyspark.sql.streaming import StreamingQuery

from sluice.api.contract import DriverStatus, QueryStatus, TopicStatus, in_app
from sluice.api.pipeline import FromKafka, ProcessingTime
from sluice.api.times import format_time

from ..metrics import QueryRecord, RunningBatches
from ..plancheck import error_summary
from .backlog import TopicPartition, source_partitions, source_topics, topic_backlogs
from .executors import Executors
from .latest import LatestOffsets

if TYPE_CHECKING:
    from ..pipeline_run import PipelineRun

log = logging.getLogger("sluice.control")


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
    return sum(
        max(sum(partitions.get(t, 0) for t in subscribed_topics(source, partitions)), source.minPartitions or 0)
        for source in sources
    )


def observe_triggers(run: PipelineRun, now: float | None = None) -> None:
    """Tell the run's busy clock which queries have a batch running now."""
    for query in list(run.queries):
        try:
            active = bool(query.isActive and query.status.get("isTriggerActive"))
        except Exception:  # a query stopping under us: its batch is not running
            active = False
        run.metrics.running.observe(query.name, active, time.time() if now is None else now)


def query_status(
    query: StreamingQuery,
    record: QueryRecord | None,
    trigger: ProcessingTime,
    running: RunningBatches,
    now: float,
    revision: str | None = None,
    path: str | None = None,
) -> QueryStatus:
    """`path`: where the query's sink is in the StreamingApp, which its error names first."""
    error = query.exception()
    progress = record.last_progress if record else {}
    duration = progress.get("batchDuration", (progress.get("durationMs") or {}).get("triggerExecution"))
    busy_ms, running_ms = running.busy_ms(query.name, record, now)
    return QueryStatus(
        name=query.name,
        id=query.id,
        runId=query.runId,
        active=query.isActive,
        error=(f"{in_app(path)}: " if path else "") + error_summary(str(error)) if error else None,
        batchId=progress.get("batchId"),
        batches=record.batches if record else 0,
        runBatches=record.run_batches if record and record.last_progress.get("runId") == query.runId else 0,
        inputRows=record.input_rows if record else 0,
        busyMs=busy_ms,
        completedBusyMs=record.busy_ms if record else 0,
        runningBatchMs=running_ms,
        revision=revision,
        inputRowsPerSecond=progress.get("inputRowsPerSecond"),
        processedRowsPerSecond=progress.get("processedRowsPerSecond"),
        lastBatchDurationMs=int(duration) if duration is not None else None,
        triggerIntervalMs=trigger.interval_ms,
        stateful=bool(progress.get("stateOperators")),
        stateRows=sum(op.get("numRowsTotal", 0) for op in progress["stateOperators"])
        if progress.get("stateOperators")
        else None,
        watermark=(progress.get("eventTime") or {}).get("watermark"),
        topics=source_topics(progress),
    )


def partitions_by_bootstrap(
    partitions: Iterable[TopicPartition], sources: Iterable[FromKafka], default_bootstrap: str
) -> dict[str, list[TopicPartition]]:
    """The partitions grouped by the Kafka cluster holding them: a source's own bootstrapServers, else the app's."""
    partitions = sorted(partitions)
    topics = {topic for topic, _ in partitions}
    cluster = {
        topic: source.bootstrapServers
        for source in sources
        if source.bootstrapServers
        for topic in subscribed_topics(source, topics)
    }
    grouped: dict[str, list[TopicPartition]] = {}
    for partition in partitions:
        grouped.setdefault(cluster.get(partition[0], default_bootstrap), []).append(partition)
    return grouped


def topics_now(run: PipelineRun, latest: LatestOffsets | None) -> tuple[list[TopicStatus], bool, str | None]:
    """Each source topic's backlog now: with `latest`, against Kafka's end offsets now (else, or when Kafka does
    not answer, the queries' last progress); whether Kafka answered, and why not. The status and the backlog
    series both read it (the last progress alone says ~0 when each batch reads up to the latest offsets)."""
    progresses = [record.last_progress for record in run.metrics.queries().values()]
    kafka_sources = [node.fromKafka for node in run.spec.nodes if node.fromKafka is not None]
    offsets, latest_error = None, None
    if latest is not None:
        try:
            offsets = latest.get(
                partitions_by_bootstrap(source_partitions(progresses), kafka_sources, run.config.kafkaBootstrap)
            )
        except Exception as exc:  # the status must answer whatever Kafka does
            latest_error = str(exc) or type(exc).__name__
            log.warning("status: Kafka end offsets unavailable, backlog from the last progress: %s", latest_error)
    return topic_backlogs(progresses, offsets), offsets is not None, latest_error


def driver_status(run: PipelineRun, executors: Executors, latest: LatestOffsets | None = None) -> DriverStatus:
    """The status now. With `latest`, the topics' latest offsets are Kafka's end offsets now (falling back to
    the queries' last progress, said in latestOffsetsFrom/latestOffsetsError, when Kafka does not answer)."""
    observe_triggers(run)
    now = time.time()
    records = run.metrics.queries()
    kafka_sources = [node.fromKafka for node in run.spec.nodes if node.fromKafka is not None]
    topics, from_kafka, latest_error = topics_now(run, latest)
    run.metrics.record_backlogs(topics)
    live = executors.live()
    return DriverStatus(
        app=run.config.app,
        revision=run.config.revision,
        state=run.state,
        observedAt=format_time(now),
        queries=[
            query_status(
                q,
                records.get(q.name),
                run.spec.trigger,
                run.metrics.running,
                now,
                run.query_revisions.get(q.name),
                run.query_path(q.name),
            )
            for q in list(run.queries)
        ],
        topics=topics,
        backlog=sum(t.backlog for t in topics),
        latestOffsetsFrom="kafka" if from_kafka else "progress",
        latestOffsetsError=latest_error,
        executors=live,
        executorTarget=executors.target,
        taskSlots=executors.task_slots(live),
        sourceTasks=source_tasks(kafka_sources, {t.topic: t.partitions for t in topics}),
        shufflePartitions=int(run.spark.conf.get("spark.sql.shuffle.partitions") or 0),
    )
