"""Helpers for operator tests against the real control plane."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "pipelines" / "examples"


def example(name: str, bootstrap: str, topic_prefix: str) -> dict[str, Any]:
    """An example manifest pointed at the test broker, its topics renamed with a unique prefix."""
    manifest = yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())
    manifest["spec"]["kafka"] = {"bootstrapServers": bootstrap}
    renames = {t["name"]: f"{topic_prefix}-{t['name']}" for t in manifest["spec"].get("topics", [])}
    for topic in manifest["spec"].get("topics", []):
        topic["name"] = renames[topic["name"]]
    text = yaml.safe_dump(manifest)
    for old, new in sorted(renames.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"topic: {old}\n", f"topic: {new}\n")
    return yaml.safe_load(text)


def wait_for(predicate: Callable[[], Any], timeout: float = 60, what: str = "condition", interval: float = 0.5):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
