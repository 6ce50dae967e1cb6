"""What the autoscaler remembers between polls, and across an operator restart or failover.

The state is stored as compact JSON in an annotation of the StreamingApp, so it is bounded: at most
MAX_SAMPLES samples (adjacent ones merge when more arrive), MAX_RECOMMENDATIONS recommendations, query
names and runs as short hashes. Unreadable stored state gives a fresh state, never an error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar, get_args

from sluice.api.contract import DriverStatus

from .collect import Counters, QueryCounters, Sample, TaskBound, counters_of, query_runs, sample_since
from .policy import Policy

# 2: samples keep batch_busy and the trigger interval, counters the completed busy time; a sample's running
# batch time is optional (a row without it reads as unknown), so earlier v2 state stays readable.
FORMAT_VERSION = 2
MAX_SAMPLES = 48
MAX_RECOMMENDATIONS = 64
MAX_QUERIES = 32
MAX_REASON = 300
MAX_JSON_CHARS = 16_000

T = TypeVar("T")


@dataclass(frozen=True)
class DecisionRecord:
    time: float
    from_executors: int
    to: int
    kind: str
    reason: str


@dataclass(frozen=True)
class CapacityCheck:
    """A scale-up waiting to be measured: did the capacity grow as the old rate per executor promised?"""

    from_executors: int
    to: int
    before: float  # records/s the executors processed when busy, before the scale-up
    expected: float  # records/s expected after it


@dataclass(frozen=True)
class AutoscalerState:
    counters: Counters | None = None  # the last reading, for the next sample's rates
    samples: tuple[Sample, ...] = ()  # time order, within the metrics window
    # (time, executors) in time order; a recommendation is dropped once a later one is as large, as only
    # the largest within the scale-down window matters.
    recommendations: tuple[tuple[float, int], ...] = ()
    recommending_since: float | None = None  # first recommendation for this revision
    last_change: DecisionRecord | None = None
    last_decision: DecisionRecord | None = None
    capacity_check: CapacityCheck | None = None
    scale_up_blocked: str | None = None  # why scale-ups are off (ineffective), until a scale-down
    # When the queries' current runs were first seen (a driver start, a query restart): its first batches run
    # on a cold JVM and are no measure of the app, so they are ignored for `stabilization` as after a change.
    runs_since: float | None = None
    spec_key: str = ""  # the settings the state was recorded under

    def to_json(self) -> str:
        document = {
            "v": FORMAT_VERSION,
            "k": self.spec_key,
            "c": _counters_json(self.counters),
            "s": [
                [
                    s.time,
                    s.duration,
                    s.input_rate,
                    s.processed_rate,
                    s.busy,
                    s.batch_busy,
                    s.backlog,
                    s.executors,
                    s.executor_target,
                    s.cores_per_executor,
                    s.max_useful_tasks,
                    s.tasks_limited_by,
                    s.trigger_interval,
                    s.running_batch,
                ]
                for s in self.samples
            ],
            "r": [list(r) for r in self.recommendations],
            "rs": self.recommending_since,
            "lc": _record_json(self.last_change),
            "ld": _record_json(self.last_decision),
            "cc": None
            if self.capacity_check is None
            else [
                self.capacity_check.from_executors,
                self.capacity_check.to,
                self.capacity_check.before,
                self.capacity_check.expected,
            ],
            "b": self.scale_up_blocked,
            "rb": self.runs_since,
        }
        return json.dumps(document, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | None) -> AutoscalerState:
        """The stored state, or a fresh one when `text` is missing, garbage or from another format."""
        if not text or len(text) > MAX_JSON_CHARS:
            return cls()
        try:
            return _state_from(json.loads(text))
        # Anything a hand-edited or truncated annotation can provoke; the state is only an optimisation.
        except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError):
            return cls()


def observe(state: AutoscalerState, status: DriverStatus, policy: Policy) -> AutoscalerState:
    """Feed a driver status: the sample since the previous reading joins the window. A new revision
    (another pipeline, other costs) starts the measurements over."""
    counters = counters_of(status)
    if counters is None:
        return state
    if state.counters is not None and state.counters.revision != counters.revision:
        state = replace(
            state, samples=(), recommendations=(), recommending_since=None, capacity_check=None, scale_up_blocked=None
        )
    sample = sample_since(state.counters, status) if state.counters is not None else None
    if state.counters is None or query_runs(state.counters) != query_runs(counters):
        state = replace(state, runs_since=counters.time)
    state = replace(state, counters=counters)
    return add_sample(state, sample, policy) if sample is not None else state


def add_sample(state: AutoscalerState, sample: Sample, policy: Policy) -> AutoscalerState:
    """The state with `sample` in its window and samples older than the window dropped. A sample longer
    than the window (the operator was away) is no measurement of the window and is left out."""
    if sample.duration > policy.metrics_window + policy.slack:
        return state
    oldest_end = sample.time - policy.metrics_window - policy.slack
    samples = [s for s in state.samples if s.time > oldest_end and s.time < sample.time] + [sample]
    while len(samples) > MAX_SAMPLES:
        samples = _merge_closest(samples)
    return replace(state, samples=tuple(samples))


def _merge_closest(samples: list[Sample]) -> list[Sample]:
    """One sample fewer: the shortest adjacent pair measured on the same executors merged, or else the
    oldest dropped."""
    pairs = [i for i in range(len(samples) - 1) if _same_setup(samples[i], samples[i + 1])]
    if not pairs:
        return samples[1:]
    i = min(pairs, key=lambda i: samples[i].duration + samples[i + 1].duration)
    return [*samples[:i], _merged(samples[i], samples[i + 1]), *samples[i + 2 :]]


def _same_setup(a: Sample, b: Sample) -> bool:
    return (a.executors, a.executor_target, a.cores_per_executor, a.max_useful_tasks) == (
        b.executors,
        b.executor_target,
        b.cores_per_executor,
        b.max_useful_tasks,
    )


def _merged(a: Sample, b: Sample) -> Sample:
    duration = a.duration + b.duration

    def mean(x: float, y: float, digits: int) -> float:
        return round((x * a.duration + y * b.duration) / duration, digits)

    return replace(
        b,
        duration=duration,
        input_rate=mean(a.input_rate, b.input_rate, 3),
        processed_rate=mean(a.processed_rate, b.processed_rate, 3),
        busy=mean(a.busy, b.busy, 5),
        batch_busy=mean(a.batch_busy, b.batch_busy, 5),
    )


# ------------------------------------------------------------------------------------------- JSON


def _counters_json(counters: Counters | None) -> list[Any] | None:
    if counters is None or len(counters.queries) > MAX_QUERIES:
        return None  # the first sample after a restart is then skipped
    return [
        counters.time,
        counters.revision,
        [[q.key, q.run, q.input_rows, q.busy_ms, q.completed_busy_ms] for q in counters.queries],
        counters.read_offsets,
    ]


def _record_json(record: DecisionRecord | None) -> list[Any] | None:
    if record is None:
        return None
    return [record.time, record.from_executors, record.to, record.kind, record.reason]


def _state_from(document: dict[str, Any]) -> AutoscalerState:
    if document["v"] != FORMAT_VERSION:
        raise ValueError("another format version")
    samples = tuple(_sample_from(s) for s in document["s"])[-MAX_SAMPLES:]
    recommendations = tuple((_number(t), _count(n)) for t, n in document["r"])[-MAX_RECOMMENDATIONS:]
    check = document["cc"]
    return AutoscalerState(
        counters=_optional(document["c"], _counters_from),
        samples=samples,
        recommendations=recommendations,
        recommending_since=_optional(document["rs"], _number),
        last_change=_optional(document["lc"], _record_from),
        last_decision=_optional(document["ld"], _record_from),
        capacity_check=None
        if check is None
        else CapacityCheck(_count(check[0]), _count(check[1]), _number(check[2]), _number(check[3])),
        scale_up_blocked=_optional(document["b"], _text),
        spec_key=_text(document["k"]),
        runs_since=_optional(document.get("rb"), _number),
    )


def _sample_from(row: list[Any]) -> Sample:
    (
        time,
        duration,
        input_rate,
        processed_rate,
        busy,
        batch_busy,
        backlog,
        executors,
        target,
        cores,
        tasks,
        bound,
        trigger,
        *rest,
    ) = row
    running = _optional(rest.pop(0), _number) if rest else None
    if rest:
        raise ValueError(f"not a sample: {row}")
    if (
        bound not in get_args(TaskBound)
        or _number(duration) <= 0
        or min(_number(busy), _number(batch_busy), running or 0) < 0
    ):
        raise ValueError(f"not a sample: {row}")
    return Sample(
        time=_number(time),
        duration=_number(duration),
        input_rate=_number(input_rate),
        processed_rate=_number(processed_rate),
        busy=_number(busy),
        batch_busy=_number(batch_busy),
        backlog=_count(backlog),
        executors=_positive(executors),
        executor_target=_optional(target, _count),
        cores_per_executor=_positive(cores),
        max_useful_tasks=_count(tasks),
        tasks_limited_by=bound,
        trigger_interval=_number(trigger),
        running_batch=running,
    )


def _counters_from(row: list[Any]) -> Counters:
    time, revision, queries, read_offsets = row
    return Counters(
        time=_number(time),
        revision=_text(revision),
        queries=tuple(
            QueryCounters(_text(k), _text(r), _count(rows), _count(busy), _count(completed))
            for k, r, rows, busy, completed in queries[:MAX_QUERIES]
        ),
        read_offsets=_count(read_offsets),
    )


def _record_from(row: list[Any]) -> DecisionRecord:
    time, from_executors, to, kind, reason = row
    if kind not in ("up", "down", "hold"):
        raise ValueError(f"not a decision kind: {kind!r}")
    return DecisionRecord(_number(time), _count(from_executors), _count(to), kind, _text(reason))


def _optional(value: Any, parse: Callable[[Any], T]) -> T | None:
    return None if value is None else parse(value)


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"not a number: {value!r}")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def _positive(value: Any) -> int:
    if _count(value) == 0:
        raise ValueError("zero where a positive count belongs")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"not a string: {value!r}")
    return value[:MAX_REASON]
