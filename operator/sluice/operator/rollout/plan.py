"""Rolling updates: the state machine kept in `status.rollout` (the strategy is chosen by strategy.py).

Per reconcile::

    base = diff_base(status.rollout, status.stableRevision, revision)   # which spec the new one is compared to
    diff = classify(spec_of(base), spec) if base else None
    result = step(app, status.rollout, status.stableRevision, Target(revision, spec.updateStrategy, diff),
                  Observed(now, revisions, drivers))
    carry out result.actions, post result.events, then write result.rollout and result.stable_revision;
    result.refusal: an explicit updateStrategy.type that is unsafe for the change (a condition, no rollout)

Pure: the same status and observations give the same result. Actions are "ensure" requests (doing one
twice is harmless) and are repeated while their phase lasts, so an operator killed mid-rollout finishes
it after its restart. Write the status only after every action succeeded: a transition's actions are
then repeated until it is recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

from sluice.api.contract import QueryAction, QueryStep
from sluice.api.rollout import Refusal
from sluice.api.times import format_time, parse_time

from ..model import RolloutPhase, RolloutStatus, UpdateStrategy
from .actions import (
    Action,
    Activate,
    ApplyRevision,
    DeleteDriver,
    Drain,
    Event,
    ReleaseRevision,
    Resume,
    StartDriver,
    Step,
    SwapQueries,
    migrated_folder,
    rollback_folder,
)
from .observed import DriverFacts, Observed, QueryFacts, Target
from .strategy import deadline_after, plan

HEALTHY_BATCHES = 3  # batches every query of a new revision completes before it is healthy
CRASH_LOOP_RESTARTS = 3  # driver restarts since the rollout began that count as a crash loop

# ----------------------------------------------------------------------------------- state machine


def diff_base(rollout: RolloutStatus | None, stable_revision: str | None, target_revision: str) -> str | None:
    """The revision whose spec a new rollout to `target_revision` starts from, or None when none is due: no
    stable revision yet (the first one is adopted), a rollout in progress (it finishes first), the target
    already there, or the target is the one that just rolled back or failed (the next change rolls out)."""
    if stable_revision is None or (rollout is not None and not rollout.terminal):
        return None
    failed = rollout is not None and rollout.phase == "Failed"
    base = rollout.toRevision if failed and rollout else stable_revision
    tried = rollout is not None and rollout.phase in ("RolledBack", "Failed") and rollout.toRevision == target_revision
    return None if target_revision == base or tried else base


def step(
    app: str, rollout: RolloutStatus | None, stable_revision: str | None, target: Target, observed: Observed
) -> Step:
    if stable_revision is None and rollout is None:
        return Step(
            None,
            target.revision,
            events=(Event("Normal", "StableRevision", f"revision {target.revision} is the first one"),),
        )
    if rollout is not None and not rollout.terminal:
        reverted = target.revision == rollout.fromRevision and rollout.phase != "RollingBack"
        abort = f"the spec went back to revision {rollout.fromRevision}" if reverted else None
        waiting = (
            f"revision {target.revision} rolls out once the rollout to {rollout.toRevision} is over"
            if target.revision not in (rollout.fromRevision, rollout.toRevision)
            else None
        )
        return _continue(rollout, stable_revision, target, observed, abort, waiting=waiting)
    base = diff_base(rollout, stable_revision, target.revision)
    if base is None:
        return Step(rollout, stable_revision)
    if target.diff is None:
        raise ValueError(f"classify revision {target.revision} against revision {base} first")
    if not target.diff.needs_rollout:
        unaffected = ", ".join(target.diff.unaffected) or "nothing the driver runs"
        adopted = target.revision if base == stable_revision else stable_revision
        return Step(
            rollout,
            adopted,
            events=(
                Event(
                    "Normal",
                    "NoRollout",
                    f"revision {base} -> {target.revision}: no rollout, only {unaffected} changed",
                ),
            ),
        )
    planned = plan(app, target.diff, base, target.revision, target.update_strategy, observed, target.available)
    if isinstance(planned, Refusal):
        return Step(rollout, stable_revision, refusal=planned)
    event = Event("Normal", "RolloutPlanned", f"revision {base} -> {target.revision} by {planned.message}")
    return _continue(planned, stable_revision, target, observed, abort=None, first_events=(event,))


def _continue(
    rollout: RolloutStatus,
    stable_revision: str | None,
    target: Target,
    observed: Observed,
    abort: str | None,
    first_events: tuple[Event, ...] = (),
    waiting: str | None = None,
) -> Step:
    rollout = _with_new_driver_failure(rollout, observed)
    events = list(first_events)
    actions: list[Action] = []
    for _ in range(len(get_args(RolloutPhase))):  # each phase is entered at most once per call
        moved = _transition(_View(rollout, observed), target.update_strategy, abort)
        if moved is None:
            break
        rollout, event = moved
        events.append(event)
        if rollout.terminal:
            actions += _cleanup(_View(rollout, observed))
    if not rollout.terminal:
        actions += _ensure(_View(rollout, observed))
    stable = rollout.toRevision if rollout.phase == "Complete" else stable_revision
    return Step(rollout, stable, tuple(actions), tuple(events), waiting=waiting)


_PHASE_ORDER: tuple[RolloutPhase, ...] = ("Planned", "Draining", "Starting", "Verifying", "Complete")
Pinned = Literal["all", "changed", "none"]


@dataclass(frozen=True)
class _View:
    """A rollout together with what is observed, and the questions the machine asks of them."""

    rollout: RolloutStatus
    observed: Observed

    @cached_property
    def _drivers(self) -> dict[str, DriverFacts]:
        return {d.name: d for d in self.observed.drivers}

    @property
    def now(self) -> float:
        return self.observed.now

    @property
    def steps(self) -> tuple[QueryStep, ...]:
        return tuple(self.rollout.queries)

    @property
    def back_steps(self) -> tuple[QueryStep, ...]:
        """The steps that return to the stable revision (reverse_steps), the queries of backCheckpoints moving
        onto their new checkpoints."""
        rewinds = {q: self.rollout.rollbackRewindMs[q] for q in self.rollout.backCheckpoints}
        return reverse_steps(self.steps, rewinds)

    def back_checkpoints(self) -> dict[str, str]:
        """Where a rollback moves each migrated query: its old checkpoint's state does not know what the new
        query wrote since the cut (a window of it straddling the new query's cut would count records again), so
        its old plan goes onto a new checkpoint, rewound from that cut as a migration is. Whether the new query
        wrote anything is the driver's to tell, from that query's checkpoint (Migration.fallbackCheckpoint): the
        operator may not hear from it (a driver restarting) as the rollback begins."""
        rollout = self.rollout
        return {
            s.name: rollback_folder(s.name, rollout.fromRevision, rollout.fromCheckpoints.get(s.name, s.name))
            for s in self.steps
            if s.action == "migrate" and s.name in rollout.rollbackRewindMs
        }

    def not_handed_back(self) -> list[str]:
        """The queries a rollback moved onto new checkpoints that have not completed a batch there (their old
        checkpoint is still where a restart would hand over from), unless they have nothing to read."""
        drivers = self.backward_drivers()
        return [
            f"{name} completed no batch on checkpoint {folder}"
            for name, folder in self.rollout.backCheckpoints.items()
            if (query := self.query(drivers, name, self.rollout.fromRevision)) is None
            or (query.batches < 1 and query.backlog != 0)
        ]

    @property
    def standby(self) -> bool:
        """The new driver starts and waits while the old one drains (all new-driver strategies but restart)."""
        return self.rollout.newDriver and self.rollout.strategy != "restart"

    def past_deadline(self) -> bool:
        return self.now > parse_time(self.rollout.deadline)

    # --------------------------------------------------------------------------- drivers
    def driver(self, name: str) -> DriverFacts | None:
        return self._drivers.get(name)

    def old_drivers(self) -> list[DriverFacts]:
        return [d for ref in self.rollout.fromDrivers if (d := self.driver(ref.name)) and d.name != self.new_name]

    @property
    def new_name(self) -> str:
        return self.rollout.toDriver

    @property
    def stable_name(self) -> str:
        """The driver a rollback starts when the stable revision's driver is gone."""
        names = [ref.name for ref in self.rollout.fromDrivers]
        return names[0] if names else f"{self.new_name}-stable"

    def in_place_drivers(self) -> list[DriverFacts]:
        """The drivers an in-driver rollout works in: the running ones (a fallback may have started toDriver)."""
        names = [ref.name for ref in self.rollout.fromDrivers] + [self.new_name]
        return [d for n in dict.fromkeys(names) if (d := self.driver(n))]

    def forward_drivers(self) -> list[DriverFacts]:
        if self.rollout.newDriver:
            return [d for d in [self.driver(self.new_name)] if d]
        return self.in_place_drivers()

    def backward_drivers(self) -> list[DriverFacts]:
        if self.rollout.newDriver:
            names = dict.fromkeys([ref.name for ref in self.rollout.fromDrivers] + [self.stable_name])
            return [d for n in names if (d := self.driver(n)) and n != self.new_name]
        return self.in_place_drivers()

    def crash_loops(self, drivers: Iterable[DriverFacts]) -> list[str]:
        baseline = {ref.name: ref.restarts for ref in self.rollout.fromDrivers}
        last = self.rollout.lastDriverFailure if self.rollout.newDriver else None
        return [
            f"driver {d.name} restarted {d.restarts - baseline.get(d.name, 0)} times"
            + (f", last: {last}" if last and d.name == self.new_name else "")
            for d in drivers
            if d.restarts - baseline.get(d.name, 0) >= CRASH_LOOP_RESTARTS
        ]

    # --------------------------------------------------------------------------- queries
    @staticmethod
    def query(drivers: Iterable[DriverFacts], name: str, revision: str) -> QueryFacts | None:
        found = [q for d in drivers if d.state == "running" for q in d.queries if q.name == name]
        return next((q for q in found if q.revision == revision), found[0] if found else None)

    def not_running(
        self, drivers: list[DriverFacts], revision: str, steps: Iterable[QueryStep], pinned: Pinned
    ) -> list[str]:
        """What keeps the steps' queries from running `revision` (empty: they do). Which queries must report
        that revision: all (a new driver runs every query on its plan), the changed ones (in-driver: the others
        run on untouched), none (a resumed driver runs what it ran)."""
        missing = []
        for s in steps:
            query = self.query(drivers, s.name, revision)
            if s.action == "stop":
                if query is not None and query.active:
                    missing.append(f"{s.name} still runs")
            elif query is None or not query.active:
                missing.append(f"{s.name} is not running")
            elif (pinned == "all" or (pinned == "changed" and s.action != "keep")) and query.revision != revision:
                missing.append(f"{s.name} runs revision {query.revision}")
        return missing

    def not_healthy(self) -> list[str]:
        drivers, revision = self.forward_drivers(), self.rollout.toRevision
        missing = self.not_running(drivers, revision, self.steps, self.forward_pinning)
        for s in self.steps:
            query = self.query(drivers, s.name, revision)
            if s.action != "stop" and query and query.batches < HEALTHY_BATCHES and query.backlog != 0:
                missing.append(f"{s.name} completed {query.batches} of {HEALTHY_BATCHES} batches")
        return missing

    @property
    def forward_pinning(self) -> Pinned:
        return "all" if self.rollout.newDriver else "changed"

    def failure(self) -> str | None:
        drivers = self.forward_drivers()
        failed = [
            f"query {q.name} failed: {q.error}"
            for d in drivers
            for q in d.queries
            if q.error and q.revision == self.rollout.toRevision
        ]
        problems = self.crash_loops(drivers) + failed
        return "; ".join(problems) if problems else None

    def in_place_drained(self) -> bool:
        """No query the rollout changes runs the old plan any more."""
        changing = {s.name for s in self.steps if s.action not in ("keep", "start")}
        return not any(
            q.active and q.revision != self.rollout.toRevision and q.name in changing
            for d in self.in_place_drivers()
            if d.state == "running"
            for q in d.queries
        )


def _goal_missing(view: _View) -> list[str]:
    """What the current forward phase still waits for (empty: it is done)."""
    rollout = view.rollout
    if rollout.phase == "Planned":
        missing = [] if rollout.toRevision in view.observed.revisions else [f"ConfigMap of {rollout.toRevision}"]
        new = view.driver(view.new_name)
        if view.standby and (new is None or new.state not in ("standby", "running")):
            missing.append(f"driver {view.new_name} on standby")
        return missing
    if rollout.phase == "Draining":
        if rollout.newDriver:
            return [f"driver {d.name} drained" for d in view.old_drivers() if d.state not in ("drained", "failed")]
        return [] if view.in_place_drained() else ["changed queries stopped"]
    if rollout.phase == "Starting":
        return view.not_running(view.forward_drivers(), rollout.toRevision, view.steps, view.forward_pinning)
    return view.not_healthy()


def _transition(view: _View, update_strategy: UpdateStrategy, abort: str | None) -> tuple[RolloutStatus, Event] | None:
    rollout, now = view.rollout, format_time(view.now)
    if rollout.terminal:
        return None
    if rollout.phase == "RollingBack":
        drivers = view.backward_drivers()
        pinned: Pinned = "none" if rollout.newDriver else "changed"
        if not view.not_running(drivers, rollout.fromRevision, view.back_steps, pinned) and not view.not_handed_back():
            return (
                _moved(rollout, "RolledBack", now, finished=True),
                Event("Warning", "RolledBack", f"back on revision {rollout.fromRevision}: {rollout.message}"),
            )
        if view.past_deadline():
            message = (
                f"rollback to revision {rollout.fromRevision} did not complete within "
                f"{update_strategy.rollback.healthTimeout} ({rollout.message})"
            )
            return _moved(rollout, "Failed", now, finished=True, message=message), Event(
                "Warning", "RolloutFailed", message
            )
        return None
    failure = abort or view.failure()
    missing = _goal_missing(view)
    if failure is None and not missing:
        next_phase = _PHASE_ORDER[_PHASE_ORDER.index(rollout.phase) + 1]
        return _moved(rollout, next_phase, now, finished=next_phase == "Complete"), _forward_event(view, next_phase)
    if failure is None and view.past_deadline():
        failure = f"not healthy within {update_strategy.rollback.healthTimeout}: {'; '.join(missing)}"
    if failure is None:
        return None
    if not update_strategy.rollback.enabled:
        message = f"revision {rollout.toRevision} failed, rollback is disabled: {failure}"
        return _moved(rollout, "Failed", now, finished=True, message=message), Event(
            "Warning", "RolloutFailed", message
        )
    rolling_back = _moved(
        rollout, "RollingBack", now, message=failure, deadline=deadline_after(view.observed, update_strategy)
    ).model_copy(update={"backCheckpoints": view.back_checkpoints()})
    return rolling_back, Event("Warning", "RollingBack", f"to revision {rollout.fromRevision}: {failure}")


def _moved(
    rollout: RolloutStatus, phase: RolloutPhase, now: str, finished: bool = False, **changes: str
) -> RolloutStatus:
    return rollout.model_copy(update={"phase": phase, **({"finishedAt": now} if finished else {}), **changes})


def _forward_event(view: _View, phase: RolloutPhase) -> Event:
    rollout = view.rollout
    changing = ", ".join(s.name for s in view.steps if s.action != "keep") or "no query"
    messages = {
        "Draining": (
            f"driver(s) {', '.join(d.name for d in view.old_drivers()) or 'none'} drain at a batch boundary"
            if rollout.newDriver
            else f"{changing} stop at a batch boundary"
        ),
        "Starting": (
            f"driver {view.new_name} starts revision {rollout.toRevision}"
            if rollout.newDriver
            else f"{changing} start on revision {rollout.toRevision}"
        ),
        "Verifying": f"every query runs revision {rollout.toRevision}; healthy after {HEALTHY_BATCHES} batches each, "
        f"by {rollout.deadline}",
        "Complete": f"revision {rollout.toRevision} is healthy and stable",
    }
    return Event("Normal", f"Rollout{phase}", messages[phase])


# ----------------------------------------------------------------------------------------- actions


def reverse_steps(steps: Iterable[QueryStep], rewinds: Mapping[str, int] | None = None) -> tuple[QueryStep, ...]:
    """The steps that return to the stable revision: the same mechanism backwards. A migrated query named in
    `rewinds` migrates again (onto a new checkpoint of the stable revision, rewound by that much), else it is
    restored onto the checkpoint it left."""
    back: dict[QueryAction, QueryAction] = {
        "keep": "keep",
        "restart": "restart",
        "migrate": "restore",
        "start": "stop",
        "stop": "restore",
    }
    again = rewinds or {}
    return tuple(
        s.model_copy(update={"action": "migrate", "rewindMs": again[s.name]})
        if s.action == "migrate" and s.name in again
        else s.model_copy(update={"action": back[s.action], "rewindMs": None})
        for s in steps
    )


def _ensure(view: _View) -> Iterator[Action]:
    """What the current phase needs to be true, repeated while it lasts."""
    rollout = view.rollout
    if rollout.phase == "RollingBack":
        yield from _ensure_back(view)
        return
    yield ApplyRevision(rollout.toRevision)
    starting = rollout.phase in ("Starting", "Verifying")
    steps = view.steps
    if not rollout.newDriver:
        if rollout.phase == "Planned":
            return
        serving = [d for d in view.in_place_drivers() if d.state == "running"]
        yield from (SwapQueries(d.name, rollout.toRevision, steps) for d in serving)
        if starting and not view.in_place_drivers():
            yield StartDriver(view.new_name, rollout.toRevision, standby=False, steps=steps)
        return
    start = StartDriver(view.new_name, rollout.toRevision, standby=view.standby, steps=steps)
    if view.standby:
        yield start
    if rollout.phase != "Planned":
        yield from (Drain(d.name) for d in view.old_drivers() if d.state in ("running", "draining"))
    if starting and view.standby:
        yield Activate(view.new_name)
    elif starting:
        yield from (DeleteDriver(d.name) for d in view.old_drivers())
        yield start


def _ensure_back(view: _View) -> Iterator[Action]:
    rollout = view.rollout
    back = view.back_steps
    yield ApplyRevision(rollout.fromRevision)
    if not rollout.newDriver:
        serving = [d for d in view.in_place_drivers() if d.state == "running"]
        yield from (SwapQueries(d.name, rollout.fromRevision, back) for d in serving)
        if not view.in_place_drivers():
            yield StartDriver(view.stable_name, rollout.fromRevision, standby=False, steps=back)
        return
    new = view.driver(view.new_name)
    processing = new is not None and new.state in ("running", "draining")
    if new is not None:
        yield Drain(new.name) if processing and not view.crash_loops([new]) else DeleteDriver(new.name)
    if processing:
        return  # the stable revision resumes once the new driver wrote its last batch
    old = view.backward_drivers()
    restores = any(s.action in ("restore", "migrate") for s in back)
    yield from (
        Resume(d.name, rollout.fromRevision if restores else None) for d in old if d.state in ("draining", "drained")
    )
    if not old:
        yield StartDriver(view.stable_name, rollout.fromRevision, standby=False, steps=back)


def _with_new_driver_failure(rollout: RolloutStatus, observed: Observed) -> RolloutStatus:
    """The rollout with the last failure its new driver's container left (kept: spark-operator deletes a failed
    driver's pod before it submits the next one, and a crash loop is told with the error that caused it)."""
    if not rollout.newDriver or rollout.terminal:
        return rollout
    failure = next((d.failure for d in observed.drivers if d.name == rollout.toDriver and d.failure), None)
    if failure is None or failure == rollout.lastDriverFailure:
        return rollout
    return rollout.model_copy(update={"lastDriverFailure": failure})


def _cleanup(view: _View) -> Iterator[Action]:
    """Once, on reaching Complete or RolledBack: what the revision left behind is no longer needed."""
    rollout = view.rollout
    if rollout.phase == "Complete":
        if rollout.newDriver:
            yield from (DeleteDriver(d.name) for d in view.old_drivers())
        left = tuple(s.name for s in view.steps if s.action in ("migrate", "stop"))
        moved_from = tuple(rollout.fromCheckpoints.get(s.name, s.name) for s in view.steps if s.action == "migrate")
        yield ReleaseRevision(rollout.fromRevision, left, moved_from)
    elif rollout.phase == "RolledBack":
        if rollout.newDriver and view.driver(view.new_name):
            yield DeleteDriver(view.new_name)
        made = tuple(s.name for s in view.steps if s.action in ("migrate", "start"))
        moved_to = tuple(migrated_folder(s.name, rollout.toRevision) for s in view.steps if s.action == "migrate")
        left = tuple(rollout.fromCheckpoints.get(name, name) for name in rollout.backCheckpoints)
        yield ReleaseRevision(rollout.toRevision, made, moved_to + left)
