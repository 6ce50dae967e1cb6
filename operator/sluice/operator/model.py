"""The StreamingApp resource: spec and status models. The CRD's schema is generated from these."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from sluice.pipelines.spec import Duration, PipelineSpec, Strict, cel

GROUP = "sluice.dev"
VERSION = "v1alpha1"
KIND = "StreamingApp"
PLURAL = "streamingapps"
SINGULAR = "streamingapp"
SHORT_NAMES = ["sapp"]

Quantity = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?([kmgtpKMGTP]i?|[kmgtp]b)?$"),
                     Field(description="An amount in Spark or Kubernetes notation: 500m, 2, 1g, 512Mi.")]
TopicName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9._-]{1,249}$")]


class StrimziCluster(Strict):
    name: str = Field(description="Name of the Strimzi Kafka resource.")
    namespace: str | None = Field(None, description="Default: the app's namespace.")
    listener: str = Field("plain", description="Listener whose bootstrap address the app uses.")


class KafkaSpec(Strict):
    """Which Kafka the app uses: an external cluster, or a Strimzi-managed one."""

    model_config = cel("has(self.bootstrapServers) != has(self.strimziCluster)",
                       "set exactly one of 'bootstrapServers' or 'strimziCluster'")

    bootstrapServers: str | None = Field(None, description="host:port[,host:port] of an external cluster.")
    strimziCluster: StrimziCluster | None = None

    @model_validator(mode="after")
    def _one(self) -> KafkaSpec:
        if (self.bootstrapServers is None) == (self.strimziCluster is None):
            raise ValueError("set exactly one of 'bootstrapServers' or 'strimziCluster'")
        return self


class TopicSpec(Strict):
    name: TopicName
    partitions: int = Field(1, ge=1, le=10000)
    replicas: int = Field(1, ge=1, le=32767)
    config: dict[str, str] = Field(default_factory=dict, description="Topic configs, e.g. retention.ms.")
    management: Literal["strimzi", "admin", "none"] | None = Field(
        None, description="strimzi: a KafkaTopic resource; admin: the Kafka Admin API; none: not managed. "
        "Default: strimzi with strimziCluster, admin with bootstrapServers.")
    deletionPolicy: Literal["retain", "delete"] = Field(
        "retain", description="delete: the topic is deleted with the app.")


class Resources(Strict):
    cores: int = Field(1, ge=1)
    memory: Quantity = "1g"
    coreLimit: Quantity | None = None
    memoryOverhead: Quantity | None = None


class PodTemplate(Strict):
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    nodeSelector: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)


class SparkSpec(Strict):
    image: str = Field("sluice/spark:0.1.0", description="Driver and executor image (Spark + sluice runner).")
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    version: str = Field("4.2.0", description="Spark version in the image.")
    driver: Resources = Field(default_factory=Resources)
    executor: Resources = Field(default_factory=Resources)
    sparkConf: dict[str, str] = Field(default_factory=dict)
    serviceAccount: str | None = Field(None, description="Default: <app>-spark, created by the operator.")
    pod: PodTemplate = Field(default_factory=PodTemplate, description="Labels, annotations, node selector, env.")


class ExecutorsSpec(Strict):
    model_config = cel(("self.min <= self.max", "min must not exceed max"),
                       ("self.instances <= self.max", "instances must not exceed max"))

    instances: int = Field(1, ge=0, description="Executors now; the scale subresource sets this.")
    min: int = Field(1, ge=0)
    max: int = Field(10, ge=1)

    @model_validator(mode="after")
    def _bounds(self) -> ExecutorsSpec:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        if self.instances > self.max:
            raise ValueError(f"instances ({self.instances}) must not exceed max ({self.max})")
        return self


class AutoscalingSpec(Strict):
    """Executor autoscaling from Kafka lag. While enabled, the autoscaler owns the live executor count
    within executors.min..max; `kubectl scale` (spec.executors.instances) is then only the count a new
    driver starts with."""

    enabled: bool = False
    interval: Duration = Field("10s", description="How often the driver is sampled.")
    metricsWindow: Duration = Field("1m", description="Samples a decision averages over.")
    stabilization: Duration = Field(
        "1m", description="After a change, samples are ignored this long (new executors warm up).")
    targetLagSeconds: int = Field(30, ge=1, description="Catch up on the backlog within this time.")
    targetUtilization: float = Field(0.7, gt=0, le=1, description="Busy time per batch interval to aim for.")
    utilizationBand: float = Field(
        0.1, ge=0, lt=1, description="No change while utilization is within target ± this and the lag is met.")
    scaleUpCooldown: Duration = Field("1m", description="Least time between a change and a scale-up.")
    scaleDownCooldown: Duration = Field("5m", description="Least time between a change and a scale-down.")
    scaleDownWindow: Duration = Field(
        "5m", description="A scale-down goes to the largest recommendation seen over this window.")
    maxStep: int = Field(4, ge=1, description="Most executors added or removed at once.")


class RollbackSpec(Strict):
    enabled: bool = True
    healthTimeout: Duration = Field("5m", description="A new revision that is not healthy in time rolls back.")


class UpdateStrategy(Strict):
    """How pipeline changes roll out (the behaviour lands with rolling updates)."""

    type: Literal["auto", "restart", "hotSwap", "checkpointMigration", "fencedHandover"] = "auto"
    rollback: RollbackSpec = Field(default_factory=RollbackSpec)


class CheckpointSpec(Strict):
    """Where queries keep their checkpoints. A path without volumeClaim gets a PersistentVolumeClaim the
    operator creates (`<app>-checkpoints`), so a checkpoint never vanishes with the driver pod."""

    location: str = Field("/checkpoints", description="Checkpoint root (a path or a Hadoop URI).")
    volumeClaim: str | None = Field(None, description="An existing PersistentVolumeClaim mounted at the location.")
    size: Quantity | None = Field(None, description="Size of the claim the operator creates (default: the chart's).")
    storageClassName: str | None = Field(None, description="Its storage class (default: the chart's).")
    deletionPolicy: Literal["retain", "delete"] = Field(
        "retain", description="delete: the claim the operator created is deleted with the app.")

    def is_hadoop_uri(self) -> bool:
        """s3a://, hdfs://, gs://, abfs://…: durable without a volume (file:// and plain paths are local)."""
        scheme, sep, _ = self.location.partition("://")
        return bool(sep) and scheme.lower() != "file"


class StreamingAppSpec(Strict):
    pipeline: PipelineSpec
    kafka: KafkaSpec
    topics: list[TopicSpec] = Field(default_factory=list, max_length=200)
    spark: SparkSpec = Field(default_factory=SparkSpec)
    executors: ExecutorsSpec = Field(default_factory=ExecutorsSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    updateStrategy: UpdateStrategy = Field(default_factory=UpdateStrategy)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    suspend: bool = Field(False, description="Stop the driver; topics and checkpoints stay.")

    @model_validator(mode="after")
    def _topics_unique(self) -> StreamingAppSpec:
        names = [t.name for t in self.topics]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"duplicate topic name(s): {', '.join(duplicates)}")
        return self

    def topic_management(self, topic: TopicSpec) -> str:
        if topic.management:
            return topic.management
        return "strimzi" if self.kafka.strimziCluster else "admin"


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
        None, description="Who sets the live count: kubectl scale (manual) or the autoscaler.")
    lag: int | None = Field(None, description="Kafka records behind latest, each source topic counted once.")
    inputRate: str | None = Field(None, description="Input rows per second.")
    observedAt: str | None = Field(None, description="When lag, inputRate and executors were read from the driver.")
    autoscaler: AutoscalerStatus | None = None
    message: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    children: list[ChildRef] = Field(default_factory=list)
