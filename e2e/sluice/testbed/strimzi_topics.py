"""A stand-in for Strimzi's topic operator at its documented seam (the KafkaTopic resource), for clusters where
Strimzi's images cannot run (none can be pulled here).

Like the unidirectional topic operator, it handles the KafkaTopics labelled `strimzi.io/cluster=<cluster>`
whose status has not observed their generation: it creates the topic in the real Kafka (or adds partitions),
then writes the status Strimzi documents — `observedGeneration`, `topicName` and a `Ready` condition, `True`,
or `False` with reason `KafkaError` and Kafka's own message (e.g. a replication factor above the brokers).
It never deletes topics and does not reconcile configs beyond creation: what sluice reads is the status.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Kubectl = Callable[..., Any]  # kubectl(*args, input=None, check=True) -> CompletedProcess


class TopicOperatorStandIn:
    def __init__(self, kubectl: Kubectl, bootstrap: str, cluster: str = "events", interval: float = 1.0) -> None:
        self.kubectl, self.bootstrap, self.cluster, self.interval = kubectl, bootstrap, cluster, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="strimzi-topic-operator", daemon=True)
        self.handled: list[str] = []  # namespace/name of each KafkaTopic whose status it wrote

    def start(self) -> TopicOperatorStandIn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sync()
            except Exception:  # an API server restarting: the next round tries again, as the operator would
                continue

    def sync(self) -> None:
        """One round: every KafkaTopic of the cluster whose status is behind its generation."""
        listed = self.kubectl(
            "get", "kafkatopics", "-A", "-l", f"strimzi.io/cluster={self.cluster}", "-o", "json", check=False
        )
        if listed.returncode != 0:
            return
        for topic in json.loads(listed.stdout)["items"]:
            meta = topic["metadata"]
            if (topic.get("status") or {}).get("observedGeneration") == meta.get("generation"):
                continue
            self._write_status(topic, self._reconcile(topic))

    def _reconcile(self, topic: dict[str, Any]) -> str | None:
        """Makes the topic as its spec says; Kafka's error, if it refused."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

        spec = topic["spec"]
        name = spec.get("topicName") or topic["metadata"]["name"]
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        try:
            existing = admin.list_topics(timeout=10).topics.get(name)
            if existing is None or existing.error is not None:
                replicas = spec.get("replicas", -1)  # none: the cluster's default.replication.factor
                new = NewTopic(name, spec.get("partitions", 1), replicas, config=spec.get("config") or {})
                admin.create_topics([new])[name].result(timeout=30)
            elif spec.get("partitions", 1) > len(existing.partitions):
                admin.create_partitions([NewPartitions(name, spec["partitions"])])[name].result(timeout=30)
        except KafkaException as exc:
            error = exc.args[0]
            return error.str() if hasattr(error, "str") else str(error)
        return None

    def _write_status(self, topic: dict[str, Any], error: str | None) -> None:
        meta = topic["metadata"]
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {"type": "Ready", "status": "True", "lastTransitionTime": now}
        if error is not None:
            ready = {**ready, "status": "False", "reason": "KafkaError", "message": error}
        status = {
            "observedGeneration": meta.get("generation"),
            "topicName": topic["spec"].get("topicName") or meta["name"],
            "conditions": [ready],
        }
        self.kubectl(
            "patch", "kafkatopic", meta["name"], "-n", meta["namespace"], "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip
        self.handled.append(f"{meta['namespace']}/{meta['name']}")


@contextmanager
def topic_operator(kubectl: Kubectl, bootstrap: str, cluster: str = "events") -> Iterator[TopicOperatorStandIn]:
    stand_in = TopicOperatorStandIn(kubectl, bootstrap, cluster).start()
    try:
        yield stand_in
    finally:
        stand_in.stop()
