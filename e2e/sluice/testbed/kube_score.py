"""kube-score (a static checker of Kubernetes manifests), built from its Go module and cached by version."""

from __future__ import annotations

from pathlib import Path

from .common import cache_dir
from .kube import cached_binaries, fetch_go_module, go_install, xflags
from .versions import KUBE_SCORE

KUBE_SCORE_MODULE = "github.com/zegl/kube-score"


def kube_score_binary() -> Path:
    return cached_binaries(cache_dir("kube-score", f"v{KUBE_SCORE}"), ["kube-score"], _build_kube_score)["kube-score"]


def _build_kube_score(out: Path, names: list[str]) -> None:
    log = out.parent / "build.log"
    module = fetch_go_module(KUBE_SCORE_MODULE, f"v{KUBE_SCORE}", log)
    stamp = {"version": KUBE_SCORE, "commit": module.commit, "date": module.time}
    ldflags = ["-s", "-w", *xflags("main", stamp)]
    go_install("kube-score", f"v{KUBE_SCORE}", f"{KUBE_SCORE_MODULE}/cmd/kube-score", ldflags, out, log)
