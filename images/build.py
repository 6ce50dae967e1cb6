"""Build the sluice images with docker, podman or buildah: `make images` (= `python images/build.py`).

Each image's build context is prepared under .sluice/images/<name>/: its Dockerfile, the sluice wheel
(`pip wheel --no-deps`), requirements.txt (the runtime dependencies that image needs: pyproject.toml's
dependencies and the image's extra, `operator` or `runner`, with their pins), wheels/ (those requirements
as wheels for the image's Python, CPython 3.11 on Linux of this machine's architecture, so a build reaches
no package index) and, for the Spark image, the runner and the Kafka connector jars
and hadoop-aws with the AWS SDK modules it needs (sluice.pipelines.local.spark.spark_image_jars(), matching
pyspark), so a driver fetches nothing when it starts and checkpoints to s3a:// work.
Tags are <repository>:<sluice version>, e.g. sluice/spark:0.1.0 (the StreamingApp's default image).

`base` is not built by default: it is the local stand-in for apache/spark and python:3.11-slim where no
container registry is reachable (sluice.testbed.local_images builds it and the others on it).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

IMAGES_DIR = Path(__file__).resolve().parent
REPO_ROOT = IMAGES_DIR.parent
CONTEXT_ROOT = REPO_ROOT / ".sluice" / "images"


class BuildError(RuntimeError):
    """A build step failed; the message is one line for the user."""


@dataclass(frozen=True)
class Image:
    name: str  # its Dockerfile is images/<name>/Dockerfile
    repository: str
    extra: str  # its Python packages: pyproject.toml's dependencies and this extra's
    provided: tuple[str, ...] = ()  # of those, the ones its base image has already
    only: tuple[str, ...] = ()  # just these of the extra's packages, without the common dependencies
    files: tuple[str, ...] = ()  # more files from images/<name>/
    connector_jars: bool = False
    base_arg: str = "BASE_IMAGE"  # the ARG naming the image it is built FROM
    tag_version: str | None = None  # default: the sluice version
    wheels_from_sources: bool = False  # pure-Python requirements some published only as sources (pyspark)

    @property
    def tag(self) -> str:
        return f"{self.repository}:{self.tag_version or version()}"

    @property
    def requirements(self) -> list[str]:
        """Its pinned requirements, as pyproject.toml declares them."""
        declared = extra_requirements(self.extra, with_dependencies=not self.only)
        names = {_name(req) for req in declared}
        if unknown := [name for name in (*self.provided, *self.only) if _normalise(name) not in names]:
            raise BuildError(f"{', '.join(unknown)} not among the requirements of the {self.extra!r} extra")
        provided, only = ({_normalise(name) for name in group} for group in (self.provided, self.only))
        return [req for req in declared if _name(req) not in provided and (not only or _name(req) in only)]

    @property
    def packages(self) -> tuple[str, ...]:
        return tuple(_name(req) for req in self.requirements)


IMAGES = {
    image.name: image
    for image in (
        Image("operator", "sluice/operator", "operator", base_arg="PYTHON_IMAGE"),
        # pyspark comes with Spark in the base image.
        # confluent-kafka (a common dependency): the exactly-once Kafka sink's transactional producers run in
        # the executors.
        Image("spark", "sluice/spark", "runner", provided=("pyspark",), files=("runner.py",), connector_jars=True),
        Image(
            "base",
            "sluice.local/spark",
            "runner",
            only=("pyspark",),  # as the official image: the spark image adds the rest of the extra
            files=("entrypoint.sh",),
            base_arg="DEBIAN_IMAGE",
            tag_version="4.2.0-python3",
            wheels_from_sources=True,
        ),
    )
}
RELEASE_IMAGES = ("operator", "spark")
IMAGE_PYTHON = "3.11"  # the Python of the base images (python:3.11-slim, Debian bookworm's)


def _project() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def version() -> str:
    return _project()["version"]


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _name(requirement: str) -> str:
    return _normalise(re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0])


def extra_requirements(extra: str, with_dependencies: bool = True) -> list[str]:
    """pyproject.toml's requirements (with their pins) of an extra, after the project's dependencies."""
    project = _project()
    extras = project.get("optional-dependencies", {})
    if extra not in extras:
        raise BuildError(f"pyproject.toml has no extra {extra!r}")
    if nested := [req for req in extras[extra] if _name(req) == _normalise(project["name"])]:
        raise BuildError(f"the {extra!r} extra names {', '.join(nested)}: an image's extra lists its packages")
    return [*(project["dependencies"] if with_dependencies else []), *extras[extra]]


def declared_packages() -> set[str]:
    """Every package pyproject.toml names, in its dependencies or any extra."""
    project = _project()
    requirements = [
        *project["dependencies"],
        *(req for reqs in project.get("optional-dependencies", {}).values() for req in reqs),
    ]
    return {_name(req) for req in requirements} - {_normalise(project["name"])}


BUILDERS = (
    ("docker", ["docker", "info"], ["docker", "build"]),
    ("podman", ["podman", "info"], ["podman", "build"]),
    ("buildah", ["buildah", "info"], ["buildah", "build"]),
)


def builder() -> list[str]:
    """The build command of the first working tool; a one-line error naming what was tried otherwise."""
    tried = []
    for tool, probe, build in BUILDERS:
        if not shutil.which(tool):
            tried.append(f"{tool} not found")
            continue
        try:
            works = subprocess.run(probe, capture_output=True, timeout=60).returncode == 0
        except subprocess.TimeoutExpired:
            works = False
        if works:
            return build
        tried.append(f"`{' '.join(probe)}` failed")
    raise BuildError("building images needs docker (with a running engine), podman or buildah: " + "; ".join(tried))


def build_wheel(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("sluice-*.whl"):
        old.unlink()
    # Fixed zip timestamps: the same sources give the same wheel, so builders reuse their cached layers.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(REPO_ROOT)],
        capture_output=True,
        text=True,
        env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"},
    )
    wheels = sorted(out.glob("sluice-*.whl"))
    if result.returncode != 0 or not wheels:
        last = (result.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise BuildError(f"pip wheel of sluice failed: {last}")
    return wheels[0]


def _pip(args: list[str], what: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise BuildError(f"{what} failed: {last}")


def download_wheels(requirements_file: Path, out: Path, from_sources: bool = False) -> None:
    """Wheels of the requirements and their dependencies for the image's Python and this machine's
    architecture; from_sources: pure-Python requirements, built into wheels where PyPI has only sources."""
    arch = {"arm64": "aarch64", "amd64": "x86_64"}.get(platform.machine().lower(), platform.machine().lower())
    target = [
        "--python-version",
        IMAGE_PYTHON,
        "--implementation",
        "cp",
        "--abi",
        f"cp{IMAGE_PYTHON.replace('.', '')}",
        *(
            arg
            for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014")
            for arg in ("--platform", f"{tag}_{arch}")
        ),
    ]
    out.mkdir(parents=True, exist_ok=True)
    if from_sources:
        _pip(
            ["wheel", "--quiet", "--wheel-dir", str(out), "-r", str(requirements_file)],
            f"pip wheel of {requirements_file.parent.name}'s requirements",
        )
    else:
        _pip(
            ["download", "--quiet", "--only-binary=:all:", *target, "--dest", str(out), "-r", str(requirements_file)],
            f"pip download of {requirements_file.parent.name}'s wheels",
        )


def prepare_context(image: Image, wheel: Path, root: Path = CONTEXT_ROOT) -> Path:
    """A fresh build context for image under root/<name>: everything its Dockerfile copies."""
    context = root / image.name
    shutil.rmtree(context, ignore_errors=True)
    (context / "dist").mkdir(parents=True)
    for name in ("Dockerfile", *image.files):
        shutil.copy2(IMAGES_DIR / image.name / name, context / name)
    shutil.copy2(wheel, context / "dist" / wheel.name)
    (context / "requirements.txt").write_text("\n".join(image.requirements) + "\n")
    download_wheels(context / "requirements.txt", context / "wheels", image.wheels_from_sources)
    if image.connector_jars:
        from sluice.pipelines.local.provision import ProvisionError
        from sluice.pipelines.local.spark import spark_image_jars

        (context / "jars").mkdir()
        try:
            jars = spark_image_jars()
        except ProvisionError as error:
            raise BuildError(str(error)) from error
        for jar in jars:
            shutil.copy2(jar, context / "jars" / jar.name)
    return context


def prepare_contexts(names: Sequence[str], root: Path = CONTEXT_ROOT) -> dict[str, Path]:
    wheel = build_wheel(root / "wheel")
    return {name: prepare_context(IMAGES[name], wheel, root) for name in names}


def build_image(command: Sequence[str], image: Image, context: Path, base: str | None = None) -> None:
    """Run a builder's build command (docker build, buildah build, ...) on a prepared context."""
    base_args = ["--build-arg", f"{image.base_arg}={base}"] if base else []
    print(f"building {image.tag} from {context}" + (f" on {base}" if base else ""), flush=True)
    if subprocess.run([*command, *base_args, "-t", image.tag, str(context)]).returncode != 0:
        raise BuildError(f"{command[0]} could not build {image.tag} (output above)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python images/build.py", description=__doc__.splitlines()[0])
    parser.add_argument(
        "images",
        nargs="*",
        metavar="IMAGE",
        help=f"any of {', '.join(IMAGES)} (default: {' and '.join(RELEASE_IMAGES)})",
    )
    parser.add_argument("--base", metavar="IMAGE", help="build FROM this image (its base ARG) instead of the default")
    parser.add_argument("--context-only", action="store_true", help="prepare the build contexts, build nothing")
    args = parser.parse_args(argv)
    names = args.images or list(RELEASE_IMAGES)
    if unknown := sorted(set(names) - set(IMAGES)):
        parser.error(f"unknown image(s) {', '.join(unknown)}: choose from {', '.join(IMAGES)}")
    try:
        build = None if args.context_only else builder()  # before the slow part: fail fast
        contexts = prepare_contexts(names)
        for name, context in contexts.items():
            if build is None:
                print(f"{IMAGES[name].tag}: context ready in {context}")
            else:
                build_image(build, IMAGES[name], context, args.base)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
