"""A real Prometheus for the test bed, configured the way the Prometheus Operator would configure it.

Prometheus is built from its Go module and runs as a pod (a files-only image around the static binary), so it
scrapes through the cluster's NetworkPolicies as a user's Prometheus does. The Prometheus Operator cannot run
here (its StatefulSet wants its images from a registry), so the test bed stands in for it at its documented
seam: it installs the operator's CRDs (PodMonitor, ServiceMonitor, PrometheusRule, from its Go module), reads
the monitors and rules found in the cluster and writes the configuration the operator generates from them:
Kubernetes service discovery kept to the monitors' selectors, namespaces and port names, with the target labels
the operator sets (job, namespace, pod, service, container, endpoint), and the rules' groups as rule files.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .common import cache_dir, wait_for
from .images import ImageSpec
from .kube import Kubectl, cached_binaries, go_install, go_module_directory
from .manifests import cluster_role_with_binding
from .versions import PROMETHEUS_MODULE_VERSION, PROMETHEUS_OPERATOR

MODULE = "github.com/prometheus/prometheus"
OPERATOR_MODULE = "github.com/prometheus-operator/prometheus-operator"
MONITORING_KINDS = ("podmonitors", "servicemonitors", "prometheusrules")  # the CRDs the stand-in reads
NAMESPACE = "monitoring"
NAME = "prometheus"
PORT = 9090
CONFIG_MOUNT = "/etc/prometheus"
CONFIG_FILE = "prometheus.yml"
DEFAULT_INTERVAL = "30s"  # the Prometheus Operator's default scrape interval
# What the monitors may set that the stand-in translates; anything else fails loudly, not silently unscraped.
ENDPOINT_FIELDS = {"port", "path", "interval", "scheme", "scrapeTimeout"}
POD_MONITOR_FIELDS = {"selector", "namespaceSelector", "podMetricsEndpoints", "jobLabel"}
SERVICE_MONITOR_FIELDS = {"selector", "namespaceSelector", "endpoints", "jobLabel"}
# Pods in these phases are dropped from the targets (the operator's own rule).
FINISHED_PHASES = "(Failed|Succeeded)"
READ = ["get", "list", "watch"]


def release() -> str:
    """The Prometheus release of the module version: v0.316.0 is 3.16.0."""
    _, minor, patch = PROMETHEUS_MODULE_VERSION.split(".")
    return f"{int(minor) // 100}.{int(minor) % 100}.{patch}"


IMAGE = f"sluice.local/prometheus:{release()}"


def prometheus_binary() -> Path:
    def build(out: Path, names: list[str]) -> None:
        ldflags = ["-s", "-w", f"-X github.com/prometheus/common/version.Version={release()}"]
        go_install(
            NAME, f"v{PROMETHEUS_MODULE_VERSION}", f"{MODULE}/cmd/prometheus", ldflags, out, out.parent / "build.log"
        )

    return cached_binaries(cache_dir(NAME, f"v{PROMETHEUS_MODULE_VERSION}"), [NAME], build)[NAME]


def prometheus_image() -> ImageSpec:
    """The static binary alone, run as nobody (the web UI's assets are not built: the API is what tests use)."""
    return ImageSpec(IMAGE, ["/bin/prometheus"], {"/bin/prometheus": prometheus_binary()}, user="65534:65534")


def monitoring_crds() -> list[Path]:
    """PodMonitor, ServiceMonitor and PrometheusRule (monitoring.coreos.com/v1) from the operator's module."""
    version = f"v{PROMETHEUS_OPERATOR}"
    module = go_module_directory(OPERATOR_MODULE, version, cache_dir("prometheus-operator", version) / "fetch.log")
    return [
        module / "example" / "prometheus-operator-crd" / f"monitoring.coreos.com_{kind}.yaml"
        for kind in MONITORING_KINDS
    ]


# --- the Prometheus Operator's translation -----------------------------------------------------------


def label_name(name: str) -> str:
    """A Kubernetes label key as Prometheus' discovery names it (`sluice.dev/app`: `sluice_dev_app`)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def selector_relabelings(selector: dict[str, Any], role: str) -> list[dict[str, Any]]:
    """keep/drop rules equal to a label selector over the discovered `role` (pod or service) labels."""
    value, present = f"__meta_kubernetes_{role}_label_", f"__meta_kubernetes_{role}_labelpresent_"
    rules = [
        {
            "action": "keep",
            "source_labels": [value + label_name(k), present + label_name(k)],
            "regex": f"({re.escape(v)});true",
        }
        for k, v in sorted((selector.get("matchLabels") or {}).items())
    ]
    for expression in selector.get("matchExpressions") or []:
        key, operator = label_name(expression["key"]), expression["operator"]
        either = "|".join(re.escape(v) for v in expression.get("values") or [])
        rules.append(
            {
                "In": {"action": "keep", "source_labels": [value + key, present + key], "regex": f"({either});true"},
                "NotIn": {"action": "drop", "source_labels": [value + key, present + key], "regex": f"({either});true"},
                "Exists": {"action": "keep", "source_labels": [present + key], "regex": "true"},
                "DoesNotExist": {"action": "drop", "source_labels": [present + key], "regex": "true"},
            }[operator]
        )
    return rules


def _sd_namespaces(monitor: dict[str, Any]) -> dict[str, Any]:
    """The monitor's own namespace unless its namespaceSelector says `any` or names others."""
    selector = monitor["spec"].get("namespaceSelector") or {}
    if selector.get("any"):
        return {}
    return {"namespaces": {"names": selector.get("matchNames") or [monitor["metadata"]["namespace"]]}}


def _checked(monitor: dict[str, Any], allowed: set[str], endpoints: str) -> list[dict[str, Any]]:
    where = f"{monitor['kind']} {monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    unknown = set(monitor["spec"]) - allowed
    unknown |= {
        f"{endpoints}[].{key}" for endpoint in monitor["spec"][endpoints] for key in set(endpoint) - ENDPOINT_FIELDS
    }
    if unknown:
        raise ValueError(f"{where} sets {', '.join(sorted(unknown))}, which the test bed's stand-in does not translate")
    if any("port" not in endpoint for endpoint in monitor["spec"][endpoints]):
        raise ValueError(f"{where}: the stand-in scrapes named ports only")
    return list(monitor["spec"][endpoints])


def _scrape_config(job_name: str, role: str, monitor: dict[str, Any], endpoint: dict[str, Any]) -> dict[str, Any]:
    return {
        "job_name": job_name,
        "kubernetes_sd_configs": [{"role": role, **_sd_namespaces(monitor)}],
        "scrape_interval": endpoint.get("interval", DEFAULT_INTERVAL),
        **({"scrape_timeout": endpoint["scrapeTimeout"]} if "scrapeTimeout" in endpoint else {}),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scheme": endpoint.get("scheme", "http"),
    }


def _target_labels(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    return [{"source_labels": [source], "target_label": target} for source, target in pairs]


def _job_from_label(role: str, job_label: str | None) -> list[dict[str, Any]]:
    """The monitor's jobLabel, where the target's pod or Service has that label, overrides the default job."""
    if not job_label:
        return []
    source = f"__meta_kubernetes_{role}_label_{label_name(job_label)}"
    return [{"source_labels": [source], "target_label": "job", "regex": "(.+)", "replacement": "${1}"}]


def pod_monitor_scrape_configs(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """Over pods; the job is `<namespace>/<monitor>` or its jobLabel."""
    namespace, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    return [
        {
            **_scrape_config(f"podMonitor/{namespace}/{name}/{index}", "pod", monitor, endpoint),
            "relabel_configs": [
                {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": FINISHED_PHASES},
                *selector_relabelings(monitor["spec"]["selector"], "pod"),
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": endpoint["port"],
                },
                *_target_labels(
                    ("__meta_kubernetes_namespace", "namespace"),
                    ("__meta_kubernetes_pod_container_name", "container"),
                    ("__meta_kubernetes_pod_name", "pod"),
                ),
                {"target_label": "job", "replacement": f"{namespace}/{name}"},
                *_job_from_label("pod", monitor["spec"].get("jobLabel")),
                {"target_label": "endpoint", "replacement": endpoint["port"]},
            ],
        }
        for index, endpoint in enumerate(_checked(monitor, POD_MONITOR_FIELDS, "podMetricsEndpoints"))
    ]


def service_monitor_scrape_configs(monitor: dict[str, Any]) -> list[dict[str, Any]]:
    """Over EndpointSlices (the Endpoints API is deprecated); the job is the Service's name or its jobLabel."""
    namespace, name = monitor["metadata"]["namespace"], monitor["metadata"]["name"]
    return [
        {
            **_scrape_config(f"serviceMonitor/{namespace}/{name}/{index}", "endpointslice", monitor, endpoint),
            "relabel_configs": [
                *selector_relabelings(monitor["spec"]["selector"], "service"),
                {
                    "action": "keep",
                    "source_labels": ["__meta_kubernetes_endpointslice_port_name"],
                    "regex": endpoint["port"],
                },
                {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": FINISHED_PHASES},
                *_target_labels(
                    ("__meta_kubernetes_namespace", "namespace"),
                    ("__meta_kubernetes_service_name", "service"),
                    ("__meta_kubernetes_pod_name", "pod"),
                    ("__meta_kubernetes_pod_container_name", "container"),
                    ("__meta_kubernetes_service_name", "job"),
                ),
                *_job_from_label("service", monitor["spec"].get("jobLabel")),
                {"target_label": "endpoint", "replacement": endpoint["port"]},
            ],
        }
        for index, endpoint in enumerate(_checked(monitor, SERVICE_MONITOR_FIELDS, "endpoints"))
    ]


def rule_file_name(rule: dict[str, Any]) -> str:
    return f"rules-{rule['metadata']['namespace']}-{rule['metadata']['name']}.yaml"


def prometheus_config(
    monitoring: Iterable[dict[str, Any]], evaluation_interval: str = DEFAULT_INTERVAL
) -> dict[str, str]:
    """The files the Prometheus Operator would give Prometheus for these PodMonitors, ServiceMonitors and
    PrometheusRules (and a job scraping Prometheus itself): {file name: content}."""
    scrape_configs: list[dict[str, Any]] = [
        {
            "job_name": NAME,
            "scrape_interval": evaluation_interval,
            "static_configs": [{"targets": [f"localhost:{PORT}"]}],
        }
    ]
    files = {}
    for item in sorted(monitoring, key=lambda i: (i["kind"], i["metadata"]["namespace"], i["metadata"]["name"])):
        if item["kind"] == "PodMonitor":
            scrape_configs += pod_monitor_scrape_configs(item)
        elif item["kind"] == "ServiceMonitor":
            scrape_configs += service_monitor_scrape_configs(item)
        elif item["kind"] == "PrometheusRule":
            files[rule_file_name(item)] = yaml.safe_dump({"groups": item["spec"].get("groups") or []}, sort_keys=False)
        else:
            raise ValueError(f"not a monitoring.coreos.com kind the stand-in reads: {item['kind']}")
    config = {
        "global": {"scrape_interval": DEFAULT_INTERVAL, "evaluation_interval": evaluation_interval},
        "rule_files": [f"{CONFIG_MOUNT}/rules-*.yaml"],
        "scrape_configs": scrape_configs,
    }
    return {CONFIG_FILE: yaml.safe_dump(config, sort_keys=False), **files}


# --- in the cluster ----------------------------------------------------------------------------------


def manifests(
    files: dict[str, str], namespace: str = NAMESPACE, pod_labels: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Prometheus in `namespace` (which enforces Pod Security "restricted"), allowed to discover pods,
    Services and EndpointSlices everywhere; its pod carries `pod_labels` (what NetworkPolicies admit)."""
    labels = {"app.kubernetes.io/name": NAME, **(pod_labels or {})}
    return [
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": namespace}},
        *cluster_role_with_binding(
            f"sluice-testbed-{NAME}",
            [
                {"apiGroups": [""], "resources": ["pods", "services", "endpoints", "namespaces"], "verbs": READ},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": READ},
            ],
            [{"kind": "ServiceAccount", "name": NAME, "namespace": namespace}],
        ),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME, "namespace": namespace}, "data": files},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {"app.kubernetes.io/name": NAME}},
                "template": {
                    "metadata": {
                        "labels": labels,
                        # a new configuration restarts the pod (as the operator's config reloader would reload)
                        "annotations": {
                            "sluice.dev/config": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[
                                :16
                            ]
                        },
                    },
                    "spec": {
                        "serviceAccountName": NAME,
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65534,
                            "fsGroup": 65534,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [
                            {
                                "name": NAME,
                                "image": IMAGE,
                                "imagePullPolicy": "Never",
                                "args": [
                                    f"--config.file={CONFIG_MOUNT}/{CONFIG_FILE}",
                                    "--storage.tsdb.path=/prometheus",
                                    "--storage.tsdb.retention.time=6h",
                                    f"--web.listen-address=:{PORT}",
                                ],
                                "ports": [{"name": "web", "containerPort": PORT}],
                                "readinessProbe": {"httpGet": {"path": "/-/ready", "port": PORT}, "periodSeconds": 2},
                                "resources": {
                                    "requests": {"cpu": "50m", "memory": "128Mi"},
                                    "limits": {"memory": "512Mi"},
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [
                                    {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
                                    {"name": "data", "mountPath": "/prometheus"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "config", "configMap": {"name": NAME}},
                            {"name": "data", "emptyDir": {"sizeLimit": "1Gi"}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": NAME, "namespace": namespace},
            "spec": {"selector": {"app.kubernetes.io/name": NAME}, "ports": [{"name": "web", "port": PORT}]},
        },
    ]


class PrometheusError(RuntimeError):
    pass


@dataclass(frozen=True)
class Prometheus:
    """The test bed's Prometheus in a cluster, read through the API server's Service proxy."""

    kubectl: Kubectl
    namespace: str = NAMESPACE

    def deploy(self, pod_labels: dict[str, str], evaluation_interval: str, timeout: float = 180) -> None:
        """Configure from the monitoring objects now in the cluster and (re)start; ready when this returns."""
        found = json.loads(self.kubectl("get", ",".join(MONITORING_KINDS), "-A", "-o", "json").stdout)["items"]
        files = prometheus_config(found, evaluation_interval)
        listed = {"apiVersion": "v1", "kind": "List", "items": manifests(files, self.namespace, pod_labels)}
        self.kubectl("apply", "-f", "-", input=json.dumps(listed))
        self.kubectl(
            "rollout",
            "status",
            f"deployment/{NAME}",
            "-n",
            self.namespace,
            f"--timeout={timeout:.0f}s",
            timeout=timeout + 30,
        )

    def api(self, path: str, **params: str) -> Any:
        """`/api/v1/<path>`'s data; PrometheusError with Prometheus' own message when it refuses."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        raw = f"/api/v1/namespaces/{self.namespace}/services/{NAME}:web/proxy/api/v1/{path}{query}"
        result = self.kubectl("get", "--raw", raw, check=False)
        try:
            answer = json.loads(result.stdout)
        except json.JSONDecodeError:
            raise PrometheusError(f"{path}: {result.stderr.strip() or result.stdout[:200]}") from None
        if answer.get("status") != "success":
            raise PrometheusError(f"{path}: {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def query(self, expression: str) -> list[dict[str, Any]]:
        """An instant query's series (each with `metric` labels and a `value`)."""
        data = self.api("query", query=expression)
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expression}: a {data['resultType']}, not a vector")
        return list(data["result"])

    def active_targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets", state="active")["activeTargets"])

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self.api(f"label/{label}/values", **{"match[]": match}))

    def wait_up(self, jobs: Iterable[str], timeout: float) -> list[dict[str, Any]]:
        """Every active target once each of `jobs` has one and all of them are up."""

        def up() -> list[dict[str, Any]] | None:
            targets = self.active_targets()
            seen = {t["labels"].get("job") for t in targets}
            return targets if set(jobs) <= seen and all(t["health"] == "up" for t in targets) else None

        return wait_for(up, timeout=timeout, what=f"Prometheus targets of {sorted(jobs)} up", interval=2)
