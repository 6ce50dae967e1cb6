"""What the operator makes and reads for an app, on its one login to the API server (and the Kafka Admin API
for Admin-API topics): the children, the revision ConfigMaps, the control token, the app's own status.

Children are written with server-side apply under one field manager, so re-applying is idempotent and
repairs drift (a child edited or deleted by hand comes back on the next pass).
"""

from __future__ import annotations

import base64
import contextlib
import logging
import secrets
import time
from typing import Any, cast

import kopf

from sluice.api.contract import REVISION_SPEC_FILE, RUNNER_CONFIG_FILE, RunnerConfig, revision_configmap_name
from sluice.api.kafka_clients import CredentialUnreadable, KafkaClient, kafka_security, read_credentials
from sluice.api.kafka_spec import KafkaSpec

from . import children as ch
from . import crd, names
from . import spark_application as sparkapp
from .desired import DesiredState, Invalid, bootstrap_for, desired_state, parse_spec
from .kube import KindNotServed, Kube, KubeError
from .model import GROUP, KIND, VERSION, StreamingAppSpec
from .settings import Access
from .status import Observation
from .topics import AdminTopics, KafkaLoginRefused, plan_topics

FIELD_MANAGER = "sluice-operator"
ACCESS_REFRESH_SECONDS = 300.0
BOOTSTRAP_TTL_SECONDS = 30.0
log = logging.getLogger("sluice.operator")


def adopt(child: dict[str, Any], owner: dict[str, Any]) -> None:
    """kopf.adopt with the app as read (kopf reads its owner as a mapping; its types name its Body)."""
    kopf.adopt(child, owner=kopf.Body(cast(kopf.RawBody, owner)))


class Cluster:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._tokens: dict[tuple[str, str], str] = {}
        self._access: dict[str, float] = {}  # namespace -> when the operator's own binding was applied there
        self._bootstraps: dict[tuple[str, str, str], tuple[float, str | None]] = {}  # Strimzi listener -> address

    def ensure_operator_access(self, namespace: str, access: Access, now: float) -> None:
        """Cluster-wide, the operator's rights in a namespace with apps are its own binding of the chart's
        app-namespace ClusterRole, made when it first handles an app there and again every ACCESS_REFRESH_SECONDS
        (a namespace deleted and made anew). The API server checks that it may bind that role; with
        watchNamespaces the chart made the bindings."""
        if access.app_namespace_cluster_role is None or access.service_account is None:
            return
        if now - self._access.get(namespace, -ACCESS_REFRESH_SECONDS) < ACCESS_REFRESH_SECONDS:
            return
        self._apply_binding(
            ch.operator_role_binding(namespace, access.app_namespace_cluster_role, access.service_account)
        )
        if namespace not in self._access:
            self._await_access(namespace)
        self._access[namespace] = now

    def _await_access(self, namespace: str, seconds: float = 10.0) -> None:
        """A new binding takes a moment to reach the API server's authorizer: the pass waits for it (asking
        whether it may read a Secret there), rather than failing and waiting for kopf's retry."""
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "metadata": {},
            "spec": {"resourceAttributes": {"namespace": namespace, "verb": "get", "resource": "secrets"}},
        }
        deadline = time.monotonic() + seconds
        while not (self.kube.create(review).get("status") or {}).get("allowed"):
            if time.monotonic() > deadline:
                log.warning("%s: the operator's binding gives no access yet after %.0f s", namespace, seconds)
                return
            time.sleep(0.2)

    def _apply_binding(self, binding: dict[str, Any]) -> None:
        """A RoleBinding's roleRef cannot change: one an older release bound to another role is made again."""
        try:
            self.apply(binding)
        except KubeError as exc:
            if "roleRef" not in str(exc):
                raise
            meta = binding["metadata"]
            self.delete(binding["apiVersion"], binding["kind"], meta["namespace"], meta["name"])
            self.apply(binding)

    def upgrade_crd(self) -> str | None:
        """The served StreamingApp CRD made this operator's when crd.crd_upgrade says so; returns why (None: left)."""
        ours = crd.crd()
        served = self.kube.get(crd.CRD_API, "CustomResourceDefinition", None, ours["metadata"]["name"])
        why = crd.crd_upgrade(served, ours)
        if why is not None:
            self.kube.apply(ours, FIELD_MANAGER)
        return why

    def checkpoint_claim(self, namespace: str, name: str) -> sparkapp.ClaimFacts:
        """An app's checkpoint claim as it is now (whether it exists, its phase and access modes)."""
        return sparkapp.claim_facts(name, self.get("v1", "PersistentVolumeClaim", namespace, name))

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.kube.apply(body, FIELD_MANAGER)

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get(api_version, kind, namespace, name)

    def delete(self, api_version: str, kind: str, namespace: str, name: str) -> None:
        self.kube.delete(api_version, kind, namespace, name)

    # ------------------------------------------------------------------------------ the app
    def app(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.get(f"{GROUP}/{VERSION}", KIND, namespace, name)

    def record(
        self, namespace: str, name: str, status: dict[str, Any] | None, annotations: dict[str, str] | None
    ) -> None:
        """The pass's writes of the app: its status (the status subresource), then its annotations."""
        if status is not None:
            self.kube.patch(f"{GROUP}/{VERSION}", KIND, namespace, name, {"status": status}, "status")
        if annotations is not None:
            self.kube.patch(f"{GROUP}/{VERSION}", KIND, namespace, name, {"metadata": {"annotations": annotations}})

    def spark_application(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.get(names.SPARK_APPLICATION_API, "SparkApplication", namespace, name)
        except KindNotServed:
            return None

    # ----------------------------------------------------------------------------- children
    # ------------------------------------------------------------------------------- Kafka
    def bootstrap(self, spec: StreamingAppSpec, namespace: str) -> str:
        """The app's Kafka address: its bootstrapServers, or its Strimzi listener's as the Kafka resource's status
        tells it (read at most every BOOTSTRAP_TTL_SECONDS); the Service Strimzi names for the listener while
        the status does not tell it (no Kafka resource yet, or its CRD not installed)."""
        cluster = spec.kafka.strimziCluster
        if cluster is None:
            return bootstrap_for(spec, namespace)
        key = (cluster.namespace or namespace, cluster.name, cluster.listener)
        read_at, address = self._bootstraps.get(key, (-BOOTSTRAP_TTL_SECONDS, None))
        if time.monotonic() - read_at >= BOOTSTRAP_TTL_SECONDS:
            try:
                kafka = self.get(names.KAFKA_API, "Kafka", key[0], key[1])
            except (KubeError, KindNotServed):
                kafka = None
            address = ch.listener_bootstrap(kafka, cluster.listener)
            self._bootstraps[key] = (time.monotonic(), address)
        return address or bootstrap_for(spec, namespace)

    def kafka_client(self, namespace: str, kafka: KafkaSpec, bootstrap: str) -> KafkaClient:
        """The operator's own login to the app's Kafka: the Secrets spec.kafka names, read through the API server
        (the driver reads the same keys as mounted files). Raises CredentialUnreadable naming the spec field."""
        security, files = kafka_security(kafka)
        data: dict[str, dict[str, str] | None] = {}

        def read(path: str) -> str:
            source = files[path]
            if source.secret not in data:
                secret = self.get("v1", "Secret", namespace, source.secret)
                data[source.secret] = None if secret is None else (secret.get("data") or {})
            values = data[source.secret]
            if values is None:
                raise CredentialUnreadable(f"{source.field}: no Secret {source.secret} in namespace {namespace}")
            if not values.get(source.key):
                raise CredentialUnreadable(f"{source.field}: Secret {source.secret} has no key {source.key}")
            return base64.b64decode(values[source.key]).decode()

        def name(path: str) -> str:
            return f"{files[path].field} (Secret {files[path].secret}, key {files[path].key})"

        return KafkaClient(bootstrap, security, read_credentials(security, read, name))

    def ensure_topics(self, owner: dict[str, Any], desired: DesiredState, obs: Observation) -> None:
        """The app's topics; first its Kafka credentials are read (the driver would mount them), so a missing
        Secret or a refused login is reported (obs.kafka_error) before anything else is made."""
        try:
            client = self.kafka_client(owner["metadata"]["namespace"], desired.spec.kafka, desired.bootstrap)
        except CredentialUnreadable as exc:
            obs.kafka_error = str(exc)
            return
        try:
            if desired.admin_topics:
                admin = AdminTopics(client, timeout=15)
                plan = plan_topics(desired.admin_topics, admin.existing([t.name for t in desired.admin_topics]))
                admin.apply(plan)
                obs.topics_refused.update(plan.refused)
            for topic in desired.strimzi_topics:
                self._ensure_kafka_topic(owner, desired, topic, obs)
        except KubeError as exc:
            obs.topics_error = f"KafkaTopic: {exc}"
        except KindNotServed:
            obs.topics_error = "the KafkaTopic CRD (kafka.strimzi.io) is not installed"
        except KafkaLoginRefused as exc:
            obs.kafka_error = str(exc)
        except Exception as exc:  # Kafka unreachable, auth, ...: reported, retried on the next pass
            obs.topics_error = f"Kafka admin: {exc}"

    def _ensure_kafka_topic(
        self, owner: dict[str, Any], desired: DesiredState, topic: dict[str, Any], obs: Observation
    ) -> None:
        meta = topic["metadata"]
        current = self.get(topic["apiVersion"], topic["kind"], meta["namespace"], meta["name"])
        pending = ch.kafka_topic_pending(current)
        if pending:
            obs.topics_pending[meta["name"]] = pending
        have = ((current or {}).get("spec") or {}).get("partitions")
        if have and have > topic["spec"]["partitions"]:
            obs.topics_refused[topic["spec"]["topicName"]] = (
                f"topic {topic['spec']['topicName']} has {have} partitions; shrinking to "
                f"{topic['spec']['partitions']} is not possible in Kafka"
            )
            topic = {**topic, "spec": {**topic["spec"], "partitions": have}}
        spec_topic = next(t for t in desired.spec.topics if t.name == topic["spec"]["topicName"])
        if spec_topic.deletionPolicy == "delete" and meta["namespace"] == owner["metadata"]["namespace"]:
            adopt(topic, owner)  # deleted with the app; Strimzi then deletes the Kafka topic
        self.apply(topic)

    def ensure_children(
        self,
        owner: dict[str, Any],
        desired: DesiredState,
        obs: Observation,
        keep: frozenset[str],
        driver: str,
        driver_app: dict[str, Any] | None = None,
    ) -> None:
        """`driver_app`: the driver's SparkApplication as observed this pass."""
        for child in desired.children:
            if ch.owned_by_app(child, desired.spec):
                adopt(child, owner)
            try:
                if child["kind"] == "PersistentVolumeClaim":
                    self._ensure_claim(child, obs.checkpoint_claim)
                elif child["kind"] == "RoleBinding":
                    self._apply_binding(child)
                elif child["kind"] == "SparkApplication" and sparkapp.kept_as_submitted(driver_app, child):
                    self._relabel(child, driver_app or {})
                else:
                    self.apply(child)
            except KubeError as exc:
                obs.apply_error = f"{child['kind']} {child['metadata']['name']}: {exc}"
            except KindNotServed:
                obs.apply_error = f"the {child['kind']} CRD ({child['apiVersion']}) is not installed"
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        if desired.spec.suspend:
            self.delete(names.SPARK_APPLICATION_API, "SparkApplication", namespace, driver)
        self._prune_pipeline_configmaps(namespace, app, keep)

    def _relabel(self, child: dict[str, Any], current: dict[str, Any]) -> None:
        """Only the labels of a SparkApplication kept as submitted (the revision its driver runs), and the runtime
        it runs where an earlier release did not stamp it: spark-operator restarts the driver on a change of its
        spec, not of its metadata."""
        meta, now = child["metadata"], current.get("metadata", {})
        have_labels, have_annotations = now.get("labels") or {}, now.get("annotations") or {}
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if have_labels.get(k) != v}
        annotations = (
            {}
            if names.RUNTIME_ANNOTATION in have_annotations
            else {names.RUNTIME_ANNOTATION: meta["annotations"][names.RUNTIME_ANNOTATION]}
        )
        patch = {key: value for key, value in (("labels", labels), ("annotations", annotations)) if value}
        if patch:  # a merge patch: the keys named change, the others stay
            self.kube.patch(child["apiVersion"], child["kind"], meta["namespace"], meta["name"], {"metadata": patch})

    def _ensure_claim(self, claim: dict[str, Any], found: sparkapp.ClaimFacts | None) -> None:
        """Created once (a claim's spec is mostly immutable); afterwards only its owner changes with the
        app's deletionPolicy (owned: deleted with the app; not owned: retained). `found`: the claim as this pass
        observed it (read here when it observed none of that name)."""
        meta = claim["metadata"]
        if found is None or found.name != meta["name"]:
            found = self.checkpoint_claim(meta["namespace"], meta["name"])
        if not found.exists:
            self.apply(claim)
            return
        owners = meta.get("ownerReferences") or []
        if found.owner_uids != tuple(owner["uid"] for owner in owners):
            self.kube.patch(
                "v1",
                "PersistentVolumeClaim",
                meta["namespace"],
                meta["name"],
                {"metadata": {"ownerReferences": owners or None}},
            )

    def delete_driver(self, namespace: str, driver: str) -> None:
        """A driver a handover no longer needs, with its runner ConfigMap."""
        self.delete(names.SPARK_APPLICATION_API, "SparkApplication", namespace, driver)
        self.delete("v1", "ConfigMap", namespace, names.runner_configmap_name(driver))

    def delete_topics(self, spec_raw: dict[str, Any], namespace: str) -> None:
        """The app's Admin-API topics whose deletionPolicy is delete (KafkaTopics go with their owner)."""
        parsed = parse_spec(spec_raw)
        if isinstance(parsed, Invalid):
            return
        desired = desired_state("_", namespace, parsed, bootstrap=self.bootstrap(parsed, namespace))
        doomed = [t.name for t in desired.admin_topics if t.deletionPolicy == "delete"]
        if not doomed:
            return
        try:
            client = self.kafka_client(namespace, parsed.kafka, desired.bootstrap)
        except CredentialUnreadable as exc:  # its Secret went first (a namespace deleted): the app still goes
            log.warning("%s: topics %s kept, the login is gone: %s", namespace, ", ".join(doomed), exc)
            return
        AdminTopics(client, timeout=15).delete(doomed)

    # ---------------------------------------------------------------------------- revisions
    def revisions(self, namespace: str, app: str) -> set[str]:
        """The revisions whose pipeline ConfigMap exists."""
        labels = (item["metadata"].get("labels") or {} for item in self._pipeline_configmaps(namespace, app))
        return {rev for rev in (label.get(names.REVISION_LABEL) for label in labels) if rev}

    def apply_revision(self, owner: dict[str, Any], spec: StreamingAppSpec, bootstrap: str) -> None:
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        configmap = ch.pipeline_configmap(app, namespace, spec, bootstrap)
        adopt(configmap, owner)
        self.apply(configmap)

    def revision_spec(
        self, namespace: str, app: str, revision: str, specs: dict[str, StreamingAppSpec]
    ) -> StreamingAppSpec | None:
        """A revision's spec, from its ConfigMap (None: gone, or written before revisions kept their spec);
        `specs`: the ones this pass read already."""
        if revision not in specs:
            configmap = self.get("v1", "ConfigMap", namespace, revision_configmap_name(app, revision))
            text = ((configmap or {}).get("data") or {}).get(REVISION_SPEC_FILE)
            try:
                specs[revision] = StreamingAppSpec.model_validate_json(text) if text else None  # type: ignore[assignment]
            except ValueError:
                log.warning("%s/%s: the spec kept for revision %s does not parse", namespace, app, revision)
                specs[revision] = None  # type: ignore[assignment]
        return specs[revision]

    def runner_revision(self, namespace: str, driver: str) -> str | None:
        """The revision a driver of the SparkApplication `driver` reads when it starts (its runner ConfigMap)."""
        configmap = self.get("v1", "ConfigMap", namespace, names.runner_configmap_name(driver))
        text = ((configmap or {}).get("data") or {}).get(RUNNER_CONFIG_FILE)
        try:
            return RunnerConfig.model_validate_json(text).revision if text else None
        except ValueError:
            return None

    def _pipeline_configmaps(self, namespace: str, app: str) -> list[dict[str, Any]]:
        selector = f"{names.APP_LABEL}={app},app.kubernetes.io/component=pipeline"
        return self.kube.list("v1", "ConfigMap", namespace, selector)

    def _prune_pipeline_configmaps(self, namespace: str, app: str, keep: frozenset[str]) -> None:
        """Revisions no rollout needs any more (the stable one, and a rollout's two, are kept)."""
        for item in self._pipeline_configmaps(namespace, app):
            meta = item["metadata"]
            if (meta.get("labels") or {}).get(names.REVISION_LABEL) not in keep:
                log.info("%s/%s: revision ConfigMap %s pruned (kept: %s)", namespace, app, meta["name"], sorted(keep))
                # gone already: a concurrent pass (update handler vs resync) got there first
                self.delete("v1", "ConfigMap", namespace, meta["name"])

    # -------------------------------------------------------------------------- control token
    def ensure_control_secret(self, owner: dict[str, Any]) -> None:
        """The control token is made once and kept (the driver mounts it; rotating it is deleting it)."""
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        if self.get("v1", "Secret", namespace, names.control_secret_name(app)) is not None:
            return
        secret = ch.control_secret(app, namespace, secrets.token_urlsafe(32))
        adopt(secret, owner)
        with contextlib.suppress(KubeError):  # 409: a concurrent pass created it
            self.kube.create(secret)
        self.forget_token(namespace, app)

    def control_token(self, namespace: str, app: str) -> str | None:
        key = (namespace, app)
        if key not in self._tokens:
            secret = self.get("v1", "Secret", namespace, names.control_secret_name(app))
            encoded = ((secret or {}).get("data") or {}).get(names.CONTROL_TOKEN_KEY)
            if not encoded:
                return None
            self._tokens[key] = base64.b64decode(encoded).decode().strip()
        return self._tokens[key]

    def forget_token(self, namespace: str, app: str) -> None:
        """Read the Secret again next time (a driver refused the token: it may have been rotated)."""
        self._tokens.pop((namespace, app), None)
