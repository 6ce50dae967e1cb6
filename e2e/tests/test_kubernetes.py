"""The real control plane: CRDs, garbage collection, pinned versions, loopback and advertised addresses."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.testbed.common import wait_until
from sluice.testbed.kube import (
    ControlPlane,
    KubectlError,
    etcd_binary,
    kubernetes_binaries,
    staging_replacements,
    wrapper_gomod,
    write_pki,
)
from sluice.testbed.versions import ETCD, KUBERNETES

CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.testing.sluice.dev
spec:
  group: testing.sluice.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size: {type: integer}
                color: {type: string}
"""


def widget(name: str, size: Any) -> str:
    return (
        f"apiVersion: testing.sluice.dev/v1\nkind: Widget\nmetadata:\n  name: {name}\n"
        f"spec:\n  size: {size}\n  color: blue\n"
    )


def get_json(plane: ControlPlane, *args: str) -> dict[str, Any]:
    return json.loads(plane.kubectl("get", *args, "-o", "json").stdout)


def is_gone(plane: ControlPlane, *args: str) -> bool:
    return plane.kubectl("get", *args, "--ignore-not-found", "-o", "name").stdout.strip() == ""


@pytest.fixture
def namespace(kube_cluster: ControlPlane) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kube_cluster.kubectl("create", "namespace", name)
    yield name
    kube_cluster.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="module")
def widget_crd(kube_cluster: ControlPlane) -> str:
    kube_cluster.kubectl("apply", "-f", "-", input=CRD)
    kube_cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.testing.sluice.dev")
    return "widgets.testing.sluice.dev"


def test_custom_object_round_trips_through_the_api_server(
    kube_cluster: ControlPlane, widget_crd: str, namespace: str
) -> None:
    kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget("w1", 3))

    stored = get_json(kube_cluster, "-n", namespace, "widget", "w1")

    assert stored["kind"] == "Widget"
    assert stored["spec"] == {"size": 3, "color": "blue"}
    assert stored["metadata"]["namespace"] == namespace
    assert stored["metadata"]["uid"]


def test_api_server_validates_custom_objects_against_the_crd_schema(
    kube_cluster: ControlPlane, widget_crd: str, namespace: str
) -> None:
    with pytest.raises(KubectlError, match=r"spec\.size"):
        kube_cluster.kubectl("apply", "-n", namespace, "-f", "-", input=widget("bad", '"big"'))


def test_garbage_collector_deletes_dependents_of_a_deleted_owner(kube_cluster: ControlPlane, namespace: str) -> None:
    kube_cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner_uid = get_json(kube_cluster, "-n", namespace, "configmap", "owner")["metadata"]["uid"]
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}],
        },
    }
    kube_cluster.kubectl("apply", "-f", "-", input=json.dumps(dependent))

    kube_cluster.kubectl("delete", "configmap", "owner", "-n", namespace)

    wait_until(
        lambda: is_gone(kube_cluster, "-n", namespace, "configmap", "dependent"),
        timeout=120,
        interval=1,
        what="the garbage collector to delete the dependent ConfigMap",
    )


def test_binaries_report_the_pinned_versions(kube_cluster: ControlPlane) -> None:
    versions = json.loads(kube_cluster.kubectl("version", "-o", "json").stdout)
    controller_manager = kubernetes_binaries("kube-controller-manager")["kube-controller-manager"]

    assert versions["clientVersion"]["gitVersion"] == f"v{KUBERNETES}"
    assert versions["serverVersion"]["gitVersion"] == f"v{KUBERNETES}"
    assert kube_cluster.get_json("/version")["gitVersion"] == f"v{KUBERNETES}"
    assert f"v{KUBERNETES}" in run_version(controller_manager)
    assert f"etcd Version: {ETCD}" in run_version(etcd_binary())


def run_version(binary: Path) -> str:
    return subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=True).stdout


def test_a_plane_with_an_advertise_address_is_reachable_from_nodes(tmp_path: Path) -> None:
    from cryptography import x509

    plane = ControlPlane(tmp_path, advertise_address="10.245.0.1")
    write_pki(plane.pki, plane.advertise_address)

    args = plane._args("kube-apiserver")
    assert {
        "--bind-address=0.0.0.0",
        "--advertise-address=10.245.0.1",
        "--endpoint-reconciler-type=lease",
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={plane.pki / 'apiserver-kubelet-client.crt'}",
    } <= set(args)
    serving = x509.load_pem_x509_certificate((plane.pki / "apiserver.crt").read_bytes())
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.245.0.1" in {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    client = x509.load_pem_x509_certificate((plane.pki / "apiserver-kubelet-client.crt").read_bytes())
    assert client.subject.rfc4514_string() == "CN=kube-apiserver-kubelet-client,O=system:masters"


def test_a_plane_without_an_advertise_address_stays_on_loopback(tmp_path: Path) -> None:
    args = ControlPlane(tmp_path)._args("kube-apiserver")
    assert {"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"} <= set(args)
    assert not [arg for arg in args if arg.startswith("--kubelet-")]


def test_staging_modules_are_replaced_by_their_published_versions() -> None:
    gomod = """module k8s.io/kubernetes

go 1.24.0

godebug default=go1.24

require (
\tgithub.com/foo/bar v1.2.3
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tgithub.com/foo/bar => github.com/fork/bar v1.2.4
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go v0.0.0 => ./staging/src/k8s.io/client-go // pinned
)

replace k8s.io/kubectl => ./staging/src/k8s.io/kubectl
"""
    assert staging_replacements(gomod, "v0.34.4") == [
        "k8s.io/api => k8s.io/api v0.34.4",
        "k8s.io/client-go => k8s.io/client-go v0.34.4",
        "k8s.io/kubectl => k8s.io/kubectl v0.34.4",
    ]
    wrapper = wrapper_gomod(gomod)
    assert "go 1.24.0\n" in wrapper and "godebug default=go1.24\n" in wrapper
    assert f"require k8s.io/kubernetes v{KUBERNETES}\n" in wrapper
    assert "github.com/fork/bar" not in wrapper
