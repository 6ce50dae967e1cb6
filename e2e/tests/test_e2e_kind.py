"""`make e2e`: the end-to-end suite (sluice.testbed.e2e_suite) on a throwaway kind cluster.

Needs a running Docker engine. kind is built from source through the Go module proxy (pinned); the
images are built with `make images`' code and loaded into the cluster; the cluster is deleted
afterwards, whatever happened.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice.testbed.common import REPO_ROOT, ProvisionError, cache_dir, run
from sluice.testbed.e2e_suite import E2ESuite, Helm, Images, StrimziKafka, Target, image_builder
from sluice.testbed.helm import helm_binary
from sluice.testbed.kube import cached_binaries, go_binary, go_env, kubectl_runner, kubernetes_binaries

KIND = "v0.30.0"  # default node image: Kubernetes v1.34
KIND_CONFIG = REPO_ROOT / "e2e" / "kind" / "cluster.yaml"
NO_DOCKER = (
    "kind e2e needs a running Docker engine (docker info failed); the same suite runs on the local "
    "cluster with make e2e-local"
)


def docker_running() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def kind_binary() -> Path:
    def build(out: Path, names: list[str]) -> None:
        run(
            [go_binary(), "install", f"sigs.k8s.io/kind@{KIND}"],
            what=f"building kind {KIND} with Go",
            hint="needs the Go module proxy (GOPROXY)",
            log=out.parent / "build.log",
            cwd=out,
            env=go_env(GOBIN=str(out)),
        )

    return cached_binaries(cache_dir("kind", KIND), ["kind"], build)["kind"]


@pytest.fixture(scope="module")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    if not docker_running():
        pytest.skip(NO_DOCKER)
    try:
        kind, helm, kubectl = kind_binary(), helm_binary(), kubernetes_binaries("kubectl")["kubectl"]
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
    work = tmp_path_factory.mktemp("kind")
    name, kubeconfig = f"sluice-e2e-{os.getpid()}", work / "kubeconfig"
    images = Images.release()

    def kind_run(*args: str) -> None:
        subprocess.run([str(kind), *args, "--name", name], check=True, timeout=900)

    try:
        kind_run("create", "cluster", f"--kubeconfig={kubeconfig}", f"--config={KIND_CONFIG}", "--wait=180s")
        assert image_builder().main([]) == 0, "building the images failed (output above)"
        subprocess.run(["docker", "tag", images.spark, images.spark_next], check=True, timeout=60)
        for image in (images.operator, images.spark, images.spark_next):
            kind_run("load", "docker-image", image)
        yield Target(kubeconfig, kubectl_runner(kubeconfig, binary=kubectl), Helm(helm, kubeconfig, work / "helm"))
    finally:
        subprocess.run([str(kind), "delete", "cluster", "--name", name], timeout=300)


@pytest.fixture(scope="module")
def suite(kind_cluster: Target) -> E2ESuite:
    namespace = "sluice-system"
    return E2ESuite(kind_cluster, Images.release(), StrimziKafka(kind_cluster, namespace), release_namespace=namespace)


@pytest.mark.parametrize("step", E2ESuite.step_params())
def test_step(suite: E2ESuite, step: str) -> None:
    if suite.failed:
        pytest.skip(f"step {suite.failed} failed")
    suite.run(step)
