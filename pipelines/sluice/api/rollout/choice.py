"""Which strategy rolls out a classified change: the cheapest safe one, or the refusal of an unsafe explicit
one, and each query's step. Pure; the operator's rollout and `sluice plan` both decide with it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sluice.api.app import Strategy
from sluice.api.contract import QueryAction, QueryStep

from .diff import Change, QueryChange, Reason, SpecDiff

STRATEGIES_CHEAPEST_FIRST: tuple[Strategy, ...] = ("hotSwap", "fencedHandover", "checkpointMigration", "restart")


@dataclass(frozen=True)
class Refusal:
    """An explicit updateStrategy.type that cannot roll out the change safely, or a change only strategies the
    caller does not carry out can roll out (reason StrategyNotAvailable): nothing is rolled out."""

    requested: str
    safe: tuple[Strategy, ...]
    message: str
    reason: str = "UnsafeUpdateStrategy"


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


def needs_new_driver(strategy: Strategy, diff: SpecDiff) -> bool:
    """The new revision runs in a driver of its own: a handover or a restart, or a migration with runtime changes."""
    return strategy in ("fencedHandover", "restart") or (strategy == "checkpointMigration" and bool(diff.runtime))
