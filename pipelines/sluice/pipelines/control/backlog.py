"""Kafka backlog from streaming query progress: what the source topics hold that the app has not read yet.

A Kafka source reports, per micro-batch, `endOffset` (where the batch stopped reading) and `latestOffset`
(the newest offsets it saw), each a map topic -> partition -> offset. A topic's backlog is the sum over its
partitions of (latest offset - the end offset of the query furthest behind), so a topic read by two queries
(a sink's query and the dead-letter query) is counted once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from sluice.api.contract import TopicStatus

TopicPartition = tuple[str, int]


def kafka_offsets(offsets: Any) -> dict[TopicPartition, int]:
    """A Kafka source's offsets (the JSON map or its text) by topic-partition; {} for anything else."""
    if isinstance(offsets, str):
        try:
            offsets = json.loads(offsets)
        except ValueError:
            return {}
    if not isinstance(offsets, Mapping):
        return {}
    out: dict[TopicPartition, int] = {}
    for topic, partitions in offsets.items():
        if not isinstance(partitions, Mapping):
            return {}  # not a Kafka source (e.g. a rate source's single number per key)
        for partition, offset in partitions.items():
            if isinstance(offset, int) and not isinstance(offset, bool) and str(partition).isdigit():
                out[(str(topic), int(partition))] = offset
    return out


def source_partitions(progresses: Iterable[Mapping[str, Any]]) -> set[TopicPartition]:
    """The Kafka partitions the queries' last progresses name."""
    return {
        partition
        for progress in progresses
        for source in progress.get("sources") or []
        for key in ("startOffset", "endOffset", "latestOffset")
        for partition in kafka_offsets(source.get(key))
    }


def source_topics(progress: Mapping[str, Any]) -> list[str]:
    """The Kafka topics a query's sources read, as its last progress names them."""
    return sorted({topic for topic, _ in source_partitions([progress])})


def topic_backlogs(
    progresses: Iterable[Mapping[str, Any]], latest: Mapping[TopicPartition, int] | None = None
) -> list[TopicStatus]:
    """Each source topic once, with its backlog behind the slowest query reading it.

    `progresses` holds the last progress of each query; `latest`, Kafka's end offsets now, when known (the
    progress only tells what a query saw when its last batch began). A partition no query has reported
    reading yet counts from offset 0 (a new partition, read from the earliest offset); a query that does not
    report the latest offsets leaves them to the others, and to its own end offsets, which the latest offsets
    cannot be below.
    """
    newest: dict[TopicPartition, int] = dict(latest or {})
    slowest_end: dict[TopicPartition, int] = {}
    for progress in progresses:
        for source in progress.get("sources") or []:
            ends = kafka_offsets(source.get("endOffset"))
            for partition, offset in [*kafka_offsets(source.get("latestOffset")).items(), *ends.items()]:
                newest[partition] = max(newest.get(partition, offset), offset)
            for partition, offset in ends.items():
                slowest_end[partition] = min(slowest_end.get(partition, offset), offset)
    by_topic: dict[str, list[TopicPartition]] = {}
    for partition in newest:
        by_topic.setdefault(partition[0], []).append(partition)
    return [
        TopicStatus(
            topic=topic,
            partitions=len(partitions),
            latestOffsets=sum(max(newest[p], 0) for p in partitions),
            backlog=sum(max(newest[p] - max(slowest_end.get(p, 0), 0), 0) for p in partitions),
        )
        for topic, partitions in sorted(by_topic.items())
    ]
