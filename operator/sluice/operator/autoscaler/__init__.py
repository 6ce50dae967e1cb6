"""Lag-driven executor autoscaling: collect → evaluate → decide → (the operator) realizes.

Per poll of a driver::

    policy = Policy.from_spec(spec.autoscaling)
    state = AutoscalerState.from_json(annotation)            # a fresh state when missing or unreadable
    state = observe(state, driver_status, policy)             # the sample since the last reading
    decision = decide_scaling(policy, spec.executors, state, time.time())
    if decision.changes: ...PUT /v1/executors {"target": decision.target}...
    state = record(state, decision, policy)
    annotation = state.to_json()
    status.autoscaler = autoscaler_status(state, decision)
"""

from .collect import Sample, sample_between
from .decide import ScalingDecision, autoscaler_status, decide_scaling, record
from .evaluate import Evaluation, evaluate
from .policy import ExecutorBounds, Policy
from .state import AutoscalerState, add_sample, observe

__all__ = [
    "AutoscalerState",
    "Evaluation",
    "ExecutorBounds",
    "Policy",
    "Sample",
    "ScalingDecision",
    "add_sample",
    "autoscaler_status",
    "decide_scaling",
    "evaluate",
    "observe",
    "record",
    "sample_between",
]
