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
import time
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from . import children as ch
from .driver_client import DriverClient, DriverUnavailable
from .model import GROUP, KIND, PLURAL, VERSION
from .planner import DesiredState, Invalid, Observation, admissible_spec, desired_state, parse_spec, status_for
from .scaling import ScalingPlan, needs_executor_request, plan_scaling
from .settings import SETTINGS, Settings
from .topics import AdminTopics, plan_topics

FIELD_MANAGER = "sluice-operator"
log = logging.getLogger("sluice.operator")


def api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _adopt(child: dict[str, Any], owner: dict[str, Any]) -> None:
    """kopf.adopt with the app as read (kopf reads its owner as a mapping; its types name its Body)."""
    kopf.adopt(child, owner=kopf.Body(cast(kopf.RawBody, owner)))


def _api_message(exc: ApiException) -> str:
    import json

    try:
        return json.loads(exc.body or "").get("message", str(exc.reason))
    except (TypeError, ValueError):
        return f"{exc.status} {exc.reason}"


@dataclass
class Outcome:
    """What one pass decided: the whole status, annotations to set on the app, events to post."""

    status: dict[str, Any]
    annotations: dict[str, str] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    scaling_kinds: list[str] = field(default_factory=list)  # up, down, manual: the changes decided


def submitted_executors(spark_app: dict[str, Any] | None, spec: Any) -> int | None:
    """The executor count a running SparkApplication was submitted with, as recorded on it (a hand edit of
    its spec is repaired back to it): changing it would make spark-operator resubmit. A new revision
    resubmits anyway, and then starts with today's count (None)."""
    if spark_app is None:
        return None
    meta = spark_app["metadata"]
    if (meta.get("labels") or {}).get(ch.REVISION_LABEL) != ch.revision(spec):
        return None
    recorded = (meta.get("annotations") or {}).get(ch.SUBMITTED_EXECUTORS_ANNOTATION, "")
    return int(recorded) if recorded.isdigit() else None


class Reconciler:
    def __init__(
        self,
        api: client.ApiClient | None = None,
        driver_client: DriverClient | None = None,
        settings: Settings = SETTINGS,
    ) -> None:
        self.settings = settings
        self.api = api or api_client()
        self.dynamic = DynamicClient(self.api)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.driver_client = driver_client or DriverClient()
        self._tokens: dict[tuple[str, str], str] = {}

    # ------------------------------------------------------------------------- kube helpers
    def _resource(self, api_version: str, kind: str):
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        resource = self._resource(body["apiVersion"], body["kind"])
        meta = body["metadata"]
        return resource.server_side_apply(
            body=body,
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        ).to_dict()

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            self._resource(api_version, kind).delete(name=name, namespace=namespace)

    # ---------------------------------------------------------------------------- reconcile
    def reconcile_by_name(self, namespace: str, name: str, *, full: bool = True) -> Outcome | None:
        """Reconcile an app outside a kopf handler and patch what changed. None when the app is gone or
        being deleted."""
        body = self.get(f"{GROUP}/{VERSION}", KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        outcome = self.reconcile(body, full=full)
        old = body.get("status") or {}
        patch: dict[str, Any] = {}
        if any(old.get(key) != value for key, value in outcome.status.items()):
            patch["status"] = outcome.status
        annotations = body["metadata"].get("annotations") or {}
        if any(annotations.get(key) != value for key, value in outcome.annotations.items()):
            patch["metadata"] = {"annotations": outcome.annotations}
        if "status" in patch:
            self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, name, {"status": outcome.status}
            )
        if "metadata" in patch:
            self.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, {"metadata": patch["metadata"]}
            )
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
        spark_app = None if parsed.suspend else self._spark_application(namespace, app)
        desired = desired_state(
            app,
            namespace,
            parsed,
            submitted_executors=submitted_executors(spark_app, parsed),
            claims=self.settings.checkpoints,
        )
        obs = Observation(suspended=parsed.suspend)
        if full:
            self._ensure_topics(body, desired, obs)
            self._ensure_control_secret(body)
            self._ensure_children(body, desired, obs)
        else:
            obs.topics_error, obs.topics_refused, obs.apply_error = self._last_full_errors(old_status)
        if spark_app is None and not parsed.suspend and full:
            spark_app = self._spark_application(namespace, app)
        self._observe(spark_app, namespace, app, obs)
        plan = plan_scaling(parsed, meta.get("annotations") or {}, obs.driver, clock, periodic=periodic)
        events = self._realize(namespace, app, obs, plan)
        status = status_for(
            obs,
            generation=meta.get("generation"),
            revision=desired.revision,
            children=desired.children,
            old_status=old_status,
            now=now,
            scaling=plan.status,
        )
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
        except ApiException as exc:
            obs.topics_error = f"KafkaTopic: {_api_message(exc)}"
        except ResourceNotFoundError:
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

    def _ensure_children(self, owner: dict[str, Any], desired: DesiredState, obs: Observation) -> list[dict]:
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
            except ApiException as exc:
                obs.apply_error = f"{child['kind']} {child['metadata']['name']}: {_api_message(exc)}"
            except ResourceNotFoundError:
                obs.apply_error = f"the {child['kind']} CRD ({child['apiVersion']}) is not installed"
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        if desired.spec.suspend:
            self.delete(ch.SPARK_APPLICATION_API, "SparkApplication", namespace, app)
        self._prune_pipeline_configmaps(namespace, app, desired.revision)
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
            self.core.patch_namespaced_persistent_volume_claim(
                meta["name"], meta["namespace"], {"metadata": {"ownerReferences": owners or None}}
            )

    def _prune_pipeline_configmaps(self, namespace: str, app: str, revision: str) -> None:
        selector = f"{ch.APP_LABEL}={app},app.kubernetes.io/component=pipeline"
        for item in self.core.list_namespaced_config_map(namespace, label_selector=selector).items:
            meta = item.metadata
            assert meta is not None and meta.name is not None  # a listed object has both
            if (meta.labels or {}).get(ch.REVISION_LABEL) != revision:
                try:
                    self.core.delete_namespaced_config_map(meta.name, namespace)
                except ApiException as exc:
                    if exc.status != 404:  # a concurrent pass (update handler vs resync) got there first
                        raise

    def _ensure_control_secret(self, owner: dict[str, Any]) -> None:
        """The control token is made once and kept (the driver mounts it; rotating it is deleting it)."""
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        if self.get("v1", "Secret", namespace, ch.control_secret_name(app)) is not None:
            return
        secret = ch.control_secret(app, namespace, secrets.token_urlsafe(32))
        _adopt(secret, owner)
        with contextlib.suppress(ApiException):  # 409: a concurrent pass created it
            # The client serialises a dict body as it is; its types name only the V1Secret model.
            self.core.create_namespaced_secret(namespace, secret)  # type: ignore[arg-type]
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
        except ResourceNotFoundError:
            return None

    def _observe(self, spark_app: dict[str, Any] | None, namespace: str, app: str, obs: Observation) -> None:
        if obs.suspended or spark_app is None:
            return
        status = spark_app.get("status") or {}
        obs.spark_state = (status.get("applicationState") or {}).get("state")
        obs.spark_error = (status.get("applicationState") or {}).get("errorMessage")
        executors = status.get("executorState") or {}
        if executors:
            obs.executors = sum(1 for s in executors.values() if s == "RUNNING")
        pod_name = (status.get("driverInfo") or {}).get("podName")
        if (obs.spark_state or "").upper() != "RUNNING" or not pod_name:
            return
        pod = self.get("v1", "Pod", namespace, pod_name)
        pod_ip = ((pod or {}).get("status") or {}).get("podIP")
        if not pod_ip:
            return
        address = self.driver_client.address(pod_ip, ch.CONTROL_PORT)
        try:
            obs.driver = self.driver_client.status(address)
        except DriverUnavailable as exc:
            obs.driver_error = str(exc)
            log.debug("driver of %s/%s not available: %s", namespace, app, exc)
            return
        obs.driver_address = address

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
