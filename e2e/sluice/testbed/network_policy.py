"""Enforced NetworkPolicy: kube-router's network policy controller, built from its Go module.

kind enforces policies with sigs.k8s.io/kube-network-policies, which sends the connections it judges through
nftables' `queue` expression; this machine's kernel has no such expression (`nft add rule … queue num 98` says
"No such file or directory"), so that agent cannot drop anything here. kube-router's controller does the same
job with iptables, ipset and marks, which the kernel has. It runs on the host (like CoreDNS and the volume
provisioner) with its firewall alone: no routing, no service proxy. Connections to a pod that some policy
selects pass only when a policy admits them; connections from the node itself always pass (kube-router's
rule, as most agents').
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from .common import cache_dir
from .kube import SERVICE_CIDR, cached_binaries, go_install
from .versions import KUBE_ROUTER

NAME = "kube-router"
MODULE = "github.com/cloudnativelabs/kube-router/v2"
CLIENT_USER = "sluice:kube-router"
IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-", "kube-router-")  # what it made; its iptables chains are KUBE-*


def agent_binary() -> Path:
    def build(out: Path, names: list[str]) -> None:
        go_install(NAME, f"v{KUBE_ROUTER}", f"{MODULE}/cmd/kube-router", ["-s", "-w"], out, out.parent / "build.log")

    return cached_binaries(cache_dir(NAME, f"v{KUBE_ROUTER}"), [NAME], build)[NAME]


def agent_args(kubeconfig: Path, node_name: str, health_port: int) -> list[str]:
    return [
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        f"--kubeconfig={kubeconfig}",
        f"--hostname-override={node_name}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--health-port={health_port}",
        "--metrics-port=0",
        "--v=1",
    ]


def agent_rbac() -> list[dict[str, Any]]:
    """What its firewall reads: read-only."""
    read = ["get", "list", "watch"]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["nodes", "pods", "namespaces", "services", "endpoints"],
                    "verbs": read,
                },
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
                {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": read},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "User", "name": CLIENT_USER, "apiGroup": "rbac.authorization.k8s.io"}],
        },
    ]


def remove_ipsets() -> None:
    """Its ipsets, once no iptables rule refers to them (kube-router's own --cleanup-config crashes in v2.1.0)."""
    listed = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, timeout=30)
    for name in listed.stdout.split():
        if name.startswith(IPSET_PREFIXES):
            subprocess.run(["ipset", "destroy", name], capture_output=True, timeout=30)


def ingress_only_from(name: str, selected: dict[str, str], peers: dict[str, str], port: int) -> dict[str, Any]:
    """A NetworkPolicy: the pods labelled `selected` admit `port` only from pods labelled `peers`."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {
            "podSelector": {"matchLabels": selected},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": peers}}], "ports": [{"port": port}]}],
        },
    }
