"""An earlier commit of this repository as a release to upgrade from: its chart and its images.

`make e2e-upgrade UPGRADE_FROM=<ref>` installs it, runs the e2e app on it, then `helm upgrade`s to this tree's
chart and images (E2ESuite.operator_upgrade). The commit's files come from `git archive` into the sluice
cache; its images are built by its own images/build.py (its wheel, its Dockerfiles) with buildah, on the same
stand-in base as this tree's, tagged `<its version>-<commit>` so they sit beside this tree's.
"""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from .common import REPO_ROOT, ProvisionError, cache_dir, locked
from .e2e_suite import Images, image_builder
from .images import full_name
from .local_images import build_command, export

UPGRADE_FROM_ENV = "SLUICE_E2E_UPGRADE_FROM"  # a commit (any git ref) to upgrade from; unset: no upgrade run
IMAGES = ("operator", "spark")


@dataclass(frozen=True)
class PreviousRelease:
    commit: str
    chart: Path
    images: Images


def commit_of(ref: str) -> str:
    result = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise ProvisionError(f"{UPGRADE_FROM_ENV}={ref} names no commit of {REPO_ROOT}")
    return result.stdout.strip()


def checkout(commit: str) -> Path:
    """The commit's files (git archive), once per commit under the sluice cache."""
    tree = cache_dir("previous-release", commit[:12]) / "tree"
    with locked(tree.with_suffix(".lock")):
        if not (tree / "pyproject.toml").is_file():
            archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", commit], capture_output=True)
            if archive.returncode != 0:
                raise ProvisionError(f"git archive {commit} failed: {archive.stderr.decode()[-400:]}")
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(tree, filter="data")
    return tree


def previous_release(ref: str) -> tuple[PreviousRelease, dict[str, Path]]:
    """The release at `ref` and its images' archives ({full name: archive}) for the cluster's nodes. This
    tree's images must be built first: the stand-in base is theirs."""
    commit = commit_of(ref)
    tree = checkout(commit)
    build = image_builder(tree / "images")
    tag = f"{build.version()}-{commit[:8]}"
    base = image_builder().IMAGES["base"].tag
    archives = {}
    with locked(cache_dir("local-images") / "build.lock"):
        contexts = build.prepare_contexts(IMAGES, cache_dir("previous-release", commit[:12], "contexts"))
        for name in IMAGES:
            image = dataclasses.replace(build.IMAGES[name], tag_version=tag)
            try:
                build.build_image(build_command(), image, contexts[name], base)
            except build.BuildError as error:
                raise ProvisionError(f"the images of {commit[:8]}: {error}") from error
            archives[full_name(image.tag)] = export(image.tag)
    spark = build.IMAGES["spark"].repository
    images = Images(f"{build.IMAGES['operator'].repository}:{tag}", f"{spark}:{tag}", f"{spark}:{tag}")
    return PreviousRelease(commit, tree / "charts" / "sluice", images), archives


def release_to_upgrade_from(archives: dict[str, Path]) -> PreviousRelease | None:
    """The release SLUICE_E2E_UPGRADE_FROM names, its images' archives added to `archives`; None when unset."""
    ref = os.environ.get(UPGRADE_FROM_ENV)
    if not ref:
        return None
    release, more = previous_release(ref)
    archives.update(more)
    return release
