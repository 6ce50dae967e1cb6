"""What applying a changed StreamingApp would do to the running one: per query, the strategy `auto` picks and what
each stated strategy would do instead. Pure: `sluice plan` prints it; the operator plans its rollouts with the
same classify and choose_strategy (operator/tests/test_change_plan.py holds the two to the same cases)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sluice.api.app import Strategy, StreamingAppSpec, revision
from sluice.api.contract import QueryAction

from .choice import STRATEGIES_CHEAPEST_FIRST, Refusal, choose_strategy, needs_new_driver, query_steps
from .diff import Change, SpecDiff, classify


@dataclass(frozen=True)
class QueryOutcome:
    name: str
    action: QueryAction  # under the strategy rolled out (auto's where the stated one is refused)
    change: str  # none, compatible (restarts on its checkpoint), incompatible (needs a new checkpoint)
    reasons: tuple[str, ...] = ()  # "spec path: why"
    rewind_ms: int | None = None  # a migrated query re-reads this much event time; None: nothing carries over


@dataclass(frozen=True)
class StrategyOption:
    strategy: Strategy
    safe: bool
    new_driver: bool = False
    why_not: str | None = None  # the refusal, when unsafe


@dataclass(frozen=True)
class ChangePlan:
    requested: str  # the new spec's updateStrategy.type
    strategy: Strategy | None  # what rolls out; None: no rollout (nothing the driver runs changed) or refused
    auto: Strategy | None  # what type auto picks
    new_driver: bool
    queries: tuple[QueryOutcome, ...]
    runtime: tuple[str, ...] = ()  # what only a new driver applies (image, Spark version, resources, …)
    unaffected: tuple[str, ...] = ()  # changed paths applied without a rollout (executors, autoscaling, topics…)
    options: tuple[StrategyOption, ...] = ()
    refusal: str | None = None  # why the stated strategy is refused: nothing would roll out
    # The revision stays and only runtime settings change (Spark version, resources, sparkConf, pod settings):
    # no rollout; the SparkApplication gets the new spec and spark-operator resubmits the driver (a restart on the
    # same checkpoints, with no rollback).
    resubmit: bool = False

    @property
    def rollout(self) -> bool:
        return self.strategy is not None or self.refusal is not None

    @property
    def changes(self) -> bool:
        return self.rollout or self.resubmit or bool(self.unaffected)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rollout": self.rollout, "changes": self.changes}


def plan_change(old: StreamingAppSpec, new: StreamingAppSpec) -> ChangePlan:
    """`old`: the running revision's spec as the operator runs it; `new`: the changed one, its operator defaults
    filled in the same way (runs_like)."""
    diff = classify(old, new)
    requested = new.updateStrategy.type
    if revision(old) == revision(new):  # what the operator rolls out is a new revision
        runtime = tuple(map(str, diff.runtime))
        return ChangePlan(
            requested, None, None, bool(runtime), _outcomes(diff, requested), runtime, diff.unaffected,
            resubmit=bool(runtime),
        )  # fmt: skip
    if not diff.needs_rollout:  # a new revision adopted as it is (a claim's size, say): nothing restarts
        return ChangePlan(requested, None, None, False, _outcomes(diff, requested), unaffected=diff.unaffected)
    chosen = choose_strategy(requested, diff)
    auto = choose_strategy("auto", diff)
    auto_strategy = None if isinstance(auto, Refusal) else auto
    strategy = None if isinstance(chosen, Refusal) else chosen
    return ChangePlan(
        requested=requested,
        strategy=strategy,
        auto=auto_strategy,
        new_driver=strategy is not None and needs_new_driver(strategy, diff),
        queries=_outcomes(diff, requested if strategy is not None else "auto"),
        runtime=tuple(map(str, diff.runtime)),
        unaffected=diff.unaffected,
        options=tuple(_option(s, diff) for s in STRATEGIES_CHEAPEST_FIRST),
        refusal=chosen.message if isinstance(chosen, Refusal) else None,
    )


def _outcomes(diff: SpecDiff, requested: str) -> tuple[QueryOutcome, ...]:
    steps = {s.name: s for s in query_steps(diff, migrate_every_change=requested == "checkpointMigration")}
    return tuple(
        QueryOutcome(
            name=q.name,
            action=steps[q.name].action,
            change=Change(q.change).name.lower(),
            reasons=tuple(str(r) for r in q.reasons),
            rewind_ms=steps[q.name].rewindMs,
        )
        for q in diff.queries
    )


def _option(strategy: Strategy, diff: SpecDiff) -> StrategyOption:
    chosen = choose_strategy(strategy, diff)
    if isinstance(chosen, Refusal):
        return StrategyOption(strategy, safe=False, why_not=chosen.message)
    return StrategyOption(strategy, safe=True, new_driver=needs_new_driver(strategy, diff))


def runs_like(new: StreamingAppSpec, running: StreamingAppSpec) -> StreamingAppSpec:
    """`new` as the operator would run it beside `running` (a revision's spec, its defaults filled in): what
    `new` leaves to the operator (checkpoint location and its store, image, Spark version) is what the app runs
    on, which the operator keeps (status.checkpointLocation, sparkImage, sparkVersion)."""
    checkpoint, spark = new.checkpoint, new.spark
    if checkpoint.location is None:
        kept = running.checkpoint
        checkpoint = checkpoint.model_copy(update={"location": kept.location, "s3": kept.s3})
    if spark.image is None:
        spark = spark.model_copy(
            update={"image": running.spark.image, "version": spark.version or running.spark.version}
        )
    elif spark.version is None:
        spark = spark.model_copy(update={"version": running.spark.version})
    return new.model_copy(update={"checkpoint": checkpoint, "spark": spark})
