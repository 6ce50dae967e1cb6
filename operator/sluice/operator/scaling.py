"""Who sets an app's live executor count, and to what (pure: plain values in, a plan out, clock passed in).

- Manual (autoscaling off): the count is `spec.executors.instances`; `kubectl scale` edits it and the
  operator asks the running driver for it through the control API (no restart).
- Autoscaler (autoscaling on): the autoscaler owns the count within executors.min..max. A `kubectl scale`
  is then a new starting point: the count jumps there (clamped to min..max), it counts as a change for
  the cooldowns, and the autoscaler goes on deciding from it.

The autoscaler's memory (samples, recommendations, the last change) lives in an annotation on the app,
so an operator restart or a failover to another replica keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.pipelines.contract import DriverStatus

from .model import StreamingAppSpec

SCALING_STATE_ANNOTATION = "sluice.dev/autoscaler-state"
INSTANCES_ANNOTATION = "sluice.dev/autoscaler-instances"


@dataclass
class ScalingPlan:
    desired: int | None  # None: no driver should run
    status: dict[str, Any]  # desiredExecutors, scaling, autoscaler
    annotations: dict[str, str] = field(default_factory=dict)  # to set on the app
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    kinds: list[str] = field(default_factory=list)  # up, down or manual, per change decided


def needs_executor_request(driver: DriverStatus, desired: int) -> bool:
    """Ask the driver when its target differs (after a restart it has none: the count is re-asserted), or
    when live executors outnumber the target: one that registered after a scale-down began stays otherwise
    (Spark's allocator never removes running executors beyond its target by itself)."""
    return driver.executorTarget != desired or len(driver.executors) > desired


def plan_scaling(
    spec: StreamingAppSpec,
    annotations: dict[str, str],
    driver: DriverStatus | None,
    now: float,
    *,
    periodic: bool = False,
) -> ScalingPlan:
    """`periodic`: the tick, the only pass that runs the autoscaler and writes its state."""
    if spec.suspend:
        return ScalingPlan(None, {"desiredExecutors": None, "scaling": None, "autoscaler": None})
    if not spec.autoscaling.enabled:
        return ScalingPlan(
            spec.executors.instances,
            {"desiredExecutors": spec.executors.instances, "scaling": "manual", "autoscaler": None},
        )
    from .autoscaling import autoscale

    return autoscale(spec, annotations, driver, now, periodic=periodic)
