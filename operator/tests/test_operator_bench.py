"""Benchmark (make bench): apply -> SparkApplication created, and the operator's memory with many apps.

Targets: median and p99 of apply-to-SparkApplication <= 2 s over 50 apps; operator RSS <= 150 MB with
200 apps. Figures are printed and written to .sluice/bench/operator.json; only correctness is asserted.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import pytest
import yaml
from conftest import OperatorProcess
from kubernetes import client, config, watch

pytestmark = pytest.mark.bench

TIMED_APPS = 50
TOTAL_APPS = 200
OUTPUT = Path(".sluice/bench/operator.json")


def app_manifest(name: str) -> dict:
    """A small valid app whose topics the operator leaves alone, so only the operator is measured."""
    return {
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "StreamingApp",
        "metadata": {"name": name},
        "spec": {
            "kafka": {"bootstrapServers": "kafka.invalid:9092"},
            "topics": [{"name": f"{name}-in", "management": "none"}],
            "pipeline": {
                "nodes": [
                    {"name": "src", "fromKafka": {"topic": f"{name}-in"}},
                    {"name": "upper", "inputs": ["src"], "select": ["upper(value) AS value"]},
                    {"name": "out", "inputs": ["upper"], "toConsole": {}},
                ]
            },
        },
    }


class CreationWatch:
    """Records when each SparkApplication first appears, from a watch on the API server."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        config.load_kube_config(str(kubeconfig))
        self.api = client.CustomObjectsApi()
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self._watch = watch.Watch()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for event in self._watch.stream(
            self.api.list_namespaced_custom_object,
            "sparkoperator.k8s.io",
            "v1beta2",
            self.namespace,
            "sparkapplications",
            timeout_seconds=3600,
        ):
            if event["type"] == "ADDED":
                self.seen.setdefault(event["object"]["metadata"]["name"], time.monotonic())

    def start(self) -> CreationWatch:
        self.thread.start()
        time.sleep(1)
        return self

    def stop(self) -> None:
        self._watch.stop()
        self.thread.join(timeout=10)

    def wait(self, name: str, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        while name not in self.seen:
            assert time.monotonic() < deadline, f"SparkApplication {name} never appeared"
            time.sleep(0.01)
        return self.seen[name]


def test_operator_latency_and_memory(crds_installed, tmp_path):
    namespace = "bench"
    crds_installed.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(crds_installed.kubeconfig, tmp_path / "operator.log", resync_seconds=60)
    try:
        operator.wait_alive()
        rss_idle = operator.rss_bytes()
        created = CreationWatch(crds_installed.kubeconfig, namespace).start()
        latencies = []
        for i in range(TOTAL_APPS):
            name = f"app-{i:03d}"
            body = yaml.safe_dump(app_manifest(name))
            started = time.monotonic()
            crds_installed.kubectl("apply", "-n", namespace, "-f", "-", input=body)
            if i < TIMED_APPS:
                latencies.append(created.wait(name) - started)
        for i in range(TOTAL_APPS):
            created.wait(f"app-{i:03d}", timeout=600)
        time.sleep(5)
        rss = operator.rss_bytes()
        created.stop()
    finally:
        operator.stop()

    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    result = {
        "apps_timed": TIMED_APPS,
        "apps_total": TOTAL_APPS,
        "apply_to_sparkapplication_s": {"median": statistics.median(latencies), "p99": p99, "max": latencies[-1]},
        "operator_rss_mb": {"idle": rss_idle / 2**20, f"with_{TOTAL_APPS}_apps": rss / 2**20},
        "targets": {"latency_s": 2.0, "rss_mb": 150},
    }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(result, indent=2))
    median = result["apply_to_sparkapplication_s"]["median"]
    print(
        f"\napply -> SparkApplication over {TIMED_APPS} apps: median {median:.2f} s, p99 {p99:.2f} s (target <= 2 s)"
        f"\noperator RSS: idle {rss_idle / 2**20:.0f} MB, "
        f"with {TOTAL_APPS} apps {rss / 2**20:.0f} MB (target <= 150 MB)\nwritten to {OUTPUT}"
    )
    assert len(created.seen) >= TOTAL_APPS
