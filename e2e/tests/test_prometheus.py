"""The test bed's stand-in for the Prometheus Operator: the chart's monitors become the scrape configuration the
operator would generate (checked here by applying its relabelings to discovered targets as Prometheus does);
the real Prometheus scraping through the NetworkPolicies is the e2e's `monitoring` step."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.testbed.e2e_suite import Helm
from sluice.testbed.prometheus import (
    label_name,
    prometheus_config,
    release,
    rule_file_name,
    selector_relabelings,
)

MONITORING_API = ("--api-versions", "monitoring.coreos.com/v1")


def relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus' relabelling (keep, drop, replace), enough for the rules the stand-in writes; None: dropped."""
    labels = dict(labels)
    for rule in rules:
        value = ";".join(labels.get(name, "") for name in rule.get("source_labels", []))
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if (action == "keep" and not match) or (action == "drop" and match):
            return None
        if action == "replace" and match:
            template = re.sub(r"\$\{?(\d)\}?", r"\\g<\1>", rule.get("replacement", "$1"))
            labels[rule["target_label"]] = match.expand(template)
    return {k: v for k, v in labels.items() if not k.startswith("__")}


def discovered(role: str, labels: dict[str, str], port: str, **meta: str) -> dict[str, str]:
    """A target as Kubernetes discovery gives it: a pod's (role pod) or its Service's (role service) labels."""
    port_name = (
        "__meta_kubernetes_pod_container_port_name" if role == "pod" else "__meta_kubernetes_endpointslice_port_name"
    )
    found = {f"__meta_kubernetes_{role}_label_{label_name(k)}": v for k, v in labels.items()}
    found |= {f"__meta_kubernetes_{role}_labelpresent_{label_name(k)}": "true" for k in labels}
    return {port_name: port, "__meta_kubernetes_pod_phase": "Running", **found, **meta}


def pod_meta(labels: dict[str, str], port: str, **meta: str) -> dict[str, str]:
    return discovered("pod", labels, port, **meta)


def service_meta(labels: dict[str, str], port: str, **meta: str) -> dict[str, str]:
    return discovered("service", labels, port, **meta)


@pytest.fixture(scope="module")
def rendered(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    chart = Helm(helm, Path(os.devnull), tmp_path_factory.mktemp("helm"))
    manifests = chart.template("r", "ops", {"monitoring": {"enabled": True, "interval": "7s"}}, *MONITORING_API)
    return [m for m in manifests if m["apiVersion"] == "monitoring.coreos.com/v1"]


@pytest.fixture(scope="module")
def config(rendered: list[dict[str, Any]]) -> dict[str, Any]:
    return yaml.safe_load(prometheus_config(rendered)["prometheus.yml"])


def jobs(config: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    return [job for job in config["scrape_configs"] if job["job_name"].startswith(prefix)]


def test_the_operators_pods_are_scraped_on_their_metrics_port_under_the_monitors_job(config: dict[str, Any]) -> None:
    (job,) = jobs(config, "podMonitor/ops/")
    operator = {
        "app.kubernetes.io/name": "sluice",
        "app.kubernetes.io/instance": "r",
        "app.kubernetes.io/component": "operator",
    }
    meta = {"__meta_kubernetes_namespace": "ops", "__meta_kubernetes_pod_name": "r-sluice-1"}

    assert job["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["ops"]}}]
    assert job["scrape_interval"] == "7s"
    assert relabel(pod_meta(operator, "metrics", **meta), job["relabel_configs"]) == {
        "namespace": "ops",
        "container": "",
        "pod": "r-sluice-1",
        "job": "ops/r-sluice",
        "endpoint": "metrics",
    }
    assert relabel(pod_meta(operator, "health", **meta), job["relabel_configs"]) is None, "another port"
    other = {**operator, "app.kubernetes.io/instance": "other"}
    assert relabel(pod_meta(other, "metrics", **meta), job["relabel_configs"]) is None, "another release"
    finished = pod_meta(operator, "metrics", **meta, __meta_kubernetes_pod_phase="Succeeded")
    assert relabel(finished, job["relabel_configs"]) is None, "a finished pod"


def test_every_apps_driver_service_is_scraped_in_any_namespace_as_job_sluice_app(config: dict[str, Any]) -> None:
    (job,) = jobs(config, "serviceMonitor/ops/")
    driver = {
        "app.kubernetes.io/name": "sluice-app",
        "app.kubernetes.io/component": "driver",
        "app.kubernetes.io/managed-by": "sluice-operator",
        "sluice.dev/app": "wordcount",
    }
    meta = {"__meta_kubernetes_namespace": "apps", "__meta_kubernetes_service_name": "wordcount-driver"}

    assert job["kubernetes_sd_configs"] == [{"role": "endpointslice"}]
    kept = relabel(service_meta(driver, "metrics", **meta), job["relabel_configs"])
    assert kept is not None and (kept["job"], kept["namespace"], kept["service"]) == (
        "sluice-app",
        "apps",
        "wordcount-driver",
    )
    unlabelled = {k: v for k, v in driver.items() if k != "sluice.dev/app"}
    assert relabel(service_meta(unlabelled, "metrics", **meta), job["relabel_configs"]) is None, (
        "matchExpressions Exists"
    )
    executor = {**driver, "app.kubernetes.io/component": "executor"}
    assert relabel(service_meta(executor, "metrics", **meta), job["relabel_configs"]) is None, "matchLabels"


def test_the_charts_alert_rules_become_a_rule_file_prometheus_loads(rendered: list[dict[str, Any]]) -> None:
    (rule,) = [m for m in rendered if m["kind"] == "PrometheusRule"]
    files = prometheus_config(rendered)

    assert yaml.safe_load(files[rule_file_name(rule)]) == {"groups": rule["spec"]["groups"]}
    assert yaml.safe_load(files["prometheus.yml"])["rule_files"] == ["/etc/prometheus/rules-*.yaml"]
    alerts = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert {"SluiceOperatorDown", "SluiceDriverDown", "SluiceKafkaBacklogHigh"} <= alerts


def test_selector_operators_in_not_in_and_does_not_exist_select_as_kubernetes_does() -> None:
    rules = selector_relabelings(
        {
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a.b", "c"]},
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["x"]},
            ]
        },
        "pod",
    )

    assert relabel(pod_meta({"tier": "a.b"}, "m"), rules) is not None
    assert relabel(pod_meta({"tier": "aXb"}, "m"), rules) is None, "a value is matched literally"
    assert relabel(pod_meta({"tier": "c", "canary": ""}, "m"), rules) is None
    assert relabel(pod_meta({"tier": "c", "zone": "x"}, "m"), rules) is None
    assert relabel(pod_meta({"tier": "c", "zone": "y"}, "m"), rules) is not None


def test_a_monitor_field_the_stand_in_cannot_translate_is_refused_by_name(rendered: list[dict[str, Any]]) -> None:
    (monitor,) = [m for m in rendered if m["kind"] == "ServiceMonitor"]
    tls = {**monitor, "spec": {**monitor["spec"], "endpoints": [{"port": "metrics", "tlsConfig": {}}]}}

    with pytest.raises(ValueError, match=r"ServiceMonitor ops/r-sluice-drivers sets endpoints\[\]\.tlsConfig"):
        prometheus_config([tls])


def test_the_release_is_read_from_the_module_version() -> None:
    assert re.fullmatch(r"3\.\d+\.\d+", release())
