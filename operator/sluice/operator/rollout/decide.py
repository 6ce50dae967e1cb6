"""The rollouts this operator carries out: a hot swap and a checkpoint migration inside the running driver
(through its control API), a fenced handover to a second driver, and a restart by spark-operator (a new
SparkApplication spec). Pure.

A driver that (re)starts runs what the app's runner ConfigMap says, so which revision that is follows the
rollout: the stable one, or the new one from the moment its queries are swapped in. The SparkApplication
records the revision it was submitted for: changing it is what makes spark-operator resubmit, so it
changes only when a restart is decided. A migrated query runs on a checkpoint of the revision it moved in
(`<query>@<revision>`, kept in status.checkpoints once stable); the revision's config also says where that
checkpoint takes over from, so a driver that starts it (none ran the swap, or it restarted) hands over the
same way.

A fenced handover starts a second SparkApplication (`rollout.toDriver`, with a runner ConfigMap of its own) on
standby; the app's driver drains at a batch boundary, the new one is activated on the same checkpoints, and
once it is healthy it becomes the app's driver (status.driver) and the old one is deleted. Each driver's runner
config says standby while it must not run queries, so a driver that restarts meanwhile waits too. A change
that needs a new driver and a new checkpoint (a stateful change with a runtime change) is a checkpoint migration
carried out the same way: the new driver's migrated queries start on checkpoints of the new revision, behind the
drained driver's cut; rolled back, the drained driver resumes on a config whose restore steps take their output
back from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sluice.api.contract import DriverStatus, Migration, QueryStep
from sluice.api.rollout import Change, Reason, SpecDiff
from sluice.api.times import format_time

from ..model import RolloutStatus
from .actions import Event, Step, SwapQueries, migrated_folder
from .observed import DriverFacts, DriverState, Observed, QueryFacts, Target
from .plan import step

SWAPPED_PHASES = ("Draining", "Starting", "Verifying", "Complete")  # the new revision's queries are (being) swapped in
FAILED_SPARK_STATES = ("FAILED", "SUBMISSION_FAILED")


@dataclass(frozen=True)
class RolloutDecision:
    step: Step
    runner_revision: str  # what a driver that starts now runs (the runner ConfigMap)
    submitted_revision: str  # what the SparkApplication is submitted for: a change makes spark-operator resubmit
    keep: frozenset[str]  # the revisions whose pipeline ConfigMaps stay


def decide_rollout(
    app: str,
    rollout: RolloutStatus | None,
    stable_revision: str | None,
    target: Target,
    observed: Observed,
    submitted_revision: str | None,
    stable_checkpoints: Mapping[str, str] | None = None,
) -> RolloutDecision:
    """One pass of the rollout: plan.step, a restart completed at once
    (spark-operator resubmits the driver on the same checkpoints), and the revisions the driver is pinned to.
    `submitted_revision`: what the existing SparkApplication was submitted for (None: there is none).
    `stable_checkpoints`: status.checkpoints, which a new rollout records as where it moves queries from."""
    result = step(app, rollout, stable_revision, target, observed)
    planned = result.rollout
    fresh = planned is not None and not planned.terminal and (rollout is None or rollout.terminal)
    if fresh and planned is not None and stable_checkpoints:
        planned = planned.model_copy(update={"fromCheckpoints": dict(stable_checkpoints)})
        result = replace(result, rollout=planned)
    running = any(d.state == "running" for d in observed.drivers)
    if fresh and planned is not None and (planned.strategy == "restart" or not running):
        # A restart is spark-operator's (a new submitted revision); with no driver running (suspended, pending,
        # failed) the next driver to start runs the new revision, as a restart would (a migrating one hands its
        # queries over as it starts them: the revision's config says from where). A driver starting now may have
        # read the config before: once it answers, driver_behind finds it and the operator restarts it.
        starting = any(d.state == "pending" for d in observed.drivers)
        how = (
            "spark-operator resubmits the driver"
            if running
            else "a driver is starting: it runs this revision (restarted if it read the one before)"
            if starting
            else "no driver runs: the next one starts it"
        )
        migrating = planned.strategy == "checkpointMigration"
        where = "; migrated queries hand over as it starts them" if migrating else ", on the same checkpoints"
        done = planned.model_copy(
            update={
                "strategy": planned.strategy if migrating else "restart",
                "phase": "Complete",
                "finishedAt": format_time(observed.now),
                "newDriver": False,
                "message": f"{(planned.message or '').split(': ', 1)[-1]}; {how}{where}",
            }
        )
        event = Event("Normal", "RolloutRestart", f"revision {planned.toRevision}: {how}")
        result = Step(done, planned.toRevision, (), (*result.events[:1], event), waiting=result.waiting)
        if planned.strategy == "restart" or planned.newDriver:  # a runtime change: a new SparkApplication spec
            submitted_revision = planned.toRevision
    runner = runner_revision(result.rollout, result.stable_revision, target.revision)
    return RolloutDecision(result, runner, submitted_revision or runner, kept_revisions(result, target.revision))


def is_handover(rollout: RolloutStatus | None) -> bool:
    """The rollout runs the new revision in a second driver that waits on standby (a fenced handover, or a
    checkpoint migration together with a runtime change)."""
    return rollout is not None and rollout.newDriver and rollout.strategy in ("fencedHandover", "checkpointMigration")


def app_driver(rollout: RolloutStatus | None, recorded: str) -> str:
    """The SparkApplication of the app's driver: the recorded one (status.driver), until a handover to another
    one completes."""
    taken_over = is_handover(rollout) and rollout is not None and rollout.phase == "Complete"
    return rollout.toDriver if taken_over and rollout is not None else recorded


def handover_driver(rollout: RolloutStatus | None) -> str | None:
    """The second driver a handover in progress runs beside the app's (None: none)."""
    return rollout.toDriver if is_handover(rollout) and rollout is not None and not rollout.terminal else None


def retired_drivers(rollout: RolloutStatus | None, app_driver_name: str) -> list[str]:
    """The drivers a finished handover leaves behind, deleted on every full pass (the cleanup action is carried
    out once): the old ones once the new one took over, the new one once rolled back."""
    if not is_handover(rollout) or rollout is None:
        return []
    if rollout.phase == "Complete":
        return [ref.name for ref in rollout.fromDrivers if ref.name != app_driver_name]
    if rollout.phase == "RolledBack":
        return [rollout.toDriver] if rollout.toDriver != app_driver_name else []
    return []


def on_standby(rollout: RolloutStatus | None, driver: str, app_driver_name: str, rollback_enabled: bool) -> bool:
    """Whether the driver's runner config says standby: a driver that restarts must not start queries the other
    driver of a handover runs (or is about to). The new one waits until activated and again while it rolls back;
    the app's own waits from its drain until the rollout ends (a failed rollback leaves it waiting: it did not
    resume)."""
    if not is_handover(rollout) or rollout is None:
        return False
    new = driver == rollout.toDriver and driver != app_driver_name
    phase = rollout.phase
    if phase in ("Planned", "RollingBack"):
        return new
    if phase == "Draining":
        return True
    if phase in ("Starting", "Verifying"):
        return not new
    if phase == "Failed":
        return new if rollback_enabled else not new
    return False


def revision_checkpoints(
    revision: str, stable_checkpoints: Mapping[str, str], rollout: RolloutStatus | None
) -> tuple[dict[str, str], dict[str, Migration]]:
    """Where a driver running `revision` keeps each query's checkpoint (query -> subfolder, where it is not the
    query's name), and which of them take over from another one: the stable revision's folders, and for the
    revision a checkpoint migration goes to, each migrated query on a folder of that revision; rolled back, each
    takes its output back from there."""
    if rollout is None or rollout.strategy != "checkpointMigration":
        return dict(stable_checkpoints), {}
    if rollout.fromRevision == revision and rollout.phase in ("RollingBack", "RolledBack"):
        back = {
            s.name: Migration(
                fromCheckpoint=migrated_folder(s.name, rollout.toRevision),
                rewindMs=rollout.rollbackRewindMs[s.name],
                fallbackCheckpoint=rollout.fromCheckpoints.get(s.name, s.name),
            )
            if s.name in rollout.backCheckpoints
            else Migration(fromCheckpoint=migrated_folder(s.name, rollout.toRevision))
            for s in rollout.queries
            if s.action == "migrate"
        }
        return {**rollout.fromCheckpoints, **rollout.backCheckpoints}, back
    if rollout.toRevision != revision:
        return dict(stable_checkpoints), {}
    folders = dict(rollout.fromCheckpoints)
    migrations: dict[str, Migration] = {}
    for s in rollout.queries:
        if s.action == "migrate":
            folders[s.name] = migrated_folder(s.name, revision)
            migrations[s.name] = Migration(
                fromCheckpoint=rollout.fromCheckpoints.get(s.name, s.name), rewindMs=s.rewindMs
            )
    return folders, migrations


def lost_base(revision: str) -> SpecDiff:
    """The diff when the base revision's spec is gone (its ConfigMap deleted by hand): nothing is known to be
    safe in the running driver, so the change restarts it."""
    why = f"the spec of revision {revision} is gone (its ConfigMap was deleted)"
    return SpecDiff(runtime=(Reason("spec", Change.COMPATIBLE, why),))


def runner_revision(rollout: RolloutStatus | None, stable_revision: str | None, target_revision: str) -> str:
    """What the app's driver runs when it starts. In a handover, it keeps the stable revision (the new revision
    runs in the other driver) until that driver takes over."""
    if is_handover(rollout) and rollout is not None and rollout.phase != "Complete":
        return rollout.fromRevision
    if rollout is not None and rollout.phase not in ("RolledBack", "Failed", "Complete"):
        return rollout.toRevision if rollout.phase in SWAPPED_PHASES else rollout.fromRevision
    if rollout is not None and rollout.phase == "Failed":
        return rollout.toRevision  # rollback disabled, or it did not finish: what last ran forward
    return stable_revision or target_revision


def kept_revisions(result: Step, target_revision: str) -> frozenset[str]:
    """The spec's, the stable one, and the last rollout's two: a pass that read the app before this one's
    status was written still diffs against the revision it saw as stable (a spec gone would mean a restart)."""
    keep = {target_revision}
    if result.stable_revision:
        keep.add(result.stable_revision)
    if result.rollout is not None:
        keep.update((result.rollout.fromRevision, result.rollout.toRevision))
    return frozenset(keep)


# ----------------------------------------------------------------------------------- observations


def driver_facts(
    name: str,
    submitted_revision: str,
    spark_state: str | None,
    restarts: int,
    status: DriverStatus | None,
    failure: str | None = None,
) -> DriverFacts:
    """The app's driver as the rollout sees it, from spark-operator's state, the driver's /v1/status and what
    its container left when it ended (`failure`)."""
    if status is None:
        failed = (spark_state or "").upper() in FAILED_SPARK_STATES
        return DriverFacts(name, submitted_revision, "failed" if failed else "pending", restarts, failure=failure)
    backlog = {t.topic: t.backlog for t in status.topics}
    state: DriverState = status.state
    queries = tuple(
        QueryFacts(
            name=q.name,
            revision=q.revision or status.revision,
            active=q.active,
            batches=q.runBatches,
            backlog=sum(backlog.get(t, 0) for t in q.topics) if q.topics else None,
            error=q.error,
        )
        for q in status.queries
    )
    return DriverFacts(name, submitted_revision, state, restarts, queries, failure, runs=status.revision)


def driver_behind(rollout: RolloutStatus | None, driver: DriverFacts | None, runs: str, target: str) -> str | None:
    """The revision the app's driver runs when no rollout explains why it is not `runs` (what its runner config
    says, which the status claims): it read its config before a change was written (it was starting when a
    rollout completed at once, or it restarted on a stale mount). None: it runs `runs`, does not answer yet, or
    a rollout in progress or one that failed owns the difference; or it runs `target`, the spec's revision: a
    rollout to it swapped it in and its record was lost (an operator killed before its status write), and the
    rollout planned again in this pass finds the driver there."""
    settled = rollout is None or rollout.phase in ("Complete", "RolledBack")
    if not settled or driver is None or driver.state != "running" or driver.runs in (None, runs, target):
        return None
    return driver.runs


def with_driver_state(observed: Observed, driver: str, state: DriverState, started: tuple[QueryFacts, ...]) -> Observed:
    """The observation after the driver answered a state change: drained with no queries, or running `started`
    (the queries it started, no batch yet)."""
    drivers = tuple(
        replace(d, state=state, queries=started if state == "running" else ()) if d.name == driver else d
        for d in observed.drivers
    )
    return replace(observed, drivers=drivers)


def with_refused_swap(observed: Observed, swap: SwapQueries, error: str) -> Observed:
    """The observation after the driver refused to run `swap.revision` (it does not compile, or a query did not
    start on it; the old plan runs on): the steps' queries count as failed on that revision."""
    failed = tuple(
        QueryFacts(name=s.name, revision=swap.revision, active=False, error=error)
        for s in swap.steps
        if s.action not in ("keep", "stop")
    )
    drivers = tuple(
        replace(d, queries=(*(q for q in d.queries if q.name not in {f.name for f in failed}), *failed))
        if d.name == swap.driver
        else d
        for d in observed.drivers
    )
    return replace(observed, drivers=drivers)


def pending_swap(swap: SwapQueries, driver: DriverFacts) -> tuple[QueryStep, ...] | None:
    """The request that brings the driver's queries to the swap's revision, or None when they run it already: a
    swap restarts every query it names, so an `ensure` repeated every pass must not send it twice. Queries on
    the revision (or stopped, for `stop`) become `keep`, or are left out when they no longer run."""
    running = {q.name: q for q in driver.queries}
    steps: list[QueryStep] = []
    for s in swap.steps:
        query = running.get(s.name)
        there = query is not None and query.revision == swap.revision and query.active and not query.error
        if s.action == "stop":
            action = "stop" if query is not None else None
        elif s.action == "keep" or there:
            action = "keep" if query is not None else None
        elif s.action in ("migrate", "restore") and query is not None:
            action = s.action  # onto another checkpoint, behind an output gate
        else:  # restart, start, restore (a removed query back on the checkpoint it kept); one that does not run
            action = "start" if query is None else "restart"  # starts as its revision's config says
        if action is not None:
            steps.append(
                s.model_copy(update={"action": action, "rewindMs": s.rewindMs if action == "migrate" else None})
            )
    changes = any(s.action != "keep" for s in steps)
    return tuple(steps) if changes else None


def rollout_condition(result: Step, target_revision: str) -> tuple[bool | None, str, str]:
    """The Rollout condition: True when the spec's revision is the stable one, Unknown while a rollout runs,
    False when the spec's change was refused, rolled back or failed (the message says why)."""
    if result.refusal is not None:
        return False, result.refusal.reason, result.refusal.message
    rollout = result.rollout
    if rollout is None:
        return True, "Stable", ""
    message = rollout.message or ""
    if not rollout.terminal:
        waiting = f"; {result.waiting}" if result.waiting else ""
        return None, rollout.phase, f"revision {rollout.fromRevision} -> {rollout.toRevision}: {message}{waiting}"
    if rollout.phase != "Complete" and result.stable_revision == target_revision:
        return True, "Stable", f"the spec is back on the stable revision (the rollout to {rollout.toRevision}: "
        f"{rollout.phase})"
    return rollout.phase == "Complete", rollout.phase, message
