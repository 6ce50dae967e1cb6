"""The operator's own Prometheus metrics."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter("sluice_operator_reconciles", "Reconcile passes", ["trigger", "result"])
RECONCILE_ERRORS = Counter("sluice_operator_reconcile_errors", "Reconcile passes that raised", ["trigger"])
RECONCILE_SECONDS = Histogram("sluice_operator_reconcile_duration_seconds", "Duration of a reconcile pass",
                              ["trigger"], buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60))
APPS = Gauge("sluice_operator_apps", "StreamingApps seen, by phase", ["phase"])
