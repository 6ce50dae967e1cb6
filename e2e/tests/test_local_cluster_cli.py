"""`make local-cluster` as a user runs it: a single-node cluster with the CRDs an app needs, idempotent `up`,
and a `down` that leaves nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sluice.testbed.cluster import attach, cluster_cli, cluster_status
from sluice.testbed.common import REPO_ROOT, pid_alive, wait_until
from sluice.testbed.images import PROBE_IMAGE
from sluice.testbed.kube import COMPONENTS, ControlPlane
from sluice.testbed.node import BRIDGE, NODE_ADDRESS, NODE_COMPONENTS, mounts_under

pytestmark = pytest.mark.kube


def _testbed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sluice.testbed", *args], capture_output=True, text=True, timeout=600)


def assert_nothing_left(state: Path, pids: dict[str, int]) -> None:
    assert not {name: pid for name, pid in pids.items() if pid_alive(pid)}, "processes survived down"
    assert not state.exists()
    assert not mounts_under(state)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f" {BRIDGE}:" not in links
    addresses = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True).stdout
    assert NODE_ADDRESS not in addresses


def test_local_cluster_up_installs_the_crds_and_runs_pods(tmp_path: Path) -> None:
    state = tmp_path / "local-cluster"
    pids: dict[str, int] = {}
    up = _testbed("cluster", "up", "--state-dir", str(state))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "export KUBECONFIG=" in up.stdout and "installed CRDs" in up.stdout
        plane = ControlPlane.attach(state)
        assert plane is not None
        pids = {**plane.pids(), **attach(state).node.pids()}
        listed = json.loads(plane.kubectl("get", "crd", "-o", "json").stdout)["items"]
        crds = {item["metadata"]["name"] for item in listed}
        assert {
            "streamingapps.sluice.dev",
            "sparkapplications.sparkoperator.k8s.io",
            "kafkatopics.kafka.strimzi.io",
            "clusterkopfpeerings.kopf.dev",
        } <= crds
        applied = plane.kubectl("apply", "--dry-run=server", "-f", str(REPO_ROOT / "pipelines" / "examples"))
        assert applied.stdout.count("streamingapp.sluice.dev/") == 4

        plane.kubectl(
            "run",
            "hello",
            f"--image={PROBE_IMAGE}",
            "--image-pull-policy=Never",
            "--restart=Never",
            "--",
            "echo",
            "hello",
            "from",
            "the",
            "local",
            "cluster",
        )
        plane.kubectl("wait", "pod/hello", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=120s", timeout=150)
        assert plane.kubectl("logs", "hello").stdout.strip() == "hello from the local cluster"
    finally:
        down = _testbed("cluster", "down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr
    assert_nothing_left(state, pids)


def test_local_cluster_up_is_idempotent_repairs_a_half_dead_cluster_and_down_cleans_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "local-cluster"
    seen: dict[str, int] = {}
    try:
        assert cluster_cli(["up", "--state-dir", str(state)]) == 0
        first = capsys.readouterr().out
        running = cluster_status(state)
        assert running is not None
        pids = running.pids()
        seen.update(pids)
        assert set(pids) == {*COMPONENTS, *NODE_COMPONENTS}

        assert cluster_cli(["up", "--state-dir", str(state)]) == 0
        assert capsys.readouterr().out == first
        assert running.pids() == pids, "a second `up` must reuse the running cluster"
        assert f"export KUBECONFIG={state.resolve() / 'kubeconfig'}" in first

        os.kill(pids["kube-proxy"], signal.SIGKILL)
        wait_until(lambda: not pid_alive(pids["kube-proxy"]), timeout=10, what="kube-proxy to die")
        assert cluster_cli(["status", "--state-dir", str(state)]) == 1
        assert "not running: kube-proxy" in capsys.readouterr().out

        assert cluster_cli(["up", "--state-dir", str(state)]) == 0
        restarted = cluster_status(state)
        assert restarted is not None
        seen.update({f"{name} (restarted)": pid for name, pid in restarted.pids().items()})
        assert set(restarted.pids()) == set(pids)
        assert not [pid for name, pid in pids.items() if pid_alive(pid)], "a restart starts from scratch"

        # Only the node left: down still stops it and cleans the machine up.
        restarted.plane.stop()
        (state / "cluster.json").unlink()
    finally:
        assert cluster_cli(["down", "--state-dir", str(state)]) == 0

    assert_nothing_left(state, seen)
    assert cluster_cli(["status", "--state-dir", str(state)]) == 1
