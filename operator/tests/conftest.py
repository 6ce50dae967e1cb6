"""Fixtures for operator tests against a real control plane: CRDs installed, the operator running."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeDriver, FakeKube

from sluice.operator.crd import CRD_FILE
from sluice.operator.reconciler import Reconciler
from sluice.testbed.common import free_ports, tail
from sluice.testbed.operator_env import operator_env, operator_python

RESYNC_SECONDS = 2
HA_NAMESPACE_PREFIX = "ha-"


@pytest.fixture(scope="session")
def crds_installed(kube_cluster):
    from sluice.testbed.external_crds import install_external_crds

    install_external_crds(kube_cluster.kubectl)
    kube_cluster.kubectl(
        "apply", "--server-side", "-f", str(CRD_FILE), "-f", str(CRD_FILE.parent / "kopf-peering.yaml")
    )
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/streamingapps.sluice.dev")
    return kube_cluster


class OperatorProcess:
    def __init__(
        self,
        kubeconfig: Path,
        log: Path,
        resync_seconds: float = RESYNC_SECONDS,
        extra_args: tuple[str, ...] = (),
        scope: tuple[str, ...] = (),
        as_deployed: bool = False,
    ) -> None:
        """as_deployed: in an environment with only the operator image's packages (operator_env)."""
        self.metrics_port, self.health_port = free_ports(2)
        self.log = log
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "SLUICE_RESYNC_SECONDS": str(resync_seconds)}
        python = Path(sys.executable)
        if as_deployed:
            python, env = operator_python(), operator_env(env)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    python,
                    "-m",
                    "sluice.operator",
                    "--log-format",
                    "plain",
                    *(scope or ("--all-namespaces",)),
                    "--metrics-port",
                    str(self.metrics_port),
                    "--liveness",
                    f"http://127.0.0.1:{self.health_port}/healthz",
                    *extra_args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )

    def wait_alive(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "operator exited:\n" + "\n".join(tail(self.log, 30))
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2)
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError("operator liveness endpoint never answered")

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            return response.read().decode()

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS for the operator process")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def operator_process(crds_installed, tmp_path_factory) -> Iterator[OperatorProcess]:
    # Every namespace but the HA tests', where peered replicas of their own run. One pattern: kopf watches the
    # union of its --namespace patterns, so a separate "*" would bring the excluded namespaces back.
    operator = OperatorProcess(
        crds_installed.kubeconfig,
        tmp_path_factory.mktemp("operator") / "operator.log",
        scope=("--namespace", f"!{HA_NAMESPACE_PREFIX}*"),
    )
    try:
        operator.wait_alive()
        yield operator
    finally:
        operator.stop()
        print("---- operator log (tail) ----\n" + "\n".join(tail(operator.log, 40)))


_namespaces = itertools.count()


@pytest.fixture
def namespace(crds_installed) -> Iterator[str]:
    name = f"t{os.getpid()}-{next(_namespaces)}"
    crds_installed.kubectl("create", "namespace", name)
    yield name
    crds_installed.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="session")
def strimzi_topic_operator(crds_installed, kafka_bootstrap):
    """Strimzi's topic operator for the cluster "events" (the session's Kafka), as a stand-in at its seam."""
    from sluice.testbed.strimzi_topics import topic_operator

    with topic_operator(crds_installed.kubectl, kafka_bootstrap, cluster="events") as stand_in:
        yield stand_in


@pytest.fixture
def world() -> tuple[Reconciler, FakeKube, FakeDriver]:
    """A reconciler with fakes at its I/O seam (fakes.py): the API server's objects, a driver's control API."""
    kube, driver = FakeKube(), FakeDriver()
    return Reconciler(kube=kube, driver_client=driver), kube, driver  # type: ignore[arg-type]
