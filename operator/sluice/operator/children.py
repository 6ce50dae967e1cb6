"""The children of a StreamingApp, built as plain dicts by small pure functions: its revisions' ConfigMaps, the
control Secret, the driver's account, Service and NetworkPolicies, its checkpoint claim, its KafkaTopics, and
(spark_application.py) the driver's SparkApplication. `children` lists what the app should have now.

Owner references are added as children are applied (cluster.adopt); everything else about a child is decided
here, so tests can check a child without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.api.app import revision
from sluice.api.contract import REVISION_SPEC_FILE, RUNNER_CONFIG_FILE, Migration, RunnerConfig, revision_configmap_name
from sluice.api.kafka_clients import kafka_security

from .model import StreamingAppSpec, TopicSpec
from .names import (
    APP_LABEL,
    CONTROL_PORT,
    CONTROL_TOKEN_KEY,
    CONTROL_TOKEN_MOUNT,
    DRIVER_CLIENT_LABEL,
    KAFKA_TOPIC_API,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    REVISION_LABEL,
    checkpoint_claim_name,
    control_secret_name,
    kafka_topic_name,
    labels,
    runner_configmap_name,
    service_account_name,
)
from .settings import Access, ClaimDefaults
from .spark_application import ClaimFacts, DriverPin, pods_kept_together, spark_application


def checkpoint_claim(
    app: str, namespace: str, spec: StreamingAppSpec, defaults: ClaimDefaults
) -> dict[str, Any] | None:
    """The claim the operator creates (None when the app names its own or checkpoints to a Hadoop URI)."""
    if spec.checkpoint.volumeClaim or spec.checkpoint.is_hadoop_uri():
        return None
    claim_spec: dict[str, Any] = {
        "accessModes": [defaults.access_mode],
        "resources": {"requests": {"storage": spec.checkpoint.size or defaults.size}},
    }
    storage_class = spec.checkpoint.storageClassName or defaults.storage_class
    if storage_class:
        claim_spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": checkpoint_claim_name(app, spec),
            "namespace": namespace,
            "labels": labels(app, "checkpoints"),
        },
        "spec": claim_spec,
    }


def owned_by_app(child: dict[str, Any], spec: StreamingAppSpec) -> bool:
    """Children are garbage-collected with their app, except a checkpoint claim the app retains."""
    return child["kind"] != "PersistentVolumeClaim" or spec.checkpoint.deletionPolicy == "delete"


def checkpoint_root(app: str, spec: StreamingAppSpec) -> str:
    return f"{spec.checkpoint.location_or_claim_path.rstrip('/')}/{app}"


def runner_config(
    app: str,
    namespace: str,
    spec: StreamingAppSpec,
    bootstrap: str,
    checkpoints: Mapping[str, str] | None = None,
    migrations: Mapping[str, Migration] | None = None,
    standby: bool = False,
) -> RunnerConfig:
    """The one thing the driver is given: this revision of the app, with the Kafka address resolved, and where
    its queries' checkpoints are (rollout.decide.revision_checkpoints; default: a folder per query's name).
    `standby`: the driver starts no query until asked (a fenced handover's drivers, as rollout.decide says)."""
    return RunnerConfig(
        app=app,
        namespace=namespace,
        revision=revision(spec),
        kafkaBootstrap=bootstrap,
        kafkaSecurity=kafka_security(spec.kafka)[0],
        pipeline=spec.pipeline,
        checkpointRoot=checkpoint_root(app, spec),
        checkpoints=dict(checkpoints or {}),
        migrations=dict(migrations or {}),
        standby=standby,
        controlPort=CONTROL_PORT,
        controlTokenFile=f"{CONTROL_TOKEN_MOUNT}/{CONTROL_TOKEN_KEY}",
    )


def _runner_json(config: RunnerConfig) -> str:
    return config.model_dump_json(by_alias=True, exclude_none=True, indent=2)


def pipeline_configmap(app: str, namespace: str, spec: StreamingAppSpec, bootstrap: str) -> dict[str, Any]:
    """One revision: what its driver runs, and the spec it came from (a rollout's diff base)."""
    rev = revision(spec)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": revision_configmap_name(app, rev),
            "namespace": namespace,
            "labels": {**labels(app, "pipeline"), REVISION_LABEL: rev},
        },
        "data": {
            RUNNER_CONFIG_FILE: _runner_json(runner_config(app, namespace, spec, bootstrap)),
            REVISION_SPEC_FILE: spec.model_dump_json(by_alias=True, exclude_none=True, indent=2),
        },
    }


def runner_configmap(app: str, namespace: str, config: RunnerConfig, driver: str | None = None) -> dict[str, Any]:
    """What the driver runs when it starts (the runner reads it once): the stable revision, or the one a rollout
    swapped in. A fixed name per driver (`driver`: its SparkApplication, default the app's), so a new revision
    does not change the SparkApplication (spark-operator would resubmit it)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": runner_configmap_name(driver or app),
            "namespace": namespace,
            "labels": {**labels(app, "runner"), REVISION_LABEL: config.revision},
        },
        "data": {RUNNER_CONFIG_FILE: _runner_json(config)},
    }


def control_secret(app: str, namespace: str, token: str) -> dict[str, Any]:
    """The bearer token the driver's control API wants for writes; the operator reads it to call the API."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": control_secret_name(app), "namespace": namespace, "labels": labels(app, "control")},
        "stringData": {CONTROL_TOKEN_KEY: token},
    }


def network_policies(app: str, namespace: str) -> list[dict[str, Any]]:
    """The driver admits its control port only from driver clients (the operator) and anything from its own
    executors (Spark's RPC and block manager); executors admit only their driver and each other (what Spark
    4.2's own executor policy does, made here because spark-operator may not create it)."""

    def peers(*roles: str) -> list[dict[str, Any]]:
        return [{"podSelector": {"matchLabels": {APP_LABEL: app, "spark-role": role}}} for role in roles]

    def policy(role: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": f"{app}-{role}", "namespace": namespace, "labels": labels(app, role)},
            "spec": {
                "podSelector": {"matchLabels": {APP_LABEL: app, "spark-role": role}},
                "policyTypes": ["Ingress"],
                "ingress": ingress,
            },
        }

    clients = {
        "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {DRIVER_CLIENT_LABEL: "true"}}}],
        "ports": [{"protocol": "TCP", "port": CONTROL_PORT}],
    }
    return [
        policy("driver", [{"from": peers("executor")}, clients]),
        policy("executor", [{"from": peers("driver", "executor")}]),
    ]


def service_account(app: str, namespace: str, spec: StreamingAppSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": service_account_name(app, spec), "namespace": namespace, "labels": labels(app, "driver")},
    }


def driver_role_binding(app: str, namespace: str, spec: StreamingAppSpec, cluster_role: str) -> dict[str, Any]:
    """The driver's rights in its namespace: the chart's driver ClusterRole, which the operator may bind but
    does not hold."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": f"{app}-spark", "namespace": namespace, "labels": labels(app, "driver")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "name": service_account_name(app, spec), "namespace": namespace}],
    }


def operator_role_binding(namespace: str, cluster_role: str, account: tuple[str, str]) -> dict[str, Any]:
    """The operator's own rights in a namespace where it handles apps (the chart's app-namespace ClusterRole)."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": cluster_role, "namespace": namespace, "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"kind": "ServiceAccount", "namespace": account[0], "name": account[1]}],
    }


def driver_service(app: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{app}-driver", "namespace": namespace, "labels": labels(app, "driver")},
        "spec": {
            "selector": {APP_LABEL: app, "app.kubernetes.io/component": "driver", "spark-role": "driver"},
            "ports": [{"name": "metrics", "port": CONTROL_PORT, "targetPort": CONTROL_PORT}],
        },
    }


def kafka_topic(app: str, namespace: str, topic: TopicSpec, cluster: str) -> dict[str, Any]:
    return {
        "apiVersion": KAFKA_TOPIC_API,
        "kind": "KafkaTopic",
        "metadata": {
            "name": kafka_topic_name(topic.name),
            "namespace": namespace,
            "labels": {**labels(app, "topic"), "strimzi.io/cluster": cluster},
        },
        "spec": {
            "topicName": topic.name,
            "partitions": topic.partitions,
            **({"replicas": topic.replicas} if topic.replicas else {}),  # none: the cluster's default
            "config": dict(topic.config),
        },
    }


def listener_bootstrap(kafka: dict[str, Any] | None, listener: str) -> str | None:
    """A Strimzi Kafka's listener address as its status tells it (status.listeners[].bootstrapServers)."""
    listeners = ((kafka or {}).get("status") or {}).get("listeners") or []
    return next((item.get("bootstrapServers") for item in listeners if item.get("name") == listener), None)


def kafka_topic_pending(topic: dict[str, Any] | None) -> str | None:
    """Why a KafkaTopic is not usable yet, as Strimzi's topic operator tells it in its status (its Ready
    condition, for the generation it observed); None when it is Ready."""
    if topic is None:
        return "created; waiting for Strimzi's topic operator"
    status = topic.get("status") or {}
    if status.get("observedGeneration", 0) < topic["metadata"].get("generation", 1):
        return "waiting for Strimzi's topic operator to observe the change"
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None:
        return "no Ready condition yet"
    if ready.get("status") == "True":
        return None
    return f"{ready.get('reason') or 'NotReady'}: {ready.get('message') or 'not ready'}"


def children(
    app: str,
    namespace: str,
    spec: StreamingAppSpec,
    bootstrap: str,
    submitted_executors: int | None = None,
    claims: ClaimDefaults | None = None,
    pin: DriverPin | None = None,
    runner: RunnerConfig | None = None,
    driver_spec: StreamingAppSpec | None = None,
    driver: str | None = None,
    driver_role: str = Access.driver_cluster_role,
    claim: ClaimFacts | None = None,
) -> list[dict[str, Any]]:
    """Every child the app should have now (topics are handled on their own: they outlive the driver; the
    control Secret too: its token is made once, not on every pass). `runner`: what a starting driver runs
    (`pin.runs`'s config; default: this spec's). `driver_spec`: the spec of the revision the SparkApplication
    is submitted for (`pin.submitted`; default: this one): a change that is not rolled out by a restart (refused,
    swapped in, or needing no rollout) leaves the SparkApplication as it is, so spark-operator does not
    resubmit it. `driver`: the SparkApplication of the app's driver (default: the app's name; after a fenced
    handover, the one that took over). `driver_role`: the ClusterRole the driver's account is bound to.
    `claim`: the app's own checkpoint claim as observed."""
    out = [service_account(app, namespace, spec)] if not spec.spark.serviceAccount else []
    out += [
        driver_role_binding(app, namespace, spec, driver_role),
        pipeline_configmap(app, namespace, spec, bootstrap),
        runner_configmap(app, namespace, runner or runner_config(app, namespace, spec, bootstrap), driver),
        driver_service(app, namespace),
        *network_policies(app, namespace),
    ]
    claims = claims or ClaimDefaults()
    created = checkpoint_claim(app, namespace, spec, claims)
    if created is not None and claims.create:
        out.append(created)
    if not spec.suspend:
        submitted = driver_spec or spec
        together = pods_kept_together(submitted, claims, claim)
        out.append(spark_application(app, namespace, submitted, submitted_executors, pin, driver, together))
    return out
