"""The operator as its image runs it: a virtualenv with only the image's packages (pyproject.toml's dependencies
and the `operator` extra) and the sluice sources on its path. `make bench-operator` measures the operator's
memory there, not in the development environment, which has more packages that the operator's own would import
(the `kubernetes` client that kopf imports when installed, httpx's command line with rich).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from sluice.pipelines.local.provision import cache_dir, virtualenv

from .common import REPO_ROOT
from .e2e_suite import image_builder

SOURCES = (REPO_ROOT / "operator", REPO_ROOT / "pipelines")


def operator_python() -> Path:
    """The environment's interpreter, made once per set of pinned requirements (under the sluice cache)."""
    requirements = image_builder().extra_requirements("operator")
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    return virtualenv(
        cache_dir("operator-env") / f"py{sys.version_info.major}.{sys.version_info.minor}-{key}", requirements
    )


def operator_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the sluice sources on the path (the `sluice` namespace spans both folders)."""
    return {**env, "PYTHONPATH": os.pathsep.join(str(path) for path in SOURCES)}
