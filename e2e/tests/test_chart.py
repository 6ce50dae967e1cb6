"""The Helm chart (charts/sluice) and the images' build contexts, against the real control plane.

The chart is linted, rendered with several value sets and each rendering applied with
`kubectl apply --dry-run=server` (spark-operator and Strimzi CRDs installed); values violating the schema
are rejected. Installed and upgraded for real, its RBAC is checked verb by verb with `kubectl auth can-i`
as the operator's ServiceAccount, and then proven sufficient by running the real operator with that
ServiceAccount's token and the args the chart gives it, and watching it reconcile apps.

The admission webhook is the chart's own configuration, served by that operator: the test bed's API server
runs on this machine with no route to Services, so each release's configuration is pointed at the
operator's port on loopback (a test certificate for 127.0.0.1), the rest of it as installed.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.api.contract import revision_configmap_name
from sluice.operator import admission, children, names
from sluice.operator.crd import CRD_FILE
from sluice.operator.model import TopicSpec
from sluice.testbed.common import ProvisionError, free_ports, port_in_use, tail
from sluice.testbed.e2e_suite import (
    CHART_DIR,
    IMAGES_DIR,
    Helm,
    HelmError,
    Images,
    Target,
    image_builder,
    service_account_kubeconfig,
    wait_for,
    wordcount_app,
)
from sluice.testbed.external_crds import install_external_crds
from sluice.testbed.kube import ControlPlane
from sluice.testbed.strimzi_topics import topic_operator

Manifest = dict[str, Any]


def unique(prefix: str) -> str:
    # "ha-": the operator tests' shared operator leaves these namespaces alone, so only the operator
    # under test reconciles there even when both run in one session.
    return f"ha-{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def chart_helm(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """helm for rendering only (no cluster)."""
    return Helm(helm, Path(os.devnull), tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="module")
def target(kube_cluster: ControlPlane, helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Target:
    try:
        install_external_crds(kube_cluster.kubectl)
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
    return Target(
        kube_cluster.kubeconfig,
        kube_cluster.kubectl,
        Helm(helm, kube_cluster.kubeconfig, tmp_path_factory.mktemp("helm")),
    )


def of_kind(manifests: list[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def operator_args(manifests: list[Manifest]) -> list[str]:
    (deployment,) = of_kind(manifests, "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def operator_cluster_role(manifests: list[Manifest]) -> Manifest:
    """The operator's own ClusterRole (the other two it only binds: the driver's, its app-namespace role)."""
    (role,) = [r for r in of_kind(manifests, "ClusterRole") if r["metadata"]["name"] == "sluice"]
    return role


def env_of(manifests: list[Manifest]) -> dict[str, str]:
    (deployment,) = of_kind(manifests, "Deployment")
    return {
        e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e
    }


def rule_set(rules: list[Manifest]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# --- the chart's files ---------------------------------------------------------------------------


def test_chart_crds_are_identical_to_crds_dir() -> None:
    ours = {p.name: p.read_bytes() for p in (CHART_DIR / "crds").glob("*.yaml")}
    source = {p.name: p.read_bytes() for p in CRD_FILE.parent.glob("*.yaml")}

    assert ours == source, "charts/sluice/crds differs from crds/: run make chart-crds"


def test_chart_app_version_is_the_sluice_version() -> None:
    assert Images.release() == Images("sluice/operator:0.1.0", "sluice/spark:0.1.0", "sluice/spark:0.1.0-next")
    assert yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"] == image_builder().version()


def exported_metrics() -> set[str]:
    """Every series name the operator and a driver export."""
    from prometheus_client import REGISTRY, CollectorRegistry

    import sluice.operator.metrics  # noqa: F401  (registers the operator's metrics)
    from sluice.pipelines.metrics import PipelineMetrics

    exported = set()
    for registry in (REGISTRY, PipelineMetrics("app", CollectorRegistry()).registry):
        for family in registry.collect():
            exported |= {family.name + suffix for suffix in ("", "_total", "_bucket", "_sum", "_count")}
    return exported


def test_dashboard_shows_the_metrics_sluice_exports(chart_helm: Helm) -> None:
    exported = exported_metrics()
    (configmap,) = of_kind(chart_helm.template("r", "monitoring", {"grafanaDashboard": {"enabled": True}}), "ConfigMap")
    dashboard = json.loads(configmap["data"]["sluice.json"])
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]

    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"]["sluice.json"] == (CHART_DIR / "dashboards" / "sluice.json").read_text().rstrip("\n")
    assert {name for expr in exprs for name in re.findall(r"\bsluice_\w+", expr)} <= exported
    for needed in (
        "sluice_input_rows_per_second",
        "sluice_processed_rows_per_second",
        "sluice_kafka_backlog_records",
        "sluice_batch_duration_seconds",
        "sluice_executors",
        "sluice_operator_desired_executors",
        "sluice_operator_scaling_decisions_total",
        "sluice_operator_reconciles_total",
        "sluice_operator_reconcile_duration_seconds_bucket",
        "sluice_dead_letter_records_total",
        "sluice_malformed_records_total",
        "sluice_late_records_dropped_total",
        "sluice_watermark_timestamp_seconds",
        "sluice_state_rows",
        "sluice_trigger_interval_seconds",
        "sluice_operator_rollouts_total",
        "sluice_operator_app_ready",
        "sluice_operator_app_rollout_failed",
        "process_resident_memory_bytes",
    ):
        assert any(needed in expr for expr in exprs), needed


def test_alerts_read_the_metrics_sluice_exports_and_the_monitors_jobs(chart_helm: Helm) -> None:
    rendered = chart_helm.template(
        "r", "ops", {"monitoring": {"enabled": True}}, "--api-versions", "monitoring.coreos.com/v1"
    )
    (rule,) = of_kind(rendered, "PrometheusRule")
    (pod_monitor,) = of_kind(rendered, "PodMonitor")
    alerts = {r["alert"]: r["expr"] for group in rule["spec"]["groups"] for r in group["rules"]}

    assert {name for expr in alerts.values() for name in re.findall(r"\bsluice_\w+", expr)} <= exported_metrics()
    assert f'job="ops/{pod_monitor["metadata"]["name"]}"' in alerts["SluiceOperatorDown"]
    assert 'job="sluice-app"' in alerts["SluiceDriverDown"]
    assert "> 1000000" in alerts["SluiceKafkaBacklogHigh"]
    assert "> 1" in alerts["SluiceDeadLetters"] and "sluice_dead_letter_records_total" in alerts["SluiceDeadLetters"]
    for alert, metric in (
        ("SluiceAppNotReady", "sluice_operator_app_ready"),
        ("SluiceRolloutRolledBack", "sluice_operator_app_rollout_failed"),
        ("SluiceKafkaBacklogGrowing", "sluice_kafka_backlog_records"),
        ("SluiceDriverRestarted", "process_start_time_seconds"),
    ):
        assert metric in alerts[alert], alert
    growing = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "SluiceKafkaBacklogGrowing")
    assert growing["for"] == "15m"
    no_rules = {"monitoring": {"enabled": True, "rules": {"enabled": False}}}
    assert (
        of_kind(
            chart_helm.template("r", "ops", no_rules, "--api-versions", "monitoring.coreos.com/v1"), "PrometheusRule"
        )
        == []
    )


def test_guard_rails_reach_the_operator_as_its_settings(chart_helm: Helm) -> None:
    from sluice.operator.settings import Settings

    rails = {
        "allowedImages": ["registry.example/spark:", "sluice/"],
        "allowedServiceAccounts": ["spark-jobs"],
        "pythonSteps": False,
        "allowedPythonModules": ["company.transforms"],
        "forbiddenSparkConf": ["spark.jars", "spark.kubernetes."],
        "refusedSqlFunctions": ["java_method"],
    }
    (deployment,) = of_kind(chart_helm.template("r", "ops", {"guardRails": rails}), "Deployment")
    env = {
        e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e
    }
    settings = Settings.from_env(env).guard_rails

    assert settings.allowed_images == ("registry.example/spark:", "sluice/")
    assert settings.allowed_service_accounts == ("spark-jobs",)
    assert settings.python_steps is False
    assert settings.allowed_python_modules == ("company.transforms",)
    assert settings.forbidden_spark_conf == ("spark.jars", "spark.kubernetes.")
    assert settings.refused_sql_functions == ("java_method",)
    (default,) = of_kind(chart_helm.template("r", "ops", {}), "Deployment")
    env = {e["name"]: e["value"] for e in default["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    assert Settings.from_env(env).guard_rails == Settings().guard_rails


# --- lint, render, schema ----------------------------------------------------------------------------


def install_page_values() -> Manifest:
    """The values.yaml of docs/install.md as a reader copies it (its watched namespaces made unique per test)."""
    page = (CHART_DIR.parents[1] / "docs" / "install.md").read_text()
    found = re.search(r"```yaml\n# values.yaml\n(.*?)```", page, re.S)
    assert found, "docs/install.md shows a values.yaml"
    values = yaml.safe_load(found[1])
    values["watchNamespaces"] = [f"{{ns}}-{name}" for name in values["watchNamespaces"]]
    return dict(values)


VALUE_SETS: dict[str, Manifest] = {
    "defaults": {},
    "install-page": install_page_values(),
    "ha": {"replicaCount": 2},
    "namespaces": {"watchNamespaces": ["{ns}-a", "{ns}-b"], "kafkaTopicNamespaces": ["{ns}-kafka"]},
    "namespaces-ha": {"watchNamespaces": ["{ns}-a"], "replicaCount": 3},
    "quick-start": {
        "kafkaCluster": {"enabled": True, "replicas": 3, "storage": {"type": "persistent-claim", "size": "5Gi"}},
        "grafanaDashboard": {"enabled": True},
        "monitoring": {"enabled": True},
        "operator": {"logFormat": "plain", "env": [{"name": "X", "value": "1"}]},
    },
    "no-webhook-no-policy": {
        "webhook": {"enabled": False},
        "networkPolicy": {"enabled": False},
        "image": {"pullPolicy": "IfNotPresent"},
    },
}


def values_for(name: str, namespace: str) -> Manifest:
    return json.loads(json.dumps(VALUE_SETS[name]).replace("{ns}", namespace))


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint(chart_helm: Helm, name: str) -> None:
    values = chart_helm._values_file(f"lint-{name}", values_for(name, "x"))
    out = chart_helm("lint", "--strict", str(CHART_DIR), "-f", str(values))

    assert "1 chart(s) linted, 0 chart(s) failed" in out


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rendering_is_accepted_by_the_api_server(target: Target, name: str) -> None:
    namespace = unique("render")
    values = values_for(name, namespace)
    for ns in [namespace, *values.get("watchNamespaces", []), *values.get("kafkaTopicNamespaces", [])]:
        target.kubectl("create", "namespace", ns)
    manifests = target.helm.template("sluice", namespace, values)

    result = target.kubectl(
        "apply",
        "--dry-run=server",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}),
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == len(manifests)


def test_defaults_watch_all_namespaces_standalone(chart_helm: Helm) -> None:
    manifests = chart_helm.template("sluice", "sys")
    role = operator_cluster_role(manifests)
    (deployment,) = of_kind(manifests, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]

    assert operator_args(manifests) == [
        "--log-format=json",
        "--all-namespaces",
        "--metrics-port=8080",
        "--liveness=http://0.0.0.0:8081/healthz",
        "--webhook-port=9443",
        "--webhook-cert-dir=/etc/sluice-webhook",
    ]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not of_kind(manifests, "Role") and not of_kind(manifests, "RoleBinding")
    assert ("sparkoperator.k8s.io", "sparkapplications", "watch") in rule_set(role["rules"])
    assert ("sparkoperator.k8s.io", "sparkapplications", "create") not in rule_set(role["rules"])  # bound per namespace
    assert env_of(manifests)["SLUICE_APP_NAMESPACE_CLUSTER_ROLE"] == "sluice-app-namespace"
    assert env_of(manifests)["SLUICE_DENIED_NAMESPACES"] == "kube-system,kube-public,kube-node-lease"
    assert not any(group == "kopf.dev" for group, _, _ in rule_set(role["rules"]))
    assert container["image"] == "sluice/operator:0.1.0"
    assert container["imagePullPolicy"] == "Always"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["tcpSocket"] == {"port": "webhook"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "metrics": 8080,
        "health": 8081,
        "webhook": 9443,
    }
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "160Mi", "ephemeral-storage": "128Mi"},
        "limits": {"cpu": "1", "memory": "320Mi", "ephemeral-storage": "256Mi"},
    }
    assert "affinity" not in pod and not of_kind(manifests, "PodDisruptionBudget")
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    labels = deployment["metadata"]["labels"]
    assert {
        k: labels[k]
        for k in (
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "app.kubernetes.io/managed-by",
        )
    } == {
        "app.kubernetes.io/name": "sluice",
        "app.kubernetes.io/instance": "sluice",
        "app.kubernetes.io/version": "0.1.0",
        "app.kubernetes.io/managed-by": "Helm",
    }


def pod_labels(manifests: list[Manifest]) -> dict[str, str]:
    (deployment,) = of_kind(manifests, "Deployment")
    return deployment["spec"]["template"]["metadata"]["labels"]


def selects_operator_pods(selector: dict[str, str], manifests: list[Manifest]) -> bool:
    return bool(selector) and selector.items() <= pod_labels(manifests).items()


def test_replicas_run_with_peering(chart_helm: Helm) -> None:
    manifests = chart_helm.template("sluice", "sys", {"replicaCount": 2})
    role = operator_cluster_role(manifests)
    (budget,) = of_kind(manifests, "PodDisruptionBudget")
    (deployment,) = of_kind(manifests, "Deployment")
    (spread,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    own_affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}]
            }
        }
    }
    with_own = of_kind(
        chart_helm.template("sluice", "sys", {"replicaCount": 2, "affinity": own_affinity}), "Deployment"
    )[0]

    assert "--peering=sluice" in operator_args(manifests)
    assert deployment["spec"]["replicas"] == 2
    assert {(r, v) for g, r, v in rule_set(role["rules"]) if g == "kopf.dev"} == {
        ("clusterkopfpeerings", verb) for verb in ("create", "list", "watch", "patch")
    }
    assert budget["spec"]["maxUnavailable"] == 1
    assert selects_operator_pods(budget["spec"]["selector"]["matchLabels"], manifests)
    assert spread["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert selects_operator_pods(spread["podAffinityTerm"]["labelSelector"]["matchLabels"], manifests)
    assert with_own["spec"]["template"]["spec"]["affinity"] == own_affinity


def test_namespace_list_gets_roles_and_minimal_cluster_rules(chart_helm: Helm) -> None:
    manifests = chart_helm.template(
        "sluice", "sys", {"watchNamespaces": ["a", "b"], "replicaCount": 2, "kafkaTopicNamespaces": ["kafka", "a"]}
    )
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in of_kind(manifests, "Role")}
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in of_kind(manifests, "RoleBinding")}
    cluster_role = operator_cluster_role(manifests)

    assert [a for a in operator_args(manifests) if a.startswith("--namespace") or a.startswith("--peering")] == [
        "--namespace=a",
        "--namespace=b",
        "--peering=sluice",
    ]
    assert "--all-namespaces" not in operator_args(manifests)
    assert set(roles) == {("a", "sluice"), ("b", "sluice"), ("kafka", "sluice-kafkatopics")}
    assert bindings == set(roles) | {("a", "sluice-app-namespace"), ("b", "sluice-app-namespace")}
    assert "SLUICE_APP_NAMESPACE_CLUSTER_ROLE" not in env_of(manifests)  # the chart bound it
    assert rule_set(cluster_role["rules"]) == {
        ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
        ("apiextensions.k8s.io", "customresourcedefinitions", "get"),  # its own, by name: crds.upgrade
        ("apiextensions.k8s.io", "customresourcedefinitions", "patch"),
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
    }
    assert ("kopf.dev", "kopfpeerings", "patch") in rule_set(roles["a", "sluice"]["rules"])
    assert rule_set(roles["kafka", "sluice-kafkatopics"]["rules"]) == {
        ("kafka.strimzi.io", "kafkatopics", verb) for verb in ("get", "create", "patch")
    } | {("kafka.strimzi.io", "kafkas", "get")}


def test_monitors_only_where_the_prometheus_operator_api_is_served(chart_helm: Helm) -> None:
    values = {"monitoring": {"enabled": True, "labels": {"release": "prom"}}}
    without = chart_helm.template("sluice", "sys", values)
    with_api = chart_helm.template("sluice", "sys", values, "--api-versions", "monitoring.coreos.com/v1")
    (pod_monitor,) = of_kind(with_api, "PodMonitor")
    (service_monitor,) = of_kind(with_api, "ServiceMonitor")

    assert not {"PodMonitor", "ServiceMonitor"} & {m["kind"] for m in without}
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pod_monitor["metadata"]["labels"]["release"] == "prom"
    # The driver Services the operator creates are what the ServiceMonitor selects.
    driver_service = children.driver_service("app", "ns")
    selector = service_monitor["spec"]["selector"]
    assert selector["matchLabels"].items() <= driver_service["metadata"]["labels"].items()
    assert selector["matchExpressions"] == [{"key": names.APP_LABEL, "operator": "Exists"}]
    assert service_monitor["spec"]["endpoints"][0]["port"] == driver_service["spec"]["ports"][0]["name"]
    assert service_monitor["spec"]["namespaceSelector"] == {"any": True}


def test_quick_start_kafka_cluster(chart_helm: Helm) -> None:
    manifests = chart_helm.template("sluice", "sys", values_for("quick-start", "sys"))
    (kafka,) = of_kind(manifests, "Kafka")
    (pool,) = of_kind(manifests, "KafkaNodePool")

    assert kafka["apiVersion"] == pool["apiVersion"] == "kafka.strimzi.io/v1"
    assert pool["metadata"]["labels"]["strimzi.io/cluster"] == kafka["metadata"]["name"] == "sluice-kafka"
    assert pool["spec"]["roles"] == ["controller", "broker"]
    config = kafka["spec"]["kafka"]["config"]
    assert config["min.insync.replicas"] == 2
    # An app's topic gets the cluster's default.replication.factor unless it names one, so exactly-once
    # producers (acks=all) can write: min.insync.replicas stays below it, for every pool size.
    assert TopicSpec(name="t").replicas is None
    for replicas in (1, 2, 3, 5):
        values = {"kafkaCluster": {"enabled": True, "replicas": replicas}}
        (sized,) = of_kind(chart_helm.template("sluice", "sys", values), "Kafka")
        settings = sized["spec"]["kafka"]["config"]
        assert settings["min.insync.replicas"] <= max(1, settings["default.replication.factor"] - 1), settings
        assert settings["default.replication.factor"] <= replicas
    assert "topicOperator" in kafka["spec"]["entityOperator"]
    # The operator may manage KafkaTopics in the release namespace, where the cluster is.
    assert not of_kind(chart_helm.template("sluice", "sys", {"kafkaCluster": {"enabled": True}}), "Role")
    roles = of_kind(
        chart_helm.template("sluice", "sys", {"kafkaCluster": {"enabled": True}, "watchNamespaces": ["apps"]}), "Role"
    )
    assert {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles} == {
        ("apps", "sluice"),
        ("sys", "sluice-kafkatopics"),
    }


def pem_certificate(data: str) -> Any:
    from cryptography import x509

    return x509.load_pem_x509_certificate(base64.b64decode(data))


def test_webhook_is_for_streamingapps_only_and_trusts_the_secret_it_serves(chart_helm: Helm) -> None:
    from cryptography import x509

    manifests = chart_helm.template("sluice", "sys")
    (configuration,) = of_kind(manifests, "ValidatingWebhookConfiguration")
    (webhook,) = configuration["webhooks"]
    (service,) = of_kind(manifests, "Service")
    (secret,) = of_kind(manifests, "Secret")
    pod = of_kind(manifests, "Deployment")[0]["spec"]["template"]["spec"]
    (tls_volume,) = [v for v in pod["volumes"] if v.get("secret")]
    (tls_mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == tls_volume["name"]]
    ca, served = pem_certificate(secret["data"]["ca.crt"]), pem_certificate(secret["data"]["tls.crt"])
    names = served.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )

    assert webhook["rules"] == [
        {
            "apiGroups": ["sluice.dev"],
            "apiVersions": ["v1alpha1"],
            "resources": ["streamingapps"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]
    assert (webhook["failurePolicy"], webhook["timeoutSeconds"], webhook["sideEffects"]) == ("Fail", 10, "None")
    assert "namespaceSelector" not in webhook and "objectSelector" not in webhook
    assert [c["expression"] for c in webhook["matchConditions"]] == [
        "request.operation == 'CREATE' || object.spec != oldObject.spec"
    ]
    assert webhook["clientConfig"]["service"] == {
        "name": service["metadata"]["name"],
        "namespace": "sys",
        "path": admission.WEBHOOK_PATH,
        "port": 443,
    }
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]
    assert selects_operator_pods(service["spec"]["selector"], manifests)
    assert webhook["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    served.verify_directly_issued_by(ca)
    assert f"{service['metadata']['name']}.sys.svc" in names
    assert tls_volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert f"--webhook-cert-dir={tls_mount['mountPath']}" in operator_args(manifests)


def test_webhook_values(chart_helm: Helm) -> None:
    manifests = chart_helm.template(
        "sluice", "sys", {"webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 3}, "watchNamespaces": ["a", "b"]}
    )
    (webhook,) = of_kind(manifests, "ValidatingWebhookConfiguration")[0]["webhooks"]
    disabled = chart_helm.template("sluice", "sys", {"webhook": {"enabled": False}})
    (on_1_27,) = of_kind(
        chart_helm.template("sluice", "sys", {}, "--kube-version", "1.27.3"), "ValidatingWebhookConfiguration"
    )[0]["webhooks"]
    (policy,) = of_kind(disabled, "NetworkPolicy")
    container = of_kind(disabled, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]

    assert (webhook["failurePolicy"], webhook["timeoutSeconds"]) == ("Ignore", 3)
    # Apps in other namespaces belong to another release's operator.
    assert webhook["namespaceSelector"] == {
        "matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["a", "b"]}]
    }
    assert "matchConditions" in webhook and "matchConditions" not in on_1_27  # GA in 1.30, beta on since 1.28
    assert not {"ValidatingWebhookConfiguration", "Service", "Secret"} & {m["kind"] for m in disabled}
    assert not [a for a in operator_args(disabled) if a.startswith("--webhook")]
    assert "readinessProbe" not in container and "webhook" not in {p["name"] for p in container["ports"]}
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == ["metrics", "health"]


def test_webhook_certificate_from_cert_manager(chart_helm: Helm) -> None:
    cert_manager = ("--api-versions", "cert-manager.io/v1")
    manifests = chart_helm.template("sluice", "sys", {"webhook": {"certManager": {"enabled": True}}}, *cert_manager)
    certificates = {c["metadata"]["name"]: c for c in of_kind(manifests, "Certificate")}
    issuers = {i["metadata"]["name"]: i for i in of_kind(manifests, "Issuer")}
    (configuration,) = of_kind(manifests, "ValidatingWebhookConfiguration")
    (service,) = of_kind(manifests, "Service")
    pod = of_kind(manifests, "Deployment")[0]["spec"]["template"]["spec"]
    cluster_issuer = {"name": "corp-ca", "kind": "ClusterIssuer"}
    own_issuer = chart_helm.template(
        "sluice", "sys", {"webhook": {"certManager": {"enabled": True, "issuerRef": cluster_issuer}}}, *cert_manager
    )

    service_name = service["metadata"]["name"]
    certificate, ca = certificates[service_name], certificates[f"{service_name}-ca"]

    assert not of_kind(manifests, "Secret")
    assert certificate["spec"]["secretName"] in {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert certificate["spec"]["dnsNames"] == [f"{service_name}.sys.svc", f"{service_name}.sys.svc.cluster.local"]
    # Served certificate <- the release's CA (renewals keep it, so the injected caBundle stays valid) <- self-signed.
    assert certificate["spec"]["issuerRef"] == {"name": service_name, "kind": "Issuer"}
    assert issuers[service_name]["spec"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    assert ca["spec"]["isCA"] is True
    assert issuers[ca["spec"]["issuerRef"]["name"]]["spec"] == {"selfSigned": {}}
    assert configuration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"sys/{certificate['metadata']['name']}"
    }
    assert "caBundle" not in configuration["webhooks"][0]["clientConfig"]
    assert not of_kind(own_issuer, "Issuer")
    assert [c["spec"]["issuerRef"] for c in of_kind(own_issuer, "Certificate")] == [cluster_issuer]
    with pytest.raises(HelmError, match="needs cert-manager"):
        chart_helm.template("sluice", "sys", {"webhook": {"certManager": {"enabled": True}}})


def test_network_policy_admits_and_reaches_only_what_the_operator_uses(chart_helm: Helm) -> None:
    manifests = chart_helm.template(
        "sluice",
        "sys",
        {
            "networkPolicy": {
                "kafkaPorts": [9092, 9094],
                "extraEgress": [{"ports": [{"protocol": "TCP", "port": 3128}]}],
            }
        },
    )
    (policy,) = of_kind(manifests, "NetworkPolicy")
    spec = policy["spec"]
    egress_ports = [{(p["protocol"], p["port"]) for p in rule["ports"]} for rule in spec["egress"]]
    (to_drivers,) = [rule for rule in spec["egress"] if "to" in rule]
    (drivers,) = to_drivers["to"]
    (driver_policy,) = [p for p in children.network_policies("app", "ns") if p["metadata"]["name"] == "app-driver"]

    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert selects_operator_pods(spec["podSelector"]["matchLabels"], manifests)
    assert [[p["port"] for p in rule["ports"]] for rule in spec["ingress"]] == [["metrics", "health"], ["webhook"]]
    assert not any("from" in rule for rule in spec["ingress"])
    assert egress_ports[:3] == [
        {("UDP", 53), ("TCP", 53)},
        {("TCP", 443), ("TCP", 6443)},
        {("TCP", 9092), ("TCP", 9094)},
    ]
    assert {("TCP", 3128)} in egress_ports
    # The drivers' control port, on the pods each driver's own policy opens it on.
    assert to_drivers["ports"] == [{"protocol": "TCP", "port": names.CONTROL_PORT}]
    assert drivers["namespaceSelector"] == {}
    assert drivers["podSelector"]["matchLabels"].items() <= driver_policy["spec"]["podSelector"]["matchLabels"].items()
    assert drivers["podSelector"]["matchExpressions"] == [{"key": names.APP_LABEL, "operator": "Exists"}]
    assert pod_labels(manifests)[names.DRIVER_CLIENT_LABEL] == "true"
    assert not of_kind(chart_helm.template("sluice", "sys", {"networkPolicy": {"enabled": False}}), "NetworkPolicy")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "replicaCount=two"], "at '/replicaCount': got string, want integer"),
        (["--set", "replicaCount=0"], "at '/replicaCount': minimum: got 0, want 1"),
        (["--set", "replicas=2"], "additional properties 'replicas' not allowed"),
        (["--set", "watchNamespaces={Team_A}"], "'Team_A' does not match pattern"),
        (["--set", "operator.logFormat=xml"], "at '/operator/logFormat': value must be one of 'json', 'plain', 'full'"),
        (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy'"),
        (
            ["--set", "kafkaCluster.storage.type=persistent-claim"],
            "at '/kafkaCluster/storage': missing property 'size'",
        ),
        (["--set", "monitoring.interval=often"], "at '/monitoring/interval'"),
        (["--set", "webhook.failurePolicy=Sometimes"], "at '/webhook/failurePolicy'"),
        (["--set", "webhook.timeoutSeconds=60"], "at '/webhook/timeoutSeconds': maximum: got 60, want 30"),
        (["--set", "networkPolicy.kafkaPorts={0}"], "at '/networkPolicy/kafkaPorts/0'"),
    ],
)
def test_values_violating_the_schema_are_rejected(chart_helm: Helm, args: list[str], message: str) -> None:
    with pytest.raises(HelmError) as caught:
        chart_helm("template", "sluice", str(CHART_DIR), *args)

    assert "values don't meet the specifications of the schema" in str(caught.value)
    assert message in str(caught.value)


# --- installed: RBAC and the real operator --------------------------------------------------------------

APPS, SPARK_APPS, TOPICS = (
    "streamingapps.sluice.dev",
    "sparkapplications.sparkoperator.k8s.io",
    "kafkatopics.kafka.strimzi.io",
)
ROLES, BINDINGS = "roles.rbac.authorization.k8s.io", "rolebindings.rbac.authorization.k8s.io"
CLUSTER_ROLES = "clusterroles.rbac.authorization.k8s.io"
KAFKAS = "kafkas.kafka.strimzi.io"
POLICIES = "networkpolicies.networking.k8s.io"
CRDS = "customresourcedefinitions.apiextensions.k8s.io"
# Cluster-scoped: kopf's list of CRDs, and its own CRD brought up to date at start (crds.upgrade), no other.
ALL_NAMESPACES_ONLY = [
    ("list", CRDS, ""),
    ("get", f"{CRDS}/{APPS}", ""),
    ("patch", f"{CRDS}/{APPS}", ""),
]


def operator_uses(fullname: str = "sluice") -> list[tuple[str, str, str]]:
    """(verb, resource, subresource) of every API call the operator makes wherever it watches apps: the apps,
    the watches of their children, events, the RoleBindings it makes (sluice.namespacedRules)."""
    uses = [(verb, APPS, "") for verb in ("get", "list", "watch", "patch")]
    uses += [("patch", APPS, "status"), ("update", APPS, "finalizers"), ("create", "events", "")]
    for resource in ("configmaps", "services", "serviceaccounts", POLICIES, SPARK_APPS):
        uses += [("list", resource, ""), ("watch", resource, "")]  # the watches of the children
    uses += [(verb, BINDINGS, "") for verb in ("create", "patch", "list", "watch", "delete")]
    uses += [("bind", f"{CLUSTER_ROLES}/{fullname}-{role}", "") for role in ("spark-driver", "app-namespace")]
    uses += [(verb, TOPICS, "") for verb in ("get", "create", "patch")]
    uses += [("get", KAFKAS, "")]  # a Strimzi listener's address, from the Kafka's status
    return uses


def app_namespace_uses() -> list[tuple[str, str, str]]:
    """What it does only in a namespace where it handles an app (sluice.appNamespaceRules)."""
    uses = [("create", "serviceaccounts", ""), ("patch", "serviceaccounts", "")]
    uses += [
        (verb, resource, "") for resource in ("configmaps", "services") for verb in ("create", "get", "patch", "delete")
    ]
    uses += [(verb, "persistentvolumeclaims", "") for verb in ("create", "get", "patch")]
    uses += [("get", "pods", ""), ("delete", "pods", ""), ("get", "secrets", ""), ("create", "secrets", "")]
    uses += [("create", POLICIES, ""), ("patch", POLICIES, "")]
    uses += [(verb, SPARK_APPS, "") for verb in ("get", "create", "patch", "delete")]
    return uses


NEVER = [
    ("create", "pods", ""),  # the drivers' rights are bound to their accounts, never held
    ("patch", "pods", ""),
    ("deletecollection", "pods", ""),
    ("bind", f"{CLUSTER_ROLES}/admin", ""),
    ("bind", f"{CLUSTER_ROLES}/cluster-admin", ""),
    ("list", "secrets", ""),
    ("delete", "secrets", ""),
    ("get", "services", "proxy"),
    ("create", "pods", "exec"),
    ("create", "deployments.apps", ""),
    ("create", APPS, ""),
    ("delete", APPS, ""),
    ("update", APPS, ""),
    ("delete", TOPICS, ""),
    ("escalate", ROLES, ""),
    ("bind", ROLES, ""),
    ("create", ROLES, ""),
    ("create", "clusterroles.rbac.authorization.k8s.io", ""),
    ("delete", "namespaces", ""),
    ("list", "nodes", ""),
    ("create", "kopfpeerings.kopf.dev", ""),
    ("create", "clusterkopfpeerings.kopf.dev", ""),
    ("patch", f"{CRDS}/{SPARK_APPS}", ""),
    ("patch", CRDS, ""),
]
# The chart owns the webhook's configuration and certificate: the operator only serves the webhook.
WEBHOOK_CONFIGURATIONS = "validatingwebhookconfigurations.admissionregistration.k8s.io"
NEVER += [(verb, WEBHOOK_CONFIGURATIONS, "") for verb in ("create", "patch", "update", "delete")]


def can_i(target: Target, account: str, checks: list[tuple[str, str, str]], namespace: str) -> dict[tuple, bool]:
    def allowed(verb: str, resource: str, subresource: str) -> bool:
        args = ["auth", "can-i", verb, resource, "-n", namespace, f"--as={account}"]
        return (
            target.kubectl(
                *args, *([f"--subresource={subresource}"] if subresource else []), check=False
            ).stdout.strip()
            == "yes"
        )

    return {check: allowed(*check) for check in checks}


@dataclass(frozen=True)
class LoopbackWebhook:
    """Where the operator under test serves the webhook: 127.0.0.1:port, a certificate of a test CA."""

    port: int
    cert_dir: Path  # tls.crt, tls.key
    ca: bytes  # PEM

    def client_config(self, path: str) -> Manifest:
        return {"url": f"https://127.0.0.1:{self.port}{path}", "caBundle": base64.b64encode(self.ca).decode()}


@pytest.fixture(scope="module")
def loopback_webhook(tmp_path_factory: pytest.TempPathFactory) -> LoopbackWebhook:
    from ipaddress import ip_address

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from sluice.testbed.kube import issue_cert, write_key_pair

    cert_dir = tmp_path_factory.mktemp("webhook-tls")
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = issue_cert("sluice-webhook-test-ca", ca_key, signer=None, usage="ca")
    write_key_pair(
        cert_dir,
        "tls",
        issue_cert(
            "127.0.0.1", key, signer=(ca, ca_key), usage="server", sans=[x509.IPAddress(ip_address("127.0.0.1"))]
        ),
        key,
    )
    (port,) = free_ports(1)
    return LoopbackWebhook(port, cert_dir, ca.public_bytes(serialization.Encoding.PEM))


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    manifests: list[Manifest]  # as installed (helm get manifest)
    notes: str  # what `helm install` printed
    webhook: LoopbackWebhook

    @property
    def account(self) -> str:
        (service_account,) = of_kind(self.manifests, "ServiceAccount")
        return service_account["metadata"]["name"]

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"


def install(target: Target, name: str, webhook: LoopbackWebhook, values: Manifest | None = None) -> Release:
    namespace = unique(name)
    notes = target.helm.install(name, CHART_DIR, namespace, values)
    manifests = [m for m in yaml.safe_load_all(target.helm("get", "manifest", name, "-n", namespace)) if m]
    release = Release(name, namespace, manifests, notes, webhook)
    point_webhook_at_loopback(target, release)
    return release


def point_webhook_at_loopback(target: Target, release: Release, *, back: bool = False) -> None:
    """The test bed's API server has no route to Services: the release's webhook calls the operator under
    test on 127.0.0.1 instead; the rest of the configuration stays as installed. back: the Service again
    (for an upgrade: helm cannot merge its Service into a url)."""
    for configuration in of_kind(release.manifests, "ValidatingWebhookConfiguration"):
        (webhook,) = configuration["webhooks"]
        installed_config = webhook["clientConfig"]
        client_config = installed_config if back else release.webhook.client_config(installed_config["service"]["path"])
        patch = [{"op": "replace", "path": "/webhooks/0/clientConfig", "value": client_config}]
        target.kubectl(
            "patch",
            "validatingwebhookconfiguration",
            configuration["metadata"]["name"],
            "--type=json",
            "-p",
            json.dumps(patch),
        )


@contextlib.contextmanager
def installed(target: Target, name: str, webhook: LoopbackWebhook, values: Manifest | None = None) -> Iterator[Release]:
    release = install(target, name, webhook, values)
    try:
        yield release
    finally:
        target.helm("uninstall", name, "-n", release.namespace)


@pytest.fixture(scope="module")
def release(target: Target, loopback_webhook: LoopbackWebhook) -> Iterator[Release]:
    """The chart installed with its defaults: all namespaces, one replica, the webhook."""
    with installed(target, "sluice", loopback_webhook) as release:
        yield release


@contextlib.contextmanager
def operator_as(
    target: Target, release: Release, log: Path, *, priority: int | None = None, webhook_port: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """The real operator, with the release's ServiceAccount token and the args its Deployment has
    (ports, log format and a short resync overridden for the test; the webhook served on loopback, on
    the release's port unless webhook_port says otherwise)."""
    kubeconfig = log.with_suffix(".kubeconfig")
    kubeconfig.write_text(service_account_kubeconfig(target, release.namespace, release.account))
    metrics_port, health_port = free_ports(2)
    chart_args = operator_args(release.manifests)
    webhook_port = webhook_port or release.webhook.port
    serves_webhook = any(arg.startswith("--webhook-port=") for arg in chart_args)
    cmd = [
        sys.executable,
        "-m",
        "sluice.operator",
        *chart_args,
        "--log-format=plain",
        "--verbose",
        f"--metrics-port={metrics_port}",
        f"--liveness=http://127.0.0.1:{health_port}/healthz",
    ]
    if serves_webhook:
        cmd += [
            f"--webhook-port={webhook_port}",
            f"--webhook-cert-dir={release.webhook.cert_dir}",
            "--webhook-address=127.0.0.1",
        ]
    if priority is not None:
        cmd.append(f"--priority={priority}")
    env = {**os.environ, **env_of(release.manifests), "KUBECONFIG": str(kubeconfig), "SLUICE_RESYNC_SECONDS": "2"}
    with open(log, "wb") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    def running() -> None:
        assert process.poll() is None, "operator exited:\n" + "\n".join(tail(log, 30))

    def alive() -> bool:
        running()
        with contextlib.suppress(OSError):
            return urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=2).status == 200
        return False

    def webhook_listening() -> bool:  # kopf opens the port once it has scanned the cluster's resources
        running()
        return port_in_use(webhook_port)

    try:
        wait_for(alive, timeout=60, what="the operator's liveness endpoint", interval=0.3)
        if serves_webhook:
            wait_for(webhook_listening, timeout=60, what="the operator's webhook port", interval=0.3)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    text = log.read_text(errors="replace")
    denied = [line for line in text.splitlines() if re.search(r"\(403\)|[Ff]orbidden|Not enough permissions", line)]
    assert not denied, "the operator was denied:\n" + "\n".join(denied[:10])


WEBHOOK = "validate.streamingapps.sluice.dev"


def with_unknown_input(app: Manifest) -> Manifest:
    return {
        **app,
        "spec": {
            **app["spec"],
            "pipeline": {
                **app["spec"]["pipeline"],
                "nodes": [
                    {**node, "inputs": ["missing"]} if node["name"] == "words" else node
                    for node in app["spec"]["pipeline"]["nodes"]
                ],
            },
        },
    }


@contextlib.contextmanager
def webhook_configuration_removed(target: Target, release: Release) -> Iterator[None]:
    """As if the release had been installed without the webhook (or the app created before it was)."""
    (configuration,) = of_kind(release.manifests, "ValidatingWebhookConfiguration")
    name = configuration["metadata"]["name"]
    live = json.loads(target.kubectl("get", "validatingwebhookconfiguration", name, "-o", "json").stdout)
    target.kubectl("delete", "validatingwebhookconfiguration", name)
    try:
        yield
    finally:
        live["metadata"] = {
            key: live["metadata"][key] for key in ("name", "labels", "annotations") if key in live["metadata"]
        }
        target.kubectl("create", "-f", "-", input=json.dumps(live))


def status(target: Target, namespace: str, name: str) -> Manifest:
    return (target.get("streamingapp", name, namespace) or {}).get("status") or {}


def wait_phase(target: Target, namespace: str, name: str, phase: str) -> Manifest:
    return wait_for(
        lambda: (s := status(target, namespace, name)).get("phase") == phase and s,
        timeout=90,
        what=f"{namespace}/{name} to be {phase}",
        interval=0.5,
    )


def app_in(target: Target, namespace: str, kafka_namespace: str) -> Manifest:
    """The word count example, its topics KafkaTopics of a Strimzi cluster in kafka_namespace."""
    app = wordcount_app(
        namespace, Images.release(), {"strimziCluster": {"name": "events", "namespace": kafka_namespace}}
    )
    target.kubectl("create", "namespace", namespace, check=False)
    target.apply(app)
    return app


def pipeline_configmaps(target: Target, namespace: str, app: str) -> list[str]:
    return target.kubectl(
        "get",
        "configmaps",
        "-n",
        namespace,
        "-o",
        "name",
        "-l",
        f"{names.APP_LABEL}={app},app.kubernetes.io/component=pipeline",
    ).stdout.split()


def test_install_and_upgrade(target: Target, loopback_webhook: LoopbackWebhook) -> None:
    with installed(target, "upgrade", loopback_webhook) as release:
        before = target.get("deployment", "upgrade-sluice", release.namespace)
        tls_before = target.get("secret", "upgrade-sluice-webhook-tls", release.namespace)
        point_webhook_at_loopback(target, release, back=True)
        target.helm.install(
            "upgrade",
            CHART_DIR,
            release.namespace,
            {"replicaCount": 2, "operator": {"logFormat": "plain"}},
            upgrade=True,
        )
        after = target.get("deployment", "upgrade-sluice", release.namespace)
        tls_after = target.get("secret", "upgrade-sluice-webhook-tls", release.namespace)
        upgraded = [
            m for m in yaml.safe_load_all(target.helm("get", "manifest", "upgrade", "-n", release.namespace)) if m
        ]
        history = json.loads(target.helm("history", "upgrade", "-n", release.namespace, "-o", "json"))
    (configuration,) = of_kind(upgraded, "ValidatingWebhookConfiguration")

    assert before is not None and after is not None
    assert f"sluice 0.1.0 is installed as release upgrade in namespace {release.namespace}" in release.notes
    assert "Not found in this cluster" not in release.notes  # the spark-operator and Strimzi CRDs are there
    assert "--log-format=json" in before["spec"]["template"]["spec"]["containers"][0]["args"]
    assert after["spec"]["replicas"] == 2
    assert {"--log-format=plain", "--peering=sluice"} <= set(after["spec"]["template"]["spec"]["containers"][0]["args"])
    assert [h["status"] for h in history] == ["superseded", "deployed"]
    for crd in ("streamingapps.sluice.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        target.kubectl("get", "crd", crd)
    # The webhook's CA and certificate are made once: an upgrade keeps what the replicas serve.
    assert tls_before is not None and tls_after is not None and tls_after["data"] == tls_before["data"]
    assert configuration["webhooks"][0]["clientConfig"]["caBundle"] == tls_after["data"]["ca.crt"]
    assert not target.kubectl(
        "get", "validatingwebhookconfiguration", "upgrade-sluice", "--ignore-not-found", "-o", "name"
    ).stdout.strip()  # uninstalled with the release


def test_rbac_is_what_the_operator_uses(target: Target, release: Release) -> None:
    """Cluster-wide, the operator holds what it does everywhere (no pods, Secrets or ConfigMap writes); in a
    namespace where it handles an app it binds itself the app-namespace role, and nothing else."""
    namespace = unique("rbac")
    target.kubectl("create", "namespace", namespace)
    app_only = app_namespace_uses()
    expected = {
        **dict.fromkeys(operator_uses() + ALL_NAMESPACES_ONLY, True),
        **dict.fromkeys(app_only + NEVER, False),
    }

    def differences(in_namespace: str) -> list[tuple[str, str, str]]:
        allowed = can_i(target, release.user, list(expected), in_namespace)
        return [check for check, ok in allowed.items() if ok != expected[check]]

    assert differences(namespace) == []
    assert differences("kube-system") == []  # e.g. it cannot patch ConfigMaps nor read Secrets there

    binding = children.operator_role_binding(namespace, "sluice-app-namespace", (release.namespace, release.account))
    as_operator = (f"--as={release.user}", "apply", "--server-side", "--field-manager=sluice-operator", "-f", "-")
    target.kubectl(*as_operator, input=json.dumps(binding))
    expected |= dict.fromkeys(app_only, True)
    assert differences(namespace) == []
    expected |= dict.fromkeys(app_only, False)
    assert differences("kube-system") == []  # the binding holds in its namespace only

    escalated = {**binding, "metadata": {**binding["metadata"], "name": "escalated"}}
    escalated["roleRef"] = {**binding["roleRef"], "name": "admin"}
    refused = target.kubectl(*as_operator, input=json.dumps(escalated), check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr


def test_operator_reconciles_with_its_service_account(
    target: Target, release: Release, tmp_path: Path, kafka_bootstrap: str
) -> None:
    namespace, kafka_namespace = unique("apps"), unique("kafka")
    target.kubectl("create", "namespace", kafka_namespace)
    # Strimzi's topic operator makes the topics Ready (a stand-in: its images cannot be had here), so the driver
    # is submitted.
    with topic_operator(target.kubectl, kafka_bootstrap), operator_as(target, release, tmp_path / "operator.log"):
        app = app_in(target, namespace, kafka_namespace)
        name = app["metadata"]["name"]
        wait_for(
            lambda: target.get("sparkapplication", name, namespace),
            what="the driver, submitted once Strimzi (its stand-in) made the topics Ready",
        )
        conditions = {c["type"]: c["status"] for c in wait_phase(target, namespace, name, "Pending")["conditions"]}
        first_revision = status(target, namespace, name)["revision"]
        topics = target.kubectl("get", "kafkatopics", "-n", kafka_namespace, "-o", "name").stdout.split()
        # Every child is there: the driver's binding too, which RBAC allows only with bind on its ClusterRole;
        # and the operator's own binding in the namespace, made before anything else.
        for kind, child in [
            ("serviceaccount", f"{name}-spark"),
            ("rolebinding", f"{name}-spark"),
            ("rolebinding", "sluice-app-namespace"),
            ("service", f"{name}-driver"),
            ("networkpolicy", f"{name}-driver"),
            ("networkpolicy", f"{name}-executor"),
            ("secret", f"{name}-control"),
            ("sparkapplication", name),
        ]:
            assert target.get(kind, child, namespace) is not None, (kind, child)

        # Two new revisions: a pipeline ConfigMap each; the first revision's is pruned (list + delete) once no
        # rollout names it (the last rollout's two revisions are kept).
        for image in ("sluice/spark:next", "sluice/spark:after"):
            before = status(target, namespace, name).get("revision")
            target.kubectl(
                "patch",
                "streamingapp",
                name,
                "-n",
                namespace,
                "--type=merge",
                "-p",
                json.dumps({"spec": {"spark": {"image": image}}}),
            )
            wait_for(
                lambda b=before: status(target, namespace, name).get("stableRevision") not in (None, b),
                timeout=60,
                what=f"the revision of {image} to be stable",
                interval=0.5,
            )

        def kept() -> list[str]:
            rollout = status(target, namespace, name)["rollout"]
            revisions = {rollout["fromRevision"], rollout["toRevision"]}
            return sorted(f"configmap/{revision_configmap_name(name, rev)}" for rev in revisions)

        wait_for(
            lambda: sorted(pipeline_configmaps(target, namespace, name)) == kept(),
            timeout=60,
            what="the first pipeline ConfigMap to be pruned",
            interval=0.5,
        )
        assert f"configmap/{revision_configmap_name(name, first_revision)}" not in kept()

        # A running driver whose pod the operator reads (it has none here: no figures, nothing stale).
        target.kubectl(
            "patch",
            "sparkapplication",
            name,
            "-n",
            namespace,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(
                {"status": {"driverInfo": {"podName": f"{name}-driver"}, "applicationState": {"state": "RUNNING"}}}
            ),
        )
        running = wait_phase(target, namespace, name, "Running")

        # Suspended: the driver is deleted.
        target.kubectl(
            "patch",
            "streamingapp",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"suspend": True}}),
        )
        wait_phase(target, namespace, name, "Suspended")
        wait_for(
            lambda: target.get("sparkapplication", name, namespace) is None,
            timeout=30,
            what="the SparkApplication to be deleted",
            interval=0.5,
        )

        # An invalid pipeline is refused at apply, with the field path, by the webhook this operator serves.
        invalid = with_unknown_input({**app, "metadata": {"name": "invalid", "namespace": namespace}})
        refused = target.kubectl("apply", "-f", "-", input=json.dumps(invalid), check=False)
        # And one crossing a guard rail (by default: SQL that calls Java methods), refused at its field.
        reflecting = copy.deepcopy({**app, "metadata": {"name": "reflecting", "namespace": namespace}})
        nodes = reflecting["spec"]["pipeline"]["nodes"]
        filtered = next(i for i, node in enumerate(nodes) if "filter" in node)
        nodes[filtered]["filter"] = "reflect('java.lang.System', 'exit', 1) IS NULL"
        railed = target.kubectl("apply", "-f", "-", input=json.dumps(reflecting), check=False)
        # One accepted while no webhook was configured: Valid=False and a Warning event, by the operator.
        with webhook_configuration_removed(target, release):
            wait_for(
                lambda: target.kubectl("apply", "-f", "-", input=json.dumps(invalid), check=False).returncode == 0,
                what="the invalid app to be accepted without the webhook",
            )
        wait_phase(target, namespace, "invalid", "Invalid")
        events = wait_for(
            lambda: json.loads(
                target.kubectl(
                    "get", "events", "-n", namespace, "--field-selector", "reason=InvalidSpec", "-o", "json"
                ).stdout
            )["items"],
            timeout=30,
            what="an InvalidSpec event",
            interval=0.5,
        )

    assert conditions == {
        "Ready": "False",  # the first that is not True: the claim, never bound here
        "Valid": "True",
        "TopicsReady": "True",
        "CheckpointReady": "False",  # no provisioner nor scheduler here: the operator's claim stays Pending
        "DriverSubmitted": "True",
        "Running": "Unknown",
        "Rollout": "True",  # the first revision is the stable one
    }
    assert len(topics) == len(app["spec"]["topics"])
    assert status(target, namespace, name)["revision"] != first_revision
    assert refused.returncode != 0
    assert f'admission webhook "{WEBHOOK}" denied the request: ' in refused.stderr
    assert "spec.pipeline.nodes[1].inputs[0]: unknown node 'missing'" in refused.stderr
    assert railed.returncode != 0
    assert f"spec.pipeline.nodes[{filtered}].filter: calls reflect, refused on this cluster" in railed.stderr
    assert events[0]["involvedObject"]["name"] == "invalid"
    assert running.get("observedAt") is None and running.get("lag") is None
    assert running["desiredExecutors"] == app["spec"].get("executors", {}).get("instances", 1)


def test_namespace_list_release_with_replicas(
    target: Target, loopback_webhook: LoopbackWebhook, tmp_path: Path
) -> None:
    watched, unwatched, kafka_namespace = unique("watched"), unique("unwatched"), unique("kafka")
    for namespace in (watched, unwatched, kafka_namespace):
        target.kubectl("create", "namespace", namespace)
    values = {"watchNamespaces": [watched], "kafkaTopicNamespaces": [kafka_namespace], "replicaCount": 2}
    with installed(target, "scoped", loopback_webhook, values) as release:
        uses = operator_uses("scoped-sluice")
        in_watched = can_i(target, release.user, uses + app_namespace_uses() + ALL_NAMESPACES_ONLY, watched)
        elsewhere = can_i(target, release.user, uses + app_namespace_uses(), unwatched)
        topics_only = can_i(target, release.user, uses, kafka_namespace)
        with operator_as(target, release, tmp_path / "operator.log"):
            app = app_in(target, watched, kafka_namespace)
            ignored = app_in(target, unwatched, kafka_namespace)
            wait_phase(target, watched, app["metadata"]["name"], "Pending")
            topics = wait_for(
                lambda: (
                    (names := target.kubectl("get", "kafkatopics", "-n", kafka_namespace, "-o", "name").stdout.split())
                    and len(names) >= len(app["spec"]["topics"])
                    and names
                ),
                what="the KafkaTopics",
            )
            peering = target.get("kopfpeering", "sluice", watched)
            unwatched_status = status(target, unwatched, ignored["metadata"]["name"])

    assert [check for check, ok in in_watched.items() if not ok] == []
    assert [check for check, ok in elsewhere.items() if ok] == []
    assert {check[:2] for check, ok in topics_only.items() if ok} == {
        (verb, "kafkatopics.kafka.strimzi.io") for verb in ("get", "create", "patch")
    } | {("get", KAFKAS)}
    assert len(topics) == len(app["spec"]["topics"])
    assert peering is not None
    assert unwatched_status == {}


def test_every_replica_serves_the_webhook_and_one_down_blocks_only_streamingapps(
    target: Target, loopback_webhook: LoopbackWebhook, tmp_path: Path
) -> None:
    namespace = unique("webhook")
    target.kubectl("create", "namespace", namespace)
    app = wordcount_app(namespace, Images.release(), {"strimziCluster": {"name": "events", "namespace": namespace}})
    name = app["metadata"]["name"]
    another = {**app, "metadata": {**app["metadata"], "name": "another"}}
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "unrelated", "namespace": namespace},
        "data": {"any": "thing"},
    }

    def kubectl_apply(manifest: Manifest) -> subprocess.CompletedProcess[str]:
        return target.kubectl("apply", "-f", "-", input=json.dumps(manifest), check=False)

    with installed(target, "webhook", loopback_webhook, {"watchNamespaces": [namespace], "replicaCount": 2}) as release:
        (active_port,) = free_ports(1)
        with (
            operator_as(target, release, tmp_path / "active.log", priority=200, webhook_port=active_port),
            operator_as(target, release, tmp_path / "standby.log", priority=100),
        ):
            # The configuration calls the standby's port.
            refused = kubectl_apply(with_unknown_input(app))
            accepted = kubectl_apply(app)
            wait_phase(target, namespace, name, "Pending")
            standby_log = (tmp_path / "standby.log").read_text()
        # No replica left: nothing answers the webhook.
        blocked = kubectl_apply(another)
        spec_change = target.kubectl(
            "patch",
            "streamingapp",
            name,
            "-n",
            namespace,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"suspend": True}}),
            check=False,
        )
        metadata_change = target.kubectl("label", "streamingapp", name, "-n", namespace, "team=a", check=False)
        unrelated = kubectl_apply(configmap)

    assert refused.returncode != 0 and "unknown node 'missing'" in refused.stderr
    assert accepted.returncode == 0, accepted.stderr
    # kopf starts paused and the replica of lower priority never resumes: it handled nothing.
    assert "Resuming operations" not in standby_log and "Handler 'reconcile'" not in standby_log
    assert blocked.returncode != 0
    assert f'failed calling webhook "{WEBHOOK}"' in blocked.stderr and "connection refused" in blocked.stderr
    assert target.get("streamingapp", "another", namespace) is None
    assert spec_change.returncode != 0 and "failed calling webhook" in spec_change.stderr
    assert metadata_change.returncode == 0, metadata_change.stderr  # not sent to the webhook (matchConditions)
    assert unrelated.returncode == 0, unrelated.stderr


# --- images ------------------------------------------------------------------------------------------


def dockerfile(name: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of images/<name>/Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (IMAGES_DIR / name / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def args_before_from(instructions: list[tuple[str, str]]) -> dict[str, str]:
    first_from = next(i for i, (op, _) in enumerate(instructions) if op == "FROM")
    return dict(arg.split("=", 1) for op, arg in instructions[:first_from] if op == "ARG")


@pytest.mark.parametrize(
    ("name", "base_arg", "base"),
    [
        ("operator", "PYTHON_IMAGE", "python:3.11-slim-bookworm"),
        ("spark", "BASE_IMAGE", "apache/spark:4.2.0-python3"),
    ],
)
def test_dockerfile_base_is_an_arg_and_the_user_is_not_root(name: str, base_arg: str, base: str) -> None:
    instructions = dockerfile(name)
    users = [arg for op, arg in instructions if op == "USER"]

    assert args_before_from(instructions) == {base_arg: base}
    assert [arg for op, arg in instructions if op == "FROM"] == [f"${{{base_arg}}}"]
    assert users and users[-1].split(":")[0].isdigit() and int(users[-1].split(":")[0]) > 0


def test_spark_image_has_the_runner_the_operator_starts() -> None:
    instructions = dockerfile("spark")
    runner = names.RUNNER_FILE.removeprefix("local://")

    assert ("COPY", f"runner.py {runner}") in instructions
    assert ("COPY", "jars/ ${SPARK_HOME}/jars/") in instructions
    assert "from sluice.pipelines.runner import main" in (IMAGES_DIR / "spark" / "runner.py").read_text()
    assert ("ENTRYPOINT", '["python", "-m", "sluice.operator"]') in dockerfile("operator")


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return image_builder().prepare_contexts(["operator", "spark"], tmp_path_factory.mktemp("images"))


@pytest.mark.parametrize("name", ["operator", "spark"])
def test_build_context_has_everything_the_dockerfile_copies(contexts: dict[str, Path], name: str) -> None:
    context = contexts[name]
    sources = [arg.split()[0].rstrip("/").replace("*.whl", "") for op, arg in dockerfile(name) if op == "COPY"]

    for source in sources:
        assert (context / source).exists(), source
    (wheel,) = (context / "dist").glob("sluice-*.whl")
    assert wheel.name.startswith(f"sluice-{image_builder().version()}-")


def test_build_contexts_pin_dependencies_and_bring_the_connector(contexts: dict[str, Path]) -> None:
    from sluice.pipelines.local.spark import spark_image_jars

    operator = (contexts["operator"] / "requirements.txt").read_text().split()
    spark = (contexts["spark"] / "requirements.txt").read_text().split()

    assert "kopf==1.45.2" in operator and not any(r.startswith("pyspark") for r in operator + spark)
    assert all("==" in r for r in operator + spark)
    jars = sorted(p.name for p in (contexts["spark"] / "jars").iterdir())
    assert jars == sorted(j.name for j in spark_image_jars())
    assert any(name.startswith("spark-sql-kafka-0-10_2.13-4.2.0") for name in jars)
    assert "hadoop-aws-3.5.0.jar" in jars and "s3-2.35.4.jar" in jars and not any("bundle" in n for n in jars)


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        (
            "operator",
            "import sluice.operator.__main__, sluice.operator.handlers, "
            "sluice.operator.topics, sluice.operator.admission",
        ),
        ("spark", "import sluice.pipelines.runner"),
    ],
)
def test_image_requirements_are_enough_to_import_its_code(name: str, entry: str) -> None:
    """Every package pyproject.toml names that the image leaves out (pyspark: the Spark image's own) is
    unimportable."""
    from importlib.metadata import packages_distributions

    build = image_builder()
    keep = {build._normalise(p) for p in build.IMAGES[name].packages} | ({"pyspark"} if name == "spark" else set())
    declared = build.declared_packages()
    left_out = [
        module
        for module, dists in packages_distributions().items()
        if not module.startswith("_") and {build._normalise(d) for d in dists} & (declared - keep)
    ]
    code = f"import sys\nfor m in {left_out!r}: sys.modules[m] = None\n{entry}\n"

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    assert result.returncode == 0, result.stderr[-2000:]


def test_images_without_a_builder_fail_with_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no docker, podman or buildah

    assert image_builder().main([]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("error: building images needs docker (with a running engine), podman or buildah")
