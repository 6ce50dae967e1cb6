"""The StreamingApp resource: the status models, and the spec's (sluice.pipelines.app, shared with the
`sluice` CLI). The CRD's schema is generated from these."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sluice.pipelines.app import (  # noqa: F401  (re-exported: the operator's modules import them from here)
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
from sluice.pipelines.spec import Strict


class Condition(Strict):
    type: Literal["Valid", "TopicsReady", "DriverSubmitted", "Running"]
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    lastTransitionTime: str | None = None


class ChildRef(Strict):
    apiVersion: str
    kind: str
    name: str


class Decision(Strict):
    time: str
    fromExecutors: int = Field(alias="from")
    to: int
    reason: str


class AutoscalerStatus(Strict):
    desiredExecutors: int | None = None
    lastDecision: Decision | None = None
    ratePerExecutor: float | None = Field(None, description="Records/s one executor processes when busy.")
    backlog: int | None = None
    message: str | None = Field(None, description="Why the autoscaler holds (e.g. an ineffective scale-up).")


class StreamingAppStatus(Strict):
    phase: Literal["Pending", "Invalid", "Submitted", "Running", "Suspended", "Failed", "Completed"] | None = None
    observedGeneration: int | None = None
    revision: str | None = Field(None, description="Hash of the pipeline the driver runs.")
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
    conditions: list[Condition] = Field(default_factory=list)
    children: list[ChildRef] = Field(default_factory=list)
