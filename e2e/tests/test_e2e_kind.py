"""`make e2e`: the end-to-end suite (sluice.testbed.e2e_suite) on a throwaway 4-node kind cluster on podman.

The cluster is sluice.testbed.kind's (a control plane and three workers from the node image built here, pod
networking across nodes, NetworkPolicies enforced by kube-router, local-path volumes bound to one node, Pod
Security). The images are those of `make e2e-local` (buildah: the sluice operator and Spark images, the
spark-operator and Prometheus from their Go modules), loaded into every node with `kind load`. Kafka (SASL_SSL
only, as in `make e2e-local`) and the S3-compatible object store are host processes of the test bed at the
podman network's gateway, which the pods reach (their traffic leaving the pod network is masqueraded behind
their node, as kindnetd does). Everything is deleted afterwards, whatever happened. Needs root (rootful
podman); run by `make e2e` only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import pytest

from sluice.testbed.common import REPO_ROOT, ProvisionError, free_ports
from sluice.testbed.e2e_suite import E2ESuite, Helm, Images, Target
from sluice.testbed.helm import helm_binary
from sluice.testbed.images import image_archive
from sluice.testbed.kind import KindCluster
from sluice.testbed.kube import kubectl_runner, kubernetes_binaries
from sluice.testbed.local_images import LocalImagesRun, build_local_images, secured_kafka
from sluice.testbed.object_store import serving
from sluice.testbed.previous_release import release_to_upgrade_from
from sluice.testbed.prometheus import IMAGE as PROMETHEUS_IMAGE
from sluice.testbed.prometheus import prometheus_image

pytestmark = [pytest.mark.kube, pytest.mark.kind]

WORKERS = 3  # the node-loss steps lose two: one with executors only, then the driver's
REPORTS = REPO_ROOT / ".sluice" / "e2e-kind"


@pytest.fixture(scope="module")
def kind_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalImagesRun]:
    work = tmp_path_factory.mktemp("e2e-kind")
    try:
        archives = build_local_images()  # before the cluster: nothing to delete when a build fails
        archives[PROMETHEUS_IMAGE] = image_archive(prometheus_image())
        previous = release_to_upgrade_from(archives)  # make e2e-upgrade
        helm, kubectl = helm_binary(), kubernetes_binaries("kubectl")["kubectl"]
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
    cluster = KindCluster(f"sluice-e2e-{os.getpid()}", work / "kind")
    with contextlib.ExitStack() as stack:
        stack.callback(cluster.delete)
        try:
            cluster.create(workers=WORKERS)
            for archive in archives.values():
                cluster.load(archive)
            images = Images.release()
            cluster.tag_image(images.spark, images.spark_next)
            host = cluster.gateway()
            (store_port,) = free_ports(1)
            store = stack.enter_context(serving(host, store_port, work / "objects"))
            secured = stack.enter_context(secured_kafka(host, work / "kafka-secured"))
        except ProvisionError as error:
            pytest.fail(str(error), pytrace=False)
        target = Target(
            cluster.kubeconfig,
            kubectl_runner(cluster.kubeconfig, binary=kubectl),
            Helm(helm, cluster.kubeconfig, work / "helm"),
        )
        yield LocalImagesRun(target, store, secured, lose_node=cluster.lose_node, previous=previous)


@pytest.fixture(scope="module")
def suite(kind_run: LocalImagesRun) -> E2ESuite:
    return kind_run.suite()


@pytest.mark.parametrize("step", E2ESuite.step_params())
def test_step(suite: E2ESuite, step: str) -> None:
    if suite.failed:
        pytest.skip(f"step {suite.failed} failed")
    try:
        suite.run(step)
    finally:
        suite.write_report(step, REPORTS)
