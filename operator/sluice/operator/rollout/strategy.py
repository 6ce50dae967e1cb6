"""The strategy for a classified change: the cheapest safe one, or the refusal of an unsafe explicit one, and
the planned rollout with its per-query steps. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from sluice.api.contract import QueryAction, QueryStep
from sluice.api.pipeline import duration_ms

from ..autoscaler.collect import format_time
from ..model import DriverRef, RolloutStatus, Strategy, UpdateStrategy
from .actions import Refusal
from .diff import Change, QueryChange, Reason, SpecDiff
from .observed import STRATEGIES_CHEAPEST_FIRST, Observed


def unsafe_reasons(strategy: Strategy, diff: SpecDiff) -> tuple[Reason, ...]:
    """Why `strategy` cannot roll out the change; empty when it can. Only checkpointMigration gives a query a
    new checkpoint; only a new driver (every strategy but hotSwap) applies runtime changes."""
    if strategy == "checkpointMigration":
        return ()
    incompatible = tuple(r for q in diff.incompatible for r in q.reasons if r.change is Change.INCOMPATIBLE)
    return incompatible + (diff.runtime if strategy == "hotSwap" else ())


def safe_strategies(diff: SpecDiff) -> tuple[Strategy, ...]:
    """Cheapest first: a hot swap stops only the changed queries; a handover costs a second driver for a
    moment; a migration re-reads the rewind; a restart stops everything until the new driver runs."""
    return tuple(s for s in STRATEGIES_CHEAPEST_FIRST if not unsafe_reasons(s, diff))


def choose_strategy(
    requested: Strategy | Literal["auto"], diff: SpecDiff, available: tuple[Strategy, ...] = STRATEGIES_CHEAPEST_FIRST
) -> Strategy | Refusal:
    safe = safe_strategies(diff)
    usable = tuple(s for s in safe if s in available)
    if requested == "auto" and usable:
        return usable[0]
    if requested != "auto" and requested in usable:
        return requested
    if requested == "auto" or requested in safe:
        needed = requested if requested in safe else " or ".join(safe)
        why = "; ".join(dict.fromkeys(map(str, _strategy_reasons(safe[0], diff)[:3])))
        return Refusal(
            requested,
            safe,
            f"this change needs {needed}, which this operator version does not carry out yet ({why}); "
            f"the running revision keeps running. It carries out {', '.join(available)}",
            reason="StrategyNotAvailable",
        )
    reasons = unsafe_reasons(requested, diff)
    shown = "; ".join(dict.fromkeys(map(str, reasons[:3])))
    more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
    return Refusal(
        requested,
        safe,
        f"updateStrategy.type {requested} cannot roll out this change safely: {shown}"
        f"{more}. Safe: {', '.join(safe)} (or type auto)",
    )


def _strategy_reasons(strategy: Strategy, diff: SpecDiff) -> tuple[Reason, ...]:
    """What makes the change need `strategy` rather than a cheaper one."""
    if strategy == "checkpointMigration":
        return tuple(r for q in diff.incompatible for r in q.reasons if r.change is Change.INCOMPATIBLE)
    return diff.runtime or tuple(r for q in diff.changed for r in q.reasons)


def query_steps(diff: SpecDiff, migrate_every_change: bool = False) -> tuple[QueryStep, ...]:
    """migrate_every_change: an explicit checkpointMigration migrates compatible changes too."""
    return tuple(_query_step(q, migrate_every_change) for q in diff.queries)


def _query_step(query: QueryChange, migrate_every_change: bool) -> QueryStep:
    action = _query_action(query, migrate_every_change)
    return QueryStep(
        name=query.name,
        action=action,
        rewindMs=query.rewind_ms if action == "migrate" else None,
        reason=_main_reason(query),
    )


def _query_action(query: QueryChange, migrate_every_change: bool) -> QueryAction:
    if query.presence == "added":
        return "start"
    if query.presence == "removed":
        return "stop"
    if query.change is Change.INCOMPATIBLE or (query.change is Change.COMPATIBLE and migrate_every_change):
        return "migrate"
    return "restart" if query.change is Change.COMPATIBLE else "keep"


def _main_reason(query: QueryChange) -> str | None:
    worst = [r for r in query.reasons if r.change is query.change] or list(query.reasons)
    return str(worst[0]) if worst else None


def plan(
    app: str,
    diff: SpecDiff,
    from_revision: str,
    to_revision: str,
    update_strategy: UpdateStrategy,
    observed: Observed,
    available: tuple[Strategy, ...] = STRATEGIES_CHEAPEST_FIRST,
) -> RolloutStatus | Refusal:
    """A Planned rollout, or the refusal of an unsafe explicit strategy."""
    strategy = choose_strategy(update_strategy.type, diff, available)
    if isinstance(strategy, Refusal):
        return strategy
    steps = query_steps(diff, migrate_every_change=update_strategy.type == "checkpointMigration")
    new_driver = strategy in ("fencedHandover", "restart") or (strategy == "checkpointMigration" and bool(diff.runtime))
    return RolloutStatus(
        fromRevision=from_revision,
        toRevision=to_revision,
        strategy=strategy,
        phase="Planned",
        startedAt=format_time(observed.now),
        message=_summary(strategy, steps, diff, new_driver),
        newDriver=new_driver,
        fromDrivers=[DriverRef(name=d.name, restarts=d.restarts) for d in observed.drivers],
        toDriver=_free_driver_name(f"{app}-{to_revision}", observed),
        queries=list(steps),
        deadline=deadline_after(observed, update_strategy),
    )


def _summary(strategy: Strategy, steps: Iterable[QueryStep], diff: SpecDiff, new_driver: bool) -> str:
    parts = [
        f"{s.action} {s.name}" + (f" (rewind {s.rewindMs} ms)" if s.rewindMs else "")
        for s in steps
        if s.action != "keep"
    ]
    if new_driver:
        parts.append("new driver" + (f" for {', '.join(r.path for r in diff.runtime)}" if diff.runtime else ""))
    return f"{strategy}: {'; '.join(parts)}"


def _free_driver_name(name: str, observed: Observed) -> str:
    taken = {d.name for d in observed.drivers}
    return next(n for n in (name, *(f"{name}-{i}" for i in range(2, len(taken) + 3))) if n not in taken)


def deadline_after(observed: Observed, update_strategy: UpdateStrategy) -> str:
    return format_time(observed.now + duration_ms(update_strategy.rollback.healthTimeout) / 1000)
