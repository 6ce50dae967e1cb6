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
    Resources,
    RollbackSpec,
    SparkSpec,
    Strategy,
    StreamingAppSpec,
    TopicSpec,
    UpdateStrategy,
)
from sluice.api.contract import QueryStep
from sluice.api.kafka_spec import KafkaSpec, StrimziCluster  # noqa: F401  (re-exported)
from sluice.api.pods import PodTemplate  # noqa: F401  (re-exported)
from sluice.api.spec_types import Quantity, Strict, TopicName, list_map  # noqa: F401  (re-exported)

ConditionType = Literal["Ready", "Valid", "TopicsReady", "CheckpointReady", "DriverSubmitted", "Running", "Rollout"]


class Condition(Strict):
    type: ConditionType = Field(
        description="Ready: the app processes records (the others all True, the driver's queries running)."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="Unknown: not decided yet.")
    reason: str = Field("", description="CamelCase, why the status is what it is.")
    message: str = Field("", description="What a person reads: the field, the error, what it waits for.")
    observedGeneration: int | None = Field(None, description="The app's metadata.generation it was set for.")
    lastTransitionTime: str | None = Field(None, description="When the status last changed.")


class ChildRef(Strict):
    """An object the operator made for the app (in its namespace)."""

    apiVersion: str = Field(description="The object's API version.")
    kind: str = Field(description="The object's kind.")
    name: str = Field(description="The object's name.")


class DecisionStatus(Strict):
    """A scaling decision of the autoscaler."""

    time: str = Field(description="When it was made (RFC 3339).")
    fromExecutors: int = Field(alias="from", description="The executors before.")
    to: int = Field(description="The executors asked for.")
    reason: str = Field(description="Why: the lag, the utilization, the bounds.")


class AutoscalerStatus(Strict):
    desiredExecutors: int | None = Field(None, description="The count the autoscaler wants now.")
    lastDecision: DecisionStatus | None = Field(None, description="Its last change of the count.")
    ratePerExecutor: float | None = Field(None, description="Records/s one executor processes when busy.")
    backlog: int | None = Field(None, description="Records behind, as the last decision saw them.")
    message: str | None = Field(None, description="Why the autoscaler holds (e.g. an ineffective scale-up).")


# ---------------------------------------- status.rollout: the rolling update in progress (or the last one)
# Everything a restarted operator needs to finish a rollout is here: the plan (strategy, per-query steps, which
# drivers were there), the phase reached and the deadline.
RolloutPhase = Literal[
    "Planned", "Draining", "Starting", "Verifying", "Complete", "RollingBack", "RolledBack", "Failed"
]
TERMINAL_PHASES: tuple[RolloutPhase, ...] = ("Complete", "RolledBack", "Failed")


class DriverRef(Strict):
    name: str = Field(description="The SparkApplication.")
    restarts: int = Field(0, description="Its restarts when the rollout began: crash loops count from there.")


class RolloutStatus(Strict):
    fromRevision: str = Field(description="The stable revision the rollout started from.")
    toRevision: str = Field(description="The revision being rolled out.")
    strategy: Strategy = Field(description="hotSwap, checkpointMigration, fencedHandover or restart.")
    phase: RolloutPhase = Field(
        description="Planned, Draining, Starting, Verifying, then Complete; or RollingBack, RolledBack, Failed."
    )
    startedAt: str = Field(description="When it was planned (RFC 3339).")
    finishedAt: str | None = Field(None, description="When it reached Complete, RolledBack or Failed.")
    message: str | None = Field(None, description="The plan, or why it rolled back or failed.")
    newDriver: bool = Field(False, description="The new revision runs in a driver of its own (toDriver).")
    lastDriverFailure: str | None = Field(
        None,
        description="The error the new driver's container last left (its termination message): a crash loop's "
        "rollback names it.",
    )
    fromDrivers: list[DriverRef] = Field(default_factory=list, description="The drivers running when planned.")
    toDriver: str = Field(description="The SparkApplication a new driver gets (when one is needed).")
    queries: list[QueryStep] = Field(default_factory=list, description="What each query does in it.")
    fromCheckpoints: dict[str, str] = Field(
        default_factory=dict,
        description="status.checkpoints when planned: where the queries a checkpoint migration moves take over from.",
    )
    rollbackRewindMs: dict[str, int] = Field(
        default_factory=dict,
        description="Per migrated query, the event time a rollback onto a new checkpoint re-reads before the new "
        "query's cut (the old plan's watermark delay + its longest window); a query not named goes back onto the "
        "checkpoint it left.",
    )
    backCheckpoints: dict[str, str] = Field(
        default_factory=dict,
        description="Set as a rollback begins: the new checkpoint each migrated query goes back onto (its old plan, "
        "rewound from the new query's cut, or from the one it left when the new query completed no batch), instead "
        "of the one it left.",
    )
    deadline: str = Field(
        description="When the current direction (forward, or back) gives up: the start of it "
        "plus rollback.healthTimeout."
    )

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES


class StreamingAppStatus(Strict):
    """What the operator observed and decided for the app (written by the operator only)."""

    phase: Literal["Pending", "Invalid", "Submitted", "Running", "Suspended", "Failed", "Completed"] | None = Field(
        None, description="Where the app is: conditions say why."
    )
    observedGeneration: int | None = Field(None, description="The metadata.generation this status is of.")
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
    checkpointLocation: str | None = Field(
        None,
        description="The checkpoint root the app runs on (its checkpoints are under <it>/<app>): where "
        "spec.checkpoint.location names none, the operator's store when the app first ran, kept from then on.",
    )
    sparkImage: str | None = Field(
        None,
        description="The image the app runs: where spec.spark.image names none, the operator's default when the "
        "app first ran, kept from then on.",
    )
    sparkVersion: str | None = Field(None, description="The Spark version the app runs (kept with sparkImage).")
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
    autoscaler: AutoscalerStatus | None = Field(None, description="The autoscaler's view (when enabled).")
    message: str | None = Field(None, description="The first problem, as the conditions tell it.")
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra=list_map("type"),
        description="Ready first; then Valid, TopicsReady, CheckpointReady, DriverSubmitted, Running and Rollout.",
    )
    selector: str | None = Field(
        None, description="The executors' pods, as a label selector (the scale subresource's, for an HPA or KEDA)."
    )
    children: list[ChildRef] = Field(default_factory=list, description="What the operator made for the app.")
