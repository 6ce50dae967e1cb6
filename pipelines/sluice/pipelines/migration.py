"""Checkpoint migration inside the running driver: a query whose state Spark cannot carry to a new plan (a
changed window, grouping key, source) moves to a checkpoint of its own, and its output goes on exactly once.

The old query stops at a batch boundary. Its last completed batch says two things (its offset log and commit
log): the watermark it ran with and the end offsets it read up to. The cut is that watermark down to the end of
the last window the old query closed there (its windows end on a grid it wrote beside its checkpoint,
`OutputGrid`): every window that closed at or before the cut is in the sink, and none that ends after it (a
new window shorter than the old one may end between the two: it is the new query's). The new query starts on
an empty checkpoint from those offsets rewound from the cut by
`rewindMs` of Kafka record time (watermark delay + the longest window or join span: enough to rebuild the
windows still open at the cut), never past them nor before where the pipeline began reading, and an output
gate leaves out its rows final before the cut (windows that closed at or before it: the old query wrote their
results). So windows closed before the cut
come from the old pipeline, later ones from the new, each once. A new tumbling window straddling the cut (off
its grid: 5 s -> 10 s windows cut at :45) would count again the records the old query counted before it: a
query of tumbling windows leaves out the records before the cut (Handover.countedBeforeMs), so that window
counts its records from the cut on. The exactly-once sink keeps that true across
crashes: its commit markers carry the checkpoint's query id, and its transactional ids fence the old query.

What was decided is written beside the new checkpoint (`Handover`) before the query starts, so a driver that
restarts mid-migration starts the query the same way. A rollback moves the query back the same way: onto the
checkpoint it left (its state and offsets intact) with the gate at the new query's cut.

An idle input needs nothing of its own: a partition with no record at or after the rewind's time (none ever,
none that recent, all deleted by retention) starts where the old query read up to, and a query that never saw a
record (watermark 0, cut 0) rewinds to time 0: everything it read, from where it began.

Rewinding by record time assumes a record's Kafka timestamp is not earlier than its event time less the
watermark delay (producer or broker time, as usual).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping

from pyspark.sql import SparkSession

from sluice.api.contract import Migration, RunnerConfig
from sluice.api.kafka_clients import KafkaClient
from sluice.api.pipeline import FromKafka

from .checkpoints import Handover, OffsetLog, OutputGrid, committed_batch, source_starts
from .compiler import QueryPlan

log = logging.getLogger("sluice.runtime")
TopicPartition = tuple[str, int]
ANSWER_TIMEOUT_S = 60  # Kafka's listOffsets, as the consumer's offsetsForTimes was given


def reads(source: FromKafka, topic: str) -> bool:
    return source.topic == topic if source.topic else bool(re.fullmatch(source.pattern or "", topic))


def starting_offsets(
    ends: Mapping[TopicPartition, int],
    found: Mapping[TopicPartition, int | None],
    sources: Mapping[str, FromKafka],
    starts: Mapping[TopicPartition, int] | None = None,
) -> dict[str, str]:
    """Per source node that read any of `ends`' partitions, Spark's startingOffsets JSON: each partition at the
    offset `found` for the rewind's time (None: no record that late, so the end), never past the end the old
    query read up to (records after it nobody has read yet, whatever their time), nor before where the
    pipeline began reading it (`starts`: records it never read, such as those before a start at latest)."""
    out: dict[str, str] = {}
    for name, source in sources.items():
        offsets: dict[str, dict[str, int]] = {}
        for (topic, partition), end in sorted(ends.items()):
            if reads(source, topic):
                at = found.get((topic, partition))
                start = end if at is None else min(at, end)
                floor = (starts or {}).get((topic, partition))
                offsets.setdefault(topic, {})[str(partition)] = start if floor is None else min(max(start, floor), end)
        if offsets:
            out[name] = json.dumps(offsets, sort_keys=True)
    return out


def described(partitions: list[TopicPartition]) -> str:
    """`topic t partitions 0, 1; topic u partition 3`."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        by_topic.setdefault(topic, []).append(partition)
    return "; ".join(
        f"topic {topic} partition{'s' if len(ps) > 1 else ''} {', '.join(map(str, ps))}"
        for topic, ps in by_topic.items()
    )


def gate_cut(source_cut: int | None, *given: Handover | None, counted: bool = False) -> int | None:
    """The output gate: the latest of the source query's cut and those of the handovers `given` (the target's
    before, the source's own: windows closed before any of them were written by another query). `counted`:
    the same for the records counted before the cut (Handover.countedBeforeMs)."""
    before = [(h.countedBeforeMs if counted else h.cutMs) for h in given if h is not None]
    cuts = [c for c in (source_cut, *before) if c is not None]
    return max(cuts) if cuts else None


class HandoverFailed(RuntimeError):
    """Where a migrating query starts could not be decided (Kafka did not answer): nothing was started."""


def offsets_for_times(
    spark: SparkSession, source: FromKafka, kafka: KafkaClient, partitions: list[TopicPartition], at_ms: int
) -> dict[TopicPartition, int | None]:
    """Per partition, the earliest offset whose record time is at or after `at_ms`; None where no record is that
    late (an empty partition, one whose records are all earlier or deleted by retention). Asked as Spark's
    source asks (its default offset reader): through the JVM Kafka Admin client's listOffsets, with the source's
    `kafka.` options. The time goes as OffsetSpec.forTimestamp's primitive long: py4j passes a Python int that
    fits 32 bits as a java.lang.Integer (and turns a Long Java hands back into a Python int), so a map of
    times such as KafkaConsumer.offsetsForTimes takes held an Integer for time 0 (the rewind of a query that
    never saw a record) and the consumer failed casting it to Long."""
    jvm = spark._jvm
    assert jvm is not None
    props = jvm.java.util.Properties()
    for key, value in source.options.items():
        if key.startswith("kafka."):
            props.put(key.removeprefix("kafka."), value)
    for key, value in kafka.at(source.bootstrapServers).java().items():
        props.put(key, value)
    admin = jvm.org.apache.kafka.clients.admin.AdminClient.create(props)
    try:
        spec = jvm.org.apache.kafka.clients.admin.OffsetSpec.forTimestamp(at_ms)
        query = jvm.java.util.HashMap()
        parts = {tp: jvm.org.apache.kafka.common.TopicPartition(tp[0], tp[1]) for tp in partitions}
        for part in parts.values():
            query.put(part, spec)
        answer = admin.listOffsets(query).all().get(ANSWER_TIMEOUT_S, jvm.java.util.concurrent.TimeUnit.SECONDS)
        found: dict[TopicPartition, int | None] = {}
        for tp, part in parts.items():
            offset = int(answer.get(part).offset())
            found[tp] = offset if offset >= 0 else None  # -1: no record that late
        return found
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(10))


def java_cause(exc: BaseException) -> str:
    """What a JVM failure py4j wraps comes down to: its innermost cause's class and message (py4j's own
    message only names the call's object id, as in `o2909.offsetsForTimes`)."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    seen = 0
    while java.getCause() is not None and seen < 20:
        java, seen = java.getCause(), seen + 1
    message = java.getMessage()
    first = next((line.strip() for line in str(message or "").splitlines() if line.strip()), "")
    name = str(java.getClass().getName())
    return f"{name}: {first}" if first else name


def _source_that_wrote(spark: SparkSession, source: str, fallback: str | None, query: str) -> tuple[str, int | None]:
    """`source`, or `fallback` when there is one and `source` holds no completed batch (it wrote nothing), with
    the chosen one's last completed batch."""
    last = committed_batch(spark, source)
    if fallback is None or last is not None:
        return source, last
    log.info("query %s: %s has no completed batch (it wrote nothing): taking over from %s", query, source, fallback)
    return fallback, committed_batch(spark, fallback)


def hand_over(
    spark: SparkSession,
    *,
    source_checkpoint: str,
    target_checkpoint: str,
    rewind_ms: int | None,
    sources: Mapping[str, FromKafka],
    kafka: KafkaClient,
    query: str,
    fallback_checkpoint: str | None = None,
) -> Handover:
    """Decide how the query on `target_checkpoint` takes over the output of the one on `source_checkpoint`
    (stopped), and write it beside the target. A target with batches of its own (a rollback onto the
    checkpoint a query left) goes on from its offsets; an empty one starts from the source's, rewound by
    `rewind_ms` (None: from the sources' startingOffsets). An idle input is no special case: a partition
    without a record at or after the rewind's time (none ever, none that recent, all deleted) starts where the
    old query read up to. A source with no completed batch wrote nothing: `fallback_checkpoint`, the one it
    took over from, is the source then (a rollback of a migration whose new query never completed a batch).
    HandoverFailed, naming `query`, the source and its topics, when Kafka does not say where the rewind's time
    is."""
    source_checkpoint, last = _source_that_wrote(spark, source_checkpoint, fallback_checkpoint, query)
    existing = Handover.latest(spark, target_checkpoint)
    inherited = Handover.latest(spark, source_checkpoint)  # the source's own, when it took over from another
    cut, ends = OffsetLog(spark, source_checkpoint).entry(last) if last is not None else (None, {})
    grid = OutputGrid.of(spark, source_checkpoint)
    if cut is not None and grid is not None:
        cut = grid.closed_by(cut)  # the source wrote no window ending past this one
    offsets: dict[str, str] = {}
    if committed_batch(spark, target_checkpoint) is None and ends and rewind_ms is not None:
        by_source: dict[str, list[TopicPartition]] = {}
        for tp in ends:
            for name, source in sources.items():
                if reads(source, tp[0]):
                    by_source.setdefault(name, []).append(tp)
        found: dict[TopicPartition, int | None] = {}
        if rewind_ms > 0 and cut is not None:
            for name, parts in by_source.items():
                # Batch 0 runs with watermark 0: a cut that early rewinds to the first record.
                at_ms = max(0, cut - rewind_ms)
                try:
                    found.update(offsets_for_times(spark, sources[name], kafka, parts, at_ms))
                except Exception as exc:
                    raise HandoverFailed(
                        f"query {query}: the migration from checkpoint {source_checkpoint} could not find where "
                        f"source {name} starts: Kafka at {kafka.at(sources[name].bootstrapServers).bootstrap} did not "
                        f"give the offsets of {described(parts)} at record time {at_ms} ms (the cut {cut} ms "
                        f"less rewindMs {rewind_ms}): {java_cause(exc)}"
                    ) from exc
        # Where the pipeline began reading, when the source query is where it began (a query that took over
        # from another may need records that one read before it: its own start is no floor).
        starts = source_starts(spark, source_checkpoint) if inherited is None else {}
        offsets = starting_offsets(ends, found, sources, starts)
    # A source that took over from another and was moved on before its watermark passed that cut: the cut holds.
    given = (existing, inherited)
    handover = Handover(
        source=source_checkpoint,
        cutMs=gate_cut(cut, *given),
        startingOffsets=offsets,
        countedBeforeMs=gate_cut(cut if grid is not None else None, *given, counted=True),
    )
    handover.write(spark, target_checkpoint)
    log.info(
        "query %s takes over from %s: cut %s, records before %s counted there, starting offsets %s",
        query,
        source_checkpoint,
        handover.cutMs,
        handover.countedBeforeMs,
        offsets or "its own",
    )
    return handover


def taken_over(
    spark: SparkSession, config: RunnerConfig, query: str, sources: Mapping[str, FromKafka], kafka: KafkaClient
) -> Handover | None:
    """How the query's checkpoint in `config` took over another's output, if it did: as `config.migrations`
    says until it has, and while the checkpoint has no completed batch of its own (decided again: the source
    may have gone on since), else as decided before. A rollback's migration names a checkpoint with batches
    (the one the query left): it goes on from its own offsets, behind the other's cut. `sources`: the compiled
    pipeline's Kafka sources by node."""
    migration = config.migrations.get(query)
    if migration is not None and not handed_over(spark, config, query, migration):
        return hand_over(
            spark,
            source_checkpoint=config.checkpoint(query, migration.fromCheckpoint),
            target_checkpoint=config.checkpoint(query),
            rewind_ms=migration.rewindMs,
            sources=sources,
            kafka=kafka,
            query=query,
            fallback_checkpoint=fallback_of(config, query),
        )
    return Handover.latest(spark, config.checkpoint(query))


def fallback_of(config: RunnerConfig, query: str) -> str | None:
    """The path of the query's migration's fallbackCheckpoint in `config`, if it names one."""
    migration = config.migrations.get(query)
    if migration is None or migration.fallbackCheckpoint is None:
        return None
    return config.checkpoint(query, migration.fallbackCheckpoint)


def handed_over(spark: SparkSession, config: RunnerConfig, query: str, migration: Migration) -> bool:
    """Whether the query's checkpoint in `config` took over as `migration` says (from its fromCheckpoint, or
    its fallbackCheckpoint) and completed a batch of its own since (else a start hands over again)."""
    checkpoint = config.checkpoint(query)
    latest = Handover.latest(spark, checkpoint)
    sources = {config.checkpoint(query, f) for f in (migration.fromCheckpoint, migration.fallbackCheckpoint) if f}
    return latest is not None and latest.source in sources and committed_batch(spark, checkpoint) is not None


def counted_before(
    spark: SparkSession, plan: QueryPlan, checkpoint: str, last: int | None, handover: Handover
) -> int | None:
    """The cut before which the plan leaves records out (Handover.countedBeforeMs) while that can matter: its
    windows are tumbling, and its watermark has not passed the end of the window straddling the cut (a
    record before the cut is late after that, and Spark drops it). `last`: the checkpoint's last committed
    batch."""
    cut = handover.countedBeforeMs
    if cut is None or not plan.tumbling or not plan.final_grid_ms:
        return None
    if last is not None and OffsetLog(spark, checkpoint).entry(last)[0] >= cut + plan.final_grid_ms:
        return None
    return cut
