"""Helpers for pointing an example StreamingApp at the topics of one test run."""

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
