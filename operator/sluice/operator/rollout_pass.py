"""A pass's rollout step: which revision the app's driver should run, and getting it there.

target   = the spec's revision, diffed against the base revision's spec (sluice.api.rollout)
drivers  = the app's driver (observed with the status) and a handover's second one (observer)
decision = rollout.decide (pure), its actions carried out (rollout_actions), decided again on what the
           drivers answered, so a handover's drain and activation follow each other in one pass; a phase whose
           actions ask a driver to change is recorded before it is asked (recorded_before_asking)
result   = RolloutPass: what the children (runner ConfigMap, SparkApplication) and the status are built from
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from sluice.api.contract import RunnerConfig

from . import children as ch
from . import spark_application as sparkapp
from .cluster import Cluster
from .model import RolloutStatus, StreamingAppSpec
from .observer import Drivers, Observer
from .rollout import Activate, Drain, DriverFacts, Observed, Resume, SwapQueries, Target, classify, diff_base
from .rollout.decide import (
    RolloutDecision,
    app_driver,
    decide_rollout,
    driver_behind,
    driver_facts,
    handover_driver,
    lost_base,
    on_standby,
    retired_drivers,
    revision_checkpoints,
    rollout_condition,
    runner_revision,
)
from .rollout_actions import Events, RolloutActions, RolloutContext, resubmit_lost
from .status import Observation, condition_of, replacing

log = logging.getLogger("sluice.operator")
ANSWERS_PER_PASS = 4  # decisions on what the drivers answered, at most, in one pass
DRIVER_REQUESTS = (SwapQueries, Drain, Activate, Resume)  # actions that change what a driver runs


@dataclass
class RolloutPass:
    """What a pass decided about the app's rollout, for the children and the status."""

    decision: RolloutDecision
    pin: sparkapp.DriverPin
    runner: RunnerConfig  # what a starting driver runs (pin.runs)
    driver_spec: StreamingAppSpec  # what the SparkApplication is submitted with (pin.submitted's spec)
    driver: str  # the SparkApplication of the app's driver after this pass (status.driver)
    driver_app: dict[str, Any] | None  # that SparkApplication as read in this pass
    retired: list[str]  # drivers a finished handover no longer needs
    condition: tuple[bool | None, str, str]
    events: Events
    status: dict[str, Any]  # stableRevision, rollout, checkpoints, driver
    stored_rollout: dict[str, Any] | None  # status.rollout as stored now (written in the pass: the phase asked in)
    moved: bool  # the rollout changed or runs: the runner ConfigMap may have to follow (also on a tick)


def recorded_rollout(status: dict[str, Any]) -> RolloutStatus | None:
    try:
        return RolloutStatus.model_validate(status["rollout"]) if status.get("rollout") else None
    except ValueError:
        log.warning("status.rollout does not parse; it is started afresh")
        return None


@dataclass
class _Recorded:
    """The rollout as the app's status recorded it before this pass."""

    rollout: RolloutStatus | None
    stable: str | None
    driver: str
    checkpoints: dict[str, str]

    @classmethod
    def of(cls, body: dict[str, Any]) -> _Recorded:
        status = body.get("status") or {}
        driver = status.get("driver") or body["metadata"]["name"]
        return cls(recorded_rollout(status), status.get("stableRevision"), driver, status.get("checkpoints") or {})


class Rollouts:
    def __init__(self, cluster: Cluster, observer: Observer, actions: RolloutActions) -> None:
        self.cluster = cluster
        self.observer = observer
        self.actions = actions

    def run(
        self,
        body: dict[str, Any],
        spec: StreamingAppSpec,
        spark_app: dict[str, Any] | None,
        obs: Observation,
        clock: float,
    ) -> RolloutPass:
        """Decide this pass of the app's rollout and carry out its actions. `spark_app`, `obs`: the app's driver
        as the pass observed it."""
        recorded = _Recorded.of(body)
        revision = ch.revision(spec)
        specs: dict[str, StreamingAppSpec] = {revision: spec}
        target, revisions = self._target(body, spec, revision, recorded, specs)
        events: Events = []
        facts = self._app_driver_facts(body, spark_app, obs, recorded, revision, specs, events)
        drivers, spark_apps = self._drivers(body, spark_app, obs, facts, recorded, clock)
        namespace = body["metadata"]["namespace"]
        events += [
            resubmit_lost(self.cluster, namespace, body["metadata"]["name"], pod) for pod in drivers.lost_submissions
        ]
        observed = Observed(clock, frozenset(revisions), tuple(drivers.facts.values()))
        submitted = sparkapp.submitted_revision(spark_app)
        decision = decide_rollout(
            body["metadata"]["name"],
            recorded.rollout,
            recorded.stable,
            target,
            observed,
            submitted,
            recorded.checkpoints,
        )
        events += [(e.type, e.reason, e.message) for e in decision.step.events]
        ctx = RolloutContext(body, decision, specs, obs, facts, recorded.checkpoints, drivers, recorded.driver, events)
        stored = (body.get("status") or {}).get("rollout")
        for _ in range(ANSWERS_PER_PASS):
            stored = self.recorded_before_asking(ctx, stored)
            answered = self.actions.carry_out(ctx, observed)
            if answered is None:
                break
            observed = answered
            step = ctx.decision.step
            ctx.decision = decide_rollout(
                body["metadata"]["name"], step.rollout, step.stable_revision, target, observed, submitted
            )
            events += [(e.type, e.reason, e.message) for e in ctx.decision.step.events]
        if facts.runs is not None:  # the spec the driver runs stays readable: what it is compared with
            ctx.decision = replace(ctx.decision, keep=ctx.decision.keep | {facts.runs})
        return self._result(body, spec, ctx, recorded, spark_apps, stored)

    def recorded_before_asking(self, ctx: RolloutContext, stored: dict[str, Any] | None) -> dict[str, Any] | None:
        """The rollout is written to the app's status before a driver is asked to swap, drain or start in a phase
        the status does not show yet: a drain or an activation takes seconds, and the status says what is
        happening meanwhile (and where an operator that dies in the middle left off). Returns the stored rollout."""
        rollout = ctx.decision.step.rollout
        if rollout is None or not any(isinstance(a, DRIVER_REQUESTS) for a in ctx.decision.step.actions):
            return stored
        if (
            stored is not None
            and stored.get("phase") == rollout.phase
            and stored.get("toRevision") == rollout.toRevision
        ):
            return stored
        now = rollout.model_dump(mode="json", exclude_none=True)
        self.cluster.record(ctx.namespace, ctx.app, {"rollout": replacing(stored, now)}, None)
        return now

    def _target(
        self,
        body: dict[str, Any],
        spec: StreamingAppSpec,
        revision: str,
        recorded: _Recorded,
        specs: dict[str, StreamingAppSpec],
    ) -> tuple[Target, set[str]]:
        """The spec's revision and its diff from the base revision; the revisions whose ConfigMap exists (read
        only while a rollout is due or runs; the new revision's ConfigMap is applied first)."""
        namespace, app = body["metadata"]["namespace"], body["metadata"]["name"]
        base = diff_base(recorded.rollout, recorded.stable, revision)
        busy = base is not None or (recorded.rollout is not None and not recorded.rollout.terminal)
        revisions: set[str] = set()
        if busy:
            revisions = self.cluster.revisions(namespace, app)
            if revision not in revisions:
                self.cluster.apply_revision(body, spec, self.cluster.bootstrap(spec, namespace))
                revisions.add(revision)
        diff = None
        if base is not None:
            base_spec = self.cluster.revision_spec(namespace, app, base, specs)
            diff = classify(base_spec, spec) if base_spec is not None else lost_base(base)
            if base_spec is None:
                log.warning("%s/%s: the spec of revision %s is gone (revisions %s)", namespace, app, base, revisions)
        return Target(revision, spec.updateStrategy, diff), revisions

    def _app_driver_facts(
        self,
        body: dict[str, Any],
        spark_app: dict[str, Any] | None,
        obs: Observation,
        recorded: _Recorded,
        revision: str,
        specs: dict[str, StreamingAppSpec],
        events: Events,
    ) -> DriverFacts:
        """The app's driver as the rollout sees it; one found behind the revision the status claims is restarted
        (rollout_actions.restart_behind_driver) and seen as the pending driver spark-operator starts next (its
        answer is no longer the pass's: nothing more is asked of it, and the status does not show it running)."""
        restarts = int(((spark_app or {}).get("status") or {}).get("executionAttempts") or 0)
        submitted = sparkapp.submitted_revision(spark_app) or ""
        facts = driver_facts(recorded.driver, submitted, obs.spark_state, restarts, obs.driver)
        claimed = runner_revision(recorded.rollout, recorded.stable, revision)  # what the status says it runs
        behind = driver_behind(recorded.rollout, facts if spark_app else None, claimed, revision)
        if behind is not None:
            restarted = self.actions.restart_behind_driver(body, recorded.driver, spark_app, behind, claimed, specs)
            if restarted is not None:
                events.append(restarted)
                facts = replace(facts, state="pending", queries=(), runs=None)
                obs.driver = obs.driver_address = None
        return facts

    def _drivers(
        self,
        body: dict[str, Any],
        spark_app: dict[str, Any] | None,
        obs: Observation,
        facts: DriverFacts,
        recorded: _Recorded,
        clock: float,
    ) -> tuple[Drivers, dict[str, dict[str, Any] | None]]:
        """The app's driver and a handover's second one (observed here), with their SparkApplications."""
        drivers = Drivers()
        if spark_app is not None:
            drivers.facts[recorded.driver] = facts
            if obs.driver_address is not None:
                drivers.addresses[recorded.driver] = obs.driver_address
        spark_apps = {recorded.driver: spark_app}
        second = handover_driver(recorded.rollout)
        if second is not None:
            namespace = body["metadata"]["namespace"]
            spark_apps[second] = self.cluster.spark_application(namespace, second)
            self.observer.second_driver(namespace, second, spark_apps[second], drivers, clock)
        return drivers, spark_apps

    def _result(
        self,
        body: dict[str, Any],
        spec: StreamingAppSpec,
        ctx: RolloutContext,
        recorded: _Recorded,
        spark_apps: dict[str, dict[str, Any] | None],
        stored_rollout: dict[str, Any] | None,
    ) -> RolloutPass:
        namespace, app = ctx.namespace, ctx.app
        decision, rollout = ctx.decision, ctx.decision.step.rollout
        old = condition_of(body.get("status") or {}, "Rollout")
        refusal = decision.step.refusal
        if refusal is not None and old.get("message") != refusal.message:
            ctx.events.append(("Warning", refusal.reason, refusal.message))
        driver = app_driver(rollout, recorded.driver)
        runs = decision.runner_revision
        runs_spec = self.cluster.revision_spec(namespace, app, runs, ctx.specs) or spec
        submitted_now = decision.submitted_revision
        if driver != recorded.driver:  # the handover's driver took over: what it was submitted for stays
            spark_apps.setdefault(driver, self.cluster.spark_application(namespace, driver))
            submitted_now = sparkapp.submitted_revision(spark_apps[driver]) or runs
        folders = revision_checkpoints(runs, recorded.checkpoints, rollout)
        standby = on_standby(rollout, driver, driver, spec.updateStrategy.rollback.enabled)
        stable = decision.step.stable_revision
        checkpoints = revision_checkpoints(stable, recorded.checkpoints, rollout)[0] if stable else {}
        bootstrap = self.cluster.bootstrap(runs_spec, namespace)
        return RolloutPass(
            decision=decision,
            pin=sparkapp.DriverPin(runs, submitted_now),
            runner=ch.runner_config(app, namespace, runs_spec, bootstrap, *folders, standby=standby),
            driver_spec=self.cluster.revision_spec(namespace, app, submitted_now, ctx.specs) or runs_spec,
            driver=driver,
            driver_app=spark_apps.get(driver),
            retired=retired_drivers(rollout, driver),
            condition=rollout_condition(decision.step, ch.revision(spec)),
            events=ctx.events,
            status={
                "stableRevision": stable,
                "rollout": rollout.model_dump(mode="json", exclude_none=True) if rollout else None,
                "checkpoints": checkpoints or None,
                "driver": None if driver == app else driver,
            },
            stored_rollout=stored_rollout,
            moved=rollout != recorded.rollout or (rollout is not None and not rollout.terminal),
        )
