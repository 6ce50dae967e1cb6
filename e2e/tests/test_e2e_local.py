"""`make e2e-local`: the end-to-end suite (sluice.testbed.e2e_suite, shared with the kind run) on real pods
here, without Docker.

A throwaway single-node cluster (what `make local-cluster` runs) gets the images built with buildah
(sluice.testbed.local_images: the sluice operator and Spark images from images/*/Dockerfile, and the
spark-operator built from its Go module) imported into its containerd. spark-operator is installed with its
own chart, sluice with charts/sluice. Kafka is a broker of the test bed listening on the node address (no
Kafka image or Strimzi operator image can be pulled here): pods get only SASL_SSL there, and apps log in with
SCRAM over TLS, their password and CA from Secrets (spec.kafka.tls, spec.kafka.authentication), with topics
managed through the Admin API; this process reads and writes through its loopback listener. The apps'
namespace enforces Pod Security "restricted". Claims bind to node-local
volumes of the cluster's default StorageClass (local-path, as on kind). The chart's monitors and alerts
configure a Prometheus built from its Go module (sluice.testbed.prometheus), which scrapes the operator and
the drivers through the enforced NetworkPolicies. Everything is torn down afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from sluice.testbed.common import REPO_ROOT, ProvisionError, pid_alive
from sluice.testbed.e2e_suite import E2ESuite, Helm, Images, Target
from sluice.testbed.helm import helm_binary
from sluice.testbed.images import image_archive
from sluice.testbed.kube import ControlPlane, kubectl_runner, kubernetes_binaries
from sluice.testbed.local_images import LocalImagesRun, build_local_images, secured_kafka
from sluice.testbed.node import NODE_ADDRESS, Node
from sluice.testbed.previous_release import release_to_upgrade_from
from sluice.testbed.prometheus import IMAGE as PROMETHEUS_IMAGE
from sluice.testbed.prometheus import prometheus_image

pytestmark = [pytest.mark.kube, pytest.mark.e2e_local]

REPORTS = REPO_ROOT / ".sluice" / "e2e"


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalImagesRun]:
    work = tmp_path_factory.mktemp("e2e-local")
    try:
        archives = build_local_images()  # before the cluster: nothing to tear down when a build fails
        archives[PROMETHEUS_IMAGE] = image_archive(prometheus_image())
        previous = release_to_upgrade_from(archives)  # make e2e-upgrade
        helm, kubectl = helm_binary(), kubernetes_binaries("kubectl")["kubectl"]
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
    plane = ControlPlane(work / "plane", advertise_address=NODE_ADDRESS)
    node = Node(plane, work / "node", archives=archives.values())
    try:
        plane.start()
        node.start()
        images = Images.release()
        node.tag_image(images.spark, images.spark_next)
        target = Target(
            plane.kubeconfig,
            kubectl_runner(plane.kubeconfig, binary=kubectl),
            Helm(helm, plane.kubeconfig, work / "helm"),
        )
    except BaseException as error:
        stop(node, plane)
        if isinstance(error, ProvisionError):
            pytest.fail(str(error), pytrace=False)
        raise
    pids = {**plane.pids(), **node.pids()}
    try:
        # Kafka on the node address, which exists while the node runs.
        with secured_kafka(NODE_ADDRESS, work / "kafka-secured") as secured:
            yield LocalImagesRun(target, node.object_store, secured, previous=previous)
    finally:
        stop(node, plane)
    assert not {name: pid for name, pid in pids.items() if pid_alive(pid)}, "cluster processes survived the run"


def stop(node: Node, plane: ControlPlane) -> None:
    """Each part is stopped even when stopping another one fails."""
    with contextlib.ExitStack() as stack:
        stack.callback(plane.stop)
        stack.callback(node.stop)


@pytest.fixture(scope="module")
def suite(local_run: LocalImagesRun) -> E2ESuite:
    return local_run.suite()


@pytest.mark.parametrize("step", E2ESuite.step_params())
def test_step(suite: E2ESuite, step: str) -> None:
    if suite.failed:
        pytest.skip(f"step {suite.failed} failed")
    try:
        suite.run(step)
    finally:
        suite.write_report(step, REPORTS)  # the figures, for the record (also of a failed run)
