"""The one typed contract between the operator and the driver.

`RunnerConfig` is everything the operator hands the runner (written as JSON into the revisioned
ConfigMap, validated by the runner at start). The driver control API's request and response bodies
(`/v1/status`, `/v1/executors`, `/v1/pipeline`, `/v1/state`) are the models below; the runner serves them and
the operator's driver client parses them, so both sides share one definition.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from .pipeline import PipelineSpec
from .spec_types import Strict

API_VERSION: Final = "sluice.dev/v1alpha1"
RUNNER_CONFIG_FILE = "runner.json"
RUNNER_CONFIG_KIND = "RunnerConfig"
REVISION_SPEC_FILE = "spec.json"  # in a revision's ConfigMap: the app's spec of that revision (what rollouts diff)
DEFAULT_CONTROL_PORT = 9090
MAX_EXECUTORS = 1000
CHECKPOINT_FOLDER = r"^[A-Za-z0-9][A-Za-z0-9._@-]*$"  # one folder under checkpointRoot, never a path


def revision_configmap_name(app: str, revision: str) -> str:
    """A revision's ConfigMap: its RunnerConfig and its spec as the operator ran it (`sluice plan` reads it)."""
    return f"{app}-pipeline-{revision}"


CheckpointFolder = Annotated[str, StringConstraints(pattern=CHECKPOINT_FOLDER)]


class Migration(Strict):
    """Where a query's checkpoint takes over its output from (a checkpoint migration to the config's revision)."""

    fromCheckpoint: CheckpointFolder = Field(description="The subfolder of checkpointRoot the query ran on before.")
    rewindMs: int | None = Field(None, ge=0, description="As a migrate step's (QueryStep.rewindMs).")
    fallbackCheckpoint: CheckpointFolder | None = Field(
        None,
        description="Where to take over from instead while fromCheckpoint holds no completed batch (its query "
        "wrote nothing): the checkpoint that query took over from. A rollback's migration names it.",
    )


class KafkaSecurity(Strict):
    """How the driver's Kafka clients log in: the protocol, and the files of the driver pod that hold the
    credentials (Secrets the operator mounts); never the credentials themselves (sluice.api.kafka_clients)."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    saslMechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] | None = None
    username: str | None = None
    passwordFile: str | None = None
    trustedCertificateFiles: list[str] = Field(
        default_factory=list, description="PEM CA certificates; none: the system's CAs."
    )
    certificateFile: str | None = Field(None, description="The PEM client certificate (mTLS).")
    keyFile: str | None = Field(None, description="Its PEM (PKCS#8) private key.")


class RunnerConfig(Strict):
    """What the driver runs: one revision of one app."""

    apiVersion: Literal["sluice.dev/v1alpha1"] = API_VERSION
    kind: Literal["RunnerConfig"] = "RunnerConfig"
    app: str = Field(min_length=1, description="The StreamingApp's name.")
    namespace: str = "default"
    revision: str = Field(min_length=1, description="Hash of what the user wrote that the driver runs.")
    kafkaBootstrap: str = Field(min_length=1, description="host:port[,host:port], resolved by the operator.")
    kafkaSecurity: KafkaSecurity = Field(
        default_factory=KafkaSecurity, description="How every Kafka client of the app logs in."
    )
    pipeline: PipelineSpec
    checkpointRoot: str = Field(min_length=1, description="The app's checkpoint folder (a query per subfolder).")
    checkpoints: dict[str, CheckpointFolder] = Field(
        default_factory=dict,
        description="Query name -> its checkpoint's subfolder of checkpointRoot, where it is not the query's name: "
        "a query migrated to a checkpoint of its own (checkpoint migration) keeps it in later revisions.",
    )
    migrations: dict[str, Migration] = Field(
        default_factory=dict,
        description="Query name -> the checkpoint its own (checkpoints) takes over from, in a checkpoint migration "
        "to this revision or its rollback: a driver that starts the query hands over first unless it did (a "
        "handover from there is recorded, and the checkpoint has a completed batch), as a hot swap's migrate "
        "and restore steps do (a driver that was not running, or restarted, mid-migration).",
    )
    standby: bool = Field(
        False,
        description="Start no query until PUT /v1/state asks for running: the pipeline is compiled and checked, the "
        "control API answers, the checkpoints are not touched (a fenced handover's new driver; a drained driver "
        "that restarts).",
    )
    controlPort: int = Field(DEFAULT_CONTROL_PORT, ge=0, le=65535, description="0: no control API.")
    controlTokenFile: str | None = Field(
        None, description="File holding the bearer token writes need; None: the API refuses every write."
    )

    def checkpoint(self, query: str, folder: str | None = None) -> str:
        """Where the query's checkpoint is (`folder`: where one of its subfolders is)."""
        return f"{self.checkpointRoot.rstrip('/')}/{folder or self.checkpoints.get(query, query)}"

    @model_validator(mode="after")
    def _migrations_move(self) -> RunnerConfig:
        for query, migration in self.migrations.items():
            for field in ("fromCheckpoint", "fallbackCheckpoint"):
                if getattr(migration, field) == self.checkpoints.get(query, query):
                    raise ValueError(
                        f"migrations.{query}.{field}: {getattr(migration, field)!r} is the checkpoint the query "
                        "runs on; a migration moves it to another (checkpoints)"
                    )
        return self


def in_app(error: str) -> str:
    """An error that starts with a path in a RunnerConfig's pipeline, as the path in its StreamingApp (whose
    spec.pipeline the operator copied there): what the app's status names."""
    return f"spec.{error}" if re.match(r"pipeline[.\[: ]", error) else error


# ------------------------------------------------------------------------------ driver control API


class Answer(Strict):
    """A body the driver answers with. Its reader ignores fields it does not know, as Kubernetes clients do: a
    driver of a newer release (an app's own image, or a rollback of the operator) still answers this one. What
    the driver is asked stays strict: a field it does not know is refused, not silently dropped."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ExecutorsRequest(Strict):
    """PUT /v1/executors: the total number of executors the app should have now."""

    target: int = Field(ge=0, le=MAX_EXECUTORS)


class ExecutorsResponse(Answer):
    target: int
    previous: int = Field(description="Live executors before the request.")
    killed: list[str] = Field(default_factory=list, description="Executors asked to stop (scale-down).")


class QueryStatus(Answer):
    """One streaming query. Counters are cumulative since the driver started, so a caller that samples
    twice gets rates over its own interval."""

    name: str
    id: str | None = None
    runId: str | None = None
    active: bool
    error: str | None = Field(
        None, description="Why the query failed, in one line: its sink's path in the StreamingApp, then Spark's error."
    )
    batchId: int | None = None
    batches: int = 0
    runBatches: int = Field(
        0, description="Batches completed by the query's current run (runId): a restart or a hot swap starts anew."
    )
    inputRows: int = 0
    busyMs: int = Field(
        0,
        description=(
            "Time spent in batches: the completed batches' triggerExecution durations plus the running batch's "
            "elapsed time, so it grows with wall time while a batch runs. Never decreases."
        ),
    )
    completedBusyMs: int | None = Field(
        None,
        description=(
            "Sum of the completed batches' triggerExecution durations: the time their inputRows took. None: a "
            "driver from before this field (busyMs then counts completed batches only)."
        ),
    )
    runningBatchMs: int = Field(0, description="Elapsed time of the batch running now; 0: none.")
    revision: str | None = Field(None, description="The revision whose plan the query runs.")
    inputRowsPerSecond: float | None = None
    processedRowsPerSecond: float | None = None
    lastBatchDurationMs: int | None = None
    triggerIntervalMs: int | None = Field(
        None, description="The pipeline's processingTime, or realTime's batch length; None for availableNow."
    )
    stateful: bool = False
    stateRows: int | None = Field(None, description="Rows its stateful operations hold (last progress); None: none.")
    watermark: str | None = Field(
        None, description="Its event-time watermark (RFC 3339, UTC) as of its last progress; None: no event time."
    )
    topics: list[str] = Field(default_factory=list, description="Kafka topics it reads (from its last progress).")


class TopicStatus(Answer):
    """A source topic, counted once however many queries read it."""

    topic: str
    partitions: int
    latestOffsets: int = Field(
        description=(
            "Sum of the partitions' latest offsets: Kafka's end offsets (read_committed) at the time of the answer, "
            "or, when Kafka could not be asked (see DriverStatus.latestOffsetsFrom), the newest its queries saw."
        )
    )
    backlog: int = Field(
        description=(
            "Sum over partitions of latest offset - the slowest query's end offset (of its last completed batch)."
        )
    )


class ExecutorStatus(Answer):
    id: str
    host: str = ""
    totalCores: int = 0
    activeTasks: int = 0


RunState = Literal["standby", "running", "draining", "drained"]


class DriverStatus(Answer):
    """GET /v1/status."""

    app: str
    revision: str
    state: RunState = Field(
        "running",
        description=(
            "standby: waits for PUT /v1/state; "
            "draining/drained: stopping/stopped its queries (as asked, or as the driver stops)."
        ),
    )
    observedAt: str = Field(description="RFC 3339 time of this answer.")
    queries: list[QueryStatus] = Field(default_factory=list)
    topics: list[TopicStatus] = Field(default_factory=list)
    backlog: int = Field(0, description="Sum of the topics' backlogs.")
    latestOffsetsFrom: Literal["kafka", "progress"] = Field(
        "progress",
        description=(
            "Where the topics' latest offsets come from: kafka, asked when answering; "
            "progress, the queries' last progress (stale while a batch runs)."
        ),
    )
    latestOffsetsError: str | None = Field(None, description="Why Kafka could not be asked, if it was not.")
    executors: list[ExecutorStatus] = Field(default_factory=list)
    executorTarget: int | None = Field(None, description="The last total asked of Spark (None: none yet).")
    taskSlots: int = Field(0, description="Tasks the live executors run at once.")
    sourceTasks: int = Field(0, description="Tasks a batch's Kafka read splits into (partitions, minPartitions).")
    shufflePartitions: int = Field(0, description="spark.sql.shuffle.partitions (stateful stages' tasks).")


class StateRequest(Strict):
    """PUT /v1/state. running: start the queries (a standby driver's activation, a drained one's resume);
    drained: stop every query at a batch boundary and write nothing more, the driver staying up (a fenced
    handover's old driver). Asking for the state the driver is in changes nothing."""

    state: Literal["running", "drained"]
    config: RunnerConfig | None = Field(
        None,
        description="running only: the config a drained driver resumes on, of the revision it ran (where its queries' "
        "checkpoints are now and which take their output back from another: the rollback of a checkpoint migration "
        "that ran in another driver). None: the config it ran.",
    )


class StateResponse(Answer):
    revision: str = Field(description="The revision whose plan the driver's queries run.")
    state: RunState
    previous: RunState
    started: list[str] = Field(default_factory=list)
    stopped: list[str] = Field(default_factory=list)
    tookMs: int = Field(0, description="From the request to the last query started or stopped.")


class DeleteCheckpointsRequest(Strict):
    """DELETE /v1/checkpoints: subfolders of checkpointRoot a finished checkpoint migration left behind."""

    checkpoints: list[CheckpointFolder] = Field(min_length=1)


class CheckpointsDeleted(Answer):
    deleted: list[str] = Field(default_factory=list)
    absent: list[str] = Field(default_factory=list, description="Asked for, but not there (deleted before).")


class ApiError(Answer):
    error: str
    field: str | None = Field(None, description="The request body's field at fault (400), e.g. 'target'.")


Health = Literal["ok", "failed", "stopping", "starting"]


# ------------------------------------------------------------------------------ rolling updates

QueryAction = Literal["keep", "restart", "migrate", "start", "stop", "restore"]
IN_DRIVER_ACTIONS: tuple[QueryAction, ...] = ("keep", "restart", "migrate", "start", "stop", "restore")


class QueryStep(Strict):
    """What one streaming query (named after its sink, or `<source>-dead-letters`) does in a rollout.

    keep: runs on unchanged (never stopped by an in-driver rollout); restart: stops at a batch boundary and
    restarts on its own checkpoint with the new plan; migrate: the new plan starts on a checkpoint of the new
    revision, from the old query's committed offsets rewound by rewindMs, behind an output gate; start: a new
    query; stop: a removed query (its checkpoint is kept until the rollout is over); restore: back on the
    checkpoint the stable revision kept (rollback of migrate and stop).
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    name: str = Field(description="The query: its sink node's name, or <source>-dead-letters.")
    action: QueryAction = Field(description="keep, restart, migrate, start, stop or restore.")
    rewindMs: int | None = Field(
        None,
        description="migrate: how much event time before the old query's position the new one re-reads "
        "(watermark delay + longest window/join span); None: nothing carries over, it starts from its sources' "
        "startingOffsets (unbounded state, or another Kafka cluster).",
    )
    reason: str | None = Field(None, description="Why, with the spec path that changed.")


class SwapRequest(Strict):
    """PUT /v1/pipeline: run `config`'s revision in this driver (a hot swap). Only the steps' queries stop, each at
    a batch boundary; every query of the new pipeline needs a step (keep, restart or start) and every running
    query one too (keep, restart or stop). Nothing changes when the new pipeline does not compile."""

    config: RunnerConfig
    steps: list[QueryStep] = Field(min_length=1)


class SwapResponse(Answer):
    revision: str
    restarted: list[str] = Field(default_factory=list)
    moved: list[str] = Field(
        default_factory=list, description="migrate and restore: on another checkpoint, behind an output gate."
    )
    started: list[str] = Field(default_factory=list)
    stopped: list[str] = Field(default_factory=list)
    kept: list[str] = Field(default_factory=list)
    tookMs: int | None = Field(
        None, description="From the first stop to the last start: the longest any changed query was not running."
    )
