"""`make local-cluster` as a user runs it: the control plane plus the CRDs an app needs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sluice.testbed.common import REPO_ROOT
from sluice.testbed.kube import ControlPlane

pytestmark = pytest.mark.kube


def _testbed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.testbed", *args], capture_output=True, text=True,
                          timeout=600)


def test_local_cluster_up_installs_the_crds_and_accepts_the_examples(tmp_path):
    state = tmp_path / "local-cluster"
    up = _testbed("cluster", "up", "--state-dir", str(state))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "export KUBECONFIG=" in up.stdout and "installed CRDs" in up.stdout
        plane = ControlPlane.attach(state)
        assert plane is not None
        listed = json.loads(plane.kubectl("get", "crd", "-o", "json").stdout)["items"]
        crds = {item["metadata"]["name"] for item in listed}
        assert {"streamingapps.sluice.dev", "sparkapplications.sparkoperator.k8s.io", "kafkatopics.kafka.strimzi.io",
                "clusterkopfpeerings.kopf.dev"} <= crds
        applied = plane.kubectl("apply", "--dry-run=server", "-f", str(REPO_ROOT / "pipelines" / "examples"))
        assert applied.stdout.count("streamingapp.sluice.dev/") == 4

        again = _testbed("cluster", "up", "--state-dir", str(state))
        assert again.returncode == 0, again.stderr
    finally:
        down = _testbed("cluster", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert not state.exists()
