"""Checkpoint migration inside the running driver: a query whose state Spark cannot carry to a new plan (a
changed window, grouping key, source) moves to a checkpoint of its own, and its output goes on exactly once.

The old query stops at a batch boundary. Its last completed batch says two things (its offset log and commit
log): the watermark it ran with and the end offsets it read up to. The cut is that watermark down to the end of
the last window the old query closed there (its windows end on a grid it wrote beside its checkpoint,
`OutputGrid`): every window that closed at or before the cut is in the sink, and none that ends after it (a
new window shorter than the old one may end between the two: it is the new query's). The new query starts on
an empty checkpoint from those offsets rewound from the cut by
`rewindMs` of Kafka record time (watermark delay + the longest window or join span: enough to rebuild the
windows still open at the cut), never past them, and an output gate leaves out its rows final before the cut
(windows that closed at or before it: the old query wrote their results). So windows closed before the cut
come from the old pipeline, later ones from the new, each once. The exactly-once sink keeps that true across
crashes: its commit markers carry the checkpoint's query id, and its transactional ids fence the old query.

What was decided is written beside the new checkpoint (`Handover`) before the query starts, so a driver that
restarts mid-migration starts the query the same way. A rollback moves the query back the same way: onto the
checkpoint it left (its state and offsets intact) with the gate at the new query's cut.

Rewinding by record time assumes a record's Kafka timestamp is not earlier than its event time less the
watermark delay (producer or broker time, as usual).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from pyspark.sql import SparkSession

from .sinks.checkpoint_files import Handover, OffsetLog, OutputGrid, committed_batch
from .spec import FromKafka

TopicPartition = tuple[str, int]


def reads(source: FromKafka, topic: str) -> bool:
    return source.topic == topic if source.topic else bool(re.fullmatch(source.pattern or "", topic))


def starting_offsets(
    ends: Mapping[TopicPartition, int],
    found: Mapping[TopicPartition, int | None],
    sources: Mapping[str, FromKafka],
) -> dict[str, str]:
    """Per source node that read any of `ends`' partitions, Spark's startingOffsets JSON: each partition at the
    offset `found` for the rewind's time (None: no record that late, so the end), never past the end the old
    query read up to (records after it nobody has read yet, whatever their time)."""
    out: dict[str, str] = {}
    for name, source in sources.items():
        offsets: dict[str, dict[str, int]] = {}
        for (topic, partition), end in sorted(ends.items()):
            if reads(source, topic):
                at = found.get((topic, partition))
                offsets.setdefault(topic, {})[str(partition)] = end if at is None else min(at, end)
        if offsets:
            out[name] = json.dumps(offsets, sort_keys=True)
    return out


def gate_cut(source_cut: int | None, existing: Handover | None) -> int | None:
    """The output gate: the later of the source query's cut and one the checkpoint was given before (windows
    closed before either were written by another query)."""
    cuts = [c for c in (source_cut, existing.cutMs if existing else None) if c is not None]
    return max(cuts) if cuts else None


def offsets_for_times(
    spark: SparkSession, source: FromKafka, bootstrap: str, partitions: list[TopicPartition], at_ms: int
) -> dict[TopicPartition, int | None]:
    """Kafka's offsetsForTimes through the Java client Spark's source uses, with the source's `kafka.` options:
    the earliest offset whose record time is at or after `at_ms`, None where no record is that late."""
    jvm = spark._jvm
    assert jvm is not None
    props = jvm.java.util.Properties()
    for key, value in source.options.items():
        if key.startswith("kafka."):
            props.put(key.removeprefix("kafka."), value)
    props.put("bootstrap.servers", source.bootstrapServers or bootstrap)
    deserializer = "org.apache.kafka.common.serialization.ByteArrayDeserializer"
    props.put("key.deserializer", deserializer)
    props.put("value.deserializer", deserializer)
    consumer = jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props)
    try:
        query = jvm.java.util.HashMap()
        parts = {tp: jvm.org.apache.kafka.common.TopicPartition(tp[0], tp[1]) for tp in partitions}
        for part in parts.values():
            query.put(part, jvm.java.lang.Long.valueOf(at_ms))
        answer = consumer.offsetsForTimes(query, jvm.java.time.Duration.ofSeconds(60))
        found: dict[TopicPartition, int | None] = {}
        for tp, part in parts.items():
            offset = answer.get(part)
            found[tp] = None if offset is None else int(offset.offset())
        return found
    finally:
        consumer.close()


def hand_over(
    spark: SparkSession,
    *,
    source_checkpoint: str,
    target_checkpoint: str,
    rewind_ms: int | None,
    sources: Mapping[str, FromKafka],
    bootstrap: str,
) -> Handover:
    """Decide how the query on `target_checkpoint` takes over the output of the one on `source_checkpoint`
    (stopped), and write it beside the target. A target with batches of its own (a rollback onto the
    checkpoint a query left) goes on from its offsets; an empty one starts from the source's, rewound by
    `rewind_ms` (None: from the sources' startingOffsets)."""
    existing = Handover.latest(spark, target_checkpoint)
    last = committed_batch(spark, source_checkpoint)
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
                found.update(offsets_for_times(spark, sources[name], bootstrap, parts, max(0, cut - rewind_ms)))
        offsets = starting_offsets(ends, found, sources)
    handover = Handover(source=source_checkpoint, cutMs=gate_cut(cut, existing), startingOffsets=offsets)
    handover.write(spark, target_checkpoint)
    return handover
