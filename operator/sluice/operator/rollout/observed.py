"""What the rollout state machine reads: the app's drivers and their queries as observed, and the target revision.
Plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sluice.api.rollout import STRATEGIES_CHEAPEST_FIRST, SpecDiff

from ..model import Strategy, UpdateStrategy

DriverState = Literal["pending", "standby", "running", "draining", "drained", "failed"]


@dataclass(frozen=True)
class QueryFacts:
    """One query as its driver reports it."""

    name: str
    revision: str  # the revision whose plan the query was started with
    active: bool
    batches: int = 0  # completed since the query started on that plan
    backlog: int | None = None  # records it has not read yet; 0: caught up
    error: str | None = None  # why it stopped (an analysis error, an exception)


@dataclass(frozen=True)
class DriverFacts:
    """One SparkApplication of the app. pending: submitted, not answering; standby: up, waiting for Activate;
    running: its queries run; draining/drained: stopping/stopped at a batch boundary, writing nothing more (as
    asked, the driver staying up, or as the driver stops); failed: spark-operator reports a failure."""

    name: str
    revision: str  # the revision it was submitted with
    state: DriverState
    restarts: int = 0  # spark-operator's restarts of it
    queries: tuple[QueryFacts, ...] = ()
    failure: str | None = None  # what its container's last run left as its termination message, if seen
    runs: str | None = None  # the revision of the config it answers it runs (None: it does not answer)


@dataclass(frozen=True)
class Observed:
    now: float  # epoch seconds
    revisions: frozenset[str] = frozenset()  # revisions whose pipeline ConfigMap exists
    drivers: tuple[DriverFacts, ...] = ()


@dataclass(frozen=True)
class Target:
    revision: str
    update_strategy: UpdateStrategy
    diff: SpecDiff | None = None  # diff_base's spec -> this one; needed when diff_base names a revision
    available: tuple[Strategy, ...] = STRATEGIES_CHEAPEST_FIRST  # the strategies the caller carries out
