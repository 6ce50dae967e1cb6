"""What an app should look like (pure): its spec as the operator accepts it, the Kafka it reaches and the
children that make it run. Nothing here talks to Kubernetes or Kafka."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.api.app import CLAIM_LOCATION, S3A_SCHEME, app_problems
from sluice.api.contract import RunnerConfig
from sluice.api.sqlcheck import static_ddl_parser, static_sql_parser
from sluice.api.validation import Problem

from . import children as ch
from . import spark_application as sparkapp
from .guard_rails import guard_rail_problems
from .model import StreamingAppSpec, TopicSpec
from .settings import ONE_POD, Access, CheckpointStore, ClaimDefaults, Settings


@dataclass
class DesiredState:
    spec: StreamingAppSpec
    bootstrap: str
    revision: str
    children: list[dict[str, Any]]
    admin_topics: list[TopicSpec]
    strimzi_topics: list[dict[str, Any]]


@dataclass
class Invalid:
    problems: list[Problem]

    @property
    def message(self) -> str:
        return "; ".join(map(str, self.problems))


def parse_spec(raw: dict[str, Any]) -> StreamingAppSpec | Invalid:
    """The app's spec, or every problem with its path (spec.pipeline.nodes[2].inputs[0]: ...). SQL syntax is
    checked without a JVM (sluice.api.sqlcheck); the driver parses it again with Spark at start."""
    spec, problems = app_problems(raw, "spec", sql=static_sql_parser, ddl=static_ddl_parser)
    return Invalid(problems) if spec is None else spec


def bootstrap_for(spec: StreamingAppSpec, namespace: str) -> str:
    """The address the spec names, or the bootstrap Service Strimzi makes for the listener (Cluster.bootstrap
    reads the listener's address from the Kafka resource's status first)."""
    if spec.kafka.bootstrapServers:
        return spec.kafka.bootstrapServers
    cluster = spec.kafka.strimziCluster
    assert cluster is not None
    port = 9093 if cluster.listener == "tls" else 9092
    return f"{cluster.name}-kafka-bootstrap.{cluster.namespace or namespace}.svc:{port}"


def checkpoint_problem(spec: StreamingAppSpec, claims: ClaimDefaults, store: CheckpointStore) -> Problem | None:
    """A checkpoint that would vanish with the driver pod is refused, never used; so is a claim its executors
    could never share."""
    checkpoint = spec.checkpoint
    if checkpoint.location is None and store.location is not None:
        return None  # the operator's store
    if not (checkpoint.volumeClaim or checkpoint.is_hadoop_uri() or claims.create):
        return Problem(
            "spec.checkpoint",
            f"location {checkpoint.location_or_claim_path!r} is a path in the driver pod and this operator creates no "
            "checkpoint claims (chart checkpoints.createClaims=false): set checkpoint.volumeClaim, or a Hadoop URI "
            "location (s3a://, hdfs://…)",
        )
    if not (checkpoint.volumeClaim or checkpoint.is_hadoop_uri()) and claims.access_mode == ONE_POD:
        return Problem(
            "spec.checkpoint",
            f"the operator's checkpoint claims are {ONE_POD} (chart checkpoints.accessMode): the executors could "
            "not mount them; set a Hadoop URI location (s3a://…) or checkpoint.volumeClaim",
        )
    return None


def with_operator_defaults(
    spec: StreamingAppSpec, namespace: str, settings: Settings, kept: Mapping[str, Any]
) -> StreamingAppSpec:
    """The spec as the operator runs it: what the app leaves to the operator filled in, each from what the app
    first ran with where the status kept it (`kept`: checkpointLocation, sparkImage and sparkVersion), else from
    the operator's settings. So an operator release with other defaults changes no app that runs."""
    location = kept.get("checkpointLocation")
    if location is None and ran_before_kept_locations(kept):
        location = CLAIM_LOCATION  # the only default then (its CRD's, written in the spec only when given)
    spec = with_checkpoint_location(spec, namespace, settings.checkpoint_store, location)
    spark = spec.spark
    if spark.image is not None:  # an image of the app's: its version, or the operator's
        version = spark.version or settings.spark.version
        return spec if version == spark.version else _with_spark(spec, spark.image, version)
    kept_image = kept.get("sparkImage")
    image, default_version = (
        (kept_image, kept.get("sparkVersion")) if kept_image else (settings.spark.image, settings.spark.version)
    )
    return _with_spark(spec, image, spark.version or default_version or settings.spark.version)


def ran_before_kept_locations(status: Mapping[str, Any]) -> bool:
    """Whether a release before status.checkpointLocation ran the app: it has a revision but neither a kept
    location nor the CheckpointReady condition, which this release writes with it. (An older CRD served by
    mistake may prune the location; the condition this release wrote stays, so the app is not moved.)"""
    conditions = {c.get("type") for c in status.get("conditions") or [] if isinstance(c, dict)}
    return bool(status.get("revision")) and "checkpointLocation" not in status and "CheckpointReady" not in conditions


KEPT_DEFAULTS = ("checkpointLocation", "sparkImage", "sparkVersion")  # the status fields kept_defaults fills


def kept_defaults(spec: StreamingAppSpec) -> dict[str, str | None]:
    """What the status keeps of a spec with_operator_defaults filled in: the next passes run on it."""
    kept = (spec.checkpoint.location, spec.spark.image, spec.spark.version)
    return dict(zip(KEPT_DEFAULTS, kept, strict=True))


def _with_spark(spec: StreamingAppSpec, image: str, version: str) -> StreamingAppSpec:
    return spec.model_copy(update={"spark": spec.spark.model_copy(update={"image": image, "version": version})})


def with_checkpoint_location(
    spec: StreamingAppSpec, namespace: str, store: CheckpointStore, kept: str | None
) -> StreamingAppSpec:
    """The spec as the operator runs it: an app that names no checkpoint location keeps the one it ran on
    (status.checkpointLocation, `kept`), else gets the operator's store (with its S3 settings), else the claim's
    path. A store changed later moves no app: its checkpoints stay where they are."""
    checkpoint = spec.checkpoint
    if checkpoint.location is not None:
        return spec
    location = kept or store.location_for(namespace) or CLAIM_LOCATION
    s3 = store.s3 if location.startswith(S3A_SCHEME) else None
    return spec.model_copy(update={"checkpoint": checkpoint.model_copy(update={"location": location, "s3": s3})})


def namespace_problem(namespace: str | None, access: Access) -> Problem | None:
    if namespace not in access.denied_namespaces:
        return None
    return Problem("metadata.namespace", f"apps may not run in {namespace} (the chart's deniedNamespaces)")


def admissible_spec(
    raw: dict[str, Any], settings: Settings, namespace: str | None = None
) -> StreamingAppSpec | Invalid:
    """What the operator accepts: a parsed spec, or every problem (the admission webhook asks the same): a
    namespace apps may not use, the model's, a checkpoint this operator cannot keep, the administrator's guard
    rails."""
    denied = namespace_problem(namespace, settings.access)
    parsed = parse_spec(raw)
    if isinstance(parsed, Invalid):
        return Invalid([denied, *parsed.problems]) if denied else parsed
    checkpoint = checkpoint_problem(parsed, settings.checkpoints, settings.checkpoint_store)
    problems = [p for p in [denied, checkpoint] if p]
    problems += guard_rail_problems(parsed, settings.guard_rails)
    return Invalid(problems) if problems else parsed


def desired_state(
    app: str,
    namespace: str,
    spec: StreamingAppSpec,
    submitted_executors: int | None = None,
    claims: ClaimDefaults | None = None,
    pin: sparkapp.DriverPin | None = None,
    runner: RunnerConfig | None = None,
    driver_spec: StreamingAppSpec | None = None,
    driver: str | None = None,
    driver_role: str = Access.driver_cluster_role,
    bootstrap: str | None = None,
    claim: sparkapp.ClaimFacts | None = None,
) -> DesiredState:
    """`submitted_executors`: what the existing SparkApplication was submitted with (kept: see children);
    `pin`, `runner`, `driver_spec`: the revisions its driver runs and was submitted for, what a starting driver
    runs, and the spec it was submitted with; `driver`: its SparkApplication (default: the app's name); `claim`:
    the app's own checkpoint claim as observed."""
    bootstrap = bootstrap or bootstrap_for(spec, namespace)
    by_mode: dict[str, list[TopicSpec]] = {"strimzi": [], "admin": [], "none": []}
    for topic in spec.topics:
        by_mode[spec.topic_management(topic)].append(topic)
    cluster = spec.kafka.strimziCluster
    strimzi = [
        ch.kafka_topic(
            app, cluster.namespace or namespace if cluster else namespace, t, cluster.name if cluster else ""
        )
        for t in by_mode["strimzi"]
    ]
    return DesiredState(
        spec,
        bootstrap,
        ch.revision(spec),
        ch.children(
            app,
            namespace,
            spec,
            bootstrap,
            submitted_executors,
            claims,
            pin,
            runner,
            driver_spec,
            driver,
            driver_role,
            claim,
        ),
        by_mode["admin"],
        strimzi,
    )
