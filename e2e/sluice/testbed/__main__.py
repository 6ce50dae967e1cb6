"""`python -m sluice.testbed …`: the make targets' entry point for the local cluster, images and prefetch (the
developer Kafka broker's is the product's: python -m sluice.pipelines.local kafka)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from sluice.pipelines.local.provision import run_command

from .common import REPO_ROOT


def cluster_command(args: argparse.Namespace) -> int:
    from .cluster import cluster_cli

    code = cluster_cli([args.action, "--state-dir", args.state_dir])
    if code == 0 and args.action == "up":
        install_crds(Path(args.state_dir))
        bin_dir = link_tools(Path(args.state_dir))
        print(f"kubectl and helm: export PATH={bin_dir}:$PATH KUBECONFIG={Path(args.state_dir) / 'kubeconfig'}")
    return code


def link_tools(state_dir: Path) -> Path:
    """kubectl and helm of the pinned versions (built once, cached) in <state dir>/bin, for the documented
    commands that follow `make local-cluster`."""
    from .helm import helm_binary
    from .kube import kubernetes_binaries

    bin_dir = state_dir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, target in {**kubernetes_binaries("kubectl"), "helm": helm_binary()}.items():
        link = bin_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return bin_dir


def images_command(args: argparse.Namespace) -> int:
    """Build the local images; load them into the local cluster's node when one is up."""
    from .cluster import LOCAL_STATE_DIR, cluster_status
    from .local_images import build_local_images

    archives = build_local_images()
    cluster = cluster_status(LOCAL_STATE_DIR)
    for name, archive in archives.items():
        if cluster is not None:
            cluster.node.import_image(archive)
        print(f"{name}: {archive}" + (" (loaded into the local cluster)" if cluster is not None else ""))
    return 0


def install_crds(state_dir: Path) -> None:
    """The CRDs a user of the local cluster needs: StreamingApp, spark-operator's and Strimzi's."""
    from sluice.operator.crd import CRD_FILE

    from .external_crds import install_external_crds
    from .kube import ControlPlane

    plane = ControlPlane.attach(state_dir)
    assert plane is not None
    install_external_crds(plane.kubectl)
    plane.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        str(CRD_FILE),
        "-f",
        str(CRD_FILE.parent / "kopf-peering.yaml"),
    )
    print("installed CRDs: streamingapps.sluice.dev, sparkoperator.k8s.io, kafka.strimzi.io")


def prefetch_command(args: argparse.Namespace) -> int:
    """Fetch and build every real component the tests use, so test time is test time."""
    from sluice.pipelines.local.kafka import java_binary, kafka_jars
    from sluice.pipelines.local.spark import spark_image_jars

    from .external_crds import prefetch_external_crds
    from .images import image_archive
    from .kube import prefetch_kubernetes
    from .kube_score import kube_score_binary
    from .node import prefetch_node
    from .prometheus import prometheus_image
    from .spark_operator import spark_operator_binary

    java_binary()
    steps: list[tuple[str, Callable[[], object]]] = [
        ("Kafka jars", kafka_jars),
        ("Spark Kafka connector, hadoop-aws and the AWS SDK", spark_image_jars),
    ]
    if not args.skip_kubernetes:
        steps.append(("Kubernetes, etcd and helm binaries", prefetch_kubernetes))
        steps.append(("node: kubelet, kube-scheduler, kube-proxy, CoreDNS, images, Debian packages", prefetch_node))
        steps.append(("spark-operator, Strimzi and Prometheus Operator CRDs", prefetch_external_crds))
        steps.append(("spark-operator binary", spark_operator_binary))
        steps.append(("kube-score (chart linter)", kube_score_binary))
        steps.append(("Prometheus (its image)", lambda: image_archive(prometheus_image())))
    for label, step in steps:
        print(f"prefetch: {label} …", flush=True)
        step()
    print("prefetch: done")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.testbed")
    sub = parser.add_subparsers(dest="command", required=True)

    cluster_parser = sub.add_parser("cluster", help="local single-node Kubernetes cluster (needs root)")
    cluster_parser.add_argument("action", choices=["up", "down", "status"])
    cluster_parser.add_argument("--state-dir", default=str(REPO_ROOT / ".local-cluster"))
    cluster_parser.set_defaults(func=cluster_command)

    images_parser = sub.add_parser("images", help="build the images with buildah, load them into the local cluster")
    images_parser.set_defaults(func=images_command)

    prefetch_parser = sub.add_parser("prefetch", help="download/build every real component")
    prefetch_parser.add_argument("--skip-kubernetes", action="store_true")
    prefetch_parser.set_defaults(func=prefetch_command)

    return run_command(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
