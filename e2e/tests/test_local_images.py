"""Pure parts of the local image pipeline (the builds themselves run in make e2e-local)."""

from __future__ import annotations

import pytest

from sluice.testbed.e2e_suite import image_builder
from sluice.testbed.local_images import LOCAL_IMAGES, full_name


@pytest.mark.parametrize(("name", "full"), [
    ("sluice/spark:0.1.0", "docker.io/sluice/spark:0.1.0"),
    ("python:3.11-slim", "docker.io/library/python:3.11-slim"),
    ("sluice.local/spark-operator:2.5.2", "sluice.local/spark-operator:2.5.2"),
    ("localhost/x:1", "localhost/x:1"),
    ("registry:5000/x:1", "registry:5000/x:1"),
])
def test_full_name_is_what_the_kubelet_asks_containerd_for(name: str, full: str) -> None:
    assert full_name(name) == full


def test_the_stand_in_base_comes_first_and_the_release_images_build_on_it() -> None:
    build = image_builder()
    assert LOCAL_IMAGES[0] == "base"
    assert set(build.RELEASE_IMAGES) < set(LOCAL_IMAGES)
    assert build.IMAGES["base"].tag == "sluice.local/spark:4.2.0-python3"  # what images/spark-operator names
    assert f"ARG BASE_IMAGE={build.IMAGES['base'].tag}" in (build.IMAGES_DIR / "spark-operator" / "Dockerfile"
                                                           ).read_text()
