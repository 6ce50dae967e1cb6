"""A real worker node for the local control plane: containerd, CNI, kubelet, kube-proxy, scheduler, CoreDNS.

Composes with kube.ControlPlane: `Node(plane, state_dir).start()` turns a control plane started with
`advertise_address=NODE_ADDRESS` into a single-node cluster that runs real pods. What runs where:

* containerd, runc and the CNI plugins (bridge, host-local, portmap, loopback) come from Debian's
  packages; containerd runs as a plain process with its own config, sockets under /run/sluice/<id>/.
* kube-scheduler, kubelet and kube-proxy are the pinned Kubernetes release, built like the control plane.
* CoreDNS is `go install`ed at a pinned release and runs on the host with a kubeconfig.
* The sandbox (pause) image and the test images are built here (images.py) and imported into
  containerd's k8s.io namespace: nothing is pulled from a registry.

The node has a non-loopback address of its own (NODE_ADDRESS, added to `lo`): the apiserver advertises it
so the `kubernetes` Service reaches it from pods, the kubelet reports it as the node's InternalIP (which
the apiserver dials) and CoreDNS serves on it. A node changes machine-wide state (that address, the
bridge, iptables rules, cgroups, two sysctls), so one runs per machine at a time; stop() undoes all of it
but the sysctls.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .common import (
    PidfileProcesses,
    ProvisionError,
    cache_dir,
    free_ports,
    http_status,
    locked,
    read_record,
    require_tool,
    run,
    stop_process_group,
    wait_until,
)
from .images import archive_names, base_image, full_name, image_archive, pause_image, probe_image
from .kube import (
    ControlPlane,
    announce,
    cached_binaries,
    fetch_go_module,
    go_install,
    issue_cert,
    kubeconfig_text,
    kubernetes_binaries,
    write_key_pair,
)
from .network_policy import CLIENT_USER as NETWORK_POLICY_USER
from .network_policy import agent_args, agent_binary, agent_rbac, remove_ipsets
from .object_store import ObjectStoreAccess, create_bucket, gateway_args, gateway_binary, gateway_env
from .storage import (
    BUSYBOX_PACKAGE,
    helper_image,
    provisioner_args,
    provisioner_binary,
    provisioner_config,
    storage_manifests,
)
from .storage import CLIENT_USER as STORAGE_USER
from .versions import COREDNS, KUBERNETES

NODE_NAME = "sluice-node"
NODE_ADDRESS = "10.245.0.1"  # on lo: the node's InternalIP, the apiserver's advertised address, DNS
CLUSTER_CIDR = "10.244.0.0/16"
POD_SUBNET = "10.244.0.0/24"  # this node's share, handed out by host-local
BRIDGE = "sluice0"
CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins

DEBIAN_PACKAGES = (
    "containerd",
    "runc",
    "containernetworking-plugins",
    "iptables",
    "conntrack",
    BUSYBOX_PACKAGE,  # the volume provisioner's helper image
    "ipset",  # the NetworkPolicy agent's
)
NODE_COMPONENTS = (  # start order
    "containerd",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "coredns",
    "local-path-provisioner",
    "kube-router",
    "object-store",
)
SYSCTLS = {"net/ipv4/ip_forward": "1", "net/bridge/bridge-nf-call-iptables": "1"}
RUNTIME_ROOT = Path("/run/sluice")
OWNER_FILE = RUNTIME_ROOT / "node.owner"  # the state dir of the node this machine runs
# The kubelet's directory sits at a short path whatever the state dir: it binds unix sockets inside it,
# whose paths may not exceed 107 bytes (a pytest tmp dir alone can come close).
KUBELET_ROOT = Path("/var/lib/sluice")


# --- host preparation ------------------------------------------------------------------------------


def missing_packages(packages: Iterable[str] = DEBIAN_PACKAGES) -> list[str]:
    def installed(name: str) -> bool:
        result = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True)
        return result.returncode == 0 and result.stdout.strip() == "install ok installed"

    return [name for name in packages if not installed(name)]


def install_packages(packages: Iterable[str] = DEBIAN_PACKAGES) -> None:
    """apt-get install what is missing (as root); one ProvisionError line when that is not possible."""
    missing = missing_packages(packages)
    if not missing:
        return
    require_tool("apt-get", f"install {' '.join(missing)} with your package manager")
    if os.geteuid() != 0:
        raise ProvisionError(
            f"a local node needs root to install {' '.join(missing)} (apt-get) and to run containerd and the kubelet"
        )
    log = cache_dir("node") / "apt.log"
    announce(f"installing {' '.join(missing)} from Debian; log: {log}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with locked(cache_dir("locks") / "apt.lock"):
        run(["apt-get", "update"], what="apt-get update", hint="needs Debian's package mirror", log=log, env=env)
        run(
            ["apt-get", "install", "-y", "--no-install-recommends", *missing],
            what="apt-get install",
            hint=f"install {' '.join(missing)} by hand",
            log=log,
            env=env,
        )


def check_host() -> None:
    """What a node needs from the kernel; sets the two sysctls the CNI bridge and kube-proxy rely on."""
    if os.geteuid() != 0:
        raise ProvisionError("a local node needs root (containerd, kubelet, iptables, network namespaces)")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise ProvisionError("the kernel has no overlayfs, which containerd's snapshotter needs")
    if not Path("/proc/sys/net/bridge").is_dir() and shutil.which("modprobe"):
        subprocess.run(["modprobe", "br_netfilter"], capture_output=True)
    if not Path("/proc/sys/net/bridge").is_dir():
        raise ProvisionError("bridge netfilter is off and `modprobe br_netfilter` did not load it (Services need it)")
    for key, value in SYSCTLS.items():
        path = Path("/proc/sys") / key
        if path.read_text().strip() != value:
            path.write_text(value)


def machine_owner() -> Path | None:
    try:
        return Path(OWNER_FILE.read_text().strip())
    except FileNotFoundError:
        return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise ProvisionError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def add_node_address(address: str = NODE_ADDRESS) -> None:
    """The node's own address on lo (the kernel here has no dummy interfaces); idempotent."""
    if f" {address}/" not in _ip("-o", "-4", "addr", "show", "dev", "lo").stdout:
        _ip("addr", "add", f"{address}/32", "dev", "lo")


def remove_node_network(address: str = NODE_ADDRESS) -> None:
    _ip("addr", "del", f"{address}/32", "dev", "lo", check=False)
    _ip("link", "del", BRIDGE, check=False)


# --- binaries and images --------------------------------------------------------------------------

NODE_BINARIES = ("kube-scheduler", "kubelet", "kube-proxy")  # from the pinned Kubernetes release


def node_binaries() -> dict[str, Path]:
    return {
        **kubernetes_binaries(*NODE_BINARIES),
        "coredns": coredns_binary(),
        "local-path-provisioner": provisioner_binary(),
        "kube-router": agent_binary(),
        "object-store": gateway_binary(),
    }


def node_archives() -> list[Path]:
    """The OCI archives every node imports: the sandbox (pause) image, the probe test image and the volume
    provisioner's helper (busybox, installed from Debian first: the archive's key hashes it)."""
    install_packages((BUSYBOX_PACKAGE,))
    return [image_archive(spec) for spec in (pause_image(), probe_image(), helper_image())]


def prefetch_node() -> None:
    """Build and install what a node and its tests need, so that starting one does not pay for it.

    The Debian packages and the Debian base image need root; without it they are skipped with a note
    (a node needs root anyway).
    """
    node_binaries()
    packages = (*DEBIAN_PACKAGES, "debootstrap")  # debootstrap: the Debian base image
    if os.geteuid() != 0:
        missing = missing_packages(packages)
        announce(
            "not root: skipping "
            + (f"{' '.join(missing)} and " if missing else "")
            + "the node's images (a local node needs root)"
        )
        return
    install_packages(packages)
    node_archives()
    image_archive(*base_image())


def coredns_binary() -> Path:
    return cached_binaries(cache_dir("coredns", f"v{COREDNS}"), ["coredns"], _build_coredns)["coredns"]


def _build_coredns(out: Path, names: list[str]) -> None:
    log = out.parent / "build.log"
    fetch_go_module("github.com/coredns/coredns", f"v{COREDNS}", log)
    go_install("CoreDNS", f"v{COREDNS}", "github.com/coredns/coredns", ["-s", "-w"], out, log)


# --- PKI and configuration -------------------------------------------------------------------------


@dataclass(frozen=True)
class NodePorts:
    kubelet: int
    kubelet_healthz: int
    scheduler: int
    proxy_healthz: int
    proxy_metrics: int
    coredns_health: int
    coredns_ready: int
    network_policy_health: int
    object_store: int

    @classmethod
    def free(cls) -> NodePorts:
        return cls(*free_ports(9))


# (file name, common name, organization): client certificates signed by the cluster CA.
CLIENTS = (
    ("kubelet", f"system:node:{NODE_NAME}", "system:nodes"),
    ("kube-scheduler", "system:kube-scheduler", None),
    ("kube-proxy", "system:kube-proxy", None),
    ("coredns", "system:coredns", None),
    ("local-path-provisioner", STORAGE_USER, None),
    ("kube-router", NETWORK_POLICY_USER, None),
)


def _load_ca(pki: Path) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), password=None)
    return cert, key


def write_node_pki(plane_pki: Path, directory: Path, address: str) -> None:
    """Client certs for the node's components and the kubelet's serving cert, from the plane's CA."""
    from ipaddress import ip_address

    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plane_pki / "ca.crt", directory / "ca.crt")
    signer = _load_ca(plane_pki)
    for name, common_name, organization in CLIENTS:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = issue_cert(common_name, key, signer=signer, usage="client", organization=organization)
        write_key_pair(directory, name, cert, key)
    sans = [
        x509.DNSName(NODE_NAME),
        x509.DNSName("localhost"),
        *(x509.IPAddress(ip_address(ip)) for ip in (address, "127.0.0.1")),
    ]
    key = ec.generate_private_key(ec.SECP256R1())
    cert = issue_cert(NODE_NAME, key, signer=signer, usage="server", sans=sans)
    write_key_pair(directory, "kubelet-serving", cert, key)


def _yaml(value: object) -> str:
    return json.dumps(value, indent=2) + "\n"  # JSON is valid YAML


def containerd_config(root: Path, state: Path, socket: Path, cni_conf_dir: Path) -> str:
    """containerd 1.6 config: CRI with runc on cgroupfs, overlayfs, the local pause image, our CNI dir."""
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    return f"""version = 2
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

{cri}
  sandbox_image = "{pause_image().name}"
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  # Root here may lack CAP_SYS_RESOURCE and so cannot lower oom_score_adj (the sandbox asks for -998).
  restrict_oom_score_adj = true

{cri[:-1]}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

{cri[:-1]}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{cri[:-1]}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{state / "runc"}"

{cri[:-1]}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf_dir}"
"""


def cni_config(ipam_dir: Path) -> dict[str, Any]:
    """bridge + host-local + portmap. No masquerading: pods talk to the node and each other only."""
    bridge = {
        "type": "bridge",
        "bridge": BRIDGE,
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "dataDir": str(ipam_dir),
            "ranges": [[{"subnet": POD_SUBNET}]],
            "routes": [{"dst": "0.0.0.0/0"}],
        },
    }
    return {
        "cniVersion": "1.0.0",
        "name": "sluice",
        "plugins": [bridge, {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True}],
    }


def kubelet_config(*, pki: Path, ports: NodePorts, runtime_socket: Path, state: Path, address: str) -> dict[str, Any]:
    minimal_eviction = {
        "memory.available": "50Mi",
        "nodefs.available": "1%",
        "nodefs.inodesFree": "1%",
        "imagefs.available": "1%",
    }
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": ports.kubelet_healthz,
        "tlsCertFile": str(pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{runtime_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [address],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": "",
        "podLogsDir": str(state / "pod-logs"),
        "volumePluginDir": str(state / "volume-plugins"),
        # A scratch node on a shared machine: never evict or garbage-collect the locally built images.
        "evictionHard": minimal_eviction,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def kube_proxy_config(kubeconfig: Path, ports: NodePorts) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": CLUSTER_CIDR,
        "healthzBindAddress": f"127.0.0.1:{ports.proxy_healthz}",
        "metricsBindAddress": f"127.0.0.1:{ports.proxy_metrics}",
        # Leave the host's conntrack sysctls alone.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def corefile(kubeconfig: Path, ports: NodePorts, address: str) -> str:
    """Cluster names only: no `forward`, so nothing is asked of resolvers outside this machine."""
    return f""".:53 {{
    bind {address}
    errors
    health 127.0.0.1:{ports.coredns_health}
    ready 127.0.0.1:{ports.coredns_ready}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} sluice-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
}}
"""


COREDNS_RBAC = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}],
        },
    ],
}


# --- the node --------------------------------------------------------------------------------------


class Node:
    """One worker node for `plane`, all state under state_dir (sockets under /run/sluice/<id>).

    The plane must advertise the node's address (ControlPlane(..., advertise_address=NODE_ADDRESS)).
    """

    def __init__(
        self,
        plane: ControlPlane,
        state_dir: Path | None = None,
        *,
        address: str = NODE_ADDRESS,
        ports: NodePorts | None = None,
        archives: Iterable[Path] = (),
    ) -> None:
        self.plane = plane
        self.state_dir = (state_dir or plane.state_dir / "node").resolve()
        self.address = address
        self.ports = ports or NodePorts.free()
        self.extra_archives = list(archives)  # more OCI archives to import, e.g. images.image_archive(...)
        digest = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]
        self.runtime_dir = RUNTIME_ROOT / digest
        self.kubelet_dir = KUBELET_ROOT / digest / "kubelet"
        self._processes = PidfileProcesses(self.state_dir)

    @classmethod
    def attach(cls, plane: ControlPlane, state_dir: Path | None = None) -> Node | None:
        """The node recorded in state_dir by an earlier start(), possibly by another process."""
        node = cls(plane, state_dir)
        recorded = read_record(node.state_dir / "node.json")
        if recorded is None:
            return None
        try:
            node.ports = NodePorts(**recorded["ports"])
        except (KeyError, TypeError):  # written by another version
            return None
        node.address = recorded.get("address", node.address)
        return node

    # -- paths --

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    @property
    def containerd_socket(self) -> Path:
        return self.runtime_dir / "containerd.sock"

    def kubeconfig(self, user: str) -> Path:
        return self.state_dir / f"{user}.kubeconfig"

    @property
    def object_store(self) -> ObjectStoreAccess:
        """The node's S3-compatible store: its endpoint on the node's address, its bucket and key pair."""
        return ObjectStoreAccess.load(self.state_dir / "object-store.json")

    @property
    def volume_root(self) -> Path:
        """Where the node's dynamically provisioned volumes live (removed with the node)."""
        return self.kubelet_dir.parent / "volumes"

    # -- lifecycle --

    def start(self, timeout: float = 180.0) -> Node:
        if self.plane.advertise_address != self.address:
            raise ProvisionError(
                f"the control plane in {self.plane.state_dir} advertises "
                f"{self.plane.advertise_address or 'only loopback'}, not the node's {self.address}: "
                f"start it with ControlPlane(..., advertise_address={self.address!r})"
            )
        install_packages()
        check_host()
        binaries = node_binaries()
        archives = [*node_archives(), *self.extra_archives]
        self._claim_machine()
        try:
            self._write_config()
            add_node_address(self.address)
            self._start_containerd(timeout)
            for archive in archives:
                self.import_image(archive)
            self._start_component("kube-scheduler", binaries, self._scheduler_healthy, timeout)
            self._start_component("kubelet", binaries, self._kubelet_healthy, timeout)
            wait_until(
                self.ready,
                timeout=timeout,
                what=f"node {NODE_NAME} to become Ready",
                process=self._processes.started["kubelet"],
            )
            self._start_component("kube-proxy", binaries, self._proxy_healthy, timeout)
            self.plane.kubectl("apply", "-f", "-", input=json.dumps(COREDNS_RBAC))
            self._start_component("coredns", binaries, self._coredns_ready, timeout)
            self.plane.kubectl("apply", "-f", "-", input=json.dumps(_list(agent_rbac())))
            self._start_component("kube-router", binaries, self._network_policy_healthy, timeout)
            self.plane.kubectl("apply", "-f", "-", input=json.dumps(_list(storage_manifests(self._volume_roots()))))
            self._start_component("local-path-provisioner", binaries, self._provisioner_started, timeout)
            self._start_component("object-store", binaries, self.object_store.healthy, timeout)
            create_bucket(self.object_store)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop everything and undo the node's changes to the machine; safe to call repeatedly.

        Only the node that owns the machine touches machine-wide state (a node that never started, e.g.
        because another one runs, leaves that one alone). Logs, config and PKI stay for debugging.
        """
        for name in (
            "object-store",
            "kube-router",
            "local-path-provisioner",
            "coredns",
            "kube-proxy",
            "kube-scheduler",
        ):
            self._processes.stop(name)
        self._drain_pods()
        self._processes.stop("kubelet")
        self._processes.stop("containerd")
        if not self.owns_machine():
            return
        self._kill_shims()
        self._cleanup_iptables()
        remove_ipsets()
        self._unmount_all()
        remove_cgroups("kubepods")
        remove_node_network(self.address)
        leftover = mounts_under(self.state_dir, self.runtime_dir, self.kubelet_dir)
        if leftover:
            raise ProvisionError(
                f"could not unmount {leftover[0]} (and {len(leftover) - 1} more): left {self.state_dir} in place"
            )
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
        shutil.rmtree(self.kubelet_dir.parent, ignore_errors=True)  # pod volumes
        shutil.rmtree(self.state_dir / "containerd", ignore_errors=True)  # images, snapshots
        OWNER_FILE.unlink(missing_ok=True)

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- queries --

    def ready(self) -> bool:
        result = self.plane.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """containerd's own CLI on this node's socket, in the k8s.io namespace the CRI plugin uses."""
        cmd = ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise ProvisionError(f"ctr {' '.join(args)} failed: {result.stderr.strip()}")
        return result

    def import_image(self, archive: Path) -> None:
        """Import an OCI archive into the k8s.io namespace and check its names arrived (ctr can import
        nothing without saying so, e.g. when the index names a bare tag)."""
        self.ctr("images", "import", str(archive))
        present = set(self.ctr("images", "ls", "-q").stdout.split())
        missing = [name for name in archive_names(archive) if name not in present]
        if missing or not archive_names(archive):
            raise ProvisionError(
                f"importing {archive} into containerd gave no image named "
                f"{', '.join(missing) or '(the archive names none)'}"
            )

    def tag_image(self, image: str, alias: str) -> None:
        """A second name for an imported image in the node's containerd: an image change that pulls nothing."""
        self.ctr("images", "tag", "--force", full_name(image), full_name(alias))

    def images(self) -> list[str]:
        """Image names as the kubelet sees them through CRI (what `crictl images` would list)."""
        node = json.loads(self.plane.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)
        return sorted(
            name
            for image in node["status"].get("images", [])
            for name in image.get("names", [])
            if not name.startswith("sha256:")
        )

    # -- internals: start --

    def _claim_machine(self) -> None:
        """One node per machine: its address, bridge, iptables rules and cgroups are machine-wide.

        A node whose processes are all gone (a killed test run) is cleaned up and replaced.
        """
        RUNTIME_ROOT.mkdir(parents=True, exist_ok=True)
        with locked(RUNTIME_ROOT / "node.lock"):
            owner = machine_owner()
            if owner is not None and owner != self.state_dir:
                stale = Node(ControlPlane.attach(owner.parent) or ControlPlane(owner.parent), owner)
                if stale.running():
                    raise ProvisionError(
                        f"another local node is running on this machine (state in {owner}): stop it first"
                    )
                stale.stop()
            OWNER_FILE.write_text(str(self.state_dir))

    def owns_machine(self) -> bool:
        return machine_owner() in (None, self.state_dir)

    def pids(self) -> dict[str, int]:
        return self._processes.pids(NODE_COMPONENTS)

    def running(self) -> bool:
        """Whether any of this node's processes is alive (also when started by another process)."""
        return bool(self.pids())

    def healthy(self) -> bool:
        """Every component alive and the node Ready."""
        return len(self.pids()) == len(NODE_COMPONENTS) and self.ready()

    def _write_config(self) -> None:
        state, pki = self.state_dir, self.pki
        for path in (state / "logs", state / "cni" / "net.d", self.runtime_dir):
            path.mkdir(parents=True, exist_ok=True)
        (state / "node.json").write_text(json.dumps({"ports": asdict(self.ports), "address": self.address}))
        write_node_pki(self.plane.pki, pki, self.address)
        server = self.plane.server
        for name, _, _ in CLIENTS:
            self.kubeconfig(name).write_text(kubeconfig_text(server, pki, name))
        (state / "containerd.toml").write_text(
            containerd_config(
                state / "containerd", self.runtime_dir / "containerd", self.containerd_socket, state / "cni" / "net.d"
            )
        )
        (state / "cni" / "net.d" / "10-sluice.conflist").write_text(_yaml(cni_config(state / "cni" / "ipam")))
        (state / "kubelet.yaml").write_text(
            _yaml(
                kubelet_config(
                    pki=pki, ports=self.ports, runtime_socket=self.containerd_socket, state=state, address=self.address
                )
            )
        )
        (state / "kube-proxy.yaml").write_text(_yaml(kube_proxy_config(self.kubeconfig("kube-proxy"), self.ports)))
        (state / "Corefile").write_text(corefile(self.kubeconfig("coredns"), self.ports, self.address))
        (state / "local-path.json").write_text(json.dumps(provisioner_config(self._volume_roots())))
        ObjectStoreAccess.new(self.address, self.ports.object_store).save(state / "object-store.json")
        (state / "objects").mkdir(exist_ok=True)  # the store's buckets

    def _volume_roots(self) -> dict[str, Path]:
        return {NODE_NAME: self.volume_root}

    def _args(self, name: str) -> list[str]:
        state = self.state_dir
        if name == "containerd":
            return [f"--config={state / 'containerd.toml'}", "--log-level=warn"]
        if name == "kube-scheduler":
            kubeconfig = self.kubeconfig("kube-scheduler")
            return [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports.scheduler}",
                f"--cert-dir={state / 'kube-scheduler'}",
                "--profiling=false",
            ]
        if name == "kubelet":
            return [
                f"--config={state / 'kubelet.yaml'}",
                f"--kubeconfig={self.kubeconfig('kubelet')}",
                f"--root-dir={self.kubelet_dir}",
                f"--cert-dir={self.kubelet_dir / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.address}",
                "--v=1",
            ]
        if name == "kube-proxy":
            return [f"--config={state / 'kube-proxy.yaml'}", "--v=1"]
        if name == "local-path-provisioner":
            return provisioner_args(self.kubeconfig("local-path-provisioner"), state / "local-path.json")
        if name == "kube-router":
            return agent_args(self.kubeconfig("kube-router"), NODE_NAME, self.ports.network_policy_health)
        if name == "object-store":
            return gateway_args(self.object_store, state / "objects")
        return ["-conf", str(state / "Corefile")]  # coredns

    def _env(self, name: str) -> dict[str, str] | None:
        """A component's environment when it needs its own (None: the test bed's)."""
        return gateway_env(self.object_store) if name == "object-store" else None

    def _start_containerd(self, timeout: float) -> None:
        binary = Path(require_tool("containerd", "apt-get install containerd"))
        self._start_component(
            "containerd", {"containerd": binary}, lambda: self.ctr("version", check=False).returncode == 0, timeout
        )

    def _start_component(self, name: str, binaries: dict[str, Path], healthy: Any, timeout: float) -> None:
        started = time.monotonic()
        process = self._processes.launch(name, [str(binaries[name]), *self._args(name)], env=self._env(name))
        wait_until(healthy, timeout=timeout, what=f"{name} to become healthy", process=process)
        announce(f"node: {name} up in {time.monotonic() - started:.1f}s")

    def _scheduler_healthy(self) -> bool:
        # Its serving cert is self-signed; only liveness matters here.
        return http_status(f"https://127.0.0.1:{self.ports.scheduler}/healthz", ssl._create_unverified_context()) == 200

    def _kubelet_healthy(self) -> bool:
        return http_status(f"http://127.0.0.1:{self.ports.kubelet_healthz}/healthz") == 200

    def _proxy_healthy(self) -> bool:
        return http_status(f"http://127.0.0.1:{self.ports.proxy_healthz}/healthz") == 200

    def _coredns_ready(self) -> bool:
        return http_status(f"http://127.0.0.1:{self.ports.coredns_ready}/ready") == 200

    def _network_policy_healthy(self) -> bool:
        return http_status(f"http://127.0.0.1:{self.ports.network_policy_health}/healthz") == 200

    def _provisioner_started(self) -> bool:
        log = self.state_dir / "logs" / "local-path-provisioner.log"
        return log.is_file() and "Started provisioner controller" in log.read_text(errors="replace")

    # -- internals: stop --

    def _drain_pods(self, timeout: float = 60.0) -> None:
        """Let the kubelet tear pods down through CRI (CNI DEL, unmounts) while it and the API still run."""
        if self._processes.recorded_pid("kubelet") is None:
            return
        with contextlib.suppress(Exception):
            self.plane.kubectl(
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                "--grace-period=0",
                "--force",
                "--wait=false",
                check=False,
            )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self._running_tasks():
                time.sleep(0.5)

    def _running_tasks(self) -> list[str]:
        result = self.ctr("tasks", "ls", check=False)
        return (
            [line.split()[0] for line in result.stdout.splitlines()[1:] if line.split() and "RUNNING" in line]
            if result.returncode == 0
            else []
        )

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes (and their containers) started for this node's containerd."""
        marker = os.fsencode(str(self.containerd_socket))
        for pid in _pids():
            cmdline = _cmdline(pid)
            if b"containerd-shim" in cmdline and marker in cmdline:
                for child in _descendants(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child, 9)
                stop_process_group(pid, grace=5)

    def _cleanup_iptables(self) -> None:
        """kube-proxy's rules (its own --cleanup), then the KUBE-* chains the kubelet adds."""
        proxy = cache_dir("kubernetes", f"v{KUBERNETES}") / "bin" / "kube-proxy"  # never build while stopping
        if proxy.is_file() and shutil.which("iptables"):
            subprocess.run([str(proxy), "--cleanup"], capture_output=True, timeout=60)
        for tool in ("iptables", "ip6tables"):
            if shutil.which(tool):
                remove_chains(tool, ("KUBE-", "CNI-"))

    def _unmount_all(self) -> None:
        for _ in range(3):
            for mount in mounts_under(self.state_dir, self.runtime_dir, self.kubelet_dir):
                subprocess.run(["umount", "-l", mount], capture_output=True)


# --- machine-level helpers -------------------------------------------------------------------------


def _list(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": items}


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for candidate in _pids():
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(Path(f"/proc/{candidate}/stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(candidate)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def mounts_under(*roots: Path) -> list[str]:
    """Mount points below any of roots, deepest first (from /proc/self/mountinfo)."""
    prefixes = [str(root.resolve()) + "/" for root in roots]
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point.startswith(prefix) or point + "/" == prefix for prefix in prefixes):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def remove_chains(tool: str, prefixes: tuple[str, ...]) -> None:
    """Unhook and delete every chain whose name starts with one of prefixes, in every table."""
    saved = subprocess.run([f"{tool}-save"], capture_output=True, text=True).stdout
    table, chains, hooks = "", [], []
    for line in saved.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":") and line[1:].startswith(prefixes):
            chains.append((table, line[1:].split()[0]))
        elif line.startswith("-A ") and not line.split()[1].startswith(prefixes):
            words = shlex.split(line)
            if "-j" in words and words[words.index("-j") + 1].startswith(prefixes):
                hooks.append((table, words[1:]))
    for table, rule in hooks:
        subprocess.run([tool, "-w", "-t", table, "-D", *rule], capture_output=True)
    for flag in ("-F", "-X"):
        for table, chain in chains:
            subprocess.run([tool, "-w", "-t", table, flag, chain], capture_output=True)


def remove_cgroups(name: str) -> None:
    """rmdir /sys/fs/cgroup/<controller>/<name> trees (cgroup v1) or /sys/fs/cgroup/<name> (v2), leaves first."""
    root = Path("/sys/fs/cgroup")
    tops = [controller / name for controller in root.iterdir() if (controller / name).is_dir()]
    if (root / name).is_dir():
        tops.append(root / name)
    for top in tops:
        for directory in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True):
            with contextlib.suppress(OSError):
                directory.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
