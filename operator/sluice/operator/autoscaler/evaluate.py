"""Evaluate: the samples of a metrics window → what the app needs, in plain numbers.

An executor's true rate is what it would process if busy all the time: the records processed ÷ the time
the completed batches took ÷ the executors. The app needs input rate ÷ target utilization (headroom) plus
backlog ÷ target lag (catching up in time) records per second. The backlog counted there is what is still to
be processed beyond the records a healthy micro-batch app always holds. A batch commits its offsets only when
it completes, so the backlog also holds the records the running batch has processed so far (about its time so
far x the capacity): those are taken out. What is left of a healthy app's is at most one trigger interval of
input: what its batch read as it began, less what it processed since, plus what arrived since. When the driver
does not say how long its batch has run, nothing is taken out and the allowance is the trigger interval x
(1 + target utilization) of input (a batch at the target commits that much at once).

How much of the executors the app needs is `load`, the input rate ÷ the capacity, not the measured busy
share: a batch catching up on a backlog keeps them busy all the time however many there are.

Figures are the window's totals over its time, not means of the samples' ratios: a batch longer than a
sample puts its records into one sample while its time spreads over several, and a ratio per sample would
swing from 0 to several times the truth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .collect import Sample, TaskBound

# Below this share of the window spent in completed batches, a rate is mostly scheduling noise: it says
# little about capacity.
BUSY_FLOOR = 0.05


@dataclass(frozen=True)
class Evaluation:
    input_rate: float  # window mean, records/s
    processed_rate: float  # window mean, records/s
    utilization: float  # the window's batch time (running batches too) over its time, at most 1
    backlog: int  # latest, records
    waiting: int  # of which a healthy micro-batch app holds still to process (see the module's text)
    executors: int  # latest live count
    cores_per_executor: int
    rate_per_executor: float | None  # records/s one busy executor processes; None: never busy enough to tell
    needed_rate: float  # records/s the app needs to keep up and catch up in time
    needed_executors: int | None  # None: no rate measured
    useful_tasks: int  # 0: unknown
    tasks_limited_by: TaskBound
    # Of the backlog, what the running batch has processed already: its offsets are committed when it completes.
    processing: int = 0

    @property
    def capacity(self) -> float | None:
        """Records/s the live executors process when busy all the time."""
        return None if self.rate_per_executor is None else self.rate_per_executor * self.executors

    @property
    def usable_executors(self) -> int | None:
        """Executors the app's tasks can keep busy; None: unknown."""
        return math.ceil(self.useful_tasks / self.cores_per_executor) if self.useful_tasks else None

    @property
    def load(self) -> float:
        """The share of the live executors' busy time the input alone needs: input rate ÷ capacity, above 1
        when they cannot keep up. The measured busy share (`utilization`) when no rate was measured.

        Unlike the busy share, it does not count the time spent catching up on a backlog: right after a step
        the batches that read the backlog keep the executors busy all the time (a micro-batch app drains it
        in a few long batches), although the input alone needs much less of them. The backlog is weighed on
        its own, by `catch_up_seconds`."""
        capacity = self.capacity
        return self.input_rate / capacity if capacity else self.utilization

    @property
    def catch_up_seconds(self) -> float:
        """Seconds to drain the excess backlog with the spare capacity; infinite when there is none."""
        if self.excess_backlog == 0:
            return 0.0
        spare = (self.capacity or 0.0) - self.input_rate
        return self.excess_backlog / spare if spare > 0 else math.inf

    @property
    def excess_backlog(self) -> int:
        """Records still to be processed beyond those a healthy micro-batch app holds."""
        return max(0, self.backlog - self.processing - self.waiting)


def evaluate(samples: Sequence[Sample], target_utilization: float, target_lag: float) -> Evaluation:
    """The window's figures; `samples` is not empty and in time order."""
    latest = samples[-1]
    seconds = sum(s.duration for s in samples)
    input_rate = sum(s.input_rate * s.duration for s in samples) / seconds
    processed = sum(s.processed_rate * s.duration for s in samples)
    batch_seconds = sum(s.batch_busy * s.duration for s in samples)
    executor_seconds = sum(s.batch_busy * s.duration * s.executors for s in samples)
    rate_per_executor = processed / executor_seconds if batch_seconds >= BUSY_FLOOR * seconds else None
    processing = running_batch_processed(latest, input_rate, rate_per_executor)
    pending = latest.backlog - processing
    intervals = 1.0 if latest.running_batch is not None else 1 + target_utilization
    waiting = min(pending, round(input_rate * latest.trigger_interval * intervals))
    needed_rate = input_rate / target_utilization + (pending - waiting) / target_lag
    return Evaluation(
        input_rate=input_rate,
        processed_rate=processed / seconds,
        utilization=min(1.0, sum(s.busy * s.duration for s in samples) / seconds),
        backlog=latest.backlog,
        waiting=waiting,
        executors=latest.executors,
        cores_per_executor=latest.cores_per_executor,
        rate_per_executor=rate_per_executor,
        needed_rate=needed_rate,
        needed_executors=executors_for(needed_rate, rate_per_executor),
        useful_tasks=latest.max_useful_tasks,
        tasks_limited_by=latest.tasks_limited_by,
        processing=processing,
    )


def running_batch_processed(latest: Sample, input_rate: float, rate_per_executor: float | None) -> int:
    """Records of `latest.backlog` the running batch has processed: its time so far x the capacity, at most
    what it read (the backlog less what arrived since it began). 0 without a running batch or a rate."""
    if not latest.running_batch or not rate_per_executor:
        return 0
    read = latest.backlog - input_rate * latest.running_batch
    done = latest.running_batch * rate_per_executor * latest.executors
    return max(0, round(min(done, read)))


def executors_for(needed_rate: float, rate_per_executor: float | None) -> int | None:
    if needed_rate <= 0:
        return 0
    if not rate_per_executor:
        return None
    # A hundredth of an executor is within measurement error (counters are whole records and milliseconds):
    # it should not add an executor.
    return math.ceil(needed_rate / rate_per_executor - 0.01)
