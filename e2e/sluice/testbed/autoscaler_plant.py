"""A simulated plant for the autoscaler's tests and benchmark, on a simulated clock.

The plant is a Kafka topic fed by an input rate (a function of time) and an app whose executors each
process a fixed rate per core, as long as the batch has a task for every core (partitions) and the sink
keeps up. A new executor works after a warm-up delay; a removed one stops at once.

With `trigger` unset, records are processed as they arrive (the limit of very short micro-batches). With a
`trigger`, the app runs micro-batches as Spark does with a processingTime trigger and no maxOffsetsPerTrigger: a
batch starts at a trigger time (a multiple of the interval) when records are waiting, or at once when the
previous batch overran the interval, and reads everything available at its start; its records count as
processed, and its offsets as committed, only when it completes. The plant answers with `DriverStatus`
objects as a current driver does (latest offsets: Kafka's end offsets now; busy time growing while a batch
runs), so the autoscaler's collect step runs on them exactly as on a real driver.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from sluice.api.contract import DriverStatus, ExecutorStatus, QueryStatus, TopicStatus
from sluice.api.times import format_time
from sluice.operator.autoscaler.decide import ScalingDecision, decide_scaling, record
from sluice.operator.autoscaler.policy import ExecutorBounds, Policy
from sluice.operator.autoscaler.state import AutoscalerState, observe

InputRate = Callable[[float], float]  # records/s at a time (seconds since the start)

EPOCH = 1_767_225_600.0  # the simulated clock's start: 2026-01-01T00:00:00Z
TOPIC = "input"


def constant(rate: float) -> InputRate:
    return lambda t: rate


def step(before: float, after: float, at: float) -> InputRate:
    return lambda t: before if t < at else after


def ramp(start: float, end: float, begin: float, duration: float) -> InputRate:
    return lambda t: start + (end - start) * min(1.0, max(0.0, (t - begin) / duration))


def sine(mean: float, amplitude: float, period: float) -> InputRate:
    return lambda t: mean + amplitude * math.sin(2 * math.pi * t / period)


def noisy(base: InputRate, amplitude: float, seed: int, piece: float = 10.0) -> InputRate:
    """`base` times a random factor in 1 ± amplitude, drawn anew every `piece` seconds (seeded)."""
    factors: dict[int, float] = {}

    def rate(t: float) -> float:
        index = int(t // piece)
        if index not in factors:
            factors[index] = 1 + random.Random(seed * 1_000_003 + index).uniform(-amplitude, amplitude)
        return base(t) * factors[index]

    return rate


@dataclass
class Batch:
    start: float  # seconds since the start
    end_offset: float  # the topic's end offset when it started: it reads up to there
    rows: float
    left: float  # rows still to process


@dataclass
class Plant:
    input_rate: InputRate
    executors: int  # working now
    rate_per_core: float = 1000.0  # records/s
    cores_per_executor: int = 1
    partitions: int = 64  # Kafka partitions: tasks of a batch's read
    shuffle_partitions: int = 0  # > 0: a stateful pipeline with that many state partitions
    sink_limit: float | None = None  # records/s the sink takes at most, whatever the executors
    warmup: float = 30.0  # seconds before an added executor works
    trigger: float | None = None  # processingTime interval, seconds; None: records processed as they come
    tick: float = 1.0
    time: float = 0.0
    produced: float = 0.0  # the topic's end offset
    committed: float = 0.0  # the end offset of the last completed batch
    processed_rows: float = 0.0  # rows of completed batches
    busy_seconds: float = 0.0  # time of completed batches
    batch: Batch | None = None  # the batch running now
    next_trigger: float = 0.0
    target: int | None = None  # the last count asked for; None: never asked
    starting: list[float] = field(default_factory=list)  # when each executor on its way starts working

    @property
    def backlog(self) -> float:
        return self.produced - self.committed

    def running_seconds(self) -> float:
        return 0.0 if self.batch is None else self.time - self.batch.start

    @property
    def useful_tasks(self) -> int:
        return max(self.partitions, self.shuffle_partitions)

    def capacity(self) -> float:
        """Records/s the working executors process when busy."""
        slots = min(self.executors * self.cores_per_executor, self.useful_tasks)
        rate = slots * self.rate_per_core
        return rate if self.sink_limit is None else min(rate, self.sink_limit)

    def set_executors(self, target: int) -> None:
        self.target = target
        missing = target - self.executors - len(self.starting)
        if missing >= 0:
            self.starting += [self.time + self.warmup] * missing
            return
        cancelled = min(-missing, len(self.starting))
        self.starting = self.starting[: len(self.starting) - cancelled]
        self.executors -= -missing - cancelled

    def advance(self, until: float) -> None:
        while self.time < until - 1e-9:
            seconds = min(self.tick, until - self.time)
            ready = [t for t in self.starting if t <= self.time]
            self.executors += len(ready)
            self.starting = [t for t in self.starting if t > self.time]
            arriving = self.input_rate(self.time + seconds / 2) * seconds
            if self.trigger is None:
                self._flow(arriving, seconds)
            else:
                self.produced += arriving
                self._run_batches(self.time + seconds)
            self.time += seconds

    def _flow(self, arriving: float, seconds: float) -> None:
        capacity = self.capacity() * seconds
        processed = min(self.backlog + arriving, capacity)
        self.produced += arriving
        self.committed += processed
        self.processed_rows += processed
        if capacity > 0:
            self.busy_seconds += processed / capacity * seconds

    def _run_batches(self, end: float) -> None:
        """Batches from `self.time` to `end`: started, worked on at the capacity of the moment, completed."""
        now = self.time
        while now < end - 1e-9:
            if self.batch is None:
                if now < self.next_trigger - 1e-9:
                    now = min(end, self.next_trigger)
                    continue
                if self.produced - self.committed < 1:  # nothing new: the trigger waits for the next interval
                    self.next_trigger = self._trigger_after(now)
                    continue
                rows = self.produced - self.committed
                self.batch = Batch(start=now, end_offset=self.produced, rows=rows, left=rows)
            batch, rate = self.batch, self.capacity()
            work = end - now if rate <= 0 else min(end - now, batch.left / rate)
            batch.left -= rate * work
            now += work
            if batch.left <= 1e-6:
                self.processed_rows += batch.rows
                self.busy_seconds += now - batch.start
                self.committed = batch.end_offset
                self.next_trigger = self._trigger_after(batch.start)  # passed already if the batch overran
                self.batch = None

    def _trigger_after(self, moment: float) -> float:
        interval = self.trigger or 0.0
        return (math.floor(moment / interval + 1e-9) + 1) * interval

    def status(self) -> DriverStatus:
        latest, committed = int(self.produced), int(self.committed)
        running_ms = int(self.running_seconds() * 1000)
        completed_ms = int(self.busy_seconds * 1000)
        return DriverStatus(
            app="sim",
            revision="r1",
            observedAt=format_time(EPOCH + self.time),
            queries=[
                QueryStatus(
                    name="main",
                    runId="run-1",
                    active=True,
                    inputRows=int(self.processed_rows),
                    busyMs=completed_ms + running_ms,
                    completedBusyMs=completed_ms,
                    runningBatchMs=running_ms,
                    stateful=self.shuffle_partitions > 0,
                    topics=[TOPIC],
                    triggerIntervalMs=None if self.trigger is None else int(self.trigger * 1000),
                )
            ],
            topics=[
                TopicStatus(topic=TOPIC, partitions=self.partitions, latestOffsets=latest, backlog=latest - committed)
            ],
            backlog=latest - committed,
            latestOffsetsFrom="kafka",
            executors=[
                ExecutorStatus(id=str(i + 1), totalCores=self.cores_per_executor) for i in range(self.executors)
            ],
            executorTarget=self.target,
            taskSlots=self.executors * self.cores_per_executor,
            sourceTasks=self.partitions,
            shufflePartitions=self.shuffle_partitions,
        )


@dataclass(frozen=True)
class Moment:
    time: float  # seconds since the start
    input_rate: float  # records/s arriving then
    backlog: int
    executors: int  # working
    decision: ScalingDecision


@dataclass
class Timeline:
    moments: list[Moment]
    final_state: AutoscalerState

    @property
    def changes(self) -> list[Moment]:
        return [m for m in self.moments if m.decision.changes]

    def targets(self) -> list[int]:
        return [m.decision.target for m in self.moments]


def simulate(
    plant: Plant, policy: Policy, bounds: ExecutorBounds, duration: float, restarts: Collection[float] = ()
) -> Timeline:
    """Run the autoscaler every `policy.interval` for `duration` seconds. At each time in `restarts` the
    state goes through JSON first, as across an operator restart."""
    state = observe(AutoscalerState(), plant.status(), policy)
    moments = []
    for index in range(1, int(duration // policy.interval) + 1):
        now = index * policy.interval
        plant.advance(now)
        if now in restarts:
            state = AutoscalerState.from_json(state.to_json())
        state = observe(state, plant.status(), policy)
        decision = decide_scaling(policy, bounds, state, EPOCH + now)
        if decision.changes:
            plant.set_executors(decision.target)
        state = record(state, decision, policy)
        moments.append(Moment(now, plant.input_rate(now), int(plant.backlog), plant.executors, decision))
    return Timeline(moments, state)
