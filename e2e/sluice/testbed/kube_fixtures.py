"""pytest plugin (-p sluice.testbed.kube_fixtures): a real Kubernetes control plane and helm for tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .common import ProvisionError, pid_alive
from .helm import helm_binary
from .kube import ControlPlane

KUBE_FIXTURES = {"kube_cluster", "helm"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kube: needs the real Kubernetes control plane")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if KUBE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.kube)


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager on free loopback ports, stopped after the session."""
    plane = ControlPlane(tmp_path_factory.mktemp("kube"))
    try:
        plane.start()
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
    pids = plane.pids()
    try:
        yield plane
    finally:
        plane.stop()
    leftover = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    assert not leftover, f"control plane processes survived stop(): {leftover}"


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return helm_binary()
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
