"""The kubeflow spark-operator binary (controller and webhook), built from its Go module and cached by version.

What the upstream image builds (`make build-operator`: `go build -o bin/spark-operator cmd/operator/main.go`
with CGO_ENABLED=0 and k8s.io/component-base/version ldflags), here from the Go module proxy: a generated
wrapper module requires github.com/kubeflow/spark-operator/v2 at the pinned version and repeats the
module's own replace directives, which Go only honours in the main module.
"""

from __future__ import annotations

from pathlib import Path

from .common import ProvisionError, cache_dir, run
from .external_crds import SPARK_OPERATOR_MODULE
from .kube import (
    announce,
    cached_binaries,
    fetch_go_module,
    go_binary,
    go_directive,
    go_env,
    replace_directives,
    xflags,
)
from .versions import SPARK_OPERATOR

SPARK_OPERATOR_BINARY = "spark-operator"  # /usr/bin/spark-operator in the upstream image
SPARK_OPERATOR_MAIN = f"{SPARK_OPERATOR_MODULE}/cmd/operator"


def spark_operator_binary() -> Path:
    """The pinned spark-operator binary (`spark-operator controller start` / `webhook start`), built once."""
    root = cache_dir("spark-operator", f"v{SPARK_OPERATOR}")
    return cached_binaries(root, [SPARK_OPERATOR_BINARY], _build_spark_operator)[SPARK_OPERATOR_BINARY]


def operator_wrapper_gomod(operator_gomod: str, version: str = f"v{SPARK_OPERATOR}") -> str:
    """go.mod of a module that builds the spark-operator commands from the module proxy."""
    replaces = replace_directives(operator_gomod)
    local = [line for line in replaces if line.split("=>")[1].strip().startswith((".", "/"))]
    if local:
        raise ProvisionError(
            f"{SPARK_OPERATOR_MODULE}@{version} replaces {local[0]!r} with a local path, which a "
            "build from the module proxy cannot follow; pin a spark-operator version without it"
        )
    lines = "".join(f"\t{line}\n" for line in replaces)
    block = f"\nreplace (\n{lines})\n" if replaces else ""
    return (
        f"module sluice.local/spark-operator-build\n\ngo {go_directive(operator_gomod)}\n\n"
        f"require {SPARK_OPERATOR_MODULE} {version}\n{block}"
    )


def _build_spark_operator(out: Path, names: list[str]) -> None:
    root = out.parent
    log = root / "build.log"
    version = f"v{SPARK_OPERATOR}"
    module = fetch_go_module(SPARK_OPERATOR_MODULE, version, log)
    workdir = root / "module"
    workdir.mkdir(exist_ok=True)
    (workdir / "go.mod").write_text(operator_wrapper_gomod(module.gomod, version))
    # The values the Makefile's LDFLAGS stamp; `spark-operator version` prints them.
    stamp = {"gitVersion": version, "gitCommit": module.commit, "gitTreeState": "clean", "buildDate": module.time}
    ldflags = ["-s", "-w", *xflags("k8s.io/component-base/version", stamp)]
    announce(f"building spark-operator {version} from source (once; a few minutes cold); log: {log}")
    # -mod=mod lets go complete go.mod/go.sum for the generated module from the proxy.
    run(
        [
            go_binary(),
            "build",
            "-mod=mod",
            "-trimpath",
            "-buildvcs=false",
            f"-ldflags={' '.join(ldflags)}",
            "-o",
            out / SPARK_OPERATOR_BINARY,
            SPARK_OPERATOR_MAIN,
        ],
        what=f"building spark-operator {version} with Go",
        hint="needs the Go module proxy (GOPROXY)",
        log=log,
        cwd=workdir,
        env=go_env(),
    )
