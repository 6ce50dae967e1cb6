"""The planned rollout of a classified change: the strategy sluice.api.rollout chooses, its per-query steps, the
drivers and the deadline. Pure."""

from __future__ import annotations

from collections.abc import Iterable

from sluice.api.contract import QueryStep
from sluice.api.rollout import (
    STRATEGIES_CHEAPEST_FIRST,
    Refusal,
    SpecDiff,
    choose_strategy,
    needs_new_driver,
    query_steps,
)
from sluice.api.times import duration_ms, format_time

from ..model import DriverRef, RolloutStatus, Strategy, UpdateStrategy
from .observed import Observed


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
    new_driver = needs_new_driver(strategy, diff)
    migrated = {s.name for s in steps if s.action == "migrate"}
    back_rewinds = {q.name: q.back_rewind_ms for q in diff.queries if q.name in migrated and q.back_rewind_ms}
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
        rollbackRewindMs=back_rewinds,
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
