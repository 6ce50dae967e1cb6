"""Node-local dynamic volumes, as kind has them: rancher's local-path-provisioner behind the default StorageClass.

A claim of the class waits for its first pod (WaitForFirstConsumer); the provisioner then makes a directory on
the node the scheduler chose, through a helper pod there, and a PersistentVolume pinned to that node. So a
ReadWriteOnce claim lives on one node, as a cloud disk does on a real cluster. The provisioner runs on the
host with a kubeconfig of its own (like CoreDNS); its helper pods run a busybox image built here from Debian's
busybox-static.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .common import cache_dir
from .images import ImageSpec
from .kube import cached_binaries, go_install
from .manifests import cluster_role_with_binding
from .versions import LOCAL_PATH_PROVISIONER

PROVISIONER = "rancher.io/local-path"
STORAGE_CLASS = "local-path"
NAMESPACE = "local-path-storage"
SERVICE_ACCOUNT = "local-path-provisioner"
CONFIG_MAP = "local-path-config"
CLIENT_USER = "sluice:local-path-provisioner"  # the host process's client certificate
HELPER_IMAGE = "sluice.local/busybox:1"
BUSYBOX_PACKAGE = "busybox-static"  # from Debian
BUSYBOX = Path("/bin/busybox")  # what it installs
HELPER_TOOLS = ("sh", "mkdir", "rm", "chmod", "cat", "ls", "sleep")  # the scripts' (and tests') commands

SETUP = 'set -eu\nmkdir -m 0777 -p "$VOL_DIR"\n'
TEARDOWN = 'set -eu\nrm -rf "$VOL_DIR"\n'


def provisioner_binary() -> Path:
    def build(out: Path, names: list[str]) -> None:
        go_install(
            "local-path-provisioner",
            f"v{LOCAL_PATH_PROVISIONER}",
            "github.com/rancher/local-path-provisioner",
            ["-s", "-w"],
            out,
            out.parent / "build.log",
        )

    root = cache_dir("local-path-provisioner", f"v{LOCAL_PATH_PROVISIONER}")
    return cached_binaries(root, ["local-path-provisioner"], build)["local-path-provisioner"]


def helper_image() -> ImageSpec:
    """busybox as each of HELPER_TOOLS: it picks the applet by the name it runs under."""
    return ImageSpec(HELPER_IMAGE, ["/bin/sh"], {f"/bin/{tool}": BUSYBOX for tool in HELPER_TOOLS})


def provisioner_config(volume_roots: dict[str, Path]) -> dict[str, Any]:
    """Where each node keeps its volumes (node name -> directory)."""
    return {"nodePathMap": [{"node": node, "paths": [str(root)]} for node, root in sorted(volume_roots.items())]}


def helper_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "priorityClassName": "system-node-critical",
            "tolerations": [{"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "helper-pod", "image": HELPER_IMAGE, "imagePullPolicy": "Never"}],
        },
    }


def storage_manifests(volume_roots: dict[str, Path]) -> list[dict[str, Any]]:
    """The provisioner's namespace, account, rights, configuration and the default StorageClass."""
    rules = [
        {
            "apiGroups": [""],
            "resources": ["nodes", "persistentvolumeclaims", "configmaps", "pods", "pods/log"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": [""],
            "resources": ["persistentvolumes"],
            "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
        },
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]},
    ]
    helper_rules = [
        {
            "apiGroups": [""],
            "resources": ["pods"],
            "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
        }
    ]
    subjects = [
        {"kind": "User", "name": CLIENT_USER, "apiGroup": "rbac.authorization.k8s.io"},
        {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
    ]
    name = "local-path-provisioner"
    return [
        # Its helper pods mount node directories: the one namespace here where that is allowed.
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": NAMESPACE, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
        },
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE}},
        *cluster_role_with_binding(name, rules, subjects),
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "rules": helper_rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": subjects,
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
            "data": {
                "config.json": json.dumps(provisioner_config(volume_roots)),
                "setup": SETUP,
                "teardown": TEARDOWN,
                "helperPod.yaml": json.dumps(helper_pod()),
            },
        },
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
            "reclaimPolicy": "Delete",
        },
    ]


def provisioner_args(kubeconfig: Path, config_file: Path) -> list[str]:
    return [
        "--debug",
        "start",
        f"--kubeconfig={kubeconfig}",
        f"--config={config_file}",
        f"--namespace={NAMESPACE}",
        f"--configmap-name={CONFIG_MAP}",
        f"--service-account-name={SERVICE_ACCOUNT}",
        f"--helper-image={HELPER_IMAGE}",
        f"--provisioner-name={PROVISIONER}",
    ]
