"""`status.rollout`: the rolling update in progress (or the last one), as the operator records it.

Everything a restarted operator needs to finish a rollout is here: the plan (strategy, per-query steps,
which drivers were there), the phase reached and the deadline.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from sluice.pipelines.spec import Strict

Strategy = Literal["hotSwap", "checkpointMigration", "fencedHandover", "restart"]
RolloutPhase = Literal["Planned", "Draining", "Starting", "Verifying", "Complete", "RollingBack", "RolledBack",
                       "Failed"]
TERMINAL_PHASES: tuple[RolloutPhase, ...] = ("Complete", "RolledBack", "Failed")

QueryAction = Literal["keep", "restart", "migrate", "start", "stop", "restore"]


class QueryStep(Strict):
    """What one streaming query (named after its sink, or `<source>-dead-letters`) does in the rollout.

    keep: runs on unchanged (never stopped by an in-driver rollout); restart: stops at a batch boundary and
    restarts on its own checkpoint with the new plan; migrate: the new plan starts on a checkpoint of the new
    revision, from the old query's committed offsets rewound by rewindMs, behind an output gate; start: a new
    query; stop: a removed query (its checkpoint is kept until the rollout is over); restore: back on the
    checkpoint the stable revision kept (rollback of migrate and stop).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str
    action: QueryAction
    rewindMs: int | None = Field(
        None, description="migrate: how much event time before the old query's position the new one re-reads "
        "(watermark delay + longest window/join span); None: nothing carries over, it starts from its sources' "
        "startingOffsets (unbounded state, or another Kafka cluster).")
    reason: str | None = Field(None, description="Why, with the spec path that changed.")


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
    deadline: str = Field(description="When the current direction (forward, or back) gives up: the start of it "
                          "plus rollback.healthTimeout.")

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES
