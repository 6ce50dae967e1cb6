"""`status.rollout`: the rolling update in progress (or the last one), as the operator records it.

Everything a restarted operator needs to finish a rollout is here: the plan (strategy, per-query steps,
which drivers were there), the phase reached and the deadline.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.pipelines.contract import QueryStep
from sluice.pipelines.spec import Strict

Strategy = Literal["hotSwap", "checkpointMigration", "fencedHandover", "restart"]
RolloutPhase = Literal[
    "Planned", "Draining", "Starting", "Verifying", "Complete", "RollingBack", "RolledBack", "Failed"
]
TERMINAL_PHASES: tuple[RolloutPhase, ...] = ("Complete", "RolledBack", "Failed")


class DriverRef(Strict):
    name: str = Field(description="The SparkApplication.")
    restarts: int = Field(0, description="Its restarts when the rollout began: crash loops count from there.")


class RolloutStatus(Strict):
    fromRevision: str = Field(description="The stable revision the rollout started from.")
    toRevision: str
    strategy: Strategy
    phase: RolloutPhase
    startedAt: str
    finishedAt: str | None = None
    message: str | None = Field(None, description="The plan, or why it rolled back or failed.")
    newDriver: bool = Field(False, description="The new revision runs in a driver of its own (toDriver).")
    fromDrivers: list[DriverRef] = Field(default_factory=list, description="The drivers running when planned.")
    toDriver: str = Field(description="The SparkApplication a new driver gets (when one is needed).")
    queries: list[QueryStep] = Field(default_factory=list)
    deadline: str = Field(
        description="When the current direction (forward, or back) gives up: the start of it "
        "plus rollback.healthTimeout."
    )

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES
