"""The StreamingApp resource's spec: its pydantic model and the checks every tool runs on it.

The operator (Valid condition, admission webhook), the CRD generator and `sluice validate` all use this
module, so a manifest is judged the same way everywhere. The status models are the operator's
(sluice.operator.model).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import (
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from .kafka_spec import KafkaSpec
from .pipeline import PipelineSpec
from .pods import PodTemplate
from .spec_types import ObjectName, Quantity, SecretKey, Strict, TopicName, cel, list_map
from .times import Duration
from .validation import DdlParser, PipelineInvalid, Problem, SqlParser, join_path, model_problems, natural_key, validate

GROUP = "sluice.dev"
VERSION = "v1alpha1"
KIND = "StreamingApp"
PLURAL = "streamingapps"
SINGULAR = "streamingapp"
SHORT_NAMES = ["sapp"]
API_VERSION = f"{GROUP}/{VERSION}"


class TopicSpec(Strict):
    """A Kafka topic of the app, made (and grown) by the operator."""

    name: TopicName = Field(description="The topic's name in Kafka.")
    partitions: int = Field(1, ge=1, le=10000, description="Partitions (they only grow).")
    replicas: int | None = Field(
        None,
        ge=1,
        le=32767,
        description="Copies of each partition. Default: the cluster's default.replication.factor, which its "
        "min.insync.replicas is set against (a topic with fewer copies cannot take exactly-once writes).",
    )
    config: dict[str, str] = Field(default_factory=dict, description="Topic configs, e.g. retention.ms.")
    management: Literal["strimzi", "admin", "none"] | None = Field(
        None,
        description="strimzi: a KafkaTopic resource; admin: the Kafka Admin API; none: not managed. "
        "Default: strimzi with strimziCluster, admin with bootstrapServers.",
    )
    deletionPolicy: Literal["retain", "delete"] = Field(
        "retain", description="delete: the topic is deleted with the app."
    )


class Resources(Strict):
    """A driver's or an executor's CPU and memory."""

    cores: int = Field(1, ge=1, description="CPU cores (Spark's task slots on an executor).")
    memory: Quantity = "1g"
    coreLimit: Quantity | None = None
    memoryOverhead: Quantity | None = None


SPARK_VERSION = "4.2.0"  # the Spark of sluice's image (images/spark), the operator's default spark.version


class SparkSpec(Strict):
    """The driver's and executors' image, resources, Spark settings and pods."""

    image: str | None = Field(
        None,
        min_length=1,
        description="Driver and executor image (Spark + sluice runner). Default: the operator's (the chart's "
        "sparkImage), as of the app's first run: kept (status.sparkImage), so an operator upgrade restarts no app.",
    )
    imagePullPolicy: Literal["Always", "IfNotPresent", "Never"] = Field("IfNotPresent", description="Of the pods.")
    version: str | None = Field(
        None,
        min_length=1,
        description="Spark version in the image. Default: that of the default image (kept with it), else the "
        f"operator's ({SPARK_VERSION}).",
    )
    driver: Resources = Field(default_factory=Resources)
    executor: Resources = Field(default_factory=Resources)
    sparkConf: dict[str, str] = Field(default_factory=dict, description="Spark settings, over sluice's defaults.")
    serviceAccount: str | None = Field(None, description="Default: <app>-spark, created by the operator.")
    pod: PodTemplate = Field(default_factory=PodTemplate, description="Labels, annotations, node selector, env.")


class ExecutorsSpec(Strict):
    """How many executors the driver has: now, and the autoscaler's bounds."""

    model_config = cel(
        ("self.min <= self.max", "min must not exceed max"),
        ("self.instances <= self.max", "instances must not exceed max"),
    )

    instances: int = Field(1, ge=0, description="Executors now; the scale subresource sets this.")
    min: int = Field(1, ge=0, description="The fewest executors the autoscaler keeps.")
    max: int = Field(10, ge=1, description="The most executors: the autoscaler's and kubectl scale's ceiling.")

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

    enabled: bool = Field(False, description="The autoscaler sets the live executor count.")
    interval: Duration = Field("10s", description="How often the driver is sampled.")
    metricsWindow: Duration = Field("1m", description="Samples a decision averages over.")
    stabilization: Duration = Field(
        "1m", description="After a change and after the driver starts, samples are ignored this long (warm-up)."
    )
    targetLagSeconds: int = Field(
        30,
        ge=1,
        description=(
            "Catch up on the backlog within this time (or, while utilization is in the band, before executors "
            "added now would be warm: stabilization)."
        ),
    )
    targetUtilization: float = Field(
        0.7,
        gt=0,
        le=1,
        description="Busy time the input needs per batch interval to aim for: input rate ÷ what the executors process.",
    )
    utilizationBand: float = Field(
        0.1, ge=0, lt=1, description="No change while utilization is within target ± this and the lag is met."
    )
    scaleUpCooldown: Duration = Field("1m", description="Least time between a change and a scale-up.")
    scaleDownCooldown: Duration = Field("5m", description="Least time between a change and a scale-down.")
    scaleDownWindow: Duration = Field(
        "5m", description="A scale-down goes to the largest recommendation seen over this window."
    )
    maxStep: int = Field(4, ge=1, description="Most executors added or removed at once.")


class RollbackSpec(Strict):
    enabled: bool = Field(
        True,
        description="Return to the stable revision when the new one fails or is not healthy in time (else: Failed).",
    )
    healthTimeout: Duration = Field(
        "5m",
        description="A new revision whose changed queries have not each completed 3 batches (or caught up) by then "
        "rolls back.",
    )


Strategy = Literal["hotSwap", "checkpointMigration", "fencedHandover", "restart"]  # how a change rolls out


class UpdateStrategy(Strict):
    """How a change of the spec rolls out: compared with the stable revision's spec, query by query, by Spark's
    rules for restarting a query on its checkpoint."""

    type: Literal["auto", "restart", "hotSwap", "checkpointMigration", "fencedHandover"] = Field(
        "auto",
        description="auto: the cheapest safe strategy. hotSwap: only the changed queries restart, in the running "
        "driver. fencedHandover: a second driver takes over at a batch boundary. checkpointMigration: changed "
        "queries start on new checkpoints from the old ones' offsets. restart: spark-operator resubmits the "
        "driver. An explicit type unsafe for the change is refused. `sluice plan` shows what a change needs.",
    )
    rollback: RollbackSpec = Field(
        default_factory=RollbackSpec, description="Whether and when a new revision that fails goes back."
    )


CLAIM_LOCATION = "/checkpoints"  # an app's checkpoint claim's mount, where it names no location and no store is set
S3A_SCHEME = "s3a://"


class S3CredentialsSecret(Strict):
    secretName: ObjectName = Field(description="A Secret in the app's namespace.")
    accessKeyId: SecretKey = Field("AWS_ACCESS_KEY_ID", description="Its key holding the access key id.")
    secretAccessKey: SecretKey = Field("AWS_SECRET_ACCESS_KEY", description="Its key holding the secret access key.")


class S3Spec(Strict):
    """How the driver and executors reach an s3a:// checkpoint (Hadoop's S3A filesystem, AWS SDK v2)."""

    endpoint: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        description="The store's URL, e.g. http://minio.storage:9000 for an S3-compatible store. Default: AWS S3's "
        "for the region.",
    )
    region: str | None = Field(None, min_length=1, max_length=64, description="The bucket's region, e.g. eu-west-1.")
    pathStyleAccess: bool = Field(
        False, description="Request https://endpoint/bucket/key instead of bucket.endpoint (most S3-compatible stores)."
    )
    credentialsSecret: S3CredentialsSecret | None = Field(
        None,
        description="A key pair from a Secret. Default: the pod's identity (web identity / IRSA, EKS Pod Identity, "
        "an instance profile), through the AWS SDK's default credentials chain.",
    )


class CheckpointSpec(Strict):
    """Where queries keep their checkpoints (each app under `<location>/<app>`). An object store (s3a://) is
    durable by itself and reachable from every node; a path is mounted from a PersistentVolumeClaim, the app's
    own or one the operator creates (`<app>-checkpoints`), so a checkpoint never vanishes with the driver pod."""

    model_config = cel(
        (
            "!has(self.s3) || (has(self.location) && self.location.startsWith('s3a://'))",
            "s3 is for an s3a:// location: name it in location",
        ),
    )

    location: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        description="Checkpoint root: a Hadoop URI (s3a://bucket/path, hdfs://…) or a path on a claim. Default: the "
        "operator's store (the chart's checkpoints.location), else /checkpoints on a claim. Kept once the app "
        "ran (status.checkpointLocation): a new operator default moves no app.",
    )
    s3: S3Spec | None = Field(
        None, description="For an s3a:// location. Default with the operator's store: the chart's checkpoints.s3."
    )
    volumeClaim: str | None = Field(None, description="An existing PersistentVolumeClaim mounted at the location.")
    size: Quantity | None = Field(None, description="Size of the claim the operator creates (default: the chart's).")
    storageClassName: str | None = Field(None, description="Its storage class (default: the chart's).")
    deletionPolicy: Literal["retain", "delete"] = Field(
        "retain", description="delete: the claim the operator created is deleted with the app."
    )

    @model_validator(mode="after")
    def _store_settings_for_a_store(self) -> CheckpointSpec:
        if self.s3 is not None and not (self.location or "").startswith(S3A_SCHEME):
            raise ValueError("s3 is for an s3a:// location: name it in location")
        if self.volumeClaim and self.is_hadoop_uri():
            raise ValueError(f"volumeClaim is mounted at a path: location {self.location!r} is a Hadoop URI")
        return self

    def is_hadoop_uri(self) -> bool:
        """s3a://, hdfs://, gs://, abfs://…: durable without a volume (file:// and plain paths are local)."""
        scheme, sep, _ = (self.location or "").partition("://")
        return bool(sep) and scheme.lower() != "file"

    @property
    def location_or_claim_path(self) -> str:
        """The location, or where the claim is mounted when none is named (before the operator fills it in)."""
        return self.location or CLAIM_LOCATION


def _duplicate_topics(topics: Any) -> str | None:
    """'duplicate topic name …' naming each clash with both indexes, for raw or parsed topics."""
    if not isinstance(topics, list):
        return None
    first: dict[str, int] = {}
    clashes = []
    for i, topic in enumerate(topics):
        name = topic.get("name") if isinstance(topic, dict) else getattr(topic, "name", None)
        if isinstance(name, str) and first.setdefault(name, i) != i:
            clashes.append(f"'{name}' (topics[{first[name]}] and topics[{i}])")
    return f"duplicate topic name {', '.join(clashes)}" if clashes else None


class StreamingAppSpec(Strict):
    pipeline: PipelineSpec
    kafka: KafkaSpec
    topics: list[TopicSpec] = Field(
        default_factory=list,
        max_length=200,
        json_schema_extra=list_map("name"),
        description="Kafka topics the operator makes and grows for the app.",
    )
    spark: SparkSpec = Field(default_factory=SparkSpec, description="The driver's and executors' image and pods.")
    executors: ExecutorsSpec = Field(default_factory=ExecutorsSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    updateStrategy: UpdateStrategy = Field(default_factory=UpdateStrategy)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    suspend: bool = Field(False, description="Stop the driver; topics and checkpoints stay.")

    @field_validator("topics", mode="wrap")
    @classmethod
    def _topics_unique(cls, topics: Any, handler: ValidatorFunctionWrapHandler) -> list[TopicSpec]:
        # Checked on the raw list too, so a duplicate is reported beside the problems of the topics themselves.
        clash = _duplicate_topics(topics)
        try:
            parsed = handler(topics)
        except ValidationError as exc:
            if clash is None:
                raise
            duplicate = {"type": "value_error", "loc": (), "input": topics, "ctx": {"error": ValueError(clash)}}
            raise ValidationError.from_exception_data(exc.title, [*exc.errors(), duplicate]) from exc  # type: ignore[list-item]
        if clash is not None:
            raise ValueError(clash)
        return parsed

    def topic_management(self, topic: TopicSpec) -> str:
        if topic.management:
            return topic.management
        return "strimzi" if self.kafka.strimziCluster else "admin"


def revision(spec: StreamingAppSpec) -> str:
    """Identifies what the driver runs: the pipeline, its Kafka, its checkpoint and the image, as the user
    wrote them. Fields left at their defaults are not hashed, so an operator release that adds a defaulted
    field does not make a new revision (and restart every app)."""

    def written(model: Any) -> Any:
        return model.model_dump(mode="json", by_alias=True, exclude_defaults=True)

    checkpoint = written(spec.checkpoint)
    if checkpoint.get("location") == CLAIM_LOCATION:  # the default before the operator's store: same revisions
        del checkpoint["location"]
    identity = {
        "pipeline": written(spec.pipeline),
        "kafka": written(spec.kafka),
        "checkpoint": checkpoint,
        "image": spec.spark.image,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:10]


def app_problems(
    spec: Any, prefix: str = "spec", sql: SqlParser | None = None, ddl: DdlParser | None = None
) -> tuple[StreamingAppSpec | None, list[Problem]]:
    """The parsed spec (None when anything is wrong) and every problem of it, each with its path."""
    parsed, problems = model_problems(spec, prefix, StreamingAppSpec)
    try:  # the pipeline's own layers: DAG, semantics, SQL (the model above only checks its shape)
        validate(
            spec.get("pipeline") if isinstance(spec, dict) else None, join_path(prefix, "pipeline"), sql=sql, ddl=ddl
        )
    except PipelineInvalid as exc:
        problems += exc.problems
    return (None if problems else parsed), sorted(set(problems), key=natural_key)


def manifest_problems(
    manifest: dict[str, Any], sql: SqlParser | None = None, ddl: DdlParser | None = None
) -> list[Problem]:
    """Every problem of a whole StreamingApp manifest (apiVersion, kind, metadata.name, spec)."""
    return parsed_manifest(manifest, sql, ddl)[1]


def parsed_manifest(
    manifest: dict[str, Any], sql: SqlParser | None = None, ddl: DdlParser | None = None
) -> tuple[StreamingAppSpec | None, list[Problem]]:
    """A whole StreamingApp manifest's spec (None when anything is wrong) and every problem of it."""
    problems = []
    if manifest.get("apiVersion") != API_VERSION:
        problems.append(Problem("apiVersion", f"must be {API_VERSION} (got {manifest.get('apiVersion')!r})"))
    if manifest.get("kind") != KIND:
        problems.append(Problem("kind", f"must be {KIND} (got {manifest.get('kind')!r})"))
    name = (manifest.get("metadata") or {}).get("name") if isinstance(manifest.get("metadata"), dict) else None
    if not isinstance(name, str) or not name:
        problems.append(Problem("metadata.name", "required"))
    spec, spec_problems = app_problems(manifest.get("spec"), "spec", sql=sql, ddl=ddl)
    problems += spec_problems
    return (None if problems else spec), problems
