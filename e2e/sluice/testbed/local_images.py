"""The images the local cluster runs, built here without Docker or a registry.

    Debian rootfs (debootstrap: images.base_image) ─▶ buildah: images/base, the stand-in for
    apache/spark:4.2.0-python3 and python:3.11-slim ─▶ buildah: images/spark and images/operator, the
    Dockerfiles `make images` builds, on that base through their base ARG ─▶ buildah: images/spark-operator
    (the kubeflow spark-operator built from its Go module, on the same base: spark-submit needs Spark)
    ─▶ OCI archives ─▶ containerd's k8s.io namespace (Node.import_image checks the names arrived).

buildah (Debian's) keeps its storage and layer cache under the sluice cache; builds never reach a package
index or a registry (`--network none`, `--pull=never`): wheels and jars come in the build contexts.

LocalImagesRun is a cluster with these images (the local one or kind) and the host processes the e2e suite
uses beside it; secured_kafka starts the SASL_SSL-only broker among them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.pipelines.local.kafka import KafkaCluster

from .common import REPO_ROOT, ProvisionError, cache_dir, locked, run
from .e2e_suite import E2ESuite, HostKafka, Images, SecuredHostKafka, SecuredKafka, Target, image_builder
from .images import BASE_IMAGE, CONTAINERD_NAME, OCI_REF_NAME, base_image, full_name, image_archive
from .kafka_security import secured_listener
from .node import RUNTIME_ROOT, install_packages
from .object_store import ObjectStoreAccess
from .versions import SPARK_OPERATOR

if TYPE_CHECKING:
    from .previous_release import PreviousRelease

BUILDAH_PACKAGES = ("buildah",)
SPARK_OPERATOR_REPOSITORY = "sluice.local/spark-operator"  # tagged with its version
SPARK_OPERATOR_DOCKERFILE = REPO_ROOT / "images" / "spark-operator" / "Dockerfile"
LOCAL_IMAGES = ("base", "spark", "operator", "spark-operator")  # build order


def _storage() -> list[str]:
    return ["--root", str(cache_dir("buildah", "storage")), "--runroot", str(RUNTIME_ROOT / "buildah")]


def buildah(*args: str, what: str) -> str:
    """buildah on the sluice storage; its output, or one line naming the step and the log."""
    log = cache_dir("buildah") / "buildah.log"
    result = subprocess.run(["buildah", *_storage(), *args], capture_output=True, text=True)
    with open(log, "a") as out:
        out.write(f"\n$ buildah {' '.join(args)}\n{result.stdout[-4000:]}{result.stderr[-4000:]}")
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ProvisionError(f"{what} failed: {last}; see {log}")
    return result.stdout


def build_command() -> list[str]:
    return ["buildah", *_storage(), "build", "--layers", "--network", "none", "--pull=never", "--quiet"]


def image_id(name: str) -> str | None:
    result = subprocess.run(
        ["buildah", *_storage(), "inspect", "--type", "image", "--format", "{{.FromImageID}}", name],
        capture_output=True,
        text=True,
    )
    return result.stdout.strip() or None if result.returncode == 0 else None


def debian_base() -> str:
    """The debootstrapped Debian image in buildah's storage, under a name keyed by its content."""
    spec, key = base_image()
    name = f"{BASE_IMAGE.rsplit(':', 1)[0]}:{key}"
    if image_id(name) is None:
        pulled = (
            buildah(
                "pull",
                "--quiet",
                f"oci-archive:{image_archive(spec, key)}",
                what="loading the Debian base image into buildah",
            )
            .strip()
            .splitlines()[-1]
        )
        buildah("tag", pulled, name, what=f"tagging {name}")
    return name


def export(name: str) -> Path:
    """The image as an OCI archive containerd imports under its full name; cached by image id."""
    digest = image_id(name)
    if digest is None:
        raise ProvisionError(f"buildah has no image {name}")
    safe = name.replace("/", "_").replace(":", "_")
    out = cache_dir("local-images") / f"{safe}-{digest[:16]}.oci.tar"
    if out.is_file():
        return out
    with locked(out.with_suffix(".lock")):
        if out.is_file():
            return out
        for stale in out.parent.glob(f"{safe}-*.oci.tar"):
            stale.unlink()
        layout = out.with_suffix(".dir")
        shutil.rmtree(layout, ignore_errors=True)
        buildah("push", "--quiet", "--disable-compression", name, f"oci:{layout}:{name}", what=f"exporting {name}")
        index = json.loads((layout / "index.json").read_text())
        for manifest in index["manifests"]:
            manifest.setdefault("annotations", {}).update({CONTAINERD_NAME: full_name(name), OCI_REF_NAME: name})
        (layout / "index.json").write_text(json.dumps(index))
        partial = out.with_suffix(".partial")
        entries = sorted(p.name for p in layout.iterdir())  # index.json at the top, not ./index.json
        run(
            ["tar", "-C", layout, "-cf", partial, *entries],
            what=f"packing {name}",
            hint="needs tar and disk space",
            log=cache_dir("local-images") / "tar.log",
        )
        partial.rename(out)
        shutil.rmtree(layout)
    return out


def spark_operator_context(root: Path) -> Path:
    """images/spark-operator's context: its Dockerfile, the binary and the module's entrypoint.sh."""
    from .external_crds import spark_operator_module
    from .spark_operator import spark_operator_binary

    context = root / "spark-operator"
    shutil.rmtree(context, ignore_errors=True)
    context.mkdir(parents=True)
    shutil.copy2(SPARK_OPERATOR_DOCKERFILE, context / "Dockerfile")
    shutil.copy2(spark_operator_binary(), context / "spark-operator")
    shutil.copy2(spark_operator_module() / "entrypoint.sh", context / "entrypoint.sh")
    (context / "entrypoint.sh").chmod(0o755)  # the module cache is read-only
    return context


def build_local_images(names: Sequence[str] = LOCAL_IMAGES) -> dict[str, Path]:
    """Build the images (a subset of LOCAL_IMAGES, in that order) and export each: {full name: archive}."""
    install_packages(BUILDAH_PACKAGES)
    build = image_builder()
    root = cache_dir("local-images", "contexts")
    with locked(cache_dir("local-images") / "build.lock"):
        stand_in = build.IMAGES["base"].tag
        sluice = [name for name in names if name in build.IMAGES]
        contexts = build.prepare_contexts(sluice, root)
        archives = {}
        for name in (n for n in LOCAL_IMAGES if n in names):
            try:
                if name == "spark-operator":
                    image = build.Image(name, SPARK_OPERATOR_REPOSITORY, (), tag_version=SPARK_OPERATOR)
                    context = spark_operator_context(root)
                else:
                    context, image = contexts[name], build.IMAGES[name]
                build.build_image(build_command(), image, context, debian_base() if name == "base" else stand_in)
            except build.BuildError as error:
                raise ProvisionError(str(error)) from error
            archives[full_name(image.tag)] = export(image.tag)
        return archives


def spark_operator_chart_values() -> dict[str, Any]:
    """The spark-operator chart on the image built here; no webhook (sluice's SparkApplications carry their
    pods' settings as Spark pod templates, which Spark applies itself)."""
    registry, repository = SPARK_OPERATOR_REPOSITORY.split("/", 1)
    return {
        "image": {"registry": registry, "repository": repository, "tag": SPARK_OPERATOR},
        "webhook": {"enable": False},
    }


@dataclass(frozen=True)
class LocalImagesRun:
    """A cluster of the test bed's (local or kind) with the images built here, and the host processes the suite
    uses beside it: the object store and the Kafka broker, which takes only SASL_SSL from pods."""

    target: Target
    object_store: ObjectStoreAccess
    secured_kafka: SecuredKafka
    lose_node: Callable[[str], None] | None = None  # a cluster of several nodes: one of them lost for good
    previous: PreviousRelease | None = None  # a release to install first and upgrade from

    def suite(self) -> E2ESuite:
        """The e2e suite there: spark-operator from its chart on its image, the test bed's Prometheus; its apps
        log in to Kafka with SCRAM over TLS, their password and CA from Secrets."""
        return E2ESuite(
            self.target,
            Images.release(),
            SecuredHostKafka(self.secured_kafka),
            strimzi=False,
            spark_operator=spark_operator_chart_values(),
            object_store_access=self.object_store,
            prometheus=True,
            secured_kafka_access=self.secured_kafka,
            lose_node=self.lose_node,
            previous=self.previous,
        )


@contextlib.contextmanager
def secured_kafka(host: str, directory: Path, user: str = "sluice-app") -> Iterator[SecuredKafka]:
    """A broker of its own whose only listener on `host` is SASL_SSL (a certificate for `host`, SCRAM user `user`);
    its plaintext listener is on loopback, for the test's own reads and writes. Stopped on exit."""
    listener = secured_listener(directory / "pki", [host], [user])
    cluster = KafkaCluster.on_free_ports(directory, host=host, secured=listener)

    def restart() -> None:
        for process in cluster.processes:
            process.stop()
            process.start()
        cluster.wait_ready(120)

    try:
        cluster.start()
        yield SecuredKafka(
            cluster.secured_bootstrap,
            HostKafka(cluster.bootstrap),
            user,
            listener.users[user],
            listener.truststore.read_text(),
            restart,
        )
    finally:
        cluster.stop()
