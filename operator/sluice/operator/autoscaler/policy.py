"""The autoscaler's settings in plain numbers (seconds), built from the StreamingApp's spec."""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Protocol

from sluice.api.times import duration_ms

from ..model import AutoscalingSpec
from .collect import short_hash


class ExecutorBounds(Protocol):
    """What `ExecutorsSpec` offers the autoscaler."""

    @property
    def instances(self) -> int: ...

    @property
    def min(self) -> int: ...

    @property
    def max(self) -> int: ...


@dataclass(frozen=True)
class Policy:
    interval: float
    metrics_window: float
    stabilization: float
    target_lag: float
    target_utilization: float
    utilization_band: float
    scale_up_cooldown: float
    scale_down_cooldown: float
    scale_down_window: float
    max_step: int

    @classmethod
    def from_spec(cls, spec: AutoscalingSpec) -> Policy:
        def seconds(duration: str) -> float:
            return duration_ms(duration) / 1000

        return cls(
            interval=seconds(spec.interval),
            metrics_window=seconds(spec.metricsWindow),
            stabilization=seconds(spec.stabilization),
            target_lag=spec.targetLagSeconds,
            target_utilization=spec.targetUtilization,
            utilization_band=spec.utilizationBand,
            scale_up_cooldown=seconds(spec.scaleUpCooldown),
            scale_down_cooldown=seconds(spec.scaleDownCooldown),
            scale_down_window=seconds(spec.scaleDownWindow),
            max_step=spec.maxStep,
        )

    @property
    def slack(self) -> float:
        """Tolerance on time comparisons: polls are about an interval apart, never exactly."""
        return self.interval / 2


def spec_key(policy: Policy, bounds: ExecutorBounds) -> str:
    """Changes when the user changes the autoscaling settings or the executor bounds."""
    return short_hash(repr((*astuple(policy), bounds.min, bounds.max)))
