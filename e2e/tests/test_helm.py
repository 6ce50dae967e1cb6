"""Helm from the test bed: the pinned version, rendering a chart, installing it into the real cluster."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from sluice.testbed.kube import ControlPlane
from sluice.testbed.versions import HELM

CONFIGMAP_TEMPLATE = """apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-{{ .Chart.Name }}
data:
  greeting: {{ .Values.greeting | quote }}
  replicas: {{ .Values.replicas | quote }}
"""


@pytest.fixture
def chart(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    (root / "templates").mkdir(parents=True)
    (root / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (root / "values.yaml").write_text("greeting: hello\nreplicas: 1\n")
    (root / "templates" / "configmap.yaml").write_text(CONFIGMAP_TEMPLATE)
    return root


def run_helm(helm: Path, tmp_path: Path, *args: str) -> str:
    # Keep helm's config/cache/data out of the user's home.
    env = {
        **os.environ,
        **{f"HELM_{kind}_HOME": str(tmp_path / f"helm-{kind.lower()}") for kind in ("CACHE", "CONFIG", "DATA")},
    }
    result = subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
    return result.stdout


def test_helm_reports_the_pinned_version(helm: Path, tmp_path: Path) -> None:
    assert run_helm(helm, tmp_path, "version", "--template", "{{ .Version }}") == f"v{HELM}"


def test_helm_template_renders_values_and_overrides(helm: Path, tmp_path: Path, chart: Path) -> None:
    rendered = yaml.safe_load(run_helm(helm, tmp_path, "template", "rel", str(chart), "--set", "replicas=3"))

    assert rendered["metadata"]["name"] == "rel-demo"
    assert rendered["data"] == {"greeting": "hello", "replicas": "3"}


def test_helm_installs_and_uninstalls_a_chart_in_the_cluster(
    helm: Path, tmp_path: Path, chart: Path, kube_cluster: ControlPlane
) -> None:
    namespace = f"helm-{uuid.uuid4().hex[:8]}"
    target = ["--kubeconfig", str(kube_cluster.kubeconfig), "--namespace", namespace]

    run_helm(
        helm,
        tmp_path,
        "install",
        "rel",
        str(chart),
        *target,
        "--create-namespace",
        "--set",
        "greeting=hi",
        "--wait",
        "--timeout",
        "2m",
    )
    data = kube_cluster.kubectl(
        "get", "configmap", "rel-demo", "-n", namespace, "-o", "jsonpath={.data.greeting}"
    ).stdout
    run_helm(helm, tmp_path, "uninstall", "rel", *target, "--wait")

    assert data == "hi"
    assert (
        kube_cluster.kubectl("get", "configmap", "rel-demo", "-n", namespace, "--ignore-not-found", "-o", "name").stdout
        == ""
    )
