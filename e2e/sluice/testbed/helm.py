"""Helm, built from source through the Go module proxy and cached by version."""

from __future__ import annotations

from pathlib import Path

from .common import cache_dir
from .kube import cached_binaries, fetch_go_module, go_install, required_version, xflags
from .versions import HELM

HELM_MODULE = "helm.sh/helm/v3"


def helm_binary() -> Path:
    return cached_binaries(cache_dir("helm", f"v{HELM}"), ["helm"], _build_helm)["helm"]


def _build_helm(out: Path, names: list[str]) -> None:
    log = out.parent / "build.log"
    module = fetch_go_module(HELM_MODULE, f"v{HELM}", log)
    ldflags = ["-s", "-w", *xflags(f"{HELM_MODULE}/internal/version", {"version": f"v{HELM}", "gitTreeState": "clean"})]
    # Helm's Makefile also stamps the Kubernetes version it was built against (client-go v0.X → 1.X).
    client_go = required_version(module.gomod, "k8s.io/client-go")
    if client_go:
        major, minor = client_go.lstrip("v").split(".")[:2]
        k8s = {"k8sVersionMajor": str(int(major) + 1), "k8sVersionMinor": minor}
        for package in ("pkg/lint/rules", "pkg/chartutil"):
            ldflags += xflags(f"{HELM_MODULE}/{package}", k8s)
    go_install("helm", f"v{HELM}", f"{HELM_MODULE}/cmd/helm", ldflags, out, log)
