"""kind clusters on podman, from a node image built here: no Docker, no registry.

kind (pinned, `go install`ed) runs with its podman provider. Its node image is made in two cached steps:

1. the base image: a Debian tree made by debootstrap with systemd, containerd, runc, the CNI plugins and
   iptables (Debian's packages), plus kind's own node files (`images/base/files` of the kind Go module,
   read from the module cache at build time), set up as kind's base Dockerfile does;
2. the node image: the base with kubeadm, kubelet and kubectl of the pinned Kubernetes, and every image
   a cluster runs imported into its containerd: the control plane, etcd, CoreDNS, pause, kube-proxy,
   local-path-provisioner and its helper, the NetworkPolicy agent and the probe test image. Each is an
   OCI archive made by images.py from binaries the test bed builds.

kind's own CNI (kindnetd) cannot be built here: its Go module (sigs.k8s.io/kind/images/kindnetd) is not
served by the Go module proxy. So clusters start without kind's CNI; KindCluster gives each node a
bridge CNI config for its pod CIDR and routes to the other nodes' pod CIDRs (no masquerading between
pods, so policies see real source addresses); what leaves the pod network (for the host, e.g. the test bed's
Kafka at the podman network's gateway) is masqueraded behind the node's address, as kindnetd does.
NetworkPolicies are enforced by kube-router's firewall as a DaemonSet (network_policy.py says why not
kube-network-policies, kind's choice, on this kernel). The default StorageClass is local-path-provisioner in
kind's shape (the manifest kind applies from the node image), with the images built here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sluice.pipelines.local.provision import run_command

from .common import REPO_ROOT, ProvisionError, cache_dir, locked, run, wait_until
from .images import (
    PAUSE_IMAGE,
    ImageSpec,
    archive_names,
    base_rootfs,
    full_name,
    image_archive,
    pause_binary,
    probe_image,
)
from .kube import (
    announce,
    cached_binaries,
    etcd_binary,
    go_binary,
    go_env,
    go_install,
    kubectl_runner,
    kubernetes_binaries,
)
from .network_policy import NAME as NETWORK_POLICY_AGENT
from .network_policy import agent_binary, agent_rbac
from .node import coredns_binary, install_packages
from .storage import NAMESPACE as STORAGE_NAMESPACE
from .storage import SERVICE_ACCOUNT as STORAGE_SERVICE_ACCOUNT
from .storage import helper_image, provisioner_binary, storage_manifests
from .versions import COREDNS, ETCD, KIND, KUBE_ROUTER, KUBERNETES, LOCAL_PATH_PROVISIONER

KIND_MODULE = "sigs.k8s.io/kind"
BASE_IMAGE = "sluice.local/kind-base"
NODE_IMAGE = "sluice.local/kind-node"
# dnsname: podman's CNI plugin that lets the nodes resolve each other's names (kubeadm join dials the
# control plane by name); podman gives a network DNS only when the plugin is there as it creates it.
HOST_PACKAGES = ("podman", "golang-github-containernetworking-plugin-dnsname", "debootstrap")
# What kind's base Dockerfile installs, from Debian (containerd, runc and the CNI plugins too).
NODE_PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "conntrack",
    "iptables",
    "nftables",
    "iproute2",
    "ethtool",
    "util-linux",
    "mount",
    "kmod",
    "socat",
    "ebtables",
    "libseccomp2",
    "pigz",
    "e2fsprogs",
    "bash",
    "ca-certificates",
    "curl",
    "jq",
    "procps",
    "containerd",
    "runc",
    "containernetworking-plugins",
)
NETFILTER_PACKAGES = ("iptables", "ipset", "conntrack", "iproute2")  # what kube-proxy and kube-router run
ETCD_IMAGE = f"registry.k8s.io/etcd:{ETCD}-0"  # kubeadm's tag shape; kind's config points kubeadm at it
PAUSE_IMAGES = (PAUSE_IMAGE, "registry.k8s.io/pause:3.10.1")  # containerd's sandbox image; kubeadm's
PROVISIONER_IMAGE = f"sluice.local/local-path-provisioner:v{LOCAL_PATH_PROVISIONER}"
VOLUME_ROOT = "/var/local-path-provisioner"  # kind's: /var is a volume of each node container
CNI_CONFIG = "/etc/cni/net.d/10-sluice.conflist"
NETWORK_POLICY_IMAGE = f"sluice.local/kube-router:v{KUBE_ROUTER}"
NETWORK_POLICY_HEALTH_PORT = 20244  # kube-router's default, in each node's network namespace
# Not kind's 10.244.0.0/16: the local cluster's pods are there, and with bridge netfilter on, traffic between
# kind's nodes crosses the host's iptables, where that cluster's rules match its pods' addresses.
POD_SUBNET = "10.250.0.0/16"
SERVICE_SUBNET = "10.96.0.0/16"  # kind's default; the local cluster's is 10.0.0.0/16
NOT_READY_TOLERATION_SECONDS = 30  # how long pods stay bound to a lost node (Kubernetes' default: 300)
PODMAN_NETWORK = "kind"
CLUSTER_LABEL = "io.x-k8s.kind.cluster"
DEFAULT_STATE_DIR = REPO_ROOT / ".sluice" / "kind-cluster"
DEFAULT_NAME = "sluice"

# --- the host: kind, podman and podman's configuration -------------------------------------------


def kind_binary() -> Path:
    def build(out: Path, names: list[str]) -> None:
        go_install("kind", f"v{KIND}", KIND_MODULE, ["-s", "-w"], out, out.parent / "build.log")

    return cached_binaries(cache_dir("kind", f"v{KIND}"), ["kind"], build)["kind"]


def kind_module_dir() -> Path:
    """kind's module source in the Go module cache (its node files live in images/base/files)."""
    result = subprocess.run(
        [go_binary(), "mod", "download", "-json", f"{KIND_MODULE}@v{KIND}"],
        capture_output=True,
        text=True,
        env=go_env(),
        cwd=cache_dir("kind"),
    )
    try:
        directory = Path(json.loads(result.stdout)["Dir"])
    except (json.JSONDecodeError, KeyError) as error:
        raise ProvisionError(
            f"could not fetch Go module {KIND_MODULE}@v{KIND}: {result.stderr.strip() or result.stdout.strip()}; "
            "check access to the Go module proxy"
        ) from error
    return directory


def containers_conf() -> Path:
    """podman's configuration for kind (CONTAINERS_CONF): default ulimits within this machine's hard limits.

    podman's own defaults (1048576 open files) exceed what an unprivileged-limit machine allows, and then
    no container starts.
    """

    def hard_limit(kind: int) -> int:
        hard = resource.getrlimit(kind)[1]
        return 1048576 if hard == resource.RLIM_INFINITY else min(1048576, hard)

    nofile = hard_limit(resource.RLIMIT_NOFILE)
    # runc may not set more processes than pid_max (it fails with "error setting rlimit type 6").
    nproc = min(hard_limit(resource.RLIMIT_NPROC), int(Path("/proc/sys/kernel/pid_max").read_text()))
    # pids_limit: podman caps each container at 2048 tasks by default, and a node container holds every thread
    # of its pods (a Spark driver and three executors on one node passed that: "unable to create native thread").
    text = f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\npids_limit = 0\n'
    path = cache_dir("kind") / "containers.conf"
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)
    return path


def podman_env() -> dict[str, str]:
    return {**os.environ, "KIND_EXPERIMENTAL_PROVIDER": "podman", "CONTAINERS_CONF": str(containers_conf())}


def prepare_host() -> None:
    """podman and debootstrap from Debian, and the /lib/modules kind mounts into every node."""
    if os.geteuid() != 0:
        raise ProvisionError("a kind cluster on podman needs root (rootful podman): run as root")
    install_packages(HOST_PACKAGES)
    Path("/lib/modules").mkdir(parents=True, exist_ok=True)


def podman(
    *args: str, check: bool = True, input: bytes | str | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """podman with the project's configuration; a ProvisionError naming the command when check fails."""
    text = not isinstance(input, bytes)
    result = subprocess.run(
        ["podman", *args], input=input, capture_output=True, text=text, timeout=timeout, env=podman_env()
    )
    stdout = result.stdout if text else result.stdout.decode(errors="replace")
    stderr = result.stderr if text else result.stderr.decode(errors="replace")
    if check and result.returncode != 0:
        first = (stderr.strip() or stdout.strip() or "no output").splitlines()[-1]
        raise ProvisionError(f"podman {' '.join(args[:3])} failed (exit {result.returncode}): {first}")
    return subprocess.CompletedProcess(result.args, result.returncode, stdout, stderr)


def image_present(name: str) -> bool:
    return podman("image", "exists", name, check=False).returncode == 0


# --- the images inside the node ------------------------------------------------------------------


def _file_digest(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def _binary_image(name: str, binary: Path, target: str | None = None) -> ImageSpec:
    """An image of one static binary (FROM scratch), at /usr/local/bin/<its name> unless target says."""
    path = target or f"/usr/local/bin/{binary.name}"
    return ImageSpec(name, [path], {path: binary})


def netfilter_archive(name: str, binary: Path) -> Path:
    """binary on a minimal Debian tree with iptables, ipset and conntrack (kube-proxy and kube-router run them)."""
    rootfs = base_rootfs(NETFILTER_PACKAGES)
    key = hashlib.sha256(((rootfs.parent / "done").read_text() + _file_digest(binary)).encode()).hexdigest()[:16]
    path = f"/usr/local/bin/{binary.name}"
    return image_archive(ImageSpec(name, [path], {path: binary}, rootfs=rootfs), key)


def node_archives() -> list[Path]:
    """Every image a node needs, as OCI archives for its containerd (nothing is pulled)."""
    binaries = kubernetes_binaries("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy")
    specs = [
        *(
            _binary_image(f"registry.k8s.io/{name}:v{KUBERNETES}", binaries[name])
            for name in binaries
            if name != "kube-proxy"
        ),
        _binary_image(ETCD_IMAGE, etcd_binary()),
        _binary_image(f"registry.k8s.io/coredns/coredns:v{COREDNS}", coredns_binary(), "/coredns"),
        *(ImageSpec(name, ["/pause"], {"/pause": pause_binary()}, user="65535:65535") for name in PAUSE_IMAGES),
        _binary_image(PROVISIONER_IMAGE, provisioner_binary()),
        helper_image(),
        probe_image(),
    ]
    return [
        *(image_archive(spec) for spec in specs),
        netfilter_archive(f"registry.k8s.io/kube-proxy:v{KUBERNETES}", binaries["kube-proxy"]),
        netfilter_archive(NETWORK_POLICY_IMAGE, agent_binary()),
    ]


def network_policy_manifests() -> list[dict[str, Any]]:
    """kube-router's firewall (no routing, no service proxy) on every node, a privileged host-network pod."""
    account = {"kind": "ServiceAccount", "name": NETWORK_POLICY_AGENT, "namespace": "kube-system"}
    role = agent_rbac()[0]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"{NETWORK_POLICY_AGENT}-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
        "subjects": [account],
    }
    container = {
        "name": NETWORK_POLICY_AGENT,
        "image": NETWORK_POLICY_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "args": [
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--hostname-override=$(NODE_NAME)",
            f"--service-cluster-ip-range={SERVICE_SUBNET}",
            f"--health-port={NETWORK_POLICY_HEALTH_PORT}",
            "--metrics-port=0",
            "--v=1",
        ],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": NETWORK_POLICY_HEALTH_PORT}, "periodSeconds": 5},
        "resources": {"requests": {"cpu": "50m", "memory": "50Mi"}},
        "securityContext": {"privileged": True},
        "volumeMounts": [
            {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": True},
            {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
        ],
    }
    labels = {"k8s-app": NETWORK_POLICY_AGENT}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": NETWORK_POLICY_AGENT, "namespace": "kube-system", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "hostNetwork": True,
                    "priorityClassName": "system-node-critical",
                    "serviceAccountName": NETWORK_POLICY_AGENT,
                    "tolerations": [{"operator": "Exists"}],
                    "terminationGracePeriodSeconds": 5,
                    "containers": [container],
                    "volumes": [
                        {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}},
                        {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}},
                    ],
                },
            },
        },
    }
    service_account = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": NETWORK_POLICY_AGENT, "namespace": "kube-system"},
    }
    return [service_account, role, binding, daemonset]


def storage_manifest() -> list[dict[str, Any]]:
    """The default StorageClass as kind installs it (/kind/manifests/default-storage.yaml): the provisioner
    as a Deployment in the cluster, volumes under /var/local-path-provisioner on every node."""
    manifests = storage_manifests({"DEFAULT_PATH_FOR_NON_LISTED_NODES": Path(VOLUME_ROOT)})
    container = {
        "name": "local-path-provisioner",
        "image": PROVISIONER_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": [
            "local-path-provisioner",
            "--debug",
            "start",
            "--config=/etc/config/config.json",
            f"--namespace={STORAGE_NAMESPACE}",
            "--configmap-name=local-path-config",
            f"--service-account-name={STORAGE_SERVICE_ACCOUNT}",
            f"--helper-image={helper_image().name}",
            "--provisioner-name=rancher.io/local-path",
        ],
        "env": [
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "CONFIG_MOUNT_PATH", "value": "/etc/config/"},
        ],
        "volumeMounts": [{"name": "config-volume", "mountPath": "/etc/config/"}],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "local-path-provisioner", "namespace": STORAGE_NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "local-path-provisioner"}},
            "template": {
                "metadata": {"labels": {"app": "local-path-provisioner"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/os": "linux"},
                    "tolerations": [
                        {"key": "node-role.kubernetes.io/control-plane", "operator": "Equal", "effect": "NoSchedule"}
                    ],
                    "serviceAccountName": STORAGE_SERVICE_ACCOUNT,
                    "containers": [container],
                    "volumes": [{"name": "config-volume", "configMap": {"name": "local-path-config"}}],
                },
            },
        },
    }
    return [*manifests, deployment]


# --- the base and node images --------------------------------------------------------------------


def base_containerfile(rootfs_image: str) -> str:
    """kind's base Dockerfile, on a Debian tree that already has its packages. One change to kind's
    containerd config: restrict_oom_score_adj, since root here may lack CAP_SYS_RESOURCE, so runc could
    not lower a container's oom_score_adj (the sandbox asks for -998) and no pod would start."""
    services = "/lib/systemd/system"
    return f"""FROM {rootfs_image}
COPY files/usr/local/bin/ /usr/local/bin/
COPY files/kind/ /kind/
COPY files/etc/ /etc/
RUN chmod 755 /usr/local/bin/* /kind/bin/* /kind /kind/bin \\
 && find {services}/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete \\
 && rm -f {services}/multi-user.target.wants/* /etc/systemd/system/*.wants/* {services}/local-fs.target.wants/* \\
      {services}/sockets.target.wants/*udev* {services}/sockets.target.wants/*initctl* \\
      {services}/basic.target.wants/* \\
 && echo ReadKMsg=no >> /etc/systemd/journald.conf \\
 && for b in containerd containerd-shim-runc-v2 ctr; do ln -sf /usr/bin/$b /usr/local/bin/$b; done \\
 && ln -sf /usr/sbin/runc /usr/local/sbin/runc \\
 && mkdir -p /opt/cni/bin && for p in /usr/lib/cni/*; do ln -sf $p /opt/cni/bin/; done \\
 && ctr oci spec | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + \\
      {{"path": "/kind/bin/mount-product-files.sh"}}' | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json \\
 && sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' /etc/containerd/config.toml \\
 && systemctl enable kubelet.service containerd.service undo-mount-hacks.service \\
 && systemctl mask systemd-binfmt.service \\
 && mkdir -p /etc/kubernetes/manifests
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]
"""


def base_image() -> str:
    """sluice.local/kind-base:<key>, built once into podman's storage."""
    rootfs = base_rootfs(NODE_PACKAGES)
    rootfs_key = (rootfs.parent / "done").read_text().strip()
    rootfs_image = f"{BASE_IMAGE}-rootfs:{rootfs_key}"
    containerfile = base_containerfile(rootfs_image)
    key = hashlib.sha256(f"{KIND}\n{containerfile}".encode()).hexdigest()[:16]
    name = f"{BASE_IMAGE}:{key}"
    if image_present(name):
        return name
    with locked(cache_dir("kind") / "base.lock"):
        if image_present(name):
            return name
        announce(f"building the kind base image {name} (once)")
        archive = image_archive(ImageSpec(rootfs_image, [], rootfs=rootfs, cmd=["/bin/bash"]), rootfs_key)
        podman("load", "--input", str(archive))
        if not image_present(rootfs_image):
            raise ProvisionError(f"podman load of {archive} gave no image named {rootfs_image}")
        with tempfile.TemporaryDirectory(dir=cache_dir("kind")) as context:
            shutil.copytree(kind_module_dir() / "images" / "base" / "files", Path(context) / "files")
            (Path(context) / "Containerfile").write_text(containerfile)
            podman(
                "build", "--network=none", "--tag", name, "--file", f"{context}/Containerfile", context, timeout=1800
            )
        podman("rmi", rootfs_image, check=False)
    return name


def node_image() -> str:
    """sluice.local/kind-node:v<Kubernetes>-<key>, rebuilt only when one of its inputs changes."""
    base = base_image()
    archives = node_archives()
    binaries = kubernetes_binaries("kubeadm", "kubelet", "kubectl")
    manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": storage_manifest()}, indent=2)
    inputs = [base, manifest, *(a.name for a in archives), *(f"{n}:{_file_digest(p)}" for n, p in binaries.items())]
    key = hashlib.sha256("\n".join(inputs).encode()).hexdigest()[:12]
    name = f"{NODE_IMAGE}:v{KUBERNETES}-{key}"
    if image_present(name):
        return name
    with locked(cache_dir("kind") / "node.lock"):
        if not image_present(name):
            started = time.monotonic()
            announce(f"building the kind node image {name} (once)")
            _build_node_image(name, base, binaries, archives, manifest)
            announce(f"built {name} in {time.monotonic() - started:.0f}s")
    return name


def _build_node_image(name: str, base: str, binaries: dict[str, Path], archives: list[Path], manifest: str) -> None:
    """kind's own recipe (`kind build node-image`): a container of the base, binaries copied in, images
    imported into its containerd without unpacking, committed."""
    container = f"sluice-kind-build-{os.getpid()}"
    podman("rm", "--force", "--time=0", container, check=False)
    podman(
        "run", "--detach", "--name", container, "--network=none", "--entrypoint=sleep",
        "--security-opt", "seccomp=unconfined", base, "infinity",
    )  # fmt: skip
    try:

        def shell(script: str, input: bytes | str | None = None) -> subprocess.CompletedProcess[str]:
            return podman("exec", "--interactive", container, "bash", "-euc", script, input=input)

        for binary_name, path in binaries.items():
            podman("cp", str(path), f"{container}:/usr/bin/{binary_name}")
        shell("chown root:root /usr/bin/kube* && chmod 755 /usr/bin/kube*")
        shell(f"echo -n v{KUBERNETES} > /kind/version")
        shell("mkdir -p /kind/manifests && cat > /kind/manifests/default-storage.yaml", input=manifest)
        shell("nohup containerd > /var/log/containerd-build.log 2>&1 &")
        shell("for i in $(seq 60); do ctr version >/dev/null 2>&1 && exit 0; sleep 0.5; done; exit 1")
        for archive in archives:
            with open(archive, "rb") as handle:
                podman(
                    "exec", "--interactive", container,
                    "ctr", "--namespace=k8s.io", "images", "import", "--all-platforms", "--no-unpack", "-",
                    input=handle.read(),
                )  # fmt: skip
        present = set(shell("ctr --namespace=k8s.io images ls -q").stdout.split())
        missing = sorted({n for a in archives for n in archive_names(a)} - present)
        if missing:
            raise ProvisionError(f"building {name}: containerd did not get {', '.join(missing)}")
        shell("pkill containerd; for i in $(seq 60); do pgrep -x containerd >/dev/null || exit 0; sleep 0.5; done")
        shell("rm -rf /run/containerd /var/log/containerd-build.log")
        podman(
            "commit",
            "--change", 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
            "--change", "CMD []",
            container, name,
            timeout=1800,
        )  # fmt: skip
    finally:
        podman("rm", "--force", "--time=0", container, check=False)


# --- the cluster ---------------------------------------------------------------------------------


def cluster_config(workers: int) -> dict[str, Any]:
    """One control plane and `workers` workers; kubeadm pointed at the etcd built here; kind's CNI off;
    pods leave a lost node after NOT_READY_TOLERATION_SECONDS."""
    # kind 0.33 writes kubeadm's v1beta3 config below Kubernetes 1.36: extraArgs is a map there.
    tolerations = {
        name: str(NOT_READY_TOLERATION_SECONDS)
        for name in ("default-not-ready-toleration-seconds", "default-unreachable-toleration-seconds")
    }
    cluster_patch = {
        "kind": "ClusterConfiguration",
        "etcd": {"local": {"imageTag": ETCD_IMAGE.split(":")[1]}},
        "apiServer": {"extraArgs": tolerations},
    }
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "networking": {"disableDefaultCNI": True, "podSubnet": POD_SUBNET, "serviceSubnet": SERVICE_SUBNET},
        "nodes": [{"role": "control-plane"}, *({"role": "worker"} for _ in range(workers))],
        "kubeadmConfigPatches": [json.dumps(cluster_patch)],
    }


def bridge_cni_config(pod_cidr: str) -> dict[str, Any]:
    """A node's pod network: a bridge, host-local addresses from its pod CIDR, no masquerading."""
    bridge = {
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]},
    }
    return {
        "cniVersion": "0.4.0",
        "name": "sluice",
        "plugins": [bridge, {"type": "portmap", "capabilities": {"portMappings": True}}],
    }


def _list(items: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


class KindCluster:
    """A kind cluster of a control plane and workers on podman; config, kubeconfig and logs under state_dir."""

    def __init__(self, name: str = DEFAULT_NAME, state_dir: Path = DEFAULT_STATE_DIR) -> None:
        self.name = name
        self.state_dir = state_dir.resolve()

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def log(self) -> Path:
        return self.state_dir / "kind.log"

    # -- lifecycle --

    def create(self, workers: int = 2, timeout: float = 300.0) -> KindCluster:
        prepare_host()
        others = [c for c in running_clusters() if c != self.name]
        if others:
            raise ProvisionError(
                f"another kind cluster ({', '.join(others)}) runs on this machine: one at a time "
                f"(make kind-cluster-down, or kind delete cluster --name {others[0]})"
            )
        kind = kind_binary()
        image = node_image()
        self._check_network()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config = self.state_dir / "cluster.json"
        config.write_text(json.dumps(cluster_config(workers), indent=2))
        started = time.monotonic()
        try:
            run(
                [kind, "create", "cluster", f"--name={self.name}", f"--image={image}", f"--config={config}",
                 f"--kubeconfig={self.kubeconfig}"],
                what=f"kind create cluster {self.name}",
                hint="the node containers' logs: podman logs <node>; then make kind-cluster-down",
                log=self.log,
                env=podman_env(),
            )  # fmt: skip
            self.connect_pod_networks()
            self.kubectl("wait", "--for=condition=Ready", "node", "--all", f"--timeout={int(timeout)}s")
            self.kubectl("apply", "-f", "-", input=_list(network_policy_manifests()))
            for kind_and_name, namespace in (
                (f"daemonset/{NETWORK_POLICY_AGENT}", "kube-system"),
                ("deployment/coredns", "kube-system"),
                ("deployment/local-path-provisioner", STORAGE_NAMESPACE),
            ):
                self.kubectl("rollout", "status", "-n", namespace, kind_and_name, f"--timeout={int(timeout)}s")
        except BaseException:
            self.delete()
            raise
        announce(f"kind cluster {self.name} up in {time.monotonic() - started:.0f}s; KUBECONFIG={self.kubeconfig}")
        return self

    def delete(self) -> None:
        """Delete the node containers, and kind's podman network when nothing else uses it."""
        kind = cache_dir("kind", f"v{KIND}") / "bin" / "kind"  # never build while deleting
        if kind.is_file():
            subprocess.run(
                [kind, "delete", "cluster", f"--name={self.name}", f"--kubeconfig={self.kubeconfig}"],
                capture_output=True,
                env=podman_env(),
                timeout=300,
            )
        for node in self.nodes():  # what kind left (a failed delete): the containers and their /var volumes
            podman("rm", "--force", "--volumes", node, check=False)
        for volume in self.volumes():
            podman("volume", "rm", "--force", volume, check=False)
        if not podman("ps", "--all", "--quiet", "--filter", f"network={PODMAN_NETWORK}", check=False).stdout.strip():
            podman("network", "rm", PODMAN_NETWORK, check=False)

    def load(self, archive: Path) -> None:
        """An image archive (docker or OCI) into every node's containerd (`kind load image-archive`)."""
        run(
            [kind_binary(), "load", "image-archive", str(archive), f"--name={self.name}"],
            what=f"kind load image-archive {archive.name}",
            hint="is the cluster up? (make kind-cluster)",
            log=self.log,
            env=podman_env(),
        )

    def lose_node(self, node: str) -> None:
        """A worker gone for good, as when a cloud loses its instance: the node's container killed, then its Node
        deleted, as a cloud's node controller does for a vanished instance (the pods bound to it are then
        garbage-collected by the control plane)."""
        podman("kill", node)
        self.kubectl("delete", "node", node, "--wait=false")

    def tag_image(self, image: str, alias: str) -> None:
        """A second name for a loaded image in every node's containerd: an image change that pulls nothing."""
        for node in self.nodes():
            self._exec(
                node, "ctr", "--namespace", "k8s.io", "images", "tag", "--force", full_name(image), full_name(alias)
            )

    def gateway(self) -> str:
        """The host's address on the nodes' network: where pods reach processes of the host."""
        network = json.loads(podman("network", "inspect", PODMAN_NETWORK).stdout)[0]
        return next(str(s["gateway"]) for s in network["subnets"] if ":" not in s["gateway"])  # kind's is dual-stack

    def _check_network(self) -> None:
        """kind's podman network, when left from before, must resolve names; an unused one without DNS goes."""
        inspected = podman("network", "inspect", PODMAN_NETWORK, check=False)
        if inspected.returncode != 0 or json.loads(inspected.stdout)[0].get("dns_enabled"):
            return
        if podman("ps", "--all", "--quiet", "--filter", f"network={PODMAN_NETWORK}").stdout.strip():
            raise ProvisionError(
                f"podman network {PODMAN_NETWORK} has no DNS (made before the dnsname plugin was installed) "
                "and containers use it: delete them, then podman network rm kind"
            )
        podman("network", "rm", PODMAN_NETWORK)

    # -- nodes --

    def nodes(self) -> list[str]:
        """The node containers' names (also the Kubernetes node names), control plane first."""
        result = podman(
            "ps", "--all", "--filter", f"label={CLUSTER_LABEL}={self.name}", "--format", "{{.Names}}", check=False
        )
        return sorted(result.stdout.split(), key=lambda n: (not n.endswith("control-plane"), n))

    def volumes(self) -> list[str]:
        """The nodes' /var volumes (kind labels each with <node name>=true)."""
        names = [f"{self.name}-control-plane", f"{self.name}-worker", *(f"{self.name}-worker{i}" for i in range(2, 10))]
        found = []
        for node in names:
            found += podman("volume", "ls", "--quiet", "--filter", f"label={node}=true", check=False).stdout.split()
        return found

    def workers(self) -> list[str]:
        return [n for n in self.nodes() if not n.endswith("control-plane")]

    def stop_node(self, node: str) -> None:
        """Stop a node's container, as a machine that is lost."""
        podman("stop", node, timeout=120)

    def start_node(self, node: str) -> None:
        """Start a stopped node again; its routes to the other nodes' pods are set up anew."""
        podman("start", node, timeout=120)
        wait_until(
            lambda: self._exec(node, "ip", "-4", "-o", "addr", "show", "eth0", check=False).stdout.strip() != "",
            timeout=60,
            what=f"node {node} to get its address",
        )
        wait_until(self._api_addresses_current, timeout=120, what=f"node {node} to report its address")
        self.connect_pod_networks()

    def connect_pod_networks(self, timeout: float = 120.0) -> None:
        """Each node: a CNI config for its pod CIDR, and a route to every other node's pod CIDR."""
        wait_until(
            lambda: all(cidr for _, cidr in self._node_networks().values()),
            timeout=timeout,
            what="every node to get a pod CIDR (kube-controller-manager allocates them)",
        )
        nodes = self._node_networks()
        leaving = ["POSTROUTING", "-s", POD_SUBNET, "!", "-d", POD_SUBNET, "-j", "MASQUERADE"]
        for name, (_, pod_cidr) in nodes.items():
            config = json.dumps(bridge_cni_config(pod_cidr), indent=2)
            self._exec(name, "sh", "-c", f"mkdir -p /etc/cni/net.d && cat > {CNI_CONFIG}", input=config)
            if self._exec(name, "iptables", "-t", "nat", "-C", *leaving, check=False).returncode != 0:
                self._exec(name, "iptables", "-t", "nat", "-A", *leaving)
            for other, (other_address, other_cidr) in nodes.items():
                if other != name:
                    self._exec(name, "ip", "route", "replace", other_cidr, "via", other_address)

    # -- queries --

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        run_kubectl = kubectl_runner(self.kubeconfig, error=ProvisionError)
        return run_kubectl(*args, input=input, check=check, timeout=timeout)

    def memory_bytes(self) -> dict[str, int]:
        """Each node container's memory use now (podman stats: its cgroup's usage)."""
        result = podman("stats", "--no-stream", "--format", "{{.Name}}\t{{.MemUsage}}", *self.nodes())
        return {
            name: _bytes(usage.split("/")[0])
            for line in result.stdout.splitlines()
            if "\t" in line
            for name, usage in [line.split("\t", 1)]
        }

    def _exec(
        self, node: str, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return podman("exec", "--interactive", node, *args, input=input, check=check, timeout=120)

    def _node_networks(self) -> dict[str, tuple[str, str]]:
        """node name -> (its InternalIP, its pod CIDR), from the API."""
        nodes = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)["items"]
        found = {}
        for node in nodes:
            address = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
            found[node["metadata"]["name"]] = (address, node["spec"].get("podCIDR", ""))
        return found

    def _api_addresses_current(self) -> bool:
        """Whether every node's InternalIP in the API is the address its container has now."""
        for name, (address, _) in self._node_networks().items():
            current = self._exec(name, "ip", "-4", "-o", "addr", "show", "eth0", check=False).stdout
            if f" {address}/" not in current:
                return False
        return True


def running_clusters() -> list[str]:
    """kind clusters whose node containers exist on this machine (kind's label on them)."""
    result = podman("ps", "--all", "--format", f'{{{{index .Labels "{CLUSTER_LABEL}"}}}}', check=False)
    return sorted({name for name in result.stdout.split() if name})


_UNITS = {"b": 1, "kb": 1000, "kib": 1024, "mb": 1000**2, "mib": 1024**2, "gb": 1000**3, "gib": 1024**3}


def _bytes(text: str) -> int:
    match = re.fullmatch(r"\s*([\d.]+)\s*([a-zA-Z]*)\s*", text)
    if not match:
        return 0
    return int(float(match.group(1)) * _UNITS.get(match.group(2).lower() or "b", 1))


# --- make kind-cluster / kind-cluster-down -------------------------------------------------------


def up(args: argparse.Namespace) -> int:
    cluster = KindCluster(args.name, Path(args.state_dir))
    if args.name in running_clusters():
        print(f"kind cluster {args.name} is already up: KUBECONFIG={cluster.kubeconfig}")
        return 0
    cluster.create(workers=args.workers)
    print(f"kind cluster {args.name}: {', '.join(cluster.nodes())}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def down(args: argparse.Namespace) -> int:
    KindCluster(args.name, Path(args.state_dir)).delete()
    shutil.rmtree(args.state_dir, ignore_errors=True)
    print(f"kind cluster {args.name} deleted")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.testbed.kind")
    sub = parser.add_subparsers(dest="command", required=True)
    for action, func in (("up", up), ("down", down)):
        command = sub.add_parser(action)
        command.add_argument("--name", default=DEFAULT_NAME)
        command.add_argument("--state-dir", default=str(DEFAULT_STATE_DIR))
        command.add_argument("--workers", type=int, default=2)
        command.set_defaults(func=func)
    return run_command(parser, list(argv) if argv is not None else None)


if __name__ == "__main__":
    sys.exit(main())
