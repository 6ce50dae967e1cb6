"""The reconciler's Kubernetes client against a real kube-apiserver (the test bed's), logged in from the
kubeconfig as the operator is out of a cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.operator.kube import KindNotServed, Kube, KubeError
from sluice.operator.model import GROUP, KIND, VERSION

MANAGER = "sluice-test"


@pytest.fixture
def kube(crds_installed, monkeypatch) -> Iterator[Kube]:
    monkeypatch.setenv("KUBECONFIG", str(crds_installed.kubeconfig))
    client = Kube()
    yield client
    client.close()


def config_map(namespace: str, data: dict[str, str], labels: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": namespace, "labels": labels or {"team": "a"}},
        "data": data,
    }


def test_apply_get_list_patch_delete(kube: Kube, namespace: str) -> None:
    assert kube.get("v1", "ConfigMap", namespace, "cm") is None
    created = kube.apply(config_map(namespace, {"k": "1"}), MANAGER)
    assert created["data"] == {"k": "1"}
    kube.apply(config_map(namespace, {"k": "2"}), MANAGER)  # applied again: updated in place
    got = kube.get("v1", "ConfigMap", namespace, "cm")
    assert got is not None and got["data"] == {"k": "2"}
    assert got["metadata"]["uid"] == created["metadata"]["uid"]
    assert any(m["manager"] == MANAGER and m["operation"] == "Apply" for m in got["metadata"]["managedFields"])

    assert [i["metadata"]["name"] for i in kube.list("v1", "ConfigMap", namespace, "team=a")] == ["cm"]
    assert kube.list("v1", "ConfigMap", namespace, "team=b") == []

    kube.patch("v1", "ConfigMap", namespace, "cm", {"metadata": {"labels": {"team": None, "tier": "x"}}})
    got = kube.get("v1", "ConfigMap", namespace, "cm")
    assert got is not None and got["metadata"]["labels"] == {"tier": "x"}  # null removed the label

    with pytest.raises(KubeError) as exists:
        kube.create(config_map(namespace, {"k": "3"}))
    assert exists.value.status == 409
    assert "already exists" in str(exists.value)  # the API server's own message

    kube.delete("v1", "ConfigMap", namespace, "cm")
    kube.delete("v1", "ConfigMap", namespace, "cm")  # gone already: fine
    assert kube.get("v1", "ConfigMap", namespace, "cm") is None


def test_status_subresource_and_refusals(kube: Kube, namespace: str) -> None:
    app = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": "app", "namespace": namespace},
        "spec": {
            "kafka": {"bootstrapServers": "kafka.invalid:9092"},
            "topics": [{"name": "in", "management": "none"}],
            "pipeline": {
                "nodes": [
                    {"name": "src", "fromKafka": {"topic": "in"}},
                    {"name": "out", "inputs": ["src"], "toConsole": {}},
                ]
            },
        },
    }
    kube.create(app)
    kube.patch(f"{GROUP}/{VERSION}", KIND, namespace, "app", {"status": {"phase": "Pending"}}, "status")
    got = kube.get(f"{GROUP}/{VERSION}", KIND, namespace, "app")
    assert got is not None and got["status"]["phase"] == "Pending"

    with pytest.raises(KubeError) as invalid:  # the CRD's schema refuses it: the API server's message says why
        kube.patch(f"{GROUP}/{VERSION}", KIND, namespace, "app", {"spec": {"topics": "not a list"}})
    assert invalid.value.status == 422 and "spec.topics" in str(invalid.value)
    # Gone before its namespace: an operator started by a later test finds no app in a terminating namespace
    # (a cold CI run's operator handled this one first, retrying its events there, and the next app waited).
    kube.delete(f"{GROUP}/{VERSION}", KIND, namespace, "app")


def test_kinds_not_served(kube: Kube) -> None:
    with pytest.raises(KindNotServed, match=r"no example\.invalid/v1"):
        kube.get("example.invalid/v1", "Widget", "default", "w")
    with pytest.raises(KindNotServed, match="no Widget in v1"):
        kube.get("v1", "Widget", "default", "w")


def test_the_operator_brings_an_older_served_crd_up_to_its_own(kube: Kube, crds_installed) -> None:
    """Helm never upgrades a chart's CRDs: the operator does at start. An older CRD (another release, without
    a condition type this operator writes) becomes this operator's; a later release's is left as it is."""
    import json

    from sluice.operator import crd
    from sluice.operator.cluster import Cluster

    ours = crd.crd()
    older = json.loads(json.dumps(ours))
    older["metadata"]["annotations"] = {crd.VERSION_ANNOTATION: "0.0.1", crd.SCHEMA_ANNOTATION: "old"}
    conditions = older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
        "conditions"
    ]["items"]["properties"]["type"]
    conditions["enum"] = [c for c in conditions["enum"] if c != "CheckpointReady"]
    name = ours["metadata"]["name"]
    try:
        kube.apply(older, "helm")
        why = Cluster(kube).upgrade_crd()
        assert why is not None and "0.0.1" in why, why
        served = kube.get(crd.CRD_API, "CustomResourceDefinition", None, name)
        assert served is not None and served["metadata"]["annotations"] == ours["metadata"]["annotations"]
        served_types = served["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"][
            "conditions"
        ]["items"]["properties"]["type"]["enum"]
        assert "CheckpointReady" in served_types
        assert Cluster(kube).upgrade_crd() is None, "up to date: left alone"

        later = json.loads(json.dumps(older))
        later["metadata"]["annotations"] = {crd.VERSION_ANNOTATION: "99.0.0", crd.SCHEMA_ANNOTATION: "new"}
        kube.apply(later, "helm")
        assert Cluster(kube).upgrade_crd() is None
        served = kube.get(crd.CRD_API, "CustomResourceDefinition", None, name)
        assert served is not None and served["metadata"]["annotations"][crd.VERSION_ANNOTATION] == "99.0.0"
    finally:
        kube.apply(ours, "sluice-test")
