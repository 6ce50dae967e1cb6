"""spark-operator and Strimzi CRDs on the real API server: children are validated server-side."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import yaml

from sluice.testbed.common import ProvisionError
from sluice.testbed.external_crds import install_external_crds, java_at_least, spark_operator_chart
from sluice.testbed.kube import ControlPlane, KubectlError
from sluice.testbed.versions import SPARK_OPERATOR

SPARK_APPLICATION = {
    "apiVersion": "sparkoperator.k8s.io/v1beta2",
    "kind": "SparkApplication",
    "spec": {
        "type": "Python",
        "mode": "cluster",
        "sparkVersion": "4.0.1",
        "image": "spark:4.0.1-python3",
        "mainApplicationFile": "local:///opt/sluice/main.py",
        "driver": {"cores": 1, "memory": "512m", "serviceAccount": "spark"},
        "executor": {"instances": 1, "cores": 1, "memory": "512m"},
    },
}

KAFKA_TOPIC = {
    "apiVersion": "kafka.strimzi.io/v1",
    "kind": "KafkaTopic",
    "metadata": {"labels": {"strimzi.io/cluster": "events"}},
    "spec": {
        "topicName": "orders.v1",
        "partitions": 3,
        "replicas": 1,
        "config": {"retention.ms": 604800000, "cleanup.policy": "delete"},
    },
}


@pytest.fixture(scope="module")
def cluster(kube_cluster: ControlPlane) -> ControlPlane:
    try:
        install_external_crds(kube_cluster.kubectl)
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
    return kube_cluster


@pytest.fixture
def namespace(cluster: ControlPlane) -> str:
    name = f"crds-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    return name


def with_changes(base: dict[str, Any], name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    metadata = {**base.get("metadata", {}), "name": name, "namespace": namespace}
    return {**base, "metadata": metadata, "spec": {**base["spec"], **spec}}


def create(cluster: ControlPlane, manifest: dict[str, Any]) -> tuple[bool, str]:
    # --validate=false: no client-side checks, so any rejection is the API server's schema validation.
    result = cluster.kubectl(
        "create", "--validate=false", "-o", "json", "-f", "-", input=json.dumps(manifest), check=False
    )
    return result.returncode == 0, result.stdout if result.returncode == 0 else result.stderr


def test_api_resources_list_spark_and_strimzi_kinds(cluster: ControlPlane) -> None:
    listed = cluster.kubectl("api-resources", "-o", "name").stdout.split()

    for resource in (
        "sparkapplications.sparkoperator.k8s.io",
        "scheduledsparkapplications.sparkoperator.k8s.io",
        "kafkatopics.kafka.strimzi.io",
        "kafkas.kafka.strimzi.io",
        "kafkanodepools.kafka.strimzi.io",
    ):
        assert resource in listed


def test_strimzi_serves_v1_as_storage_version(cluster: ControlPlane) -> None:
    crd = json.loads(cluster.kubectl("get", "crd", "kafkatopics.kafka.strimzi.io", "-o", "json").stdout)

    assert [(v["name"], v["served"], v["storage"]) for v in crd["spec"]["versions"]] == [("v1", True, True)]


def test_valid_spark_application_is_accepted(cluster: ControlPlane, namespace: str) -> None:
    ok, out = create(cluster, with_changes(SPARK_APPLICATION, "etl", namespace))

    assert ok, out
    stored = json.loads(out)
    assert stored["spec"]["type"] == "Python"
    assert stored["spec"]["executor"] == {"instances": 1, "cores": 1, "memory": "512m"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"type": "Cobol"}, 'spec.type: Unsupported value: "Cobol"'),
        ({"executor": {"instances": "two"}}, "spec.executor.instances: Invalid value"),
        ({"sparkVersion": None}, "spec.sparkVersion: Required value"),
    ],
)
def test_invalid_spark_application_is_rejected(
    cluster: ControlPlane, namespace: str, change: dict[str, Any], message: str
) -> None:
    manifest = with_changes(SPARK_APPLICATION, "bad", namespace, **change)
    manifest["spec"] = {key: value for key, value in manifest["spec"].items() if value is not None}

    ok, out = create(cluster, manifest)

    assert not ok
    assert message in out


def test_valid_kafka_topic_is_accepted(cluster: ControlPlane, namespace: str) -> None:
    ok, out = create(cluster, with_changes(KAFKA_TOPIC, "orders", namespace))

    assert ok, out
    stored = json.loads(out)
    assert stored["spec"]["partitions"] == 3
    assert stored["spec"]["config"]["cleanup.policy"] == "delete"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"partitions": "many"}, "spec.partitions: Invalid value"),
        ({"partitions": 0}, "spec.partitions: Invalid value"),
        ({"replicas": 40000}, "spec.replicas: Invalid value"),
    ],
)
def test_invalid_kafka_topic_is_rejected(
    cluster: ControlPlane, namespace: str, change: dict[str, Any], message: str
) -> None:
    ok, out = create(cluster, with_changes(KAFKA_TOPIC, "bad", namespace, **change))

    assert not ok
    assert message in out


def test_install_is_idempotent(cluster: ControlPlane) -> None:
    install_external_crds(cluster.kubectl)


def test_spark_operator_chart_matches_the_pinned_version() -> None:
    chart = yaml.safe_load((spark_operator_chart() / "Chart.yaml").read_text())

    assert (chart["name"], chart["version"]) == ("spark-operator", SPARK_OPERATOR)


def test_missing_java_is_one_clear_line() -> None:
    with pytest.raises(ProvisionError, match=r"needs Java >= 99 .* set JAVA_HOME") as caught:
        java_at_least(99, "the generator")

    assert "\n" not in str(caught.value)


def test_kubectl_failure_is_one_clear_line() -> None:
    def kubectl(*args: str) -> None:
        raise KubectlError("kubectl apply failed (exit 1): error: connection refused\nmore detail")

    with pytest.raises(ProvisionError, match=r"CRDs failed: .*connection refused$"):
        install_external_crds(kubectl)
