"""The StreamingApp resource: the status models, and the spec's (sluice.api.app, shared with the
`sluice` CLI). The CRD's schema is generated from these."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.api.app import (  # noqa: F401  (re-exported: the operator's modules import them from here)
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    AutoscalingSpec,
    CheckpointSpec,
    ExecutorsSpec,
    KafkaSpec,
    PodTemplate,
    Quantity,
    Resources,
    RollbackSpec,
    SparkSpec,
    StreamingAppSpec,
    StrimziCluster,
    TopicName,
    TopicSpec,
    UpdateStrategy,
)
from sluice.api.contract import QueryStep
from sluice.api.pipeline import Strict, list_map


class Condition(Strict):
    type: Literal["Ready", "Valid", "TopicsReady", "DriverSubmitted", "Running", "Rollout"] = Field(
        description="Ready: the app processes records (the others all True, the driver's queries running)."
    )
    status: Literal["True", "False", "Unknown"]
    reason: str = Field("", description="CamelCase, why the status is what it is.")
    message: str = ""
    observedGeneration: int | None = Field(None, description="The app's metadata.generation it was set for.")
    lastTransitionTime: str | None = Field(None, description="When the status last changed.")


class ChildRef(Strict):
    apiVersion: str
    kind: str
    name: str


class DecisionStatus(Strict):
    time: str
    fromExecutors: int = Field(alias="from")
    to: int
    reason: str


class AutoscalerStatus(Strict):
    desiredExecutors: int | None = None
    lastDecision: DecisionStatus | None = None
    ratePerExecutor: float | None = Field(None, description="Records/s one executor processes when busy.")
    backlog: int | None = None
    message: str | None = Field(None, description="Why the autoscaler holds (e.g. an ineffective scale-up).")


# ---------------------------------------- status.rollout: the rolling update in progress (or the last one)
# Everything a restarted operator needs to finish a rollout is here: the plan (strategy, per-query steps, which
# drivers were there), the phase reached and the deadline.
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
    lastDriverFailure: str | None = Field(
        None,
        description="The error the new driver's container last left (its termination message): a crash loop's "
        "rollback names it.",
    )
    fromDrivers: list[DriverRef] = Field(default_factory=list, description="The drivers running when planned.")
    toDriver: str = Field(description="The SparkApplication a new driver gets (when one is needed).")
    queries: list[QueryStep] = Field(default_factory=list)
    fromCheckpoints: dict[str, str] = Field(
        default_factory=dict,
        description="status.checkpoints when planned: where the queries a checkpoint migration moves take over from.",
    )
    deadline: str = Field(
        description="When the current direction (forward, or back) gives up: the start of it "
        "plus rollback.healthTimeout."
    )

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


class StreamingAppStatus(Strict):
    phase: Literal["Pending", "Invalid", "Submitted", "Running", "Suspended", "Failed", "Completed"] | None = None
    observedGeneration: int | None = None
    revision: str | None = Field(
        None, description="The revision the driver runs (a hash of what the user wrote that the driver runs)."
    )
    stableRevision: str | None = Field(
        None, description="The last revision that was healthy: what a rollback returns to."
    )
    rollout: RolloutStatus | None = Field(None, description="The rolling update in progress, or the last one.")
    checkpoints: dict[str, str] = Field(
        default_factory=dict,
        description="Query -> the subfolder of the app's checkpoint folder it runs on in the stable revision, where "
        "a checkpoint migration moved it (<query>@<revision>; every other query's is its name).",
    )
    driver: str | None = Field(
        None,
        description="The SparkApplication of the app's driver, where it is not named after the app: a fenced "
        "handover's new driver (<app>-<revision>) goes on as the app's driver.",
    )
    executors: int | None = Field(None, description="Live executors the driver reports.")
    desiredExecutors: int | None = Field(None, description="Executors the operator asks the driver for.")
    scaling: Literal["manual", "autoscaler"] | None = Field(
        None, description="Who sets the live count: kubectl scale (manual) or the autoscaler."
    )
    lag: int | None = Field(None, description="Kafka records behind latest, each source topic counted once.")
    inputRate: str | None = Field(None, description="Input rows per second.")
    observedAt: str | None = Field(None, description="When lag, inputRate and executors were read from the driver.")
    autoscaler: AutoscalerStatus | None = None
    message: str | None = None
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    selector: str | None = Field(
        None, description="The executors' pods, as a label selector (the scale subresource's, for an HPA or KEDA)."
    )
    children: list[ChildRef] = Field(default_factory=list)
