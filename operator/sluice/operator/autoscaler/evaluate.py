"""Evaluate: the samples of a metrics window → what the app needs, in plain numbers.

An executor's true rate is what it would process if busy all the time: the processed rate ÷ the busy
fraction ÷ the executors. The app needs input rate ÷ target utilization (headroom) plus backlog ÷
target lag (catching up in time) records per second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from .collect import Sample, TaskBound

# Below this busy fraction a sample's rate is mostly scheduling noise: it says little about capacity.
BUSY_FLOOR = 0.05


@dataclass(frozen=True)
class Evaluation:
    input_rate: float                # window mean, records/s
    processed_rate: float            # window mean, records/s
    utilization: float               # window mean busy fraction
    backlog: int                     # latest, records
    executors: int                   # latest live count
    cores_per_executor: int
    rate_per_executor: float | None  # records/s one busy executor processes; None: never busy enough to tell
    needed_rate: float               # records/s the app needs to keep up and catch up in time
    needed_executors: int | None     # None: no rate measured
    useful_tasks: int                # 0: unknown
    tasks_limited_by: TaskBound

    @property
    def capacity(self) -> float | None:
        """Records/s the live executors process when busy all the time."""
        return None if self.rate_per_executor is None else self.rate_per_executor * self.executors

    @property
    def usable_executors(self) -> int | None:
        """Executors the app's tasks can keep busy; None: unknown."""
        return math.ceil(self.useful_tasks / self.cores_per_executor) if self.useful_tasks else None

    @property
    def catch_up_seconds(self) -> float:
        """Seconds to drain the backlog with the spare capacity; infinite when there is none."""
        if self.backlog == 0:
            return 0.0
        spare = (self.capacity or 0.0) - self.input_rate
        return self.backlog / spare if spare > 0 else math.inf


def evaluate(samples: Sequence[Sample], target_utilization: float, target_lag: float) -> Evaluation:
    """The window's figures; `samples` is not empty and in time order."""
    latest = samples[-1]
    input_rate = fmean(s.input_rate for s in samples)
    busy_rates = [s.processed_rate / s.busy / s.executors for s in samples if s.busy >= BUSY_FLOOR]
    rate_per_executor = fmean(busy_rates) if busy_rates else None
    needed_rate = input_rate / target_utilization + latest.backlog / target_lag
    return Evaluation(
        input_rate=input_rate,
        processed_rate=fmean(s.processed_rate for s in samples),
        utilization=fmean(s.busy for s in samples),
        backlog=latest.backlog,
        executors=latest.executors,
        cores_per_executor=latest.cores_per_executor,
        rate_per_executor=rate_per_executor,
        needed_rate=needed_rate,
        needed_executors=executors_for(needed_rate, rate_per_executor),
        useful_tasks=latest.max_useful_tasks,
        tasks_limited_by=latest.tasks_limited_by)


def executors_for(needed_rate: float, rate_per_executor: float | None) -> int | None:
    if needed_rate <= 0:
        return 0
    if not rate_per_executor:
        return None
    # A hundredth of an executor is within measurement error (counters are whole records and milliseconds):
    # it should not add an executor.
    return math.ceil(needed_rate / rate_per_executor - 0.01)
