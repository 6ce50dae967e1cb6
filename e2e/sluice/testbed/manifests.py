"""Manifests the test bed writes (RBAC of its components) and rewrites (an example app's topics for one run)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any


def kafka_bodies(pipeline: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every fromKafka/toKafka body of a pipeline (dead-letter sink included), to read or rewrite."""
    for node in pipeline["nodes"]:
        for op in ("fromKafka", "toKafka"):
            if op in node:
                yield node[op]
    if "toKafka" in (pipeline.get("deadLetter") or {}):
        yield pipeline["deadLetter"]["toKafka"]


def retarget_topics(manifest: dict[str, Any], rename: Callable[[dict[str, Any]], str]) -> dict[str, str]:
    """Give each topic of spec.topics the name rename(topic) returns, in spec.topics and wherever the
    pipeline reads or writes it; returns old name -> new name."""
    topics = manifest["spec"]["topics"]
    renamed = {t["name"]: rename(t) for t in topics}
    for topic in topics:
        topic["name"] = renamed[topic["name"]]
    for body in kafka_bodies(manifest["spec"]["pipeline"]):
        body["topic"] = ",".join(renamed.get(t, t) for t in body["topic"].split(","))
    return renamed


def cluster_role_with_binding(
    name: str, rules: list[dict[str, Any]], subjects: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A ClusterRole `name` with `rules`, bound to `subjects`."""
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": name},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subjects,
        },
    ]
