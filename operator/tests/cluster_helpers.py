"""Helpers for operator tests against the real control plane."""

from __future__ import annotations

from typing import Any

from sluice.api.validation import load_documents
from sluice.testbed.common import REPO_ROOT, wait_for
from sluice.testbed.manifests import retarget_topics

EXAMPLES = REPO_ROOT / "pipelines" / "examples"

__all__ = ["example", "wait_for"]


def example(name: str, bootstrap: str, topic_prefix: str) -> dict[str, Any]:
    """An example manifest pointed at the test broker, its topics renamed with a unique prefix."""
    manifest = load_documents(EXAMPLES / f"{name}.yaml")[0].manifest
    assert manifest is not None
    manifest["spec"]["kafka"] = {"bootstrapServers": bootstrap}
    retarget_topics(manifest, lambda topic: f"{topic_prefix}-{topic['name']}")
    return manifest
