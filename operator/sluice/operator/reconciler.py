"""The operator's I/O: applies what the planner decided and observes what came of it.

Children are written with server-side apply under one field manager, so re-applying is idempotent and
repairs drift (a child edited or deleted by hand comes back on the next pass).
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

import kopf

from sluice.api.contract import DriverStatus, Migration, RunnerConfig, StateResponse, SwapRequest, in_app

from . import children as ch
from .autoscaler.plan import ScalingPlan, needs_executor_request, plan_scaling
from .driver_client import DriverClient, DriverRefused, DriverUnavailable
from .kube import KindNotServed, Kube, KubeError
from .model import GROUP, KIND, VERSION, RolloutStatus, StreamingAppSpec
from .planner import (
    DesiredState,
    Invalid,
    Observation,
    admissible_spec,
    bootstrap_for,
    desired_state,
    driver_failure,
    last_driver_failure,
    parse_spec,
    status_for,
    status_write_due,
)
from .rollout import (
    Activate,
    ApplyRevision,
    DeleteDriver,
    Drain,
    DriverFacts,
    Observed,
    QueryFacts,
    ReleaseRevision,
    Resume,
    StartDriver,
    SwapQueries,
    Target,
    classify,
    diff_base,
)
from .rollout.decide import (
    RolloutDecision,
    app_driver,
    decide_rollout,
    driver_behind,
    driver_facts,
    handover_driver,
    lost_base,
    on_standby,
    pending_swap,
    retired_drivers,
    revision_checkpoints,
    rollout_condition,
    runner_revision,
    with_driver_state,
    with_refused_swap,
)
from .settings import SETTINGS, Settings
from .topics import AdminTopics, plan_topics

FIELD_MANAGER = "sluice-operator"
log = logging.getLogger("sluice.operator")


def _adopt(child: dict[str, Any], owner: dict[str, Any]) -> None:
    """kopf.adopt with the app as read (kopf reads its owner as a mapping; its types name its Body)."""
    kopf.adopt(child, owner=kopf.Body(cast(kopf.RawBody, owner)))


@dataclass
class RolloutPass:
    """What a pass decided about the app's rollout, for the children and the status."""

    decision: RolloutDecision
    pin: ch.DriverPin
    runner: RunnerConfig  # what a starting driver runs (pin.runs)
    driver_spec: StreamingAppSpec  # what the SparkApplication is submitted with (pin.submitted's spec)
    driver: str  # the SparkApplication of the app's driver after this pass (status.driver)
    driver_app: dict[str, Any] | None  # that SparkApplication as read in this pass
    retired: list[str]  # drivers a finished handover no longer needs
    condition: tuple[bool | None, str, str]
    events: list[tuple[str, str, str]]
    status: dict[str, Any]  # stableRevision, rollout, checkpoints, driver
    moved: bool  # the rollout changed or runs: the runner ConfigMap may have to follow (also on a tick)


def _recorded_rollout(status: dict[str, Any]) -> RolloutStatus | None:
    try:
        return RolloutStatus.model_validate(status["rollout"]) if status.get("rollout") else None
    except ValueError:
        log.warning("status.rollout does not parse; it is started afresh")
        return None


@dataclass
class Outcome:
    """What one pass decided: the whole status, annotations to set on the app, events to post."""

    status: dict[str, Any]
    annotations: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    scaling_kinds: list[str] = field(default_factory=list)  # up, down, manual: the changes decided


@dataclass
class _Drivers:
    """The app's drivers as this pass found them: facts for the rollout, control API addresses."""

    facts: dict[str, DriverFacts] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)


def _replaced(pod: dict[str, Any] | None, submitted: str | None) -> bool:
    """A driver pod on its way out: being deleted, or started for another submission than the SparkApplication's
    (spark-operator is replacing it)."""
    meta = (pod or {}).get("metadata") or {}
    ran = (meta.get("annotations") or {}).get(ch.SUBMITTED_REVISION_ANNOTATION)
    return bool(meta.get("deletionTimestamp")) or (ran is not None and submitted is not None and ran != submitted)


def submitted_revision(spark_app: dict[str, Any] | None) -> str | None:
    """The revision a SparkApplication was submitted for (None: none, or one made before rollouts)."""
    if spark_app is None:
        return None
    annotations = ((spark_app.get("spec") or {}).get("driver") or {}).get("annotations") or {}
    return annotations.get(ch.SUBMITTED_REVISION_ANNOTATION)


def submitted_executors(spark_app: dict[str, Any] | None, submitted: str) -> int | None:
    """The executor count a running SparkApplication was submitted with, as recorded on it (a hand edit of
    its spec is repaired back to it): changing it would make spark-operator resubmit. A driver resubmitted
    for another revision (a restart) starts with today's count (None)."""
    if spark_app is None or submitted_revision(spark_app) != submitted:
        return None
    recorded = (spark_app["metadata"].get("annotations") or {}).get(ch.SUBMITTED_EXECUTORS_ANNOTATION, "")
    return int(recorded) if recorded.isdigit() else None


class Reconciler:
    def __init__(
        self,
        kube: Kube | None = None,
        driver_client: DriverClient | None = None,
        settings: Settings = SETTINGS,
    ) -> None:
        self.settings = settings
        self.kube = kube or Kube()
        self.driver_client = driver_client or DriverClient()
        self._tokens: dict[tuple[str, str], str] = {}
        self._pipelines_differ_cache: dict[tuple[str, str, str, str], bool] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()

    # ------------------------------------------------------------------------- kube helpers
    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.kube.apply(body, FIELD_MANAGER)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get(api_version, kind, namespace, name)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.kube.delete(api_version, kind, namespace, name)

    # ---------------------------------------------------------------------------- reconcile
    def reconcile_by_name(
        self, namespace: str, name: str, *, full: bool = True, periodic: bool = False
    ) -> Outcome | None:
        """Reconcile the app as it is now and patch what changed; None when it is gone or being deleted. One pass
        per app at a time, each reading what the one before wrote: the handlers, the timer and the children's
        events all come here, and a pass that had read the app before another's status landed would write an
        older rollout phase back."""
        with self._app_lock(namespace, name):
            return self._reconcile_now(namespace, name, full=full, periodic=periodic)

    def _app_lock(self, namespace: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def _reconcile_now(self, namespace: str, name: str, *, full: bool, periodic: bool) -> Outcome | None:
        body = self.get(f"{GROUP}/{VERSION}", KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        outcome = self.reconcile(body, full=full, periodic=periodic)
        old = body.get("status") or {}
        patch: dict[str, Any] = {}
        if status_write_due(old, outcome.status, self.settings.status_figures_seconds):
            patch["status"] = outcome.status
        annotations = body["metadata"].get("annotations") or {}
        if any(annotations.get(key) != value for key, value in outcome.annotations.items()):
            patch["metadata"] = {"annotations": outcome.annotations}
        if "status" in patch:
            self.kube.patch(f"{GROUP}/{VERSION}", KIND, namespace, name, {"status": outcome.status}, "status")
        if "metadata" in patch:
            self.kube.patch(f"{GROUP}/{VERSION}", KIND, namespace, name, {"metadata": patch["metadata"]})
        return outcome

    def reconcile(
        self, body: dict[str, Any], *, full: bool = True, periodic: bool = False, clock: float | None = None
    ) -> Outcome:
        """One pass. `full`: also apply topics and children (events and the resync); without it only the
        driver is observed and scaled. `periodic`: the tick, which also runs the autoscaler."""
        meta, namespace, app = body["metadata"], body["metadata"]["namespace"], body["metadata"]["name"]
        clock = time.time() if clock is None else clock
        now = dt.datetime.fromtimestamp(clock, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        old_status = body.get("status") or {}
        parsed = admissible_spec(body.get("spec") or {}, self.settings.checkpoints)
        if isinstance(parsed, Invalid):
            # Nothing is created or changed for an invalid spec: what runs keeps running.
            return Outcome(
                status_for(
                    Observation(valid=parsed),
                    generation=meta.get("generation"),
                    revision=None,
                    children=[],
                    old_status=old_status,
                    now=now,
                )
            )
        recorded_driver = old_status.get("driver") or app
        spark_app = None if parsed.suspend else self._spark_application(namespace, recorded_driver)
        obs = Observation(suspended=parsed.suspend)
        if full:
            topics = desired_state(app, namespace, parsed, claims=self.settings.checkpoints)
            self._ensure_topics(body, topics, obs)  # before a rollout: a new revision may write a new topic
            self._ensure_control_secret(body)
        else:
            obs.topics_error, obs.topics_refused, obs.apply_error = self._last_full_errors(old_status)
        self._observe(spark_app, namespace, obs)
        rollout = self._rollout(body, parsed, spark_app, obs, clock)
        desired = desired_state(
            app,
            namespace,
            parsed,
            submitted_executors=submitted_executors(rollout.driver_app, rollout.pin.submitted),
            claims=self.settings.checkpoints,
            pin=rollout.pin,
            runner=rollout.runner,
            driver_spec=rollout.driver_spec,
            driver=None if rollout.driver == app else rollout.driver,
        )
        if full:
            self._ensure_children(body, desired, obs, rollout.decision.keep, rollout.driver)
            for retired in rollout.retired:
                self._delete_driver(namespace, retired)
        elif rollout.moved:
            runner = ch.runner_configmap_name(rollout.driver)
            self.apply(next(c for c in desired.children if c["metadata"]["name"] == runner))
        if rollout.driver_app is None and not parsed.suspend and full:
            spark_app = self._spark_application(namespace, rollout.driver)
            self._observe(spark_app, namespace, obs)
        obs.rollout = rollout.condition
        if obs.driver is None and obs.driver_failure is None and not parsed.suspend:
            obs.driver_failure = last_driver_failure(old_status, rollout.pin.runs)
        plan = plan_scaling(parsed, meta.get("annotations") or {}, obs.driver, clock, periodic=periodic)
        events = self._realize(namespace, app, obs, plan)
        status = status_for(
            obs,
            generation=meta.get("generation"),
            revision=rollout.pin.runs,
            children=desired.children,
            old_status=old_status,
            now=now,
            scaling=plan.status,
            rollout=rollout.status,
        )
        events = [*rollout.events, *events]
        return Outcome(status, plan.annotations, [*plan.events, *events], plan.kinds)

    @staticmethod
    def _last_full_errors(old_status: dict[str, Any]) -> tuple[str | None, dict[str, str], str | None]:
        """A tick applies nothing, so the errors of the last full pass stand (from its conditions)."""
        by_type = {c.get("type"): c for c in old_status.get("conditions") or []}
        topics, submitted = by_type.get("TopicsReady") or {}, by_type.get("DriverSubmitted") or {}
        topics_error = topics.get("message") or None if topics.get("reason") == "TopicError" else None
        refused = {"_": topics["message"]} if topics.get("reason") == "PartitionShrinkRefused" else {}
        apply_error = submitted.get("message") or None if submitted.get("reason") == "ApplyFailed" else None
        return topics_error, refused, apply_error

    def _ensure_topics(self, owner: dict[str, Any], desired: DesiredState, obs: Observation) -> None:
        try:
            if desired.admin_topics:
                admin = AdminTopics(desired.bootstrap, timeout=15)
                plan = plan_topics(desired.admin_topics, admin.existing([t.name for t in desired.admin_topics]))
                admin.apply(plan)
                obs.topics_refused.update(plan.refused)
            for topic in desired.strimzi_topics:
                self._ensure_kafka_topic(owner, desired, topic, obs)
        except KubeError as exc:
            obs.topics_error = f"KafkaTopic: {exc}"
        except KindNotServed:
            obs.topics_error = "the KafkaTopic CRD (kafka.strimzi.io) is not installed"
        except Exception as exc:  # Kafka unreachable, auth, ...: reported, retried on the next pass
            obs.topics_error = f"Kafka admin: {exc}"

    def _ensure_kafka_topic(
        self, owner: dict[str, Any], desired: DesiredState, topic: dict[str, Any], obs: Observation
    ) -> None:
        meta = topic["metadata"]
        current = self.get(topic["apiVersion"], topic["kind"], meta["namespace"], meta["name"])
        have = ((current or {}).get("spec") or {}).get("partitions")
        if have and have > topic["spec"]["partitions"]:
            obs.topics_refused[topic["spec"]["topicName"]] = (
                f"topic {topic['spec']['topicName']} has {have} partitions; shrinking to "
                f"{topic['spec']['partitions']} is not possible in Kafka"
            )
            topic = {**topic, "spec": {**topic["spec"], "partitions": have}}
        spec_topic = next(t for t in desired.spec.topics if t.name == topic["spec"]["topicName"])
        if spec_topic.deletionPolicy == "delete" and meta["namespace"] == owner["metadata"]["namespace"]:
            _adopt(topic, owner)  # deleted with the app; Strimzi then deletes the Kafka topic
        self.apply(topic)

    def _ensure_children(
        self, owner: dict[str, Any], desired: DesiredState, obs: Observation, keep: frozenset[str], driver: str
    ) -> list[dict]:
        applied = []
        for child in desired.children:
            if ch.owned_by_app(child, desired.spec):
                _adopt(child, owner)
            try:
                if child["kind"] == "PersistentVolumeClaim":
                    self._ensure_claim(child)
                    continue
                self.apply(child)
                applied.append(child)
            except KubeError as exc:
                obs.apply_error = f"{child['kind']} {child['metadata']['name']}: {exc}"
            except KindNotServed:
                obs.apply_error = f"the {child['kind']} CRD ({child['apiVersion']}) is not installed"
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        if desired.spec.suspend:
            self.delete(ch.SPARK_APPLICATION_API, "SparkApplication", namespace, driver)
        self._prune_pipeline_configmaps(namespace, app, keep)
        return applied

    def _ensure_claim(self, claim: dict[str, Any]) -> None:
        """Created once (a claim's spec is mostly immutable); afterwards only its owner changes with the
        app's deletionPolicy (owned: deleted with the app; not owned: retained)."""
        meta = claim["metadata"]
        current = self.get("v1", "PersistentVolumeClaim", meta["namespace"], meta["name"])
        if current is None:
            self.apply(claim)
            return
        owners = meta.get("ownerReferences") or []
        if (current["metadata"].get("ownerReferences") or []) != owners:
            self.kube.patch(
                "v1",
                "PersistentVolumeClaim",
                meta["namespace"],
                meta["name"],
                {"metadata": {"ownerReferences": owners or None}},
            )

    def _pipeline_configmaps(self, namespace: str, app: str) -> list[dict[str, Any]]:
        selector = f"{ch.APP_LABEL}={app},app.kubernetes.io/component=pipeline"
        return self.kube.list("v1", "ConfigMap", namespace, selector)

    def _prune_pipeline_configmaps(self, namespace: str, app: str, keep: frozenset[str]) -> None:
        """Revisions no rollout needs any more (the stable one, and a rollout's two, are kept)."""
        for item in self._pipeline_configmaps(namespace, app):
            meta = item["metadata"]
            if (meta.get("labels") or {}).get(ch.REVISION_LABEL) not in keep:
                log.info("%s/%s: revision ConfigMap %s pruned (kept: %s)", namespace, app, meta["name"], sorted(keep))
                # gone already: a concurrent pass (update handler vs resync) got there first
                self.delete("v1", "ConfigMap", namespace, meta["name"])

    def _ensure_control_secret(self, owner: dict[str, Any]) -> None:
        """The control token is made once and kept (the driver mounts it; rotating it is deleting it)."""
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        if self.get("v1", "Secret", namespace, ch.control_secret_name(app)) is not None:
            return
        secret = ch.control_secret(app, namespace, secrets.token_urlsafe(32))
        _adopt(secret, owner)
        with contextlib.suppress(KubeError):  # 409: a concurrent pass created it
            self.kube.create(secret)
        self._tokens.pop((namespace, app), None)

    def _control_token(self, namespace: str, app: str) -> str | None:
        key = (namespace, app)
        if key not in self._tokens:
            secret = self.get("v1", "Secret", namespace, ch.control_secret_name(app))
            encoded = ((secret or {}).get("data") or {}).get(ch.CONTROL_TOKEN_KEY)
            if not encoded:
                return None
            self._tokens[key] = base64.b64decode(encoded).decode().strip()
        return self._tokens[key]

    def _spark_application(self, namespace: str, app: str) -> dict[str, Any] | None:
        try:
            return self.get(ch.SPARK_APPLICATION_API, "SparkApplication", namespace, app)
        except KindNotServed:
            return None

    def _observe(self, spark_app: dict[str, Any] | None, namespace: str, obs: Observation) -> None:
        if obs.suspended or spark_app is None:
            return
        status = spark_app.get("status") or {}
        obs.spark_state = (status.get("applicationState") or {}).get("state")
        obs.spark_error = (status.get("applicationState") or {}).get("errorMessage")
        executors = status.get("executorState") or {}
        if executors:
            obs.executors = sum(1 for s in executors.values() if s == "RUNNING")
        if not (status.get("driverInfo") or {}).get("podName"):
            return
        pod, answer, address, obs.driver_error = self._ask_driver(namespace, status, submitted_revision(spark_app))
        if answer is not None:
            obs.driver, obs.driver_address = answer, address
            return
        obs.driver_failure = driver_failure(pod)  # not answering: failed at start, or its pod restarted

    def _ask_driver(
        self, namespace: str, spark_status: dict[str, Any], submitted: str | None
    ) -> tuple[dict[str, Any] | None, DriverStatus | None, str | None, str | None]:
        """A SparkApplication's driver pod and, while spark-operator says it runs, its /v1/status: (pod, status,
        control address, why it did not answer). `submitted`: the revision the SparkApplication is submitted for;
        a pod of an earlier submission (being replaced) or one being deleted is not asked."""
        pod_name = (spark_status.get("driverInfo") or {}).get("podName")
        pod = self.get("v1", "Pod", namespace, pod_name) if pod_name else None
        pod_ip = ((pod or {}).get("status") or {}).get("podIP")
        state = (spark_status.get("applicationState") or {}).get("state")
        if (state or "").upper() != "RUNNING" or not pod_ip or _replaced(pod, submitted):
            return pod, None, None, None
        address = self.driver_client.address(pod_ip, ch.CONTROL_PORT)
        try:
            return pod, self.driver_client.status(address), address, None
        except DriverUnavailable as exc:
            log.debug("driver %s in %s not available: %s", pod_name, namespace, exc)
            return pod, None, None, str(exc)

    # ---------------------------------------------------------------------------- rollouts
    def _rollout(
        self,
        body: dict[str, Any],
        spec: StreamingAppSpec,
        spark_app: dict[str, Any] | None,
        obs: Observation,
        clock: float,
    ) -> RolloutPass:
        """Decide this pass of the app's rollout (rollout.decide) and carry out its actions: the revisions'
        ConfigMaps, the hot swap in the driver, a handover's second driver and the drivers' states. What a driver
        answered (a refused swap, a drain or an activation done) is what the same pass decides on next, so a
        handover's drain and activation follow each other without waiting for the next pass."""
        meta, status = body["metadata"], body.get("status") or {}
        namespace, app = meta["namespace"], meta["name"]
        recorded = _recorded_rollout(status)
        stable = status.get("stableRevision")
        recorded_driver = status.get("driver") or app
        revision = ch.revision(spec)
        specs: dict[str, StreamingAppSpec] = {revision: spec}
        base = diff_base(recorded, stable, revision)
        busy = base is not None or (recorded is not None and not recorded.terminal)
        revisions: set[str] = set()
        if busy:
            labels = (item["metadata"].get("labels") or {} for item in self._pipeline_configmaps(namespace, app))
            revisions = {rev for rev in (label.get(ch.REVISION_LABEL) for label in labels) if rev}
            if revision not in revisions:  # the new revision's ConfigMap first: a rollout starts in this pass
                self._apply_revision(body, spec)
                revisions.add(revision)
        diff = None
        if base is not None:
            base_spec = self._revision_spec(namespace, app, base, specs)
            diff = classify(base_spec, spec) if base_spec is not None else lost_base(base)
            if base_spec is None:
                log.warning("%s/%s: the spec of revision %s is gone (revisions %s)", namespace, app, base, revisions)
        target = Target(revision, spec.updateStrategy, diff)
        submitted = submitted_revision(spark_app)
        restarts = int(((spark_app or {}).get("status") or {}).get("executionAttempts") or 0)
        facts = driver_facts(recorded_driver, submitted or "", obs.spark_state, restarts, obs.driver)
        events: list[tuple[str, str, str]] = []
        claimed = runner_revision(recorded, stable, revision)  # what the status says the driver runs
        behind = driver_behind(recorded, facts if spark_app else None, claimed)
        if behind is not None:
            restarted = self._restart_behind_driver(namespace, app, spark_app, behind, claimed, specs)
            if restarted is not None:
                events.append(restarted)
                facts = replace(facts, state="pending", queries=(), runs=None)  # what spark-operator starts next
        drivers = _Drivers()
        if spark_app is not None:
            drivers.facts[recorded_driver] = facts
            if obs.driver_address is not None:
                drivers.addresses[recorded_driver] = obs.driver_address
        spark_apps = {recorded_driver: spark_app}
        second = handover_driver(recorded)
        if second is not None:
            spark_apps[second] = self._spark_application(namespace, second)
            self._observe_driver(namespace, second, spark_apps[second], drivers)
        observed = Observed(clock, frozenset(revisions), tuple(drivers.facts.values()))
        stable_checkpoints = status.get("checkpoints") or {}
        decision = decide_rollout(app, recorded, stable, target, observed, submitted, stable_checkpoints)
        if facts.runs is not None:  # the spec the driver runs stays readable: what it is compared with
            decision = replace(decision, keep=decision.keep | {facts.runs})
        events += [(e.type, e.reason, e.message) for e in decision.step.events]
        for _ in range(4):
            answered = self._carry_out(
                body, decision, specs, obs, facts, observed, events, stable_checkpoints, drivers, recorded_driver
            )
            if answered is None:
                break
            observed = answered
            rollout = decision.step.rollout
            decision = decide_rollout(app, rollout, decision.step.stable_revision, target, observed, submitted)
            events += [(e.type, e.reason, e.message) for e in decision.step.events]
        condition = rollout_condition(decision.step, revision)
        old: dict[str, Any] = next((c for c in status.get("conditions") or [] if c.get("type") == "Rollout"), {})
        refusal = decision.step.refusal
        if refusal is not None and old.get("message") != refusal.message:
            events.append(("Warning", refusal.reason, refusal.message))
        rollout = decision.step.rollout
        driver = app_driver(rollout, recorded_driver)
        runs = decision.runner_revision
        runs_spec = self._revision_spec(namespace, app, runs, specs) or spec
        submitted_now = decision.submitted_revision
        if driver != recorded_driver:  # the handover's driver took over: what it was submitted for stays
            spark_apps.setdefault(driver, self._spark_application(namespace, driver))
            submitted_now = submitted_revision(spark_apps[driver]) or runs
        folders = revision_checkpoints(runs, stable_checkpoints, rollout)
        standby = on_standby(rollout, driver, driver, spec.updateStrategy.rollback.enabled)
        new_stable = decision.step.stable_revision
        return RolloutPass(
            decision=decision,
            pin=ch.DriverPin(runs, submitted_now),
            runner=ch.runner_config(
                app, namespace, runs_spec, bootstrap_for(runs_spec, namespace), *folders, standby=standby
            ),
            driver_spec=self._revision_spec(namespace, app, submitted_now, specs) or runs_spec,
            driver=driver,
            driver_app=spark_apps.get(driver),
            retired=retired_drivers(rollout, driver),
            condition=condition,
            events=events,
            status={
                "stableRevision": new_stable,
                "rollout": rollout.model_dump(mode="json", exclude_none=True) if rollout else None,
                "checkpoints": (revision_checkpoints(new_stable, stable_checkpoints, rollout)[0] if new_stable else {})
                or None,
                "driver": None if driver == app else driver,
            },
            moved=rollout != recorded or (rollout is not None and not rollout.terminal),
        )

    def _restart_behind_driver(
        self,
        namespace: str,
        app: str,
        spark_app: dict[str, Any] | None,
        runs: str,
        claimed: str,
        specs: dict[str, StreamingAppSpec],
    ) -> tuple[str, str, str] | None:
        """The app's driver runs revision `runs` where its runner config says `claimed`, and no rollout explains
        it (rollout.decide.driver_behind): its pod is deleted, and spark-operator starts it again on `claimed`
        (on the same checkpoints; migrated queries hand over as they start). Nothing is done when the two run the
        same pipeline (a change only outside it, adopted without a rollout). Returns the event."""
        if not self._pipelines_differ(namespace, app, runs, claimed, specs):
            return None
        pod = (((spark_app or {}).get("status") or {}).get("driverInfo") or {}).get("podName")
        if not pod:
            return None
        self.delete("v1", "Pod", namespace, pod)
        message = (
            f"driver pod {pod} runs revision {runs}, not {claimed} (it read its config before {claimed} was "
            f"written): deleted, spark-operator starts it again on revision {claimed}"
        )
        log.warning("%s/%s: %s", namespace, app, message)
        return ("Warning", "DriverRestarted", message)

    def _pipelines_differ(
        self, namespace: str, app: str, before: str, after: str, specs: dict[str, StreamingAppSpec]
    ) -> bool:
        """Whether a driver running revision `before` runs something other than `after` (a rollout would be due
        between them). Revisions are hashes of what they hold, so the answer is kept. A spec that is gone counts
        as different."""
        key = (namespace, app, before, after)
        if key not in self._pipelines_differ_cache:
            old = self._revision_spec(namespace, app, before, specs)
            new = self._revision_spec(namespace, app, after, specs)
            differ = old is None or new is None or classify(old, new).needs_rollout
            if len(self._pipelines_differ_cache) > 10_000:
                self._pipelines_differ_cache.clear()
            self._pipelines_differ_cache[key] = differ
        return self._pipelines_differ_cache[key]

    def _observe_driver(self, namespace: str, name: str, spark_app: dict[str, Any] | None, drivers: _Drivers) -> None:
        """A handover's second driver, as the rollout sees it (the app's own is observed with the status)."""
        if spark_app is None:
            return
        status = spark_app.get("status") or {}
        state = (status.get("applicationState") or {}).get("state")
        pod, answer, address, _ = self._ask_driver(namespace, status, submitted_revision(spark_app))
        if address is not None:
            drivers.addresses[name] = address
        restarts = int(status.get("executionAttempts") or 0)
        failure = driver_failure(pod)
        drivers.facts[name] = driver_facts(name, submitted_revision(spark_app) or "", state, restarts, answer, failure)

    def _carry_out(
        self,
        owner: dict[str, Any],
        decision: RolloutDecision,
        specs: dict[str, StreamingAppSpec],
        obs: Observation,
        facts: DriverFacts,
        observed: Observed,
        events: list[tuple[str, str, str]],
        stable_checkpoints: dict[str, str],
        drivers: _Drivers,
        recorded_driver: str,
    ) -> Observed | None:
        """The decision's actions; returns the observation as the drivers' answers changed it (a refused swap, a
        drain or an activation done), None when nothing changed. `facts`: the app's driver as observed (not as a
        refused swap makes the decision see it): what a swap still has to ask for."""
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        rollout = decision.step.rollout
        changed: Observed | None = None
        for action in decision.step.actions:
            if isinstance(action, ApplyRevision):
                spec = self._revision_spec(namespace, app, action.revision, specs)
                if spec is not None and action.revision not in observed.revisions:
                    self._apply_revision(owner, spec)
            elif isinstance(action, SwapQueries):
                folders = revision_checkpoints(action.revision, stable_checkpoints, rollout)
                error = self._swap(namespace, app, action, specs, obs, facts, events, folders)
                if error is not None:
                    return with_refused_swap(changed or observed, action, error)
            elif isinstance(action, StartDriver):
                self._start_driver(owner, action, specs, stable_checkpoints, decision, recorded_driver)
            elif isinstance(action, Activate | Resume | Drain):
                wanted: Literal["running", "drained"] = "drained" if isinstance(action, Drain) else "running"
                if isinstance(action, Drain) and rollout is not None and action.driver == rollout.toDriver:
                    # A new driver drained in a rollback: its runner config says standby before it is asked, so a
                    # restart meanwhile does not start its queries beside the resumed one.
                    back = StartDriver(action.driver, rollout.toRevision, standby=True, steps=())
                    self._start_driver(owner, back, specs, stable_checkpoints, decision, recorded_driver, submit=False)
                config = None
                if isinstance(action, Resume) and action.revision is not None:
                    folders = revision_checkpoints(action.revision, stable_checkpoints, rollout)
                    config = self._revision_config(namespace, app, action.revision, specs, folders)
                    if config is None:
                        continue  # the ConfigMap of the stable revision is applied first (ApplyRevision)
                answer = self._set_driver_state(namespace, app, action.driver, wanted, drivers, events, config)
                if answer is not None:
                    started = tuple(QueryFacts(name=q, revision=answer.revision, active=True) for q in answer.started)
                    changed = with_driver_state(changed or observed, action.driver, answer.state, started)
                    drivers.facts = {d.name: d for d in changed.drivers}
            elif isinstance(action, DeleteDriver):
                if action.driver != app_driver(rollout, recorded_driver):
                    self._delete_driver(namespace, action.driver)
            elif isinstance(action, ReleaseRevision):  # the revision's ConfigMap is pruned with the children
                if action.retired_folders:
                    address = drivers.addresses.get(app_driver(rollout, recorded_driver), obs.driver_address)
                    self._delete_checkpoints(namespace, app, action.retired_folders, address, events)
            else:
                log.warning("%s/%s: %s is not carried out by this operator", namespace, app, action)
        return changed

    def _start_driver(
        self,
        owner: dict[str, Any],
        action: StartDriver,
        specs: dict[str, StreamingAppSpec],
        stable_checkpoints: dict[str, str],
        decision: RolloutDecision,
        recorded_driver: str,
        submit: bool = True,
    ) -> None:
        """Ensure a handover's second driver: its runner ConfigMap (standby while the rollout's phase says so)
        and (`submit`) its SparkApplication, submitted for the revision it runs."""
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        if action.name == app_driver(decision.step.rollout, recorded_driver):
            return  # the app's own driver is one of its children
        spec = self._revision_spec(namespace, app, action.revision, specs)
        if spec is None:
            return
        rollout = decision.step.rollout
        folders = revision_checkpoints(action.revision, stable_checkpoints, rollout)
        standby = on_standby(rollout, action.name, recorded_driver, spec.updateStrategy.rollback.enabled)
        config = ch.runner_config(app, namespace, spec, bootstrap_for(spec, namespace), *folders, standby=standby)
        pin = ch.DriverPin(action.revision, action.revision)
        children = [ch.runner_configmap(app, namespace, config, action.name)]
        if submit:
            children.append(ch.spark_application(app, namespace, spec, pin=pin, name=action.name))
        for child in children:
            _adopt(child, owner)
            self.apply(child)

    def _set_driver_state(
        self,
        namespace: str,
        app: str,
        driver: str,
        wanted: Literal["running", "drained"],
        drivers: _Drivers,
        events: list[tuple[str, str, str]],
        config: RunnerConfig | None = None,
    ) -> StateResponse | None:
        """Ask the driver to run or drain, unless it does already or does not answer yet; its answer, or None.
        `config`: what a drained driver resumes on (else what it ran)."""
        facts, address = drivers.facts.get(driver), drivers.addresses.get(driver)
        needed = ("standby", "drained") if wanted == "running" else ("running", "draining")
        if facts is None or address is None or facts.state not in needed:
            return None
        token = self._control_token(namespace, app)
        if token is None:
            events.append(("Warning", "HandoverFailed", f"no control token in Secret {ch.control_secret_name(app)}"))
            return None
        try:
            answer = self.driver_client.set_state(address, token, wanted, config)
        except DriverUnavailable as exc:  # also a refusal: the rollout's deadline decides what follows
            self._tokens.pop((namespace, app), None)
            events.append(("Warning", "HandoverFailed", f"driver {driver}: {str(exc)[:1000]}"))
            return None
        what = f"stopped {', '.join(answer.stopped)}" if wanted == "drained" else f"started {', '.join(answer.started)}"
        log.info(
            "%s/%s: driver %s %s -> %s in %d ms", namespace, app, driver, answer.previous, answer.state, answer.tookMs
        )
        reason = {"drained": "Drained", "running": "Activated" if answer.previous == "standby" else "Resumed"}[wanted]
        events.append(("Normal", reason, f"driver {driver} (revision {answer.revision}): {what} in {answer.tookMs} ms"))
        return answer

    def _delete_checkpoints(
        self,
        namespace: str,
        app: str,
        folders: tuple[str, ...],
        address: str | None,
        events: list[tuple[str, str, str]],
    ) -> None:
        """Once, when a checkpoint migration ends: the app's driver (at `address`) deletes the folders it left
        behind (the operator does not mount the checkpoint volume). Not deleted (no driver answering, or it
        still needs one), they stay, and the event says which."""
        listed = ", ".join(folders)
        token = self._control_token(namespace, app)
        if address is None or token is None:
            why = "no driver answers" if address is None else "no control token"
            events.append(("Warning", "CheckpointsKept", f"{why}: checkpoint folders {listed} stay"))
            return
        try:
            answer = self.driver_client.delete_checkpoints(address, token, list(folders))
        except DriverUnavailable as exc:
            events.append(("Warning", "CheckpointsKept", f"checkpoint folders {listed} stay: {str(exc)[:1000]}"))
            return
        gone = f"; already gone: {', '.join(answer.absent)}" if answer.absent else ""
        message = f"checkpoint folders no longer needed, deleted: {', '.join(answer.deleted) or 'none'}{gone}"
        events.append(("Normal", "CheckpointsDeleted", message))

    def _delete_driver(self, namespace: str, driver: str) -> None:
        """A driver a handover no longer needs, with its runner ConfigMap."""
        self.delete(ch.SPARK_APPLICATION_API, "SparkApplication", namespace, driver)
        self.delete("v1", "ConfigMap", namespace, ch.runner_configmap_name(driver))

    def _apply_revision(self, owner: dict[str, Any], spec: StreamingAppSpec) -> None:
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        configmap = ch.pipeline_configmap(app, namespace, spec, bootstrap_for(spec, namespace))
        _adopt(configmap, owner)
        self.apply(configmap)

    def _swap(
        self,
        namespace: str,
        app: str,
        action: SwapQueries,
        specs: dict[str, StreamingAppSpec],
        obs: Observation,
        facts: DriverFacts,
        events: list[tuple[str, str, str]],
        folders: tuple[dict[str, str], dict[str, Migration]],
    ) -> str | None:
        """Ask the driver to run the swap's revision, unless it does; returns the driver's refusal. `folders`:
        where the revision keeps its queries' checkpoints (revision_checkpoints)."""
        if obs.driver is None or obs.driver_address is None:
            return None
        steps = pending_swap(action, facts)
        if steps is None:
            return None
        config = self._revision_config(namespace, app, action.revision, specs, folders)
        if config is None:
            return f"the spec of revision {action.revision} is gone (its ConfigMap was deleted)"
        token = self._control_token(namespace, app)
        if token is None:
            events.append(("Warning", "SwapFailed", f"no control token in Secret {ch.control_secret_name(app)}"))
            return None
        try:
            answer = self.driver_client.swap(obs.driver_address, token, SwapRequest(config=config, steps=list(steps)))
        except DriverRefused as exc:
            return in_app(str(exc))
        except DriverUnavailable as exc:
            self._tokens.pop((namespace, app), None)
            events.append(("Warning", "SwapFailed", str(exc)[:1000]))
            return None
        done = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("restarted", answer.restarted),
                ("moved to a checkpoint of their own", answer.moved),
                ("started", answer.started),
                ("stopped", answer.stopped),
            )
            if names
        ]
        if not done:  # another pass asked first: the driver runs the revision already
            return None
        log.info("%s/%s: revision %s swapped in: %s", namespace, app, answer.revision, "; ".join(done))
        events.append(
            (
                "Normal",
                "Swapped",
                f"revision {answer.revision}: {'; '.join(done)}"
                + (f" in {answer.tookMs} ms" if answer.tookMs is not None else "")
                + f"; {len(answer.kept)} kept running",
            )
        )
        return None

    def _revision_config(
        self,
        namespace: str,
        app: str,
        revision: str,
        specs: dict[str, StreamingAppSpec],
        folders: tuple[dict[str, str], dict[str, Migration]],
    ) -> RunnerConfig | None:
        """What a driver runs for `revision` with its queries' checkpoints at `folders` (revision_checkpoints);
        None when the revision's spec is gone."""
        spec = self._revision_spec(namespace, app, revision, specs)
        return (
            None if spec is None else ch.runner_config(app, namespace, spec, bootstrap_for(spec, namespace), *folders)
        )

    def _revision_spec(
        self, namespace: str, app: str, revision: str, specs: dict[str, StreamingAppSpec]
    ) -> StreamingAppSpec | None:
        """A revision's spec, from its ConfigMap (None: gone, or written before revisions kept their spec)."""
        if revision not in specs:
            configmap = self.get("v1", "ConfigMap", namespace, ch.configmap_name(app, revision))
            text = ((configmap or {}).get("data") or {}).get(ch.SPEC_FILE)
            try:
                specs[revision] = StreamingAppSpec.model_validate_json(text) if text else None  # type: ignore[assignment]
            except ValueError:
                log.warning("%s/%s: the spec kept for revision %s does not parse", namespace, app, revision)
                specs[revision] = None  # type: ignore[assignment]
        return specs[revision]

    def _realize(self, namespace: str, app: str, obs: Observation, plan: ScalingPlan) -> list[tuple[str, str, str]]:
        """Ask the driver for the desired count when it runs another one (after a restart it runs none:
        the count is re-asserted)."""
        if obs.driver is None or obs.driver_address is None or plan.desired is None:
            return []
        if not needs_executor_request(obs.driver, plan.desired):
            return []
        token = self._control_token(namespace, app)
        if token is None:
            return [("Warning", "ScaleFailed", f"no control token in Secret {ch.control_secret_name(app)}")]
        try:
            answer = self.driver_client.set_executors(obs.driver_address, token, plan.desired)
        except DriverUnavailable as exc:
            self._tokens.pop((namespace, app), None)  # a rotated Secret is read again next time
            return [("Warning", "ScaleFailed", str(exc)[:1000])]
        log.info("%s/%s: executors %s -> %s", namespace, app, answer.previous, answer.target)
        if plan.events or answer.previous == answer.target:
            return []  # the decision's own event says why
        why = (
            "the driver started without a target: the desired count is re-asserted"
            if obs.driver.executorTarget is None
            else f"spec.executors.instances is {answer.target}"
        )
        return [("Normal", "Scaled", f"{answer.previous} → {answer.target}: {why}")]

    # ---------------------------------------------------------------------------- deletion
    def delete_topics(self, spec_raw: dict[str, Any], namespace: str) -> None:
        parsed = parse_spec(spec_raw)
        if isinstance(parsed, Invalid):
            return
        desired = desired_state("_", namespace, parsed)
        doomed = [t.name for t in desired.admin_topics if t.deletionPolicy == "delete"]
        if doomed:
            AdminTopics(desired.bootstrap, timeout=15).delete(doomed)
