"""What a hot swap request asks of a running driver, checked before anything changes: which queries restart,
move to another checkpoint, start, stop or are kept. Pure: the run's current config and queries are passed in."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from sluice.api.contract import QueryStep, RunnerConfig

from .compiler import QueryPlan


class SwapRefused(Exception):
    """A hot swap this driver cannot do (nothing was changed): `field` is the request's field at fault."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def still_to_do(
    steps: Sequence[QueryStep], *, current: RunnerConfig, config: RunnerConfig, running: Mapping[str, str | None]
) -> list[QueryStep]:
    """The same swap asked twice changes nothing the second time: a query that already runs the revision (on
    its checkpoint) is kept, one already stopped needs no step; a `restore` of a query that does not run is
    a start on the checkpoint it kept. `running`: the run's queries, each with the revision it actively runs
    (None: it is not active)."""
    todo = []
    for step in steps:
        there = running.get(step.name) == config.revision and current.checkpoint(step.name) == config.checkpoint(
            step.name
        )
        if step.action == "stop" and step.name not in running:
            continue
        if step.action in ("restart", "start", "migrate", "restore") and there:
            step = step.model_copy(update={"action": "keep"})
        elif step.action == "restore" and step.name not in running:
            step = step.model_copy(update={"action": "start"})
        todo.append(step)
    return todo


def steps_by_action(
    steps: Sequence[QueryStep],
    *,
    current: RunnerConfig,
    config: RunnerConfig,
    plans: Mapping[str, QueryPlan],
    running: Collection[str],
) -> dict[str, list[str]]:
    """The steps' query names by action (migrate and restore: "move"), or SwapRefused. `running`: the run's
    queries (a failed one may be restarted on a new plan); `plans`: the new pipeline's."""
    for field in ("app", "namespace", "kafkaBootstrap", "kafkaSecurity", "checkpointRoot"):
        if getattr(config, field) != getattr(current, field):
            raise SwapRefused(f"a hot swap keeps the run's {field} ({getattr(current, field)!r})", f"config.{field}")
    names: dict[str, list[str]] = {"restart": [], "move": [], "start": [], "stop": [], "keep": []}
    for index, step in enumerate(steps):
        where = f"steps[{index}]"
        if any(step.name in listed for listed in names.values()):
            raise SwapRefused(f"query {step.name!r} has two steps", f"{where}.name")
        if step.action in ("migrate", "restore"):
            check_move(step, plans.get(step.name), current=current, config=config, where=where)
        elif step.action in ("restart", "keep") and config.checkpoint(step.name) != current.checkpoint(step.name):
            raise SwapRefused(
                f"{step.action} of query {step.name!r} would move it from its checkpoint "
                f"{current.checkpoint(step.name)} to {config.checkpoint(step.name)}: moving it takes migrate",
                f"{where}.action",
            )
        must_run, must_be_new = step.action != "start", step.action != "stop"
        if must_run != (step.name in running):
            raise SwapRefused(
                f"query {step.name!r} is {'not ' if must_run else ''}one of this driver's", f"{where}.name"
            )
        if must_be_new != (step.name in plans):
            raise SwapRefused(
                f"query {step.name!r} is {'not ' if must_be_new else ''}in the new pipeline", f"{where}.name"
            )
        names["move" if step.action in ("migrate", "restore") else step.action].append(step.name)
    missing = sorted((set(running) | set(plans)) - {name for listed in names.values() for name in listed})
    if missing:
        raise SwapRefused(f"no step for the queries {', '.join(missing)}", "steps")
    return names


def check_move(
    step: QueryStep, plan: QueryPlan | None, *, current: RunnerConfig, config: RunnerConfig, where: str
) -> None:
    """A query moves to another checkpoint only with its output kept exactly once: an output gate (rows
    final by event time) or, for a stateless query, a start exactly where the old one stopped (no rewind)."""
    if plan is None:
        return  # refused by the caller: not in the new pipeline
    if config.checkpoint(step.name) == current.checkpoint(step.name):
        raise SwapRefused(
            f"{step.action} of query {step.name!r} needs another checkpoint than the one it runs on "
            f"({current.checkpoint(step.name)}): set config.checkpoints[{step.name!r}]",
            f"{where}.action",
        )
    exact_without_gate = not plan.stateful and step.action == "migrate" and step.rewindMs == 0
    if plan.final_time is None and not exact_without_gate:
        raise SwapRefused(
            f"{step.action} of query {step.name!r}: its rows are not final per event-time window (a windowed "
            "aggregation in append mode), so no output gate can keep what the other checkpoint wrote from "
            "being written again (a stateless query migrates with rewindMs 0: where the old one stopped)",
            f"{where}.action",
        )
