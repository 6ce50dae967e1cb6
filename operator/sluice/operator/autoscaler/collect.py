"""Collect: two driver statuses → one `Sample` of rates over the time between them.

The driver's counters are cumulative since it started, so a rate needs two readings. `Counters` is the
part of a `DriverStatus` a later reading is compared against; it is small enough to keep in the
autoscaler's stored state, so the first poll after an operator restart already yields a sample.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Literal

from sluice.api.contract import DriverStatus
from sluice.api.times import parse_time

TaskBound = Literal["source", "shuffle", ""]


@dataclass(frozen=True)
class Sample:
    """What the app did between two readings. Rates are in records per second.

    A topic read by several queries counts once per reading query in `input_rate`, as those queries'
    `inputRows` do in `processed_rate`, so the two compare like for like.
    """

    time: float  # epoch seconds of the later reading
    duration: float  # seconds between the two readings
    input_rate: float  # records arriving in the source topics
    processed_rate: float  # records the queries read, over wall-clock time
    # The busiest query's batch time (the running batch's too) over wall-clock time: about 0..1, above 1 when
    # time of a batch began before the sample lands in it. Not clamped: the window's totals must not lose it.
    busy: float
    batch_busy: float  # the same for completed batches only: the time the processed records took
    backlog: int  # records behind latest at the later reading
    executors: int  # live executors at the later reading
    executor_target: int | None  # the total last asked of Spark (None: never asked since the driver started)
    cores_per_executor: int
    max_useful_tasks: int  # tasks a batch's busiest stage splits into; 0: unknown
    tasks_limited_by: TaskBound  # source: Kafka partitions / minPartitions; shuffle: state partitions
    trigger_interval: float = 0.0  # seconds between micro-batches (the longest query's); 0: none
    # Seconds the running batch had run at the later reading (the longest running query's); 0: none; None: the
    # driver does not say (one from before completedBusyMs). Its offsets are committed only when it completes,
    # so the backlog still counts the records it has processed.
    running_batch: float | None = None

    @property
    def start(self) -> float:
        return self.time - self.duration


@dataclass(frozen=True)
class QueryCounters:
    key: str  # crc32 of the query's name: fixed size in the stored state
    run: str  # crc32 of its runId: a new run restarted the counters
    input_rows: int
    busy_ms: int
    completed_busy_ms: int


@dataclass(frozen=True)
class Counters:
    time: float
    revision: str
    queries: tuple[QueryCounters, ...]
    # Σ over topics of latestOffsets (Kafka's end offsets now, from a current driver) times the queries reading
    # it: its growth is the arrival rate, not what the batches happened to read.
    read_offsets: int


def short_hash(text: str) -> str:
    return f"{zlib.crc32(text.encode()):08x}"


def counters_of(status: DriverStatus) -> Counters | None:
    """The cumulative counters of a status; None when its time cannot be read."""
    try:
        time = parse_time(status.observedAt)
    except ValueError:
        return None
    readers = _readers_per_topic(status)
    return Counters(
        time=time,
        revision=short_hash(status.revision),
        queries=tuple(
            QueryCounters(
                short_hash(q.name),
                short_hash(q.runId or ""),
                q.inputRows,
                q.busyMs,
                q.busyMs if q.completedBusyMs is None else q.completedBusyMs,
            )
            for q in sorted(status.queries, key=lambda q: q.name)
        ),
        read_offsets=sum(t.latestOffsets * readers.get(t.topic, 1) for t in status.topics),
    )


def query_runs(counters: Counters) -> list[tuple[str, str]]:
    """The queries and their runs: a new run (a restart) or another set of queries changes it."""
    return [(q.key, q.run) for q in counters.queries]


def sample_between(previous: DriverStatus, current: DriverStatus) -> Sample | None:
    earlier = counters_of(previous)
    return sample_since(earlier, current) if earlier is not None else None


def sample_since(earlier: Counters, current: DriverStatus) -> Sample | None:
    """The sample from `earlier` to `current`; None when no honest rate can be computed: the driver
    restarted (a counter went back, a query's run changed), the revision or the set of queries changed,
    time did not advance, or no executor is live."""
    later = counters_of(current)
    if later is None or later.revision != earlier.revision:
        return None
    seconds = later.time - earlier.time
    executors = [e for e in current.executors if e.id != "driver"]
    if seconds <= 0 or not executors:
        return None
    if query_runs(later) != query_runs(earlier):
        return None
    row_deltas = [b.input_rows - a.input_rows for a, b in zip(earlier.queries, later.queries, strict=True)]
    busy_deltas = [b.busy_ms - a.busy_ms for a, b in zip(earlier.queries, later.queries, strict=True)]
    completed_deltas = [
        b.completed_busy_ms - a.completed_busy_ms for a, b in zip(earlier.queries, later.queries, strict=True)
    ]
    offset_delta = later.read_offsets - earlier.read_offsets
    if min([*row_deltas, *busy_deltas, *completed_deltas, offset_delta]) < 0:
        return None
    useful_tasks, bound = _useful_tasks(current)
    return Sample(
        time=later.time,
        duration=seconds,
        input_rate=round(offset_delta / seconds, 3),
        processed_rate=round(sum(row_deltas) / seconds, 3),
        busy=round(max(busy_deltas, default=0) / 1000 / seconds, 5),
        batch_busy=round(max(completed_deltas, default=0) / 1000 / seconds, 5),
        backlog=max(0, current.backlog),
        executors=len(executors),
        executor_target=current.executorTarget,
        cores_per_executor=_cores_per_executor(current, len(executors)),
        max_useful_tasks=useful_tasks,
        tasks_limited_by=bound,
        trigger_interval=max((q.triggerIntervalMs or 0 for q in current.queries), default=0) / 1000,
        running_batch=None
        if any(q.completedBusyMs is None for q in current.queries)
        else max((q.runningBatchMs for q in current.queries), default=0) / 1000,
    )


def _readers_per_topic(status: DriverStatus) -> dict[str, int]:
    readers: dict[str, int] = {}
    for query in status.queries:
        for topic in set(query.topics):
            readers[topic] = readers.get(topic, 0) + 1
    return readers


def _cores_per_executor(status: DriverStatus, executors: int) -> int:
    cores = sum(e.totalCores for e in status.executors if e.id != "driver") or status.taskSlots
    return max(1, round(cores / executors))


def _useful_tasks(status: DriverStatus) -> tuple[int, TaskBound]:
    """Tasks beyond which more cores sit idle: the Kafka read's tasks, or for a stateful pipeline the
    state (shuffle) partitions when there are more of those."""
    source = status.sourceTasks or sum(t.partitions for t in status.topics)
    stateful = any(q.stateful for q in status.queries)
    if stateful and status.shufflePartitions > source:
        return status.shufflePartitions, "shuffle"
    return (source, "source") if source > 0 else (0, "")
