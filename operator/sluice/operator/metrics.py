"""The operator's own Prometheus metrics. Counters whose label values are known start at 0 (Prometheus's advice),
so a dashboard or an alert over them has a series before the first count."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
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


ROLLOUTS = Counter(
    "sluice_operator_rollouts",
    "Rollouts that ended, by result: Complete, RolledBack, Failed; Refused: a stated strategy refused the change",
    ["app_namespace", "app", "result"],
)
APP_READY = Gauge(
    "sluice_operator_app_ready",
    "1 while the app processes records (its Ready condition), else 0; no series while it is suspended",
    ["app_namespace", "app"],
)
ROLLOUT_FAILED = Gauge(
    "sluice_operator_app_rollout_failed",
    "1 while the app's spec does not run because its rollout rolled back, failed or was refused (its Rollout "
    "condition is False): the revision before runs",
    ["app_namespace", "app"],
)
ROLLOUT_RESULTS = {
    "RolloutComplete": "Complete",
    "RolledBack": "RolledBack",
    "RolloutFailed": "Failed",
    "UnsafeUpdateStrategy": "Refused",
    "StrategyNotAvailable": "Refused",
}
PER_APP = (DESIRED_EXECUTORS, APP_READY, ROLLOUT_FAILED)
RECONCILE_TRIGGERS = ("create", "update", "resume", "tick", "resync")  # kopf's reasons, and handlers' timers
SCALING_REASONS = ("up", "down", "manual")

for _trigger in RECONCILE_TRIGGERS:
    RECONCILE_ERRORS.labels(_trigger)
for _reason in SCALING_REASONS:
    SCALING_DECISIONS.labels(_reason)


def record_app(namespace: str, app: str, status: dict[str, Any], event_reasons: Iterable[str]) -> None:
    """The app's series after a pass: its executors asked for, whether it is Ready, whether its spec runs, the
    rollouts that ended in the pass."""
    desired = status.get("desiredExecutors")
    if desired is None:
        _forget(DESIRED_EXECUTORS, namespace, app)
    else:
        DESIRED_EXECUTORS.labels(namespace, app).set(desired)
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    ready = conditions.get("Ready", {})
    if status.get("phase") == "Suspended":
        _forget(APP_READY, namespace, app)
    else:
        APP_READY.labels(namespace, app).set(1 if ready.get("status") == "True" else 0)
    ROLLOUT_FAILED.labels(namespace, app).set(1 if conditions.get("Rollout", {}).get("status") == "False" else 0)
    for result in ROLLOUT_RESULTS.values():
        ROLLOUTS.labels(namespace, app, result)  # 0 until one ends so
    for reason in event_reasons:
        if reason in ROLLOUT_RESULTS:
            ROLLOUTS.labels(namespace, app, ROLLOUT_RESULTS[reason]).inc()


def forget_app(namespace: str, app: str) -> None:
    for gauge in PER_APP:
        _forget(gauge, namespace, app)
    for result in set(ROLLOUT_RESULTS.values()):
        _forget(ROLLOUTS, namespace, app, result)


def _forget(metric: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):
        metric.remove(*labels)
