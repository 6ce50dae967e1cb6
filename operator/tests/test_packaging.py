"""The wheel (and so each image) holds every product package and no test code: pyproject.toml lists its
packages one by one, so a new subpackage left out of the list would be missing from the images."""

from __future__ import annotations

import tomllib

from sluice.testbed.common import REPO_ROOT


def test_every_product_package_is_in_the_wheel_and_the_test_bed_is_not() -> None:
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(init.parent.relative_to(REPO_ROOT / top).parts)
        for top in ("operator", "pipelines")
        for init in (REPO_ROOT / top / "sluice").rglob("__init__.py")
    }
    assert found == listed, f"missing from the wheel: {found - listed}; listed but absent: {listed - found}"
    assert not any(name.startswith("sluice.testbed") for name in listed)
    assert all((REPO_ROOT / config["package-dir"][name]).is_dir() for name in listed)
