"""A real single-node cluster: containerd + kubelet + kube-proxy + CoreDNS running locally built images."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.testbed.common import ProvisionError, pid_alive, wait_until
from sluice.testbed.e2e_suite import pvc, restricted_namespace
from sluice.testbed.images import BASE_IMAGE, PAUSE_IMAGE, PROBE_IMAGE, base_image, image_archive
from sluice.testbed.kube import ControlPlane
from sluice.testbed.network_policy import ingress_only_from
from sluice.testbed.node import BRIDGE, NODE_ADDRESS, NODE_NAME, Node, mounts_under
from sluice.testbed.storage import HELPER_IMAGE, STORAGE_CLASS

pytestmark = pytest.mark.kube

RESTRICTED_POD_SECURITY = {"runAsNonRoot": True, "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    state = tmp_path_factory.mktemp("node-cluster")
    plane = ControlPlane(state / "plane", advertise_address=NODE_ADDRESS)
    node = Node(plane, state / "node")
    try:
        plane.start()
        node.start()
    except ProvisionError as error:
        stop(node, plane)
        pytest.fail(str(error), pytrace=False)
    pids = {**plane.pids(), **node.pids()}
    try:
        yield node
    finally:
        stop(node, plane)
    assert not {name: pid for name, pid in pids.items() if pid_alive(pid)}, "processes survived stop()"
    assert not mounts_under(node.state_dir, node.runtime_dir, node.kubelet_dir), "mounts survived stop()"
    assert not node.kubelet_dir.exists(), "the kubelet directory survived stop()"
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert f" {BRIDGE}:" not in links, "the CNI bridge survived stop()"
    addresses = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True).stdout
    assert NODE_ADDRESS not in addresses, "the node address survived stop()"


def stop(node: Node, plane: ControlPlane) -> None:
    try:
        node.stop()
    finally:
        plane.stop()


def pod(name: str, *args: str, restart: str = "Never", labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": PROBE_IMAGE, "imagePullPolicy": "Never", "args": list(args)}],
        },
    }


def apply(node: Node, *objects: dict[str, Any]) -> None:
    node.plane.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    )


def wait_succeeded(node: Node, name: str, timeout: int = 120) -> None:
    result = node.plane.kubectl(
        "wait",
        f"pod/{name}",
        "--for=jsonpath={.status.phase}=Succeeded",
        f"--timeout={timeout}s",
        check=False,
        timeout=timeout + 30,
    )
    if result.returncode != 0:
        described = node.plane.kubectl("describe", "pod", name, check=False).stdout
        pytest.fail(f"pod {name} did not succeed: {result.stderr}\n{described}")


def test_node_is_ready_with_the_locally_built_images(node: Node) -> None:
    assert node.ready()
    info = json.loads(node.plane.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
    addresses = {a["type"]: a["address"] for a in info["status"]["addresses"]}
    assert addresses["InternalIP"] == NODE_ADDRESS
    assert info["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    images = node.images()
    assert PAUSE_IMAGE in images and PROBE_IMAGE in images


def test_pod_runs_and_its_logs_are_readable(node: Node) -> None:
    apply(node, pod("hello", "echo", "hello", "from", "sluice"))
    wait_succeeded(node, "hello")
    # The apiserver fetches logs from the kubelet by its InternalIP, as kube-apiserver-kubelet-client.
    assert node.plane.kubectl("logs", "hello").stdout.strip() == "hello from sluice"


def test_the_plane_records_its_advertise_address(node: Node) -> None:
    attached = ControlPlane.attach(node.plane.state_dir)
    assert attached is not None and attached.advertise_address == NODE_ADDRESS
    restored = Node.attach(attached, node.state_dir)
    assert restored is not None and restored.healthy() and restored.address == NODE_ADDRESS


def test_a_node_refuses_a_loopback_only_plane(tmp_path) -> None:
    with pytest.raises(ProvisionError, match="advertise"):
        Node(ControlPlane(tmp_path / "plane"), tmp_path / "node").start()


def test_service_is_reachable_by_its_dns_name(node: Node) -> None:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "greeter"},
        "spec": {"selector": {"app": "greeter"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    apply(node, pod("greeter", "serve", "8080", "hi through a Service", restart="Always"), service)
    node.plane.kubectl("wait", "pod/greeter", "--for=condition=Ready", "--timeout=120s", timeout=150)
    apply(node, pod("client", "get", "http://greeter.default.svc.cluster.local/"))
    wait_succeeded(node, "client")
    # stdout and stderr both land in the log; the body is the last line whatever the retries said.
    assert node.plane.kubectl("logs", "client").stdout.strip().splitlines()[-1] == "hi through a Service"


def test_pods_reach_the_apiserver_through_the_kubernetes_service(node: Node) -> None:
    apply(
        node,
        pod("resolver", "lookup", "kubernetes.default.svc.cluster.local"),
        pod("dialer", "dial", "kubernetes.default.svc.cluster.local:443"),
    )
    wait_succeeded(node, "resolver")
    wait_succeeded(node, "dialer")
    assert node.plane.kubectl("logs", "resolver").stdout.strip() == "10.0.0.1"
    assert node.plane.kubectl("logs", "dialer").stdout.strip() == "connected"
    endpoints = json.loads(
        node.plane.kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=kubernetes", "-o", "json").stdout
    )
    assert [a for s in endpoints["items"] for e in s["endpoints"] for a in e["addresses"]] == [NODE_ADDRESS]


def test_debian_base_image_runs_python_and_java(node: Node) -> None:
    archive = image_archive(*base_image())
    node.import_image(archive)
    script = "python3 -c 'print(6 * 7)' && java -version 2>&1 | head -n 1"
    spec = pod("base", "-c", script)
    spec["spec"]["containers"][0].update(image=BASE_IMAGE, command=["/bin/sh"])
    apply(node, spec)
    wait_succeeded(node, "base", timeout=180)
    lines = node.plane.kubectl("logs", "base").stdout.strip().splitlines()
    assert lines[0] == "42" and lines[1].startswith('openjdk version "17.'), lines


def test_state_lives_under_the_state_dir(node: Node) -> None:
    assert (node.state_dir / "containerd").is_dir()
    assert str(node.containerd_socket).startswith("/run/sluice/")


def test_a_claim_of_the_default_class_binds_on_its_pods_node_and_goes_with_it(node: Node) -> None:
    claim = pvc("notes", "default", size="64Mi")

    def shell(name: str, script: str) -> dict[str, Any]:
        spec = pod(name, "-c", script)
        spec["spec"]["containers"][0].update(
            image=HELPER_IMAGE, command=["/bin/sh"], volumeMounts=[{"name": "notes", "mountPath": "/data"}]
        )
        spec["spec"]["volumes"] = [{"name": "notes", "persistentVolumeClaim": {"claimName": "notes"}}]
        return spec

    apply(node, claim, shell("writer", "echo kept > /data/note"))
    wait_succeeded(node, "writer")
    apply(node, shell("reader", "cat /data/note"))
    wait_succeeded(node, "reader")

    bound = json.loads(node.plane.kubectl("get", "pvc", "notes", "-o", "json").stdout)
    volume = json.loads(node.plane.kubectl("get", "pv", bound["spec"]["volumeName"], "-o", "json").stdout)
    terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    directory = Path(volume["spec"]["hostPath"]["path"])
    assert bound["spec"]["storageClassName"] == STORAGE_CLASS and bound["status"]["phase"] == "Bound"
    assert [value for t in terms for e in t["matchExpressions"] for value in e["values"]] == [NODE_NAME]
    assert directory.parent == node.volume_root and (directory / "note").read_text() == "kept\n"
    assert node.plane.kubectl("logs", "reader").stdout == "kept\n"

    node.plane.kubectl("delete", "pod", "writer", "reader", "--wait=true", timeout=120)
    node.plane.kubectl("delete", "pvc", "notes", "--wait=true", timeout=120)
    wait_until(lambda: not directory.exists(), timeout=120, what=f"the provisioner to remove {directory}")


def test_a_restricted_namespace_refuses_a_privileged_pod_and_admits_a_hardened_one(node: Node) -> None:
    namespace = restricted_namespace("restricted")
    apply(node, namespace)
    privileged = pod("privileged", "echo", "root")
    privileged["metadata"]["namespace"] = "restricted"
    privileged["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    hardened = pod("hardened", "echo", "fine")
    hardened["metadata"]["namespace"] = "restricted"
    hardened["spec"]["securityContext"] = RESTRICTED_POD_SECURITY
    hardened["spec"]["containers"][0]["securityContext"] = RESTRICTED_CONTAINER_SECURITY

    refused = node.plane.kubectl("apply", "-f", "-", input=json.dumps(privileged), check=False)
    apply(node, hardened)

    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr and "privileged" in refused.stderr
    node.plane.kubectl(
        "wait", "-n", "restricted", "pod/hardened", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=120s"
    )
    assert node.plane.kubectl("logs", "-n", "restricted", "hardened").stdout.strip() == "fine"


def _phase(node: Node, name: str, timeout: int = 120) -> str:
    wait_until(
        lambda: (
            json.loads(node.plane.kubectl("get", "pod", name, "-o", "json").stdout)["status"].get("phase")
            in ("Succeeded", "Failed")
        ),
        timeout=timeout,
        what=f"pod {name} to finish",
    )
    return json.loads(node.plane.kubectl("get", "pod", name, "-o", "json").stdout)["status"]["phase"]


def test_a_network_policy_denies_what_it_does_not_admit_and_passes_what_it_does(node: Node) -> None:
    apply(node, pod("guarded", "serve", "8080", "guarded", restart="Always"))
    node.plane.kubectl("wait", "pod/guarded", "--for=condition=Ready", "--timeout=120s", timeout=150)
    address = json.loads(node.plane.kubectl("get", "pod", "guarded", "-o", "json").stdout)["status"]["podIP"]
    apply(node, pod("before-policy", "dial", f"{address}:8080"))
    assert _phase(node, "before-policy") == "Succeeded", "reachable before any policy selects it"
    policy = ingress_only_from("friends-only", {"app": "guarded"}, {"role": "friend"}, 8080)
    apply(node, policy)

    # The friend retries: the agent admits a new pod's address once it has seen the pod (within seconds).
    apply(
        node,
        pod("friend", "get", f"http://{address}:8080/", labels={"role": "friend"}),
        pod("stranger", "dial", f"{address}:8080", labels={"role": "stranger"}),
    )

    assert _phase(node, "friend") == "Succeeded"
    assert node.plane.kubectl("logs", "friend").stdout.strip().splitlines()[-1] == "guarded"
    assert _phase(node, "stranger") == "Failed"
    assert "connection refused" in node.plane.kubectl("logs", "stranger").stdout


def test_the_object_store_keeps_objects_for_its_key_pair_refuses_another_and_pods_reach_it(node: Node) -> None:
    from pyarrow.fs import FileSelector

    access = node.object_store
    store = access.filesystem()
    for name, body in (("a", b"one"), ("b", b"two")):
        with store.open_output_stream(f"{access.bucket}/test/{name}.txt") as out:
            out.write(body)
    with store.open_input_stream(f"{access.bucket}/test/a.txt") as stream:
        assert stream.read() == b"one"
    listed = {info.path: info.size for info in store.get_file_info(FileSelector(f"{access.bucket}/test"))}
    assert listed == {f"{access.bucket}/test/a.txt": 3, f"{access.bucket}/test/b.txt": 3}
    store.delete_dir_contents(f"{access.bucket}/test")
    with pytest.raises(OSError, match=r"(?i)signature|denied|forbidden"):
        access.filesystem(secret_key=f"not-{access.secret_key}").get_file_info(FileSelector(access.bucket))
    gateway = node.pids()["object-store"]
    assert access.secret_key.encode() not in Path(f"/proc/{gateway}/cmdline").read_bytes(), "key pair in ps"
    apply(node, pod("object-store-client", "get", f"{access.endpoint}/health"))
    wait_succeeded(node, "object-store-client")
