"""CRDs of the operators sluice drives, so the test API server validates the children it creates.

The Prometheus Operator's (PodMonitor, ServiceMonitor, PrometheusRule) come from its Go module: the chart
renders its monitors and alerts where the cluster serves them (sluice.testbed.prometheus).

spark-operator's CRDs (and its Helm chart) come from its Go module through the Go module proxy. Strimzi
publishes no CRD YAML on Maven Central, so its CRDs are generated with Strimzi's own crd-generator from
its io.strimzi artifacts, with the arguments Strimzi's api module build uses (see the api POM).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from sluice.pipelines.local.maven import fetch_jars

from .common import ProvisionError, cache_dir, locked, run
from .kube import KubectlError, go_module_directory
from .prometheus import monitoring_crds
from .versions import SPARK_OPERATOR, STRIMZI

SPARK_OPERATOR_MODULE = "github.com/kubeflow/spark-operator/v2"
STRIMZI_API_VERSION = "v1"  # the only (and storage) version Strimzi 1.x serves
STRIMZI_MIN_JAVA = 21  # Strimzi 1.x is compiled for Java 21
STRIMZI_KINDS = {
    "KafkaTopic": "io.strimzi.api.kafka.model.topic.KafkaTopic",
    "Kafka": "io.strimzi.api.kafka.model.kafka.Kafka",
    "KafkaNodePool": "io.strimzi.api.kafka.model.nodepool.KafkaNodePool",
}
FIELD_MANAGER = "sluice-testbed"


# --- spark-operator --------------------------------------------------------------------------------


@functools.cache
def spark_operator_module() -> Path:
    """The spark-operator module's (read-only) directory in the Go module cache, downloaded once."""
    version = f"v{SPARK_OPERATOR}"
    return go_module_directory(SPARK_OPERATOR_MODULE, version, cache_dir("spark-operator", version) / "fetch.log")


def spark_operator_crds() -> list[Path]:
    """SparkApplication, ScheduledSparkApplication and SparkConnect (sparkoperator.k8s.io/v1beta2)."""
    crds = sorted((spark_operator_module() / "config" / "crd" / "bases").glob("*.yaml"))
    if not crds:
        raise ProvisionError(
            f"no CRDs under config/crd/bases in {SPARK_OPERATOR_MODULE}@v{SPARK_OPERATOR}; "
            "pin a spark-operator version that ships them"
        )
    return crds


def spark_operator_chart() -> Path:
    """The spark-operator Helm chart directory (read-only: copy it before `helm dependency` writes)."""
    chart = spark_operator_module() / "charts" / "spark-operator-chart"
    if not (chart / "Chart.yaml").is_file():
        raise ProvisionError(
            f"{SPARK_OPERATOR_MODULE}@v{SPARK_OPERATOR} has no charts/spark-operator-chart; "
            "pin a spark-operator version that ships its Helm chart"
        )
    return chart


# --- Strimzi ---------------------------------------------------------------------------------------


def strimzi_crds() -> list[Path]:
    """KafkaTopic, Kafka and KafkaNodePool CRDs (kafka.strimzi.io/v1), generated once per Strimzi version."""
    root = cache_dir("strimzi", STRIMZI)
    crds = [root / "crds" / f"{kind.lower()}.yaml" for kind in STRIMZI_KINDS]
    if not all(crd.is_file() for crd in crds):
        with locked(root / ".crds.lock"):
            if not all(crd.is_file() for crd in crds):
                _generate_strimzi_crds(root)
    return crds


def _generate_strimzi_crds(root: Path) -> None:
    java = java_at_least(STRIMZI_MIN_JAVA, f"Strimzi {STRIMZI}'s crd-generator")
    jars = fetch_jars(
        f"strimzi-{STRIMZI}", [f"io.strimzi:api:{STRIMZI}", f"io.strimzi:crd-generator:{STRIMZI}"], root / "jars"
    )
    scratch = root / "crds.partial"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    run(
        [
            java,
            "-cp",
            os.pathsep.join(map(str, jars)),
            "io.strimzi.crdgenerator.CrdGenerator",
            "--label",
            "app:strimzi",
            "--label",
            "strimzi.io/crd-install:true",
            "--target-kube",
            "1.16+",
            "--crd-api-version",
            "v1",
            "--api-versions",
            STRIMZI_API_VERSION,
            "--storage-version",
            STRIMZI_API_VERSION,
            "--yaml",
            *(f"{cls}={scratch / f'{kind.lower()}.yaml'}" for kind, cls in STRIMZI_KINDS.items()),
        ],
        what=f"generating the Strimzi {STRIMZI} CRDs with io.strimzi:crd-generator",
        hint=f"needs io.strimzi:api and crd-generator {STRIMZI} from Maven Central",
        log=root / "generate.log",
    )
    missing = [kind for kind in STRIMZI_KINDS if not (scratch / f"{kind.lower()}.yaml").is_file()]
    if missing:
        raise ProvisionError(
            f"Strimzi {STRIMZI}'s crd-generator wrote no CRD for {', '.join(missing)}; see {root / 'generate.log'}"
        )
    shutil.rmtree(root / "crds", ignore_errors=True)
    scratch.rename(root / "crds")


def _java_candidates() -> Iterator[Path]:
    if home := os.environ.get("JAVA_HOME"):
        yield Path(home) / "bin" / "java"
    if on_path := shutil.which("java"):
        yield Path(on_path)
    yield from sorted(Path("/usr/lib/jvm").glob("*/bin/java"))


def java_major(java: Path) -> int:
    """The feature version `java -version` reports (8 for "1.8.0"), 0 when it cannot say."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except OSError:
        return 0
    match = re.search(r'version "(?:1\.)?(\d+)', out)
    return int(match.group(1)) if match else 0


@functools.cache
def java_at_least(major: int, needed_by: str) -> Path:
    """A java >= major from JAVA_HOME, PATH or /usr/lib/jvm (a second JDK beside the default one)."""
    for java in _java_candidates():
        if java.is_file() and java_major(java) >= major:
            return java
    raise ProvisionError(
        f"{needed_by} needs Java >= {major} but JAVA_HOME, PATH and /usr/lib/jvm have none: "
        f"install a JDK >= {major} (e.g. Eclipse Temurin) and set JAVA_HOME to it"
    )


# --- installing ------------------------------------------------------------------------------------


def external_crds() -> list[Path]:
    return [*spark_operator_crds(), *strimzi_crds(), *monitoring_crds()]


def install_external_crds(
    kubectl: Callable[..., Any], timeout: float = 60.0, crds: Sequence[Path] | None = None
) -> None:
    """Server-side apply the external CRDs (`crds`, or all of them) and wait until all are Established.

    kubectl(*args) runs kubectl against the target cluster and raises KubectlError on failure, like
    ControlPlane.kubectl. Server-side because the SparkApplication CRD is too big for the annotation
    client-side apply keeps; idempotent, so clusters that already have the CRDs are fine.
    """
    files = [arg for crd in (external_crds() if crds is None else crds) for arg in ("-f", str(crd))]
    try:
        kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={FIELD_MANAGER}", *files)
        kubectl("wait", "--for=condition=Established", f"--timeout={timeout:.0f}s", *files)
    except KubectlError as error:
        first = str(error).strip().splitlines()[0][:400]
        raise ProvisionError(
            f"installing the spark-operator, Strimzi or Prometheus Operator CRDs failed: {first}"
        ) from error


def prefetch_external_crds() -> None:
    """Download the spark-operator module and generate the Strimzi CRDs, so tests only apply them."""
    spark_operator_crds()
    spark_operator_chart()
    strimzi_crds()
    monitoring_crds()
