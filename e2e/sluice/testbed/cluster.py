"""`make local-cluster`: a single-node Kubernetes cluster for development, left running between commands.

kube.ControlPlane (advertising NODE_ADDRESS) plus a node.Node, all state in one directory (default
.local-cluster: PKI, etcd, logs, the admin kubeconfig; the node's under node/). `up` is idempotent: a
healthy cluster is reused, anything less is torn down and started afresh. `down` stops the node, then
the control plane, and deletes the directory.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .common import REPO_ROOT, ProvisionError, cache_dir, locked
from .kube import COMPONENTS, ControlPlane, Ports
from .node import NODE_ADDRESS, NODE_COMPONENTS, NODE_NAME, Node, machine_owner, mounts_under
from .versions import KUBERNETES

LOCAL_STATE_DIR = REPO_ROOT / ".local-cluster"


@dataclass(frozen=True)
class LocalCluster:
    plane: ControlPlane
    node: Node

    @property
    def kubeconfig(self) -> Path:
        return self.plane.kubeconfig

    def pids(self) -> dict[str, int]:
        return {**self.plane.pids(), **self.node.pids()}

    def healthy(self) -> bool:
        return self.plane.healthy() and self.node.healthy()


def _node_dir(state_dir: Path) -> Path:
    return state_dir.resolve() / "node"


def _cluster_lock(state_dir: Path) -> Path:
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:16]
    return cache_dir("locks") / f"cluster-{digest}.lock"


def attach(state_dir: Path = LOCAL_STATE_DIR) -> LocalCluster | None:
    """The cluster an earlier `up` recorded in state_dir (healthy or not), or None when either half is missing."""
    plane = ControlPlane.attach(state_dir)
    node = Node.attach(plane, _node_dir(state_dir)) if plane is not None else None
    return LocalCluster(plane, node) if plane is not None and node is not None else None


def cluster_up(state_dir: Path = LOCAL_STATE_DIR) -> LocalCluster:
    """Start a detached single-node cluster in state_dir, or return the healthy one already running there."""
    with locked(_cluster_lock(state_dir)):
        running = attach(state_dir)
        if running is not None and running.healthy():
            return running
        _down(state_dir)
        plane = ControlPlane(state_dir, Ports.preferred(), advertise_address=NODE_ADDRESS)
        # Left running on purpose: the processes are in their own sessions and outlive this one.
        plane.start()
        node = Node(plane, _node_dir(state_dir))
        try:
            node.start()  # stops the node again when it fails
        except BaseException:
            plane.stop()  # the logs stay for the error message; the next up or down clears them
            raise
        return LocalCluster(plane, node)


def cluster_down(state_dir: Path = LOCAL_STATE_DIR) -> bool:
    """Stop the node and the control plane recorded in state_dir and delete it; False when there was none."""
    with locked(_cluster_lock(state_dir)):
        return _down(state_dir)


def _down(state_dir: Path) -> bool:
    """Also tidies what a crashed or half-finished `up` left: a node without a plane and the reverse."""
    if not state_dir.exists():
        return False
    # Stopping goes by pidfiles, so a plane without cluster.json is stopped too.
    plane = ControlPlane.attach(state_dir) or ControlPlane(state_dir)
    node_dir = _node_dir(state_dir)
    try:
        if node_dir.exists() or machine_owner() == node_dir:
            # The node first, while the apiserver can still tell its kubelet to tear the pods down.
            (Node.attach(plane, node_dir) or Node(plane, node_dir)).stop()
    finally:
        plane.stop()
    leftover = mounts_under(state_dir)
    if leftover:  # never rmtree through a mount
        raise ProvisionError(
            f"{leftover[0]} (and {len(leftover) - 1} more) is still mounted: left {state_dir} in place"
        )
    shutil.rmtree(state_dir, ignore_errors=True)
    return True


def cluster_status(state_dir: Path = LOCAL_STATE_DIR) -> LocalCluster | None:
    cluster = attach(state_dir)
    return cluster if cluster is not None and cluster.healthy() else None


def _describe(cluster: LocalCluster) -> str:
    plane, node = cluster.plane, cluster.node
    return (
        f"Kubernetes v{KUBERNETES} single-node cluster: control plane at {plane.server}, node {NODE_NAME} "
        f"({node.address}) Ready\n"
        f"logs: {plane.state_dir / 'logs'} and {node.state_dir / 'logs'}\n"
        f"load an image (OCI or docker archive): ctr --address {node.containerd_socket} -n k8s.io images "
        f"import IMAGE.tar\n"
        f"S3 object store: {node.object_store.endpoint}, bucket {node.object_store.bucket} (path-style); its "
        f"key pair: {node.state_dir / 'object-store.json'}\n"
        f"kubeconfig: {plane.kubeconfig}\n"
        f"  export KUBECONFIG={plane.kubeconfig}"
    )


def _describe_unhealthy(state_dir: Path) -> str:
    plane = ControlPlane.attach(state_dir)
    if plane is None:
        return f"no local cluster in {state_dir} (start one with: make local-cluster)"
    node = Node.attach(plane, _node_dir(state_dir))
    plane_state = "healthy" if plane.healthy() else _missing(COMPONENTS, plane.pids())
    if node is None:
        node_state = "not started"
    elif len(node.pids()) < len(NODE_COMPONENTS):
        node_state = _missing(NODE_COMPONENTS, node.pids())
    else:
        node_state = "Ready" if node.ready() else "not Ready"
    return (
        f"local cluster in {state_dir} is not healthy (make local-cluster restarts it):\n"
        f"  control plane: {plane_state}\n  node {NODE_NAME}: {node_state}"
    )


def _missing(components: tuple[str, ...], pids: dict[str, int]) -> str:
    return "not running: " + ", ".join(name for name in components if name not in pids)


def cluster_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.testbed cluster", description="Local single-node Kubernetes cluster for development."
    )
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=LOCAL_STATE_DIR,
        help=f"where PKI, data, logs and the kubeconfig live (default: {LOCAL_STATE_DIR})",
    )
    args = parser.parse_args(argv)
    try:
        if args.action == "up":
            print(_describe(cluster_up(args.state_dir)))
            print("stop it with: make local-cluster-down")
        elif args.action == "down":
            print("local cluster stopped" if cluster_down(args.state_dir) else "no local cluster was running")
        else:
            cluster = cluster_status(args.state_dir)
            if cluster is None:
                print(_describe_unhealthy(args.state_dir))
                return 1
            print(_describe(cluster))
    except ProvisionError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
