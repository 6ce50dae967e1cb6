"""A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on loopback.

Binaries are built from source through the Go module proxy and cached by version; the processes run
envtest-style as plain local processes with a throwaway PKI. No nodes: nothing schedules pods unless a
node.Node joins a plane started with an advertise address (cluster.py puts the two together).
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from .common import (
    REPO_ROOT,
    PidfileProcesses,
    ProvisionError,
    cache_dir,
    free_ports,
    http_status,
    locked,
    pick_port,
    read_record,
    require_tool,
    run,
    wait_until,
)
from .versions import ETCD, KUBERNETES

# --- Go builds -------------------------------------------------------------------------------------

GO_HINT = (
    "install Go >= {min} (https://go.dev/dl or your package manager) and put it on PATH, "
    "or set GOTOOLCHAIN=auto to let an older Go fetch it"
)


MIN_GO = "1.26"  # the newest `go` directive among the pinned modules (helm, etcd)


def go_binary() -> str:
    return require_tool("go", GO_HINT.format(min=MIN_GO))


@functools.cache
def _go_env_values() -> tuple[str, str, str]:
    out = subprocess.run(
        [go_binary(), "env", "GOVERSION", "GOTOOLCHAIN", "GOPROXY"], capture_output=True, text=True
    ).stdout.splitlines()
    version, toolchain, proxy = [*out, "", "", ""][:3]
    return version, toolchain, proxy


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def require_go(minimum: str, needed_by: str) -> None:
    """Fail early and clearly when the local Go is older than a module's `go` directive."""
    version, toolchain, _ = _go_env_values()
    # Any GOTOOLCHAIN other than "local" lets go switch to a newer toolchain by itself.
    if toolchain.startswith("local") and _version_tuple(version) < _version_tuple(minimum):
        raise ProvisionError(
            f"{needed_by} needs Go >= {minimum} but found {version or 'unknown'}: " + GO_HINT.format(min=minimum)
        )


def go_env(**extra: str) -> dict[str, str]:
    # Static binaries like the official builds; no C toolchain needed.
    return {**os.environ, "CGO_ENABLED": "0", "GOWORK": "off", "GO111MODULE": "on", **extra}


def go_directive(gomod: str) -> str:
    match = re.search(r"^go\s+(\S+)", gomod, re.MULTILINE)
    return match.group(1) if match else "1.21"


def required_version(gomod: str, module: str) -> str | None:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod, re.MULTILINE)
    return match.group(1) if match else None


@dataclass(frozen=True)
class GoModule:
    path: str
    version: str
    gomod: str
    time: str  # commit time from the proxy, used as a reproducible build date
    commit: str = ""  # VCS revision the proxy recorded (its Origin), when it did
    directory: Path | None = None  # the extracted module in the module cache (read-only)


def fetch_go_module(path: str, version: str, log: Path) -> GoModule:
    """Download a module through GOPROXY and check the local Go can build it."""
    log.parent.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [go_binary(), "mod", "download", "-json", f"{path}@{version}"],
        capture_output=True,
        text=True,
        env=go_env(),
        cwd=log.parent,
    )
    with open(log, "a") as out:
        out.write(f"\n$ go mod download -json {path}@{version}\n{result.stdout}{result.stderr}")
    try:
        info = json.loads(result.stdout)
    except json.JSONDecodeError:
        info = {"Error": result.stderr.strip() or "no output"}
    if result.returncode != 0 or "Error" in info:
        first_line = str(info.get("Error", "")).strip().splitlines()[:1] or ["unknown error"]
        raise ProvisionError(
            f"could not fetch Go module {path}@{version} through GOPROXY="
            f"{_go_env_values()[2]}: {first_line[0]}; check access to the Go module proxy"
        )
    gomod = Path(info["GoMod"]).read_text()
    require_go(go_directive(gomod), f"{path}@{version}")
    published = json.loads(Path(info["Info"]).read_text())
    return GoModule(
        path,
        version,
        gomod,
        published.get("Time", ""),
        (published.get("Origin") or {}).get("Hash", ""),
        Path(info["Dir"]) if info.get("Dir") else None,
    )


def go_module_directory(path: str, version: str, log: Path) -> Path:
    """The module's extracted (read-only) directory in the Go module cache, downloaded once."""
    directory = fetch_go_module(path, version, log).directory
    if directory is None or not directory.is_dir():
        raise ProvisionError(
            f"{path}@{version} was downloaded but not extracted ({directory}); check `go env GOMODCACHE`"
        )
    return directory


_REPLACE = re.compile(r"^\s*(?:replace\s+)?(\S+(?:\s+v\S+)?\s*=>\s*\S+(?:\s+v\S+)?)\s*$")


def replace_directives(gomod: str) -> list[str]:
    """Every replace directive of a go.mod as "old [version] => new [version]" (block or single-line form).

    A module's replaces only apply when it is the main module, so a wrapper module that builds one of its
    commands has to repeat them.
    """
    replaces, in_block = [], False
    for raw in gomod.splitlines():
        line = raw.split("//")[0].strip()
        if in_block and line == ")":
            in_block = False
        elif re.fullmatch(r"replace\s*\(", line):
            in_block = True
        elif (in_block or line.startswith("replace ")) and (match := _REPLACE.match(line)):
            replaces.append(re.sub(r"\s+", " ", match.group(1)))
    return replaces


def xflags(package: str, values: dict[str, str]) -> list[str]:
    return [f"-X {package}.{key}={value}" for key, value in values.items() if value]


def announce(message: str) -> None:
    print(f"sluice: {message}", file=sys.stderr, flush=True)


def go_install(name: str, version: str, package: str, ldflags: Sequence[str], out: Path, log: Path) -> None:
    """`go install package@version` (reproducible: trimmed paths, no VCS stamp) into `out`, logged to `log`."""
    announce(f"building {name} {version} from source (once); log: {log}")
    run(
        [
            go_binary(),
            "install",
            "-trimpath",
            "-buildvcs=false",
            f"-ldflags={' '.join(ldflags)}",
            f"{package}@{version}",
        ],
        what=f"building {name} {version} with Go",
        hint="needs the Go module proxy (GOPROXY)",
        log=log,
        cwd=out,
        env=go_env(GOBIN=str(out)),
    )


def cached_binaries(root: Path, names: Sequence[str], build: Callable[[Path, list[str]], None]) -> dict[str, Path]:
    """`root`/bin/<name> for each name, building the missing ones once (under a lock) via build(out, names).

    build() writes into a scratch dir; finished binaries are moved into bin/ so a failed or interrupted
    build never leaves a half-written binary that would be mistaken for a cached one.
    """
    bin_dir = root / "bin"

    def missing() -> list[str]:
        return [name for name in names if not (bin_dir / name).is_file()]

    if missing():
        with locked(root / ".lock"):
            todo = missing()
            if todo:
                scratch = root / "bin.partial"
                shutil.rmtree(scratch, ignore_errors=True)
                scratch.mkdir(parents=True)
                build(scratch, todo)
                bin_dir.mkdir(exist_ok=True)
                for name in todo:
                    os.replace(scratch / name, bin_dir / name)
                shutil.rmtree(scratch, ignore_errors=True)
    return {name: bin_dir / name for name in names}


# --- Kubernetes and etcd binaries ------------------------------------------------------------------

K8S_COMPONENTS = (
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "kubeadm",  # kind nodes (sluice.testbed.kind)
)
DEFAULT_COMPONENTS = K8S_COMPONENTS[:3]  # what the control plane and tests need
K8S_BUILD_TAGS = "selinux,notest,grpcnotrace"  # what hack/lib/golang.sh uses for release builds
STAGING_VERSION = f"v0.{KUBERNETES.split('.', 1)[1]}"  # staging modules are published as v0.<minor>.<patch>


def staging_modules(gomod: str) -> list[str]:
    """Modules that kubernetes' go.mod replaces with its own ./staging tree (block or single-line form)."""
    return [
        old.split()[0]
        for old, new in (r.split("=>") for r in replace_directives(gomod))
        if new.strip().startswith("./staging/")
    ]


def staging_replacements(gomod: str, version: str = STAGING_VERSION) -> list[str]:
    return [f"{module} => {module} {version}" for module in staging_modules(gomod)]


def wrapper_gomod(kubernetes_gomod: str) -> str:
    """go.mod of a module that can build k8s.io/kubernetes commands from the module proxy."""
    keep = [line for line in kubernetes_gomod.splitlines() if re.match(r"(go|godebug)\s", line)]
    replaces = "".join(f"\t{line}\n" for line in staging_replacements(kubernetes_gomod))
    return (
        "module sluice.local/kubernetes-build\n\n" + "\n".join(keep) + "\n\n"
        f"require k8s.io/kubernetes v{KUBERNETES}\n\nreplace (\n{replaces})\n"
    )


def kubernetes_binaries(*names: str) -> dict[str, Path]:
    """Paths of the pinned Kubernetes binaries (default: apiserver, controller-manager, kubectl), built once."""
    names = names or DEFAULT_COMPONENTS
    unknown = sorted(set(names) - set(K8S_COMPONENTS))
    if unknown:
        raise ValueError(f"unknown Kubernetes components {unknown}; choose from {K8S_COMPONENTS}")
    return cached_binaries(cache_dir("kubernetes", f"v{KUBERNETES}"), names, _build_kubernetes)


def _build_kubernetes(out: Path, names: list[str]) -> None:
    root = out.parent
    log = root / "build.log"
    module = fetch_go_module("k8s.io/kubernetes", f"v{KUBERNETES}", log)
    workdir = root / "module"
    workdir.mkdir(exist_ok=True)
    (workdir / "go.mod").write_text(wrapper_gomod(module.gomod))
    major, minor = KUBERNETES.split(".")[:2]
    version = {
        "gitVersion": f"v{KUBERNETES}",
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": module.time,
    }
    ldflags = [
        "-s",
        "-w",
        *xflags("k8s.io/component-base/version", version),
        *xflags("k8s.io/client-go/pkg/version", version),
    ]
    announce(f"building {', '.join(names)} v{KUBERNETES} from source (once; 6-20 min cold on 2 cores); log: {log}")
    # -mod=mod lets go complete go.mod/go.sum for the generated module from the proxy.
    run(
        [
            go_binary(),
            "build",
            "-mod=mod",
            "-trimpath",
            "-buildvcs=false",
            f"-tags={K8S_BUILD_TAGS}",
            f"-ldflags={' '.join(ldflags)}",
            "-o",
            f"{out}/",
            *(f"k8s.io/kubernetes/cmd/{n}" for n in names),
        ],
        what=f"building Kubernetes {', '.join(names)} v{KUBERNETES} with Go",
        hint="needs the Go module proxy (GOPROXY) and a few GB of disk",
        log=log,
        cwd=workdir,
        env=go_env(),
    )


ETCD_MAIN = REPO_ROOT / "e2e" / "toolchain" / "etcd" / "main.go"


def etcd_binary() -> Path:
    return cached_binaries(cache_dir("etcd", f"v{ETCD}"), ["etcd"], _build_etcd)["etcd"]


def _build_etcd(out: Path, names: list[str]) -> None:
    root = out.parent
    log = root / "build.log"
    if not ETCD_MAIN.is_file():
        raise ProvisionError(f"{ETCD_MAIN} is missing: run from a sluice source checkout")
    module = fetch_go_module("go.etcd.io/etcd/server/v3", f"v{ETCD}", log)
    workdir = root / "module"
    workdir.mkdir(exist_ok=True)
    shutil.copyfile(ETCD_MAIN, workdir / "main.go")
    (workdir / "go.mod").write_text(
        f"module sluice.local/etcd\n\ngo {go_directive(module.gomod)}\n\nrequire go.etcd.io/etcd/server/v3 v{ETCD}\n"
    )
    announce(f"building etcd v{ETCD} from source (once); log: {log}")
    hint = "needs the Go module proxy (GOPROXY)"
    run(
        [go_binary(), "mod", "tidy"],
        what=f"resolving etcd v{ETCD} dependencies",
        hint=hint,
        log=log,
        cwd=workdir,
        env=go_env(),
    )
    run(
        [go_binary(), "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out / "etcd", "."],
        what=f"building etcd v{ETCD} with Go",
        hint=hint,
        log=log,
        cwd=workdir,
        env=go_env(),
    )


def prefetch_kubernetes() -> None:
    """Build everything the Kubernetes tests need, so the first test does not pay for it."""
    from .helm import helm_binary

    kubernetes_binaries(*DEFAULT_COMPONENTS)
    etcd_binary()
    helm_binary()


# --- PKI and kubeconfigs ---------------------------------------------------------------------------

SERVICE_CIDR = "10.0.0.0/16"  # room for a Service per app at 1,000 apps (make bench-operator)
KUBERNETES_SERVICE_IP = "10.0.0.1"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


def _apiserver_sans(advertise_address: str | None = None) -> list[Any]:
    from ipaddress import ip_address

    from cryptography import x509

    names = [
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    ips = ["127.0.0.1", "::1", KUBERNETES_SERVICE_IP, *([advertise_address] if advertise_address else [])]
    return [*map(x509.DNSName, names), *(x509.IPAddress(ip_address(ip)) for ip in ips)]


def issue_cert(
    common_name: str,
    key: Any,
    *,
    signer: tuple[Any, Any] | None,
    usage: str,
    organization: str | None = None,
    sans: Sequence[Any] = (),
) -> Any:
    """An X.509 certificate; usage is "ca", "server" or "client". signer None means self-signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attributes.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    subject = x509.Name(attributes)
    issuer_cert, issuer_key = signer if signer else (None, key)
    is_ca = usage == "ca"
    now = datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(hours=1))
        .not_valid_after(now + timedelta(days=3650 if is_ca else 825))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=not is_ca,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=is_ca,
                crl_sign=is_ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if not is_ca:
        purpose = ExtendedKeyUsageOID.SERVER_AUTH if usage == "server" else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def write_key_pair(directory: Path, name: str, cert: Any, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private_key(directory / f"{name}.key", key)


def _write_private_key(path: Path, key: Any) -> None:
    from cryptography.hazmat.primitives import serialization

    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def write_pki(directory: Path, advertise_address: str | None = None) -> None:
    """Cluster and front-proxy CAs, apiserver serving cert, client certs and the service-account keys.

    The serving cert also names advertise_address (what pods dial through the `kubernetes` Service).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    directory.mkdir(parents=True, exist_ok=True)

    def new_key() -> Any:
        return ec.generate_private_key(ec.SECP256R1())

    signers = {}
    for name in ("ca", "front-proxy-ca"):
        key = new_key()
        signers[name] = (issue_cert(f"sluice-local-{name}", key, signer=None, usage="ca"), key)
        write_key_pair(directory, name, *signers[name])
    leaves = [
        ("apiserver", "kube-apiserver", None, "server", _apiserver_sans(advertise_address), "ca"),
        ("admin", "kubernetes-admin", "system:masters", "client", [], "ca"),
        # How the apiserver authenticates to kubelets (logs, exec, port-forward); kubeadm's name.
        ("apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters", "client", [], "ca"),
        ("controller-manager", "system:kube-controller-manager", None, "client", [], "ca"),
        ("front-proxy-client", "front-proxy-client", None, "client", [], "front-proxy-ca"),
    ]
    for name, common_name, organization, usage, sans, signer in leaves:
        key = new_key()
        cert = issue_cert(common_name, key, signer=signers[signer], usage=usage, organization=organization, sans=sans)
        write_key_pair(directory, name, cert, key)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_private_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


def kubeconfig_text(server: str, pki: Path, user: str) -> str:
    """A self-contained kubeconfig (certs embedded) for the client cert pki/<user>.crt. JSON is valid YAML."""

    def data(name: str) -> str:
        return base64.b64encode((pki / name).read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "current-context": "sluice-local",
        "clusters": [
            {"name": "sluice-local", "cluster": {"server": server, "certificate-authority-data": data("ca.crt")}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": data(f"{user}.crt"), "client-key-data": data(f"{user}.key")},
            }
        ],
        "contexts": [{"name": "sluice-local", "context": {"cluster": "sluice-local", "user": user}}],
    }
    return json.dumps(config, indent=2) + "\n"


# --- the control plane -----------------------------------------------------------------------------

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager")  # start order


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its stderr."""


Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]
"""kubectl(*args, input=None, check=True, timeout=120) against one cluster; raises on failure when check."""


def kubectl_runner(
    kubeconfig: Path,
    *,
    binary: Path | None = None,
    cache_dir: Path | None = None,
    error: type[Exception] = KubectlError,
    default_timeout: float = 120.0,
) -> Kubectl:
    """kubectl(*args, input=, check=, timeout=) against one kubeconfig with the pinned kubectl; a non-zero exit
    raises `error` carrying kubectl's stderr (unless check=False)."""

    def kubectl(
        *args: str, input: str | None = None, check: bool = True, timeout: float = default_timeout
    ) -> subprocess.CompletedProcess[str]:
        command = [str(binary or kubernetes_binaries("kubectl")["kubectl"]), f"--kubeconfig={kubeconfig}"]
        if cache_dir is not None:
            command.append(f"--cache-dir={cache_dir}")
        result = subprocess.run([*command, *args], input=input, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise error(f"kubectl {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()}")
        return result

    return kubectl


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int

    @classmethod
    def free(cls) -> Ports:
        return cls(*free_ports(4))

    @classmethod
    def preferred(cls) -> Ports:
        """The usual ports when free, others where they are taken."""
        return cls(*(pick_port(port) for port in (2379, 2380, 6443, 10257)))


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager with all state (PKI, data, logs) under state_dir.

    Without advertise_address everything is on loopback. With it the plane is one nodes can join (see
    node.Node): the apiserver listens on all addresses and advertises that one, so the `kubernetes`
    Service reaches it from pods (the endpoint reconciler publishes it), and it reaches kubelets by their
    InternalIP with its own client certificate (apiserver-kubelet-client).
    """

    def __init__(self, state_dir: Path, ports: Ports | None = None, advertise_address: str | None = None) -> None:
        self.state_dir = state_dir.resolve()
        self.ports = ports or Ports.free()
        self.advertise_address = advertise_address
        self._processes = PidfileProcesses(self.state_dir)

    @classmethod
    def attach(cls, state_dir: Path) -> ControlPlane | None:
        """The control plane recorded in state_dir by an earlier start(), possibly by another process."""
        recorded = read_record(state_dir / "cluster.json")
        if recorded is None:
            return None
        try:
            return cls(state_dir, Ports(**recorded["ports"]), recorded.get("advertise_address"))
        except (KeyError, TypeError):  # written by another version
            return None

    @property
    def kubeconfig(self) -> Path:
        return self.state_dir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    def start(self, timeout: float = 180.0) -> ControlPlane:
        binaries = {**kubernetes_binaries(*DEFAULT_COMPONENTS), "etcd": etcd_binary()}
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "cluster.json").write_text(
            json.dumps({"ports": asdict(self.ports), "advertise_address": self.advertise_address})
        )
        try:
            write_pki(self.pki, self.advertise_address)
            self.kubeconfig.write_text(kubeconfig_text(self.server, self.pki, "admin"))
            (self.state_dir / "controller-manager.kubeconfig").write_text(
                kubeconfig_text(self.server, self.pki, "controller-manager")
            )
            checks = {
                "etcd": self._etcd_healthy,
                "kube-apiserver": self._apiserver_ready,
                "kube-controller-manager": self._controller_manager_healthy,
            }
            for name in COMPONENTS:
                process = self._processes.launch(name, [str(binaries[name]), *self._args(name)])
                wait_until(checks[name], timeout=timeout, what=f"{name} to become healthy", process=process)
            # The service-account controller creating "default" proves the controllers are working.
            wait_until(
                lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default") == 200,
                timeout=timeout,
                what="the default service account",
                process=self._processes.started["kube-controller-manager"],
            )
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every component (own children, or via pidfiles after attach()); safe to call repeatedly.

        The etcd data (64 MB of preallocated WAL) goes too; PKI, kubeconfig and logs stay for debugging.
        """
        for name in reversed(COMPONENTS):
            self._processes.stop(name)
        shutil.rmtree(self.state_dir / "etcd", ignore_errors=True)

    def pids(self) -> dict[str, int]:
        return self._processes.pids(COMPONENTS)

    def healthy(self) -> bool:
        return len(self.pids()) == len(COMPONENTS) and self._apiserver_ready()

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        run_kubectl = kubectl_runner(self.kubeconfig, cache_dir=self.state_dir / "kubectl-cache")
        return run_kubectl(*args, input=input, check=check, timeout=timeout)

    def get_json(self, path: str) -> Any:
        """GET an API path as the cluster admin (e.g. "/version")."""
        with urllib.request.urlopen(self.server + path, context=self._admin_tls, timeout=10) as response:
            return json.load(response)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals --

    def _args(self, name: str) -> list[str]:
        p, pki, state = self.ports, self.pki, self.state_dir
        if name == "etcd":
            peer, client = f"http://127.0.0.1:{p.etcd_peer}", f"http://127.0.0.1:{p.etcd_client}"
            # --unsafe-no-fsync: scratch clusters trade durability for speed.
            return [
                "--name=sluice",
                f"--data-dir={state / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=sluice={peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ]
        if name == "kube-apiserver":
            return [
                f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
                *self._apiserver_address_args(),
                f"--secure-port={p.apiserver}",
                f"--cert-dir={state / 'apiserver'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-issuer={SA_ISSUER}",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--allow-privileged=true",
                "--profiling=false",
                *self._aggregation_args(),
            ]
        kubeconfig = state / "controller-manager.kubeconfig"
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            f"--cert-dir={state / 'controller-manager'}",
            "--controllers=*",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=true",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
        ]

    def _apiserver_address_args(self) -> list[str]:
        if self.advertise_address is None:
            # Endpoints may not point at loopback, and nothing in-cluster could reach it anyway.
            return ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"]
        # Kubelet names do not resolve here: dial them by the InternalIP they report.
        return [
            "--bind-address=0.0.0.0",
            f"--advertise-address={self.advertise_address}",
            "--endpoint-reconciler-type=lease",
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={self.pki / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={self.pki / 'apiserver-kubelet-client.key'}",
        ]

    def _aggregation_args(self) -> list[str]:
        """Front-proxy (request-header) auth, as in kubeadm clusters; controllers expect its CA bundle."""
        return [
            f"--requestheader-client-ca-file={self.pki / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.pki / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={self.pki / 'front-proxy-client.key'}",
        ]

    @functools.cached_property
    def _admin_tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        context.load_cert_chain(self.pki / "admin.crt", self.pki / "admin.key")
        return context

    def _get(self, url_or_path: str, context: ssl.SSLContext | None = None) -> int:
        """HTTP status of a GET (0 when the server is not answering yet); API paths go as the admin."""
        url = url_or_path if "://" in url_or_path else self.server + url_or_path
        if context is None and url.startswith(self.server):
            context = self._admin_tls
        return http_status(url, context)

    def _etcd_healthy(self) -> bool:
        return self._get(f"http://127.0.0.1:{self.ports.etcd_client}/health") == 200

    def _apiserver_ready(self) -> bool:
        return self._get("/readyz") == 200

    def _controller_manager_healthy(self) -> bool:
        # Its serving cert is self-signed; only liveness matters here.
        insecure = ssl._create_unverified_context()
        return self._get(f"https://127.0.0.1:{self.ports.controller_manager}/healthz", insecure) == 200
