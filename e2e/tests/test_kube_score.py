"""The chart passes kube-score, built from its Go module: every CRITICAL or WARNING finding in a rendering
is an exception listed here with its reason, and in the chart README."""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.testbed.common import ProvisionError
from sluice.testbed.e2e_suite import CHART_DIR, Helm
from sluice.testbed.kube_score import kube_score_binary
from sluice.testbed.versions import KUBERNETES

# Renderings of the chart, with the API versions the cluster would serve for them.
VALUE_SETS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "defaults": ({}, ()),
    "ha": ({"replicaCount": 3}, ()),
    "monitoring": (
        {"monitoring": {"enabled": True}, "grafanaDashboard": {"enabled": True}},
        ("--api-versions", "monitoring.coreos.com/v1"),
    ),
    "webhook-cert-manager": ({"webhook": {"certManager": {"enabled": True}}}, ("--api-versions", "cert-manager.io/v1")),
    "namespaces-quick-start": (
        {"watchNamespaces": ["apps"], "kafkaCluster": {"enabled": True}},
        ("--api-versions", "kafka.strimzi.io/v1"),
    ),
    "no-webhook": ({"webhook": {"enabled": False}}, ()),
}
GRADES = {1: "CRITICAL", 5: "WARNING"}  # kube-score's scorecard grades; 7 and 10 are fine


@dataclass(frozen=True)
class Finding:
    check: str  # kube-score's check id
    grade: str
    target: str  # Kind/group/version/namespace/name
    comment: str


@dataclass(frozen=True)
class Exception_:
    check: str
    value_sets: frozenset[str]
    reason: str


SINGLE_REPLICA_WITH_WEBHOOK = frozenset({"defaults", "monitoring", "webhook-cert-manager", "namespaces-quick-start"})
EXCEPTIONS = [
    Exception_(
        "deployment-strategy",
        SINGLE_REPLICA_WITH_WEBHOOK,
        "one replica runs standalone (no peering): a rolling update would have two operators reconciling "
        "the same apps, so the Deployment is Recreate; replicaCount > 1 runs with peering and rolls",
    ),
    Exception_(
        "deployment-replicas",
        SINGLE_REPLICA_WITH_WEBHOOK,
        "one replica is the default (the operator is one active process either way); while it restarts "
        "StreamingApps wait for the webhook, nothing else does; replicaCount: 2 keeps it served",
    ),
]


@pytest.fixture(scope="module")
def kube_score() -> Path:
    try:
        return kube_score_binary()
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def chart_helm(helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm, Path(os.devnull), tmp_path_factory.mktemp("helm"))


def score(kube_score: Path, manifests: list[dict[str, Any]], scratch: Path) -> list[Finding]:
    """Every CRITICAL or WARNING finding kube-score has on the manifests."""
    rendered = scratch / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(manifests))
    major, minor = KUBERNETES.split(".")[:2]
    result = subprocess.run(
        [str(kube_score), "score", f"--kubernetes-version=v{major}.{minor}", "--output-format=json", str(rendered)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode in (0, 1), result.stderr  # 1: there are CRITICAL findings
    return [
        Finding(
            check["check"]["id"],
            GRADES[check["grade"]],
            scored["object_name"],
            "; ".join(f"{c['path']} {c['summary']}".strip() for c in check["comments"] or []),
        )
        for scored in json.loads(result.stdout)
        for check in scored["checks"]
        if not check["skipped"] and check["grade"] in GRADES
    ]


@pytest.fixture(scope="module")
def findings(kube_score: Path, chart_helm: Helm) -> dict[str, list[Finding]]:
    return {
        name: score(kube_score, chart_helm.template("sluice", "sys", values, *args), chart_helm.home)
        for name, (values, args) in VALUE_SETS.items()
    }


def excused(value_set: str, finding: Finding) -> bool:
    return any(e.check == finding.check and value_set in e.value_sets for e in EXCEPTIONS)


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_finding_is_a_documented_exception(findings: dict[str, list[Finding]], value_set: str) -> None:
    assert [f for f in findings[value_set] if not excused(value_set, f)] == []


def test_every_exception_is_needed_and_in_the_chart_readme(findings: dict[str, list[Finding]]) -> None:
    readme = (CHART_DIR / "README.md").read_text()
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", readme, re.MULTILINE))

    for exception in EXCEPTIONS:
        for value_set in exception.value_sets:
            assert exception.check in {f.check for f in findings[value_set]}, f"stale: {exception} in {value_set}"
    assert documented == {e.check for e in EXCEPTIONS}


def test_kube_score_finds_what_the_chart_avoids(kube_score: Path, chart_helm: Helm) -> None:
    """The checks bite: the defaults that keep them quiet, turned off."""
    values = {
        "networkPolicy": {"enabled": False},
        "image": {"pullPolicy": "IfNotPresent"},
        "resources": {"limits": {"cpu": None, "ephemeral-storage": None}, "requests": {"ephemeral-storage": None}},
    }
    found = {
        (f.check, f.grade) for f in score(kube_score, chart_helm.template("sluice", "sys", values), chart_helm.home)
    }
    without_budget = [
        m for m in chart_helm.template("sluice", "sys", {"replicaCount": 2}) if m["kind"] != "PodDisruptionBudget"
    ]

    assert {
        ("pod-networkpolicy", "CRITICAL"),
        ("container-image-pull-policy", "CRITICAL"),
        ("container-resources", "CRITICAL"),
        ("container-ephemeral-storage-request-and-limit", "CRITICAL"),
    } <= found
    assert ("deployment-has-poddisruptionbudget", "CRITICAL") in {
        (f.check, f.grade) for f in score(kube_score, without_budget, chart_helm.home)
    }
