"""A 3-node kind cluster on podman (sluice.testbed.kind): the production shape the e2e can run on.

One cluster for the module: a control plane and two workers from the node image built here. Pods on
different workers reach each other through Services; NetworkPolicies are enforced across nodes; the
default StorageClass binds a claim on its pod's node; Pod Security is enforced; a lost worker's pods
move to the other one. Run by `make test-kind` only (needs root).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.testbed.common import ProvisionError, wait_for
from sluice.testbed.e2e_suite import pvc, restricted_namespace
from sluice.testbed.images import PROBE_IMAGE
from sluice.testbed.kind import CLUSTER_LABEL, PODMAN_NETWORK, KindCluster, podman, running_clusters
from sluice.testbed.network_policy import ingress_only_from
from sluice.testbed.storage import HELPER_IMAGE, STORAGE_CLASS

pytestmark = [pytest.mark.kube, pytest.mark.kind]

FIGURES = Path(__file__).resolve().parents[2] / ".sluice" / "kind" / "figures.json"


def network_traces(subnets: list[str], bridge: str) -> list[str]:
    """Host iptables rules naming kind's podman network or its subnets, and its bridge, if still there."""
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout.splitlines()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    marks = [f'name: \\"{PODMAN_NETWORK}\\"', *subnets]
    return [line for line in rules if any(mark in line for mark in marks)] + (
        [f"link {bridge}"] if bridge and f" {bridge}:" in links else []
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KindCluster]:
    cluster = KindCluster(f"sluice-test-{os.getpid()}", tmp_path_factory.mktemp("kind"))
    started = time.monotonic()
    failure = None
    try:
        cluster.create(workers=2)
    except ProvisionError as error:  # create() has deleted what it made
        failure = str(error)
    if failure:
        pytest.fail(failure, pytrace=False)
    figures: dict[str, Any] = {"create_seconds": round(time.monotonic() - started, 1)}
    subnets: list[str] = []
    bridge = ""
    try:
        network = json.loads(podman("network", "inspect", PODMAN_NETWORK).stdout)[0]
        subnets = [s["subnet"] for s in network.get("subnets", [])]
        bridge = network.get("network_interface", "")
        assert network_traces(subnets, bridge), "the check after delete() must see kind's network while it is up"
        time.sleep(30)  # at rest: the create's rollouts done
        try:
            figures["memory_bytes_at_rest"] = cluster.memory_bytes()
        except ProvisionError as error:  # a figure, not a check
            figures["memory_bytes_at_rest"] = str(error)
        print(f"kind cluster figures: {figures}")
        yield cluster
    finally:
        cluster.delete()
        FIGURES.parent.mkdir(parents=True, exist_ok=True)
        FIGURES.write_text(json.dumps(figures, indent=2) + "\n")
    containers = podman("ps", "--all", "--quiet", "--filter", f"label={CLUSTER_LABEL}={cluster.name}").stdout
    assert not containers.strip(), "node containers survived delete()"
    assert cluster.name not in running_clusters()
    assert not cluster.volumes(), "the nodes' /var volumes survived delete()"
    assert podman("network", "exists", PODMAN_NETWORK, check=False).returncode != 0, "kind's network survived"
    assert not network_traces(subnets, bridge), f"left on the host: {network_traces(subnets, bridge)}"


def apply(cluster: KindCluster, *objects: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)}))


def probe(
    name: str, *args: str, node: str | None = None, labels: dict[str, str] | None = None, restart: str = "Never"
) -> dict[str, Any]:
    """A pod of the probe image (serve PORT TEXT, get URL, dial HOST:PORT), on `node` when given."""
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": PROBE_IMAGE, "imagePullPolicy": "Never", "args": list(args)}],
    }
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": spec,
    }


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def get(cluster: KindCluster, kind: str, name: str, namespace: str = "default") -> Any:
    return json.loads(cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json").stdout)


def ready(cluster: KindCluster, *pods: str, timeout: int = 180) -> None:
    cluster.kubectl("wait", *(f"pod/{p}" for p in pods), "--for=condition=Ready", f"--timeout={timeout}s")


def finished(cluster: KindCluster, name: str, timeout: float = 180) -> str:
    """The pod's final phase, Succeeded or Failed."""

    def phase() -> str | None:
        value = get(cluster, "pod", name)["status"].get("phase")
        return value if value in ("Succeeded", "Failed") else None

    return wait_for(phase, timeout=timeout, what=f"pod {name} to finish")


def node_ready(cluster: KindCluster, node: str) -> bool:
    conditions = get(cluster, "node", node)["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_three_nodes_are_ready_with_distinct_names(cluster: KindCluster) -> None:
    nodes = json.loads(cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    names = [n["metadata"]["name"] for n in nodes]
    roles = sorted(
        "control-plane" if "node-role.kubernetes.io/control-plane" in n["metadata"]["labels"] else "worker"
        for n in nodes
    )
    assert len(set(names)) == 3 and sorted(names) == sorted(cluster.nodes())
    assert roles == ["control-plane", "worker", "worker"]
    assert all(node_ready(cluster, name) for name in names)
    addresses = {a["address"] for n in nodes for a in n["status"]["addresses"] if a["type"] == "InternalIP"}
    assert len(addresses) == 3


def test_a_pod_on_each_worker_reaches_a_service_whose_pod_runs_on_the_other(cluster: KindCluster) -> None:
    first, second = cluster.workers()
    apply(
        cluster,
        probe("echo-first", "serve", "8080", f"served on {first}", node=first, restart="Always"),
        probe("echo-second", "serve", "8080", f"served on {second}", node=second, restart="Always"),
        service("echo-first"),
        service("echo-second"),
    )
    ready(cluster, "echo-first", "echo-second")
    apply(
        cluster,
        probe("from-second", "get", "http://echo-first.default.svc.cluster.local/", node=second),
        probe("from-first", "get", "http://echo-second.default.svc.cluster.local/", node=first),
    )
    for client, server_node, client_node in (("from-second", first, second), ("from-first", second, first)):
        assert finished(cluster, client) == "Succeeded", cluster.kubectl("logs", client, check=False).stdout
        assert get(cluster, "pod", client)["spec"]["nodeName"] == client_node
        assert cluster.kubectl("logs", client).stdout.strip().splitlines()[-1] == f"served on {server_node}"


def test_a_network_policy_denies_what_it_does_not_admit_and_passes_what_it_does(cluster: KindCluster) -> None:
    first, second = cluster.workers()
    apply(cluster, probe("guarded", "serve", "8080", "guarded", node=first, restart="Always"))
    ready(cluster, "guarded")
    address = get(cluster, "pod", "guarded")["status"]["podIP"]
    apply(cluster, probe("before-policy", "dial", f"{address}:8080", node=second, labels={"role": "stranger"}))
    assert finished(cluster, "before-policy") == "Succeeded", "reachable from the other worker before any policy"
    policy = ingress_only_from("friends-only", {"app": "guarded"}, {"role": "friend"}, 8080)
    apply(cluster, policy)
    time.sleep(5)  # the agents sync on each policy event, within a second or two
    # The friend retries: the agent admits a new pod's address once it has seen the pod (within seconds).
    apply(
        cluster,
        probe("friend", "get", f"http://{address}:8080/", node=second, labels={"role": "friend"}),
        probe("stranger", "dial", f"{address}:8080", node=second, labels={"role": "stranger"}),
    )
    assert finished(cluster, "friend") == "Succeeded"
    assert cluster.kubectl("logs", "friend").stdout.strip().splitlines()[-1] == "guarded"
    assert finished(cluster, "stranger") == "Failed"
    denied = cluster.kubectl("logs", "stranger").stdout
    assert "connection refused" in denied or "timeout" in denied, denied


def test_the_default_class_binds_a_claim_and_its_pod_lands_on_the_volumes_node(cluster: KindCluster) -> None:
    claim = pvc("notes", "default", size="64Mi")

    def shell(name: str, script: str) -> dict[str, Any]:
        pod = probe(name)
        pod["spec"]["containers"][0].update(
            image=HELPER_IMAGE,
            command=["/bin/sh"],
            args=["-c", script],
            volumeMounts=[{"name": "notes", "mountPath": "/data"}],
        )
        pod["spec"]["volumes"] = [{"name": "notes", "persistentVolumeClaim": {"claimName": "notes"}}]
        return pod

    apply(cluster, claim, shell("writer", "echo kept > /data/note"))
    assert finished(cluster, "writer") == "Succeeded"
    apply(cluster, shell("reader", "cat /data/note"))
    assert finished(cluster, "reader") == "Succeeded"

    bound = get(cluster, "pvc", "notes")
    volume = get(cluster, "pv", bound["spec"]["volumeName"])
    terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    volume_nodes = [value for t in terms for e in t["matchExpressions"] for value in e["values"]]
    assert bound["spec"]["storageClassName"] == STORAGE_CLASS and bound["status"]["phase"] == "Bound"
    assert volume["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert len(volume_nodes) == 1 and volume_nodes[0] in cluster.workers()
    assert get(cluster, "pod", "writer")["spec"]["nodeName"] == volume_nodes[0]
    assert get(cluster, "pod", "reader")["spec"]["nodeName"] == volume_nodes[0]
    assert cluster.kubectl("logs", "reader").stdout == "kept\n"


def test_a_restricted_namespace_refuses_a_privileged_pod(cluster: KindCluster) -> None:
    namespace = restricted_namespace("restricted")
    apply(cluster, namespace)
    privileged = probe("privileged", "echo", "root")
    privileged["metadata"]["namespace"] = "restricted"
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(privileged), check=False)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr and "privileged" in refused.stderr


def test_a_lost_workers_pod_moves_to_the_other_and_the_worker_comes_back(cluster: KindCluster) -> None:
    pod = probe("survivor", "serve", "8080", "still here", restart="Always")
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "survivor"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "survivor"}},
            "template": {"metadata": {"labels": {"app": "survivor"}}, "spec": pod["spec"]},
        },
    }
    apply(cluster, deployment, service("survivor"))
    cluster.kubectl("rollout", "status", "deployment/survivor", "--timeout=180s")

    def running_pods() -> list[dict[str, Any]]:
        pods = json.loads(cluster.kubectl("get", "pods", "-l", "app=survivor", "-o", "json").stdout)["items"]
        return [
            p
            for p in pods
            if "deletionTimestamp" not in p["metadata"]
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        ]

    lost = running_pods()[0]["spec"]["nodeName"]
    other = next(w for w in cluster.workers() if w != lost)
    started = time.monotonic()
    cluster.stop_node(lost)
    try:
        wait_for(lambda: not node_ready(cluster, lost), timeout=120, what=f"{lost} to be NotReady", interval=2)
        not_ready = time.monotonic() - started
        moved = wait_for(
            lambda: [p for p in running_pods() if p["spec"]["nodeName"] == other],
            timeout=240,
            what=f"the survivor pod to run on {other}",
            interval=2,
        )
        moved_after = time.monotonic() - started
    finally:
        cluster.start_node(lost)
    wait_for(lambda: node_ready(cluster, lost), timeout=180, what=f"{lost} to be Ready again", interval=2)
    back_after = time.monotonic() - started
    assert len(moved) == 1
    print(
        f"lost worker: NotReady after {not_ready:.0f}s, its pod moved after {moved_after:.0f}s, "
        f"Ready again after {back_after:.0f}s"
    )
    apply(cluster, probe("after-return", "get", "http://survivor.default.svc.cluster.local/", node=lost))
    assert finished(cluster, "after-return") == "Succeeded", "a pod on the returned worker reaches the other's"
    assert cluster.kubectl("logs", "after-return").stdout.strip().splitlines()[-1] == "still here"
