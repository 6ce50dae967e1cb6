"""The operator's per-app series, from a pass's status and events (what the chart's alerts read)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from sluice.operator import metrics


def value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def status(ready: str, reason: str = "Processing", rollout: str = "True") -> dict:
    return {
        "phase": "Suspended" if reason == "Suspended" else "Running",
        "desiredExecutors": 2,
        "conditions": [{"type": "Ready", "status": ready, "reason": reason}, {"type": "Rollout", "status": rollout}],
    }


def test_an_apps_readiness_rollouts_and_executors_and_their_removal_with_it() -> None:
    app = {"app_namespace": "team", "app": "metrics-test"}
    metrics.record_app("team", "metrics-test", status("True"), ["RolloutPlanned"])
    assert value("sluice_operator_app_ready", **app) == 1
    assert value("sluice_operator_app_rollout_failed", **app) == 0
    assert value("sluice_operator_desired_executors", **app) == 2
    assert value("sluice_operator_rollouts_total", **app, result="Complete") == 0, "not a rollout's end"
    for result in ("RolledBack", "Failed", "Refused"):
        assert value("sluice_operator_rollouts_total", **app, result=result) == 0, "each result's series from the start"

    metrics.record_app("team", "metrics-test", status("False", "DriverFailed", "False"), ["RolledBack"])
    assert value("sluice_operator_app_ready", **app) == 0
    assert value("sluice_operator_app_rollout_failed", **app) == 1
    assert value("sluice_operator_rollouts_total", **app, result="RolledBack") == 1

    metrics.record_app("team", "metrics-test", status("False", "Suspended", "True"), ["RolloutComplete"])
    assert value("sluice_operator_app_ready", **app) is None, "a suspended app is not unready"
    assert value("sluice_operator_app_rollout_failed", **app) == 0
    assert value("sluice_operator_rollouts_total", **app, result="Complete") == 1

    metrics.forget_app("team", "metrics-test")
    for name in ("sluice_operator_app_rollout_failed", "sluice_operator_desired_executors"):
        assert value(name, **app) is None
    assert value("sluice_operator_rollouts_total", **app, result="RolledBack") is None


def test_counters_with_known_labels_have_their_series_before_the_first_count() -> None:
    """The dashboard's reconcile errors and scaling decisions panels, and alerts over them, read 0, not nothing."""
    for trigger in ("create", "update", "resume", "tick", "resync"):
        assert value("sluice_operator_reconcile_errors_total", trigger=trigger) is not None, trigger
    for reason in ("up", "down", "manual"):
        assert value("sluice_operator_scaling_decisions_total", reason=reason) is not None, reason
