"""The operator's own Prometheus metrics."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("sluice_operator_reconciles", "Reconcile passes", ["trigger", "result"])
RECONCILE_ERRORS = Counter("sluice_operator_reconcile_errors", "Reconcile passes that raised", ["trigger"])
RECONCILE_SECONDS = Histogram(
    "sluice_operator_reconcile_duration_seconds",
    "Duration of a reconcile pass",
    ["trigger"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
APPS = Gauge("sluice_operator_apps", "StreamingApps seen, by phase", ["phase"])
DESIRED_EXECUTORS = Gauge(
    "sluice_operator_desired_executors", "Executors the operator asks each app's driver for", ["app_namespace", "app"]
)
SCALING_DECISIONS = Counter(
    "sluice_operator_scaling_decisions",
    "Live executor count changes decided, by reason: "
    "up or down (the autoscaler), manual (kubectl scale while autoscaling)",
    ["reason"],
)


def record_scaling(namespace: str, app: str, status: dict[str, Any]) -> None:
    desired = status.get("desiredExecutors")
    if desired is None:
        forget_app(namespace, app)
    else:
        DESIRED_EXECUTORS.labels(namespace, app).set(desired)


def forget_app(namespace: str, app: str) -> None:
    with contextlib.suppress(KeyError):
        DESIRED_EXECUTORS.remove(namespace, app)
