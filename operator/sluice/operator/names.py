"""The names, labels and annotations of an app's children: what the children are made with (children.py,
spark_application.py) and what the rest of the operator finds them, and reads their facts back, by."""

from __future__ import annotations

import hashlib
import re

from sluice.api.contract import DEFAULT_CONTROL_PORT

from .model import StreamingAppSpec

MANAGED_BY = "sluice-operator"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
APP_LABEL = "sluice.dev/app"
REVISION_LABEL = "sluice.dev/revision"
SUBMITTED_EXECUTORS_ANNOTATION = "sluice.dev/submitted-executors"
# On the driver pod template: the revision the SparkApplication was submitted for. spark-operator resubmits
# on any spec change, so it changes only when a rollout restarts the driver (a hot swap does not).
SUBMITTED_REVISION_ANNOTATION = "sluice.dev/submitted-revision"
# On the SparkApplication, for kept_as_submitted: a hash of its spec as this operator rendered it, and one of the
# app's runtime it was rendered from (what only a new driver applies).
RENDERED_ANNOTATION = "sluice.dev/rendered"
RUNTIME_ANNOTATION = "sluice.dev/runtime"
CONTROL_PORT = DEFAULT_CONTROL_PORT  # the driver's control API: /metrics, /healthz, /v1/...
RUNNER_FILE = "local:///opt/sluice/runner.py"
PIPELINE_MOUNT = "/etc/sluice"
CONTROL_TOKEN_MOUNT = "/etc/sluice-control"
CONTROL_TOKEN_KEY = "token"
# Pods with this label may reach drivers' control ports (the chart puts it on the operator's pods; give
# it to Prometheus to scrape /metrics). Writes still need the app's token.
DRIVER_CLIENT_LABEL = "sluice.dev/driver-client"
SPARK_NETWORK_POLICY_STEP = "org.apache.spark.deploy.k8s.features.NetworkPolicyFeatureStep"
# The container names spark-operator gives Spark for its pod templates.
SPARK_CONTAINERS = {"driver": "spark-kubernetes-driver", "executor": "spark-kubernetes-executor"}
SPARK_APPLICATION_API = "sparkoperator.k8s.io/v1beta2"
KAFKA_TOPIC_API = KAFKA_API = "kafka.strimzi.io/v1"


def labels(app: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "sluice-app",
        "app.kubernetes.io/instance": app,
        "app.kubernetes.io/component": component,
        MANAGED_BY_LABEL: MANAGED_BY,
        APP_LABEL: app,
    }


def executor_selector(app: str) -> str:
    """The app's executor pods as a label selector (status.selector: the scale subresource's)."""
    return f"{APP_LABEL}={app},app.kubernetes.io/component=executor"


def runner_configmap_name(app: str) -> str:
    return f"{app}-runner"


def control_secret_name(app: str) -> str:
    return f"{app}-control"


def service_account_name(app: str, spec: StreamingAppSpec) -> str:
    return spec.spark.serviceAccount or f"{app}-spark"


def checkpoint_claim_name(app: str, spec: StreamingAppSpec) -> str | None:
    """The claim mounted at the checkpoint location: the app's own, else one the operator creates; none for
    a Hadoop URI (s3a://, hdfs://…), which is durable by itself."""
    if spec.checkpoint.volumeClaim:
        return spec.checkpoint.volumeClaim
    return None if spec.checkpoint.is_hadoop_uri() else f"{app}-checkpoints"


def kafka_topic_name(topic: str) -> str:
    """Kubernetes names are DNS-1123: lower case, '-' and '.'; a hash keeps mapped names unique."""
    name = re.sub(r"[^a-z0-9.-]", "-", topic.lower()).strip("-.")[:50] or "topic"
    if name != topic:
        name = f"{name}-{hashlib.sha256(topic.encode()).hexdigest()[:8]}"
    return name
