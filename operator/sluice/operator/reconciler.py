"""One pass over one app: observe -> decide -> act -> record.

    observe  the app's SparkApplication and driver (observer), the last full pass's errors on a tick
    decide   the rollout (rollout_pass: rollout.decide, carried out by rollout_actions), the desired children
             (desired), the executor count (autoscaler.plan)
    act      topics and children applied (cluster), the count asked of the driver (autoscaler.realize)
    record   the status (status.status_for), written when due, and the annotations: the pass's last write (a
             rollout phase that asks a driver to change is written before it asks: rollout_pass)

The handlers, the timers and the children's events all come here; one pass per app runs at a time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sluice.api.times import format_time_seconds

from . import names
from . import spark_application as sparkapp
from .autoscaler.plan import plan_scaling
from .autoscaler.realize import realize_scaling
from .cluster import Cluster
from .desired import Invalid, admissible_spec, desired_state, kept_defaults, with_operator_defaults
from .driver_client import DriverClient
from .kube import Kube
from .model import StreamingAppSpec
from .observer import Observer, submitted_executors
from .rollout_actions import RolloutActions, resubmit_lost
from .rollout_pass import RolloutPass, Rollouts
from .settings import SETTINGS, Settings
from .status import (
    CHECKPOINT_READY,
    CLAIM_PENDING,
    KAFKA_LOGIN_FAILED,
    Observation,
    blocks_first_driver,
    checkpoint_condition,
    condition_of,
    last_driver_failure,
    status_for,
    status_write_due,
    waits_for_topics,
)


@dataclass
class Outcome:
    """What one pass decided: the whole status, annotations to set on the app, events to post."""

    status: dict[str, Any]
    annotations: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    scaling_kinds: list[str] = field(default_factory=list)  # up, down, manual: the changes decided


class Reconciler:
    def __init__(
        self,
        kube: Kube | None = None,
        driver_client: DriverClient | None = None,
        settings: Settings = SETTINGS,
    ) -> None:
        self.settings = settings
        self.cluster = Cluster(kube or Kube())
        self.driver_client = driver_client or DriverClient()
        self.observer = Observer(self.cluster, self.driver_client)
        actions = RolloutActions(self.cluster, self.driver_client, settings.checkpoints)
        self.rollouts = Rollouts(self.cluster, self.observer, actions)
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()

    @property
    def kube(self) -> Kube:
        return self.cluster.kube

    def reconcile_by_name(
        self, namespace: str, name: str, *, full: bool = True, periodic: bool = False
    ) -> Outcome | None:
        """Reconcile the app as it is now and record what changed; None when it is gone or being deleted. One pass
        per app at a time, each reading what the one before wrote: a pass that had read the app before another's
        status landed would write an older rollout phase back."""
        with self._app_lock(namespace, name):
            body = self.cluster.app(namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None
            outcome = self.reconcile(body, full=full, periodic=periodic)
            self._record(body, outcome)
            return outcome

    def _app_lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def reconcile(
        self, body: dict[str, Any], *, full: bool = True, periodic: bool = False, clock: float | None = None
    ) -> Outcome:
        """One pass. `full`: also apply topics and children (events and the resync); without it only the
        driver is observed and scaled. `periodic`: the tick, which also runs the autoscaler."""
        meta, namespace, app = body["metadata"], body["metadata"]["namespace"], body["metadata"]["name"]
        clock = time.time() if clock is None else clock
        now = format_time_seconds(clock)
        old_status = body.get("status") or {}
        admitted = admissible_spec(body.get("spec") or {}, self.settings, namespace)
        if isinstance(admitted, Invalid):  # nothing is created or changed: what runs keeps running
            obs = Observation(valid=admitted)
            return Outcome(status_for(obs, generation=meta.get("generation"), revision=None, children=[],
                                      old_status=old_status, now=now))  # fmt: skip
        spec = with_operator_defaults(admitted, namespace, self.settings, old_status)
        self.cluster.ensure_operator_access(namespace, self.settings.access, clock)
        full = full or waits_for_topics(old_status)  # a KafkaTopic not Ready yet: looked at again
        obs, spark_app = self._observe(body, spec, full, clock)
        resubmitted = [resubmit_lost(self.cluster, namespace, app, obs.lost_submission)] if obs.lost_submission else []
        rollout = self.rollouts.run(body, spec, spark_app, obs, clock)
        children = self._apply(body, spec, rollout, obs, full)
        obs.rollout = rollout.condition
        if obs.driver is None and obs.driver_failure is None and not spec.suspend:
            obs.driver_failure = last_driver_failure(old_status, rollout.pin.runs)
        plan = plan_scaling(spec, meta.get("annotations") or {}, obs.driver, clock, periodic=periodic)
        scaled = realize_scaling(self.cluster, self.driver_client, namespace, app, obs, plan)
        status = status_for(
            obs,
            generation=meta.get("generation"),
            revision=rollout.pin.runs,
            children=children,
            old_status={**old_status, "rollout": rollout.stored_rollout},  # as the pass left it stored
            now=now,
            scaling=plan.status,
            rollout=rollout.status,
            selector=names.executor_selector(app),
            kept=kept_defaults(spec),
        )
        events = [*resubmitted, *plan.events, *rollout.events, *scaled]
        return Outcome(status, plan.annotations, events, plan.kinds)

    # --------------------------------------------------------------------------- observe
    def _observe(
        self, body: dict[str, Any], spec: StreamingAppSpec, full: bool, clock: float
    ) -> tuple[Observation, dict[str, Any] | None]:
        """The app's driver; on a full pass the topics are applied first (a new revision may write a new topic),
        on a tick the last full pass's errors stand."""
        namespace, app = body["metadata"]["namespace"], body["metadata"]["name"]
        old_status = body.get("status") or {}
        recorded_driver = old_status.get("driver") or app
        spark_app = None if spec.suspend else self.cluster.spark_application(namespace, recorded_driver)
        obs = Observation(suspended=spec.suspend)
        if full:
            bootstrap = self.cluster.bootstrap(spec, namespace)
            topics = desired_state(app, namespace, spec, claims=self.settings.checkpoints, bootstrap=bootstrap)
            self.cluster.ensure_topics(body, topics, obs)
            if obs.kafka_error is None:  # an app that cannot log in gets nothing made (see _apply)
                self.cluster.ensure_control_secret(body)
            self._observe_checkpoint(app, namespace, spec, obs)
        else:
            obs.kafka_error, obs.topics_error, obs.topics_refused, obs.apply_error = self._last_full_errors(old_status)
            checkpoint = condition_of(old_status, CHECKPOINT_READY)
            if checkpoint.get("reason") == CLAIM_PENDING:  # read again until it binds (nothing else says so)
                self._observe_checkpoint(app, namespace, spec, obs)
            elif checkpoint:
                ok = {"True": True, "False": False}.get(checkpoint.get("status", ""))
                obs.checkpoint = (ok, checkpoint.get("reason", ""), checkpoint.get("message", ""))
        self.observer.app_driver(spark_app, namespace, obs, now=clock)
        return obs, spark_app

    def _observe_checkpoint(self, app: str, namespace: str, spec: StreamingAppSpec, obs: Observation) -> None:
        """The checkpoint claim, if any, and what CheckpointReady says of it."""
        name = names.checkpoint_claim_name(app, spec)
        if name is not None:
            obs.checkpoint_claim = self.cluster.checkpoint_claim(namespace, name)
        together = sparkapp.pods_kept_together(spec, self.settings.checkpoints, obs.checkpoint_claim)
        obs.checkpoint = checkpoint_condition(app, spec, obs.checkpoint_claim, together)

    @staticmethod
    def _last_full_errors(old_status: dict[str, Any]) -> tuple[str | None, str | None, dict[str, str], str | None]:
        """A tick applies nothing, so the errors of the last full pass stand (from its conditions)."""
        topics, submitted = condition_of(old_status, "TopicsReady"), condition_of(old_status, "DriverSubmitted")
        kafka_error = topics.get("message") or None if topics.get("reason") == KAFKA_LOGIN_FAILED else None
        topics_error = topics.get("message") or None if topics.get("reason") == "TopicError" else None
        refused = {"_": topics["message"]} if topics.get("reason") == "PartitionShrinkRefused" else {}
        apply_error = submitted.get("message") or None if submitted.get("reason") == "ApplyFailed" else None
        return kafka_error, topics_error, refused, apply_error

    # ------------------------------------------------------------------------------- act
    def _apply(
        self, body: dict[str, Any], spec: StreamingAppSpec, rollout: RolloutPass, obs: Observation, full: bool
    ) -> list[dict[str, Any]]:
        """The children as the rollout left them: all of them on a full pass (a driver a handover retired
        deleted), else only the runner ConfigMap when the rollout moved. A SparkApplication created now is
        observed at once. Returns the desired children."""
        namespace, app = body["metadata"]["namespace"], body["metadata"]["name"]
        desired = desired_state(
            app,
            namespace,
            spec,
            submitted_executors=submitted_executors(rollout.driver_app, rollout.pin.submitted),
            claims=self.settings.checkpoints,
            pin=rollout.pin,
            runner=rollout.runner,
            driver_spec=rollout.driver_spec,
            driver=None if rollout.driver == app else rollout.driver,
            driver_role=self.settings.access.driver_cluster_role,
            bootstrap=self.cluster.bootstrap(spec, namespace),
            claim=obs.checkpoint_claim,
        )
        # Nothing is made for a driver that could not log in to Kafka (obs.kafka_error says why), and no first
        # driver is submitted before Strimzi made its topics Ready; one that runs keeps its children.
        login_failed = obs.kafka_error is not None and rollout.driver_app is None
        if (obs.topics_pending or blocks_first_driver(obs.checkpoint)) and rollout.driver_app is None:
            desired.children = [c for c in desired.children if c["kind"] != "SparkApplication"]
        if full and not login_failed:
            self.cluster.ensure_children(body, desired, obs, rollout.decision.keep, rollout.driver, rollout.driver_app)
            for retired in rollout.retired:
                self.cluster.delete_driver(namespace, retired)
        elif rollout.moved and not full:
            runner = names.runner_configmap_name(rollout.driver)
            self.cluster.apply(next(c for c in desired.children if c["metadata"]["name"] == runner))
        if rollout.driver_app is None and not spec.suspend and full and not login_failed:
            self.observer.app_driver(self.cluster.spark_application(namespace, rollout.driver), namespace, obs)
        return [] if full and login_failed else desired.children

    # ---------------------------------------------------------------------------- record
    def _record(self, body: dict[str, Any], outcome: Outcome) -> None:
        """The pass's last write of the app: the status when due (status_write_due), the annotations that
        changed."""
        meta = body["metadata"]
        old = body.get("status") or {}
        due = status_write_due(old, outcome.status, self.settings.status_figures_seconds)
        annotations = meta.get("annotations") or {}
        changed = any(annotations.get(key) != value for key, value in outcome.annotations.items())
        self.cluster.record(
            meta["namespace"],
            meta["name"],
            outcome.status if due else None,
            outcome.annotations if changed else None,
        )

    def delete_topics(self, spec_raw: dict[str, Any], namespace: str) -> None:
        self.cluster.delete_topics(spec_raw, namespace)
