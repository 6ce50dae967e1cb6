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

from sluice.api.contract import DriverStatus
from sluice.api.times import parse_time

from ..model import StreamingAppSpec
from .decide import ScalingDecision, autoscaler_status, current_executors, decide_scaling, record
from .policy import Policy, spec_key
from .state import AutoscalerState, observe

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
    return autoscale(spec, annotations, driver, now, periodic=periodic)


def autoscale(
    spec: StreamingAppSpec, annotations: dict[str, str], driver: DriverStatus | None, now: float, *, periodic: bool
) -> ScalingPlan:
    """The autoscaler on one app: its stored state in, a ScalingPlan out. Only the periodic tick runs it (one
    writer of its state): it feeds the driver's answer, decides and keeps the state in the app's annotation.
    Other passes (create, update, child events) read the stored state to know the count to ask for. A `kubectl
    scale` while autoscaling is on is a new starting point: a change to spec.executors.instances is recorded as a
    change of the live count (clamped to min..max), which starts the cooldowns; the annotation
    `sluice.dev/autoscaler-instances` remembers the instances last acted on."""
    policy = Policy.from_spec(spec.autoscaling)
    bounds = spec.executors
    state = AutoscalerState.from_json(annotations.get(SCALING_STATE_ANNOTATION))
    if not periodic:
        desired = min(max(current_executors(state, bounds), bounds.min), bounds.max)
        return ScalingPlan(desired, _status(desired, state, None))

    if driver is not None:
        # Samples carry the driver's time: a decision made on this answer must not look older than it, or the
        # next pass would take the count before this change for the current one.
        now = max(now, parse_time(driver.observedAt))
    events: list[tuple[str, str, str]] = []
    kinds: list[str] = []
    seen = annotations.get(INSTANCES_ANNOTATION)
    if seen is not None and seen != str(bounds.instances):
        current = current_executors(state, bounds)
        target = min(max(bounds.instances, bounds.min), bounds.max)
        if target != current:
            nudge = ScalingDecision(
                now,
                current,
                target,
                "up" if target > current else "down",
                f"{current} → {target}: kubectl scale set spec.executors.instances to "
                f"{bounds.instances}, a new starting point for the autoscaler",
                spec_key=spec_key(policy, bounds),
            )
            state = record(state, nudge, policy)
            events.append(("Normal", "Scaled", nudge.reason))
            kinds.append("manual")
    if driver is not None and _due(state, driver, policy):
        state = observe(state, driver, policy)
    decision = decide_scaling(policy, bounds, state, now)
    if decision.changes:
        events.append(("Normal", "Scaled", decision.reason))
        kinds.append(decision.kind)
    state = record(state, decision, policy)
    annotations_out = {SCALING_STATE_ANNOTATION: state.to_json(), INSTANCES_ANNOTATION: str(bounds.instances)}
    return ScalingPlan(decision.target, _status(decision.target, state, decision), annotations_out, events, kinds)


def _due(state: AutoscalerState, driver: DriverStatus, policy: Policy) -> bool:
    """A sample spans about `interval` (the operator's tick may be shorter)."""
    if state.counters is None:
        return True
    return parse_time(driver.observedAt) - state.counters.time >= policy.interval - policy.slack / 2


def _status(desired: int, state: AutoscalerState, decision: ScalingDecision | None) -> dict:
    if decision is None:
        last = state.last_decision
        decision = ScalingDecision(
            last.time if last else 0.0,
            desired,
            desired,
            "hold",
            last.reason if last and last.kind == "hold" else f"hold at {desired}",
        )
    autoscaler = autoscaler_status(state, decision).model_dump(mode="json", by_alias=True)
    return {"desiredExecutors": desired, "scaling": "autoscaler", "autoscaler": autoscaler}
