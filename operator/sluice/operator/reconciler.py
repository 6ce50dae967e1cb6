"""The operator's I/O: applies what the planner decided and observes what came of it.

Children are written with server-side apply under one field manager, so re-applying is idempotent and
repairs drift (a child edited or deleted by hand comes back on the next pass).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
from typing import Any

import kopf
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError, ResourceNotFoundError

from . import children as ch
from .model import GROUP, KIND, PLURAL, VERSION
from .planner import DesiredState, Invalid, Observation, desired_state, parse_driver_metrics, parse_spec, status_for
from .topics import AdminTopics, plan_topics

FIELD_MANAGER = "sluice-operator"
log = logging.getLogger("sluice.operator")


def api_client() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()


def _api_message(exc: ApiException) -> str:
    import json

    try:
        return json.loads(exc.body).get("message", str(exc.reason))
    except (TypeError, ValueError):
        return f"{exc.status} {exc.reason}"


class Reconciler:
    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or api_client()
        self.dynamic = DynamicClient(self.api)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    # ------------------------------------------------------------------------- kube helpers
    def _resource(self, api_version: str, kind: str):
        return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        resource = self._resource(body["apiVersion"], body["kind"])
        meta = body["metadata"]
        return resource.server_side_apply(body=body, name=meta["name"], namespace=meta.get("namespace"),
                                          field_manager=FIELD_MANAGER, force_conflicts=True).to_dict()

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._resource(api_version, kind).get(name=name, namespace=namespace).to_dict()
        except NotFoundError:
            return None

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        with contextlib.suppress(NotFoundError):
            self._resource(api_version, kind).delete(name=name, namespace=namespace)

    # ---------------------------------------------------------------------------- reconcile
    def reconcile_by_name(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Reconcile an app outside a kopf handler and patch its status when it changed.
        None when the app is gone or being deleted."""
        body = self.get(f"{GROUP}/{VERSION}", KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        status = self.reconcile(body)
        old = body.get("status") or {}
        if any(old.get(key) != value for key, value in status.items()):
            self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, name,
                                                              {"status": status})
        return status

    def reconcile(self, body: dict[str, Any]) -> dict[str, Any]:
        meta, namespace, app = body["metadata"], body["metadata"]["namespace"], body["metadata"]["name"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        old_status = body.get("status") or {}
        parsed = parse_spec(body.get("spec") or {})
        if isinstance(parsed, Invalid):
            # Nothing is created or changed for an invalid spec: what runs keeps running.
            return status_for(Observation(valid=parsed), generation=meta.get("generation"), revision=None,
                              requested_executors=None, children=[], old_status=old_status, now=now)
        desired = desired_state(app, namespace, parsed)
        obs = Observation(suspended=parsed.suspend)
        self._ensure_topics(body, desired, obs)
        applied = self._ensure_children(body, desired, obs)
        self._observe(desired, namespace, app, obs)
        return status_for(obs, generation=meta.get("generation"), revision=desired.revision,
                          requested_executors=parsed.executors.instances, children=applied,
                          old_status=old_status, now=now)

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

    def _ensure_kafka_topic(self, owner: dict[str, Any], desired: DesiredState, topic: dict[str, Any],
                            obs: Observation) -> None:
        meta = topic["metadata"]
        current = self.get(topic["apiVersion"], topic["kind"], meta["namespace"], meta["name"])
        have = ((current or {}).get("spec") or {}).get("partitions")
        if have and have > topic["spec"]["partitions"]:
            obs.topics_refused[topic["spec"]["topicName"]] = (
                f"topic {topic['spec']['topicName']} has {have} partitions; shrinking to "
                f"{topic['spec']['partitions']} is not possible in Kafka")
            topic = {**topic, "spec": {**topic["spec"], "partitions": have}}
        spec_topic = next(t for t in desired.spec.topics if t.name == topic["spec"]["topicName"])
        if spec_topic.deletionPolicy == "delete" and meta["namespace"] == owner["metadata"]["namespace"]:
            kopf.adopt(topic, owner=owner)  # deleted with the app; Strimzi then deletes the Kafka topic
        self.apply(topic)

    def _ensure_children(self, owner: dict[str, Any], desired: DesiredState, obs: Observation) -> list[dict]:
        applied = []
        for child in desired.children:
            kopf.adopt(child, owner=owner)
            try:
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

    def _prune_pipeline_configmaps(self, namespace: str, app: str, revision: str) -> None:
        selector = f"{ch.APP_LABEL}={app},app.kubernetes.io/component=pipeline"
        for item in self.core.list_namespaced_config_map(namespace, label_selector=selector).items:
            if (item.metadata.labels or {}).get(ch.REVISION_LABEL) != revision:
                try:
                    self.core.delete_namespaced_config_map(item.metadata.name, namespace)
                except ApiException as exc:
                    if exc.status != 404:  # a concurrent pass (update handler vs resync) got there first
                        raise

    def _observe(self, desired: DesiredState, namespace: str, app: str, obs: Observation) -> None:
        if desired.spec.suspend:
            return
        try:
            spark_app = self.get(ch.SPARK_APPLICATION_API, "SparkApplication", namespace, app)
        except ResourceNotFoundError:
            return
        status = (spark_app or {}).get("status") or {}
        obs.spark_state = (status.get("applicationState") or {}).get("state")
        obs.spark_error = (status.get("applicationState") or {}).get("errorMessage")
        executors = status.get("executorState") or {}
        if executors:
            obs.executors = sum(1 for s in executors.values() if s == "RUNNING")
        if (obs.spark_state or "").upper() == "RUNNING":
            obs.driver_metrics = self._driver_metrics(namespace, app)

    def _driver_metrics(self, namespace: str, app: str) -> dict[str, float] | None:
        try:
            text = self.core.connect_get_namespaced_service_proxy_with_path(
                f"{app}-driver:{ch.METRICS_PORT}", namespace, "metrics")
        except (ApiException, OSError) as exc:
            log.debug("driver metrics of %s/%s not available: %s", namespace, app, exc)
            return None
        return parse_driver_metrics(text if isinstance(text, str) else text.decode())

    # ---------------------------------------------------------------------------- deletion
    def delete_topics(self, spec_raw: dict[str, Any], namespace: str) -> None:
        parsed = parse_spec(spec_raw)
        if isinstance(parsed, Invalid):
            return
        desired = desired_state("_", namespace, parsed)
        doomed = [t.name for t in desired.admin_topics if t.deletionPolicy == "delete"]
        if doomed:
            AdminTopics(desired.bootstrap, timeout=15).delete(doomed)
