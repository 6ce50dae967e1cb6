"""Pure parts of the local image pipeline and of images/build.py (the builds themselves run in make e2e-local)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from sluice.testbed.e2e_suite import image_builder
from sluice.testbed.images import full_name
from sluice.testbed.local_images import LOCAL_IMAGES


@pytest.mark.parametrize(
    ("name", "full"),
    [
        ("sluice/spark:0.1.0", "docker.io/sluice/spark:0.1.0"),
        ("python:3.11-slim", "docker.io/library/python:3.11-slim"),
        ("sluice.local/spark-operator:2.5.2", "sluice.local/spark-operator:2.5.2"),
        ("localhost/x:1", "localhost/x:1"),
        ("registry:5000/x:1", "registry:5000/x:1"),
    ],
)
def test_full_name_is_what_the_kubelet_asks_containerd_for(name: str, full: str) -> None:
    assert full_name(name) == full


def test_the_stand_in_base_comes_first_and_the_release_images_build_on_it() -> None:
    build = image_builder()
    assert LOCAL_IMAGES[0] == "base"
    assert set(build.RELEASE_IMAGES) < set(LOCAL_IMAGES)
    assert build.IMAGES["base"].tag == "sluice.local/spark:4.2.0-python3"  # what images/spark-operator names
    assert (
        f"ARG BASE_IMAGE={build.IMAGES['base'].tag}" in (build.IMAGES_DIR / "spark-operator" / "Dockerfile").read_text()
    )


def test_each_image_takes_its_packages_from_pyproject_extras() -> None:
    build = image_builder()
    project = build._project()
    dependencies, extras = project["dependencies"], project["optional-dependencies"]

    assert build.IMAGES["operator"].requirements == [*dependencies, *extras["operator"]]
    runner = extras["runner"]
    pyspark = [req for req in runner if req.startswith("pyspark==")]
    assert len(pyspark) == 1
    # the runner extra's pyspark is the base image's (as in the official image); the rest is the spark image's
    assert build.IMAGES["spark"].requirements == [*dependencies, *(req for req in runner if req not in pyspark)]
    assert build.IMAGES["base"].requirements == pyspark


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"extra": "nope"}, "no extra 'nope'"),
        ({"extra": "cli"}, "names sluice[runner]"),
        ({"provided": ("kopf",)}, "kopf not among"),
    ],
)
def test_an_image_whose_extra_does_not_fit_fails_with_one_line(change: dict, says: str) -> None:
    build = image_builder()
    image = replace(build.IMAGES["spark"], **change)

    with pytest.raises(build.BuildError, match=re.escape(says)):
        _ = image.requirements
