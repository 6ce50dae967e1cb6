"""One running pipeline: validated with Spark's parsers, compiled, its queries started, observed and stopped.

A run is described by a RunnerConfig: the one the operator writes, or one made from a StreamingApp manifest
or a bare pipeline file for local runs (`config_from_document`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from .compiler import compile_pipeline
from .contract import RunnerConfig
from .metrics import PipelineMetrics, ProgressListener
from .queries import UnsupportedTrigger, start_query
from .spec import PipelineSpec
from .validation import PipelineDocument, PipelineInvalid, Problem, join_path, semantic_problems, validate

LOCAL_REVISION = "local"  # the revision of a run made from a file rather than by the operator


def _java_message(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)  # py4j wraps JVM exceptions
    message = str(java.getMessage() if java is not None else exc)
    return next((line.strip() for line in message.splitlines() if line.strip()), message)


def spark_sql_parser(spark: SparkSession):
    """A validation SqlParser backed by Spark's own expression parser (F.expr parses lazily in Spark 4)."""
    parser = spark._jsparkSession.sessionState().sqlParser()

    def parse(expression: str) -> str | None:
        try:
            parser.parseExpression(expression)
        except Exception as exc:
            return _java_message(exc)
        return None

    return parse


def spark_ddl_parser(spark: SparkSession):
    struct_type = spark._jvm.org.apache.spark.sql.types.StructType

    def parse(ddl: str) -> list[str] | str:
        try:
            return list(struct_type.fromDDL(ddl).fieldNames())
        except Exception as exc:
            return _java_message(exc)

    return parse


def config_from_document(document: PipelineDocument, *, checkpoint_root: str, bootstrap_servers: str | None = None,
                         control_port: int = 0, control_token_file: str | None = None) -> RunnerConfig:
    """A manifest or bare pipeline (validated without Spark) as the RunnerConfig a local run runs.

    The Kafka bootstrap is decided here: the flag, else the manifest's spec.kafka.bootstrapServers, else
    $SLUICE_KAFKA_BOOTSTRAP.
    """
    spec = validate(document.pipeline, document.prefix)
    manifest = document.manifest or {}
    kafka = (manifest.get("spec") or {}).get("kafka") or {}
    bootstrap = bootstrap_servers or kafka.get("bootstrapServers") or os.environ.get("SLUICE_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise PipelineInvalid([Problem("spec.kafka.bootstrapServers" if manifest else "--bootstrap-servers",
                                       "no Kafka bootstrap: pass --bootstrap-servers, set "
                                       "spec.kafka.bootstrapServers or $SLUICE_KAFKA_BOOTSTRAP")])
    return RunnerConfig(app=document.app_name, namespace=(manifest.get("metadata") or {}).get("namespace") or "default",
                        revision=LOCAL_REVISION, kafkaBootstrap=bootstrap, pipeline=spec,
                        checkpointRoot=checkpoint_root, controlPort=control_port,
                        controlTokenFile=control_token_file)


@dataclass
class QueryState:
    name: str
    active: bool
    error: str | None
    progress: dict[str, Any] | None


class PipelineRun:
    """One running pipeline: its queries, metrics and lifecycle. Used by the runner, the CLI and tests.

    `pipeline_path` is where the pipeline sits in the file it came from, for error messages.
    """

    def __init__(self, spark: SparkSession, config: RunnerConfig, *, pipeline_path: str = "pipeline",
                 metrics: PipelineMetrics | None = None) -> None:
        self.spark = spark
        self.config = config
        self.pipeline_path = pipeline_path
        self.metrics = metrics or PipelineMetrics(config.app)
        self.queries: list[StreamingQuery] = []
        self._listener: ProgressListener | None = None
        self._stopping = threading.Event()

    @classmethod
    def from_document(cls, spark: SparkSession, document: PipelineDocument, *, checkpoint_root: str,
                      bootstrap_servers: str | None = None, metrics: PipelineMetrics | None = None) -> PipelineRun:
        config = config_from_document(document, checkpoint_root=checkpoint_root, bootstrap_servers=bootstrap_servers)
        return cls(spark, config, pipeline_path=document.prefix, metrics=metrics)

    @property
    def spec(self) -> PipelineSpec:
        return self.config.pipeline

    def start(self) -> PipelineRun:
        problems = semantic_problems(self.spec, self.pipeline_path, sql=spark_sql_parser(self.spark),
                                     ddl=spark_ddl_parser(self.spark))
        if problems:
            raise PipelineInvalid(problems)
        compiled = compile_pipeline(self.spark, self.spec, bootstrap_servers=self.config.kafkaBootstrap,
                                    prefix=self.pipeline_path, app_name=self.config.app)
        self._listener = ProgressListener(self.metrics.record_progress)
        self.spark.streams.addListener(self._listener)
        try:
            for plan in compiled.queries:
                self.queries.append(start_query(plan, checkpoint_root=self.config.checkpointRoot,
                                                trigger=self.spec.trigger, bootstrap=self.config.kafkaBootstrap,
                                                spark_version=self.spark.version,
                                                on_dead_letters=self._count_dead_letters,
                                                app_id=f"{self.config.namespace}/{self.config.app}"))
                self.metrics.up.labels(app=self.metrics.app, query=plan.name).set(1)
        except UnsupportedTrigger as exc:
            self.stop()
            raise PipelineInvalid([Problem(join_path(self.pipeline_path, "trigger"), str(exc))]) from exc
        except BaseException:
            self.stop()
            raise
        return self

    def _count_dead_letters(self, source: str, count: int) -> None:
        self.metrics.dead_letters.labels(app=self.metrics.app, source=source).inc(count)

    # ------------------------------------------------------------------------------- observing
    def states(self) -> list[QueryState]:
        out = []
        for query in self.queries:
            error = query.exception()
            out.append(QueryState(query.name, query.isActive, str(error).split("\n")[0] if error else None,
                                  query.lastProgress))
        return out

    def failed(self) -> list[QueryState]:
        return [s for s in self.states() if s.error]

    def request_stop(self) -> None:
        """Ask await_termination() to return (signal handlers call this); stop() does the stopping."""
        self._stopping.set()

    def stopping(self) -> bool:
        return self._stopping.is_set()

    def healthy(self) -> bool:
        return bool(self.queries) and not self.failed() and not self._stopping.is_set()

    def caught_up(self) -> bool:
        """Every query idle with all its sources read up to the latest offsets."""
        for query in self.queries:
            if not query.isActive:
                continue
            status, progress = query.status, query.lastProgress
            if status["isTriggerActive"] or status["isDataAvailable"] or progress is None:
                return False
            for source in progress.get("sources", []):
                latest, end = source.get("latestOffset"), source.get("endOffset")
                if latest is not None and json.dumps(latest, sort_keys=True) != json.dumps(end, sort_keys=True):
                    return False
        return True

    def wait_until_caught_up(self, timeout: float = 300, settle: float = 2.0) -> None:
        deadline = time.monotonic() + timeout
        stable_since: float | None = None
        while time.monotonic() < deadline:
            self.raise_if_failed()
            if self.caught_up():
                stable_since = stable_since or time.monotonic()
                if time.monotonic() - stable_since >= settle:
                    return
            else:
                stable_since = None
            time.sleep(0.25)
        raise TimeoutError(f"pipeline {self.config.app} did not catch up within {timeout}s")

    def raise_if_failed(self) -> None:
        failed = self.failed()
        if failed:
            raise RuntimeError("; ".join(f"query {s.name} failed: {s.error}" for s in failed))

    def await_termination(self, poll: float = 1.0) -> int:
        """Block until stop() is called or every query ends; non-zero when a query failed."""
        while not self._stopping.is_set():
            if self.failed():
                break
            if self.queries and not any(q.isActive for q in self.queries):
                break
            self._stopping.wait(poll)
        return 1 if self.failed() else 0

    # ------------------------------------------------------------------------------- stopping
    def stop(self, boundary_timeout: float = 30.0) -> None:
        """Stop every query, each between two micro-batches when it can be caught idle in time."""
        self._stopping.set()
        for query in self.queries:
            deadline = time.monotonic() + boundary_timeout
            while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
                time.sleep(0.05)
            query.stop()
            self.metrics.up.labels(app=self.metrics.app, query=query.name).set(0)
        if self._listener is not None:
            self.spark.streams.removeListener(self._listener)
            self._listener = None
