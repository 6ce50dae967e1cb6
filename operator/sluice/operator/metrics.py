"""The operator's own Prometheus metrics. Counters whose label values are known start at 0 (Prometheus's advice),
so a dashboard or an alert over them has a series before the first count.

The per-app series are kept as plain values and made into samples when Prometheus scrapes (a custom collector,
as an exporter does): a labelled child per series and app would hold a lock and a value object each, about
4 KB an app, and a thousand apps' operator keeps within its memory target (make bench-operator)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

RECONCILES = Counter("sluice_operator_reconciles", "Reconcile passes", ["trigger", "result"])
RECONCILE_ERRORS = Counter("sluice_operator_reconcile_errors", "Reconcile passes that raised", ["trigger"])
RECONCILE_SECONDS = Histogram(
    "sluice_operator_reconcile_duration_seconds",
    "Duration of a reconcile pass",
    ["trigger"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
APPS = Gauge("sluice_operator_apps", "StreamingApps seen, by phase", ["phase"])
SCALING_DECISIONS = Counter(
    "sluice_operator_scaling_decisions",
    "Live executor count changes decided, by reason: "
    "up or down (the autoscaler), manual (kubectl scale while autoscaling)",
    ["reason"],
)


ROLLOUT_RESULTS = {
    "RolloutComplete": "Complete",
    "RolledBack": "RolledBack",
    "RolloutFailed": "Failed",
    "UnsafeUpdateStrategy": "Refused",
    "StrategyNotAvailable": "Refused",
}
RECONCILE_TRIGGERS = ("create", "update", "resume", "tick", "resync")  # kopf's reasons, and handlers' timers
SCALING_REASONS = ("up", "down", "manual")

for _trigger in RECONCILE_TRIGGERS:
    RECONCILE_ERRORS.labels(_trigger)
for _reason in SCALING_REASONS:
    SCALING_DECISIONS.labels(_reason)


@dataclass(slots=True)
class _AppSeries:
    desired_executors: int | None = None
    ready: int | None = None  # None while the app is suspended
    rollout_failed: int = 0
    # by result, each result's series from the start
    rollouts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ROLLOUT_RESULTS.values(), 0))


class AppCollector(Collector):
    """Each app's series: the executors the operator asks its driver for, whether it is Ready, whether its spec
    runs, and the rollouts that ended, by result."""

    LABELS = ("app_namespace", "app")

    def __init__(self) -> None:
        self._apps: dict[tuple[str, str], _AppSeries] = {}
        self._lock = threading.Lock()

    def record(self, namespace: str, app: str, status: dict[str, Any], event_reasons: Iterable[str]) -> None:
        """The app's series after a pass, from its status and the events the pass sent."""
        conditions = {c.get("type"): c for c in status.get("conditions") or []}
        ended = [ROLLOUT_RESULTS[reason] for reason in event_reasons if reason in ROLLOUT_RESULTS]
        with self._lock:
            series = self._apps.setdefault((namespace, app), _AppSeries())
            series.desired_executors = status.get("desiredExecutors")
            suspended = status.get("phase") == "Suspended"
            series.ready = None if suspended else int(conditions.get("Ready", {}).get("status") == "True")
            series.rollout_failed = int(conditions.get("Rollout", {}).get("status") == "False")
            for result in ended:
                series.rollouts[result] += 1

    def forget(self, namespace: str, app: str) -> None:
        with self._lock:
            self._apps.pop((namespace, app), None)

    def collect(self) -> Iterator[Metric]:
        desired = GaugeMetricFamily(
            "sluice_operator_desired_executors", "Executors the operator asks each app's driver for", labels=self.LABELS
        )
        ready = GaugeMetricFamily(
            "sluice_operator_app_ready",
            "1 while the app processes records (its Ready condition), else 0; no series while it is suspended",
            labels=self.LABELS,
        )
        rollout_failed = GaugeMetricFamily(
            "sluice_operator_app_rollout_failed",
            "1 while the app's spec does not run because its rollout rolled back, failed or was refused (its "
            "Rollout condition is False): the revision before runs",
            labels=self.LABELS,
        )
        rollouts = CounterMetricFamily(
            "sluice_operator_rollouts",
            "Rollouts that ended, by result: Complete, RolledBack, Failed; Refused: a stated strategy refused the "
            "change",
            labels=(*self.LABELS, "result"),
        )
        with self._lock:
            apps = [
                (key, series.desired_executors, series.ready, series.rollout_failed, dict(series.rollouts))
                for key, series in self._apps.items()
            ]
        for key, desired_executors, is_ready, failed, ended in apps:
            if desired_executors is not None:
                desired.add_metric(key, desired_executors)
            if is_ready is not None:
                ready.add_metric(key, is_ready)
            rollout_failed.add_metric(key, failed)
            for result, count in ended.items():
                rollouts.add_metric((*key, result), count)
        yield from (desired, ready, rollout_failed, rollouts)


APP_SERIES = AppCollector()
REGISTRY.register(APP_SERIES)


def record_app(namespace: str, app: str, status: dict[str, Any], event_reasons: Iterable[str]) -> None:
    """The app's series after a pass: its executors asked for, whether it is Ready, whether its spec runs, the
    rollouts that ended in the pass."""
    APP_SERIES.record(namespace, app, status, event_reasons)


def forget_app(namespace: str, app: str) -> None:
    APP_SERIES.forget(namespace, app)
