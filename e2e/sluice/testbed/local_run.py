"""The local cluster the e2e suite and the long runs run on (`make e2e-local`, `make soak`, `make overload`): a
throwaway control plane and node on this machine with the images built here (buildah), the node's object store,
and a Kafka broker that takes only SASL_SSL from pods. Everything is torn down on exit."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .common import ProvisionError, pid_alive
from .e2e_suite import E2ESuite, Helm, Images, Target
from .helm import helm_binary
from .images import image_archive
from .kube import ControlPlane, kubectl_runner, kubernetes_binaries
from .local_images import LocalImagesRun, build_local_images, secured_kafka
from .node import NODE_ADDRESS, Node
from .previous_release import release_to_upgrade_from
from .prometheus import IMAGE as PROMETHEUS_IMAGE
from .prometheus import prometheus_image


@contextlib.contextmanager
def local_cluster_run(work: Path, upgrade: bool = True) -> Iterator[LocalImagesRun]:
    """The cluster in `work`; `upgrade`: with the earlier release SLUICE_E2E_UPGRADE_FROM names (make e2e-upgrade).
    A ProvisionError when something cannot be built or fetched (before the cluster: nothing to tear down)."""
    archives = build_local_images()
    archives[PROMETHEUS_IMAGE] = image_archive(prometheus_image())
    previous = release_to_upgrade_from(archives) if upgrade else None
    helm, kubectl = helm_binary(), kubernetes_binaries("kubectl")["kubectl"]
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
    except BaseException:
        stop(node, plane)
        raise
    pids = {**plane.pids(), **node.pids()}
    try:
        # Kafka on the node address, which exists while the node runs.
        with secured_kafka(NODE_ADDRESS, work / "kafka-secured") as secured:
            yield LocalImagesRun(target, node.object_store, secured, previous=previous)
    finally:
        stop(node, plane)
    survived = {name: pid for name, pid in pids.items() if pid_alive(pid)}
    if survived:
        raise ProvisionError(f"cluster processes survived the run: {survived}")


LONG_RUN_SETUP = ("install", "kafka_ready", "object_store", "deploy_app")


@contextlib.contextmanager
def deployed_word_count(
    work: Path, app_changes: Callable[[dict[str, Any]], dict[str, Any]] | None = None
) -> Iterator[E2ESuite]:
    """The local cluster in `work` with the e2e's first steps run (LONG_RUN_SETUP: sluice installed, Kafka and
    the object store ready, the word count deployed, changed by `app_changes`), for the long runs (soak,
    overload)."""
    with local_cluster_run(work, upgrade=False) as run:
        suite = run.suite()
        suite.app_changes = app_changes
        for step in LONG_RUN_SETUP:
            suite.run(step)
        yield suite


def stop(node: Node, plane: ControlPlane) -> None:
    """Each part is stopped even when stopping another one fails."""
    with contextlib.ExitStack() as stack:
        stack.callback(plane.stop)
        stack.callback(node.stop)
