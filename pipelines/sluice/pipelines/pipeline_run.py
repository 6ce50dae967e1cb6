"""One running pipeline: validated with Spark's parsers, compiled, its queries started, observed and stopped.

A run is described by a RunnerConfig: the one the operator writes, or one made from a StreamingApp manifest
or a bare pipeline file for local runs (`config_from_document`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from pyspark.errors import AnalysisException, IllegalArgumentException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from sluice.api.contract import (
    CheckpointsDeleted,
    QueryStep,
    RunnerConfig,
    RunState,
    StateResponse,
    SwapResponse,
)
from sluice.api.kafka_clients import KafkaClient, read_credentials, read_file
from sluice.api.pipeline import PipelineSpec
from sluice.api.validation import (
    PipelineDocument,
    PipelineInvalid,
    Problem,
    join_path,
    semantic_problems,
)

from .callbacks import close_connections
from .checkpoints import Handover, OutputGrid, committed_batch, delete_folder
from .compiler import DEAD_LETTER_QUERY_SUFFIX, CompiledPipeline, QueryPlan, compile_pipeline
from .local_config import config_from_document
from .metrics import PipelineMetrics, ProgressListener
from .migration import counted_before, fallback_of, hand_over, handed_over, taken_over
from .plancheck import error_summary, java_message, sink_path, spark_ddl_parser, spark_sql_parser, streaming_problems
from .queries import WARM_UP_QUERY_PREFIX, UnsupportedTrigger, start_query, warm_up
from .realtime import real_time_slot_problems
from .sinks import release_kept_clients
from .swap_steps import SwapRefused, steps_by_action, still_to_do

log = logging.getLogger("sluice.runtime")

WARM_UP_SECONDS = 2  # of each source's latest records a standby driver runs its plans over


@dataclass
class QueryState:
    name: str
    active: bool
    error: str | None
    progress: dict[str, Any] | None
    path: str = ""  # where the query's sink sits in the pipeline's file: pipeline.nodes[4], pipeline.deadLetter

    def failure(self) -> str:
        return f"{self.path} ({self.name}): {self.error}"


def _last_batch(query: StreamingQuery) -> Any:
    """The id of the query's last completed batch (None: none yet)."""
    progress = query.lastProgress
    return progress.get("batchId") if progress else None


class PipelineRun:
    """One running pipeline: its queries, metrics and lifecycle. Used by the runner, the CLI and tests.

    `pipeline_path` is where the pipeline sits in the file it came from, for error messages.
    """

    def __init__(
        self,
        spark: SparkSession,
        config: RunnerConfig,
        *,
        pipeline_path: str = "pipeline",
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self.spark = spark
        self.config = config
        self.pipeline_path = pipeline_path
        self.metrics = metrics or PipelineMetrics(config.app, spark=spark)
        self.queries: list[StreamingQuery] = []
        self.query_revisions: dict[str, str] = {}  # query name -> the revision whose plan it runs
        self._listener: ProgressListener | None = None
        self._stopping = threading.Event()
        self._changing = threading.Lock()  # a hot swap in progress: its queries stop and start
        self._logged_runs: set[Any] = set()
        self._state: RunState = "running"
        self._standby_plan: CompiledPipeline | None = None
        self._kafka_credentials = read_credentials(config.kafkaSecurity, read_file)  # a new login is a new driver

    @property
    def kafka(self) -> KafkaClient:
        """The app's Kafka, as the config that runs names it."""
        return self.kafka_of(self.config)

    def kafka_of(self, config: RunnerConfig) -> KafkaClient:
        return KafkaClient(config.kafkaBootstrap, config.kafkaSecurity, self._kafka_credentials)

    @classmethod
    def from_document(
        cls,
        spark: SparkSession,
        document: PipelineDocument,
        *,
        checkpoint_root: str,
        bootstrap_servers: str | None = None,
        metrics: PipelineMetrics | None = None,
    ) -> PipelineRun:
        config = config_from_document(document, checkpoint_root=checkpoint_root, bootstrap_servers=bootstrap_servers)
        return cls(spark, config, pipeline_path=document.prefix, metrics=metrics)

    @property
    def spec(self) -> PipelineSpec:
        return self.config.pipeline

    def start(self) -> PipelineRun:
        """Compile the pipeline and start its queries, or (config.standby) only compile it: set_state starts them."""
        compiled = self._compile(self.config)
        self._listener = ProgressListener(
            self.metrics.record_progress,
            self._log_first_batch,
            ignored=lambda progress: str(progress.get("name")).startswith(WARM_UP_QUERY_PREFIX),
        )
        self.spark.streams.addListener(self._listener)
        if self.config.standby:
            self._warm_up(self.config)
            self._standby_plan = compiled  # what activation starts: compiled and checked already
            self._state = "standby"
            log.info("revision %s on standby: %d queries start when asked", self.config.revision, len(compiled.queries))
            return self
        try:
            self._start_all(compiled)
        except BaseException:
            self.stop()
            raise
        return self

    def _warm_up(self, config: RunnerConfig) -> None:
        """Pay on standby what a cold driver's first batch pays (queries.warm_up), over the sources' records of
        the last WARM_UP_SECONDS, on a checkpoint folder of its own that is deleted after."""
        compiled = self._plans(config, since_ms=int(time.time() * 1000) - WARM_UP_SECONDS * 1000)
        warm_up(self.spark, compiled.queries, f"{config.checkpointRoot.rstrip('/')}/_warm-up-{config.revision}")

    def _start_all(self, compiled: CompiledPipeline) -> list[str]:
        """Start every query of the compiled config (each on its checkpoint, handing over first where its
        migration says); PipelineInvalid naming the query Spark refused."""
        try:
            for plan in compiled.queries:
                try:
                    self._start_query(plan, self.config, self._taken_over(self.config, plan.name, compiled))
                except (AnalysisException, IllegalArgumentException) as exc:  # refused by Spark as the query starts
                    problem = Problem(
                        self.query_path(plan.name), f"query {plan.name} did not start: {java_message(exc)}"
                    )
                    raise PipelineInvalid([problem]) from exc
        except UnsupportedTrigger as exc:
            raise PipelineInvalid([Problem(join_path(self.pipeline_path, "trigger"), str(exc))]) from exc
        return [plan.name for plan in compiled.queries]

    @property
    def state(self) -> RunState:
        return self._state

    def set_state(self, state: Literal["running", "drained"], config: RunnerConfig | None = None) -> StateResponse:
        """running: start the queries of a standby or drained run (on their checkpoints, which another driver
        may have advanced meanwhile); drained: stop every query at a batch boundary and release the exactly-once
        sinks' producers, the run staying up (and answering) until it is stopped. The state it is in: nothing
        changes (a stopped run is drained: asked to drain while it stops, it answers once its queries stopped).
        A query that fails to start stops the ones started with it: the run stays as it was. `config`: what a
        drained run resumes on instead of the config it ran (the same app and revision; the checkpoints may have
        moved and a query may take its output back from another checkpoint)."""
        began = time.monotonic()
        with self._changing:
            previous: RunState = self._state
            if self._stopping.is_set() and not (state == "drained" and previous == "drained"):
                raise SwapRefused("the driver is stopping", "state")
            started: list[str] = []
            stopped: list[str] = []
            if config is not None:
                self._check_resume_config(state, previous, config)
            if state == "running" and previous != "running":
                ran = self.config
                try:
                    self.config = config or self.config
                    # a standby run's plan was compiled from the config it ran
                    compiled = self._compile(config) if config else self._standby_plan or self._compile(self.config)
                    self._standby_plan = None
                    started = self._start_all(compiled)
                except BaseException:
                    for query in list(self.queries):
                        self._stop_query(query)
                    self.config = ran
                    raise
                self._state = "running"
            elif state == "drained" and previous != "drained":
                self._state = "draining"
                stopping = list(self.queries)
                self._stop_all(stopping, self._stop_query)
                stopped = [query.name for query in stopping]
                release_kept_clients()
                self._state = "drained"
            took = round((time.monotonic() - began) * 1000)
            log.info("state %s -> %s in %d ms: started %s, stopped %s", previous, self._state, took, started, stopped)
            return StateResponse(
                revision=self.config.revision,
                state=self._state,
                previous=previous,
                started=started,
                stopped=stopped,
                tookMs=took,
            )

    def _check_resume_config(self, state: str, previous: RunState, config: RunnerConfig) -> None:
        if state != "running" or previous != "drained":
            raise SwapRefused(f"a config is given only to resume a drained driver (this one is {previous})", "config")
        ran = (self.config.namespace, self.config.app, self.config.revision)
        if (config.namespace, config.app, config.revision) != ran:
            raise SwapRefused(
                f"config: a drained driver resumes revision {self.config.revision} of {'/'.join(ran[:2])}, not "
                f"revision {config.revision} of {config.namespace}/{config.app} (a new revision is a swap)",
                "config",
            )

    def _compile(
        self,
        config: RunnerConfig,
        starting_offsets: dict[str, str] | None = None,
        counted_before_ms: int | None = None,
    ) -> CompiledPipeline:
        """The pipeline's queries, checked with Spark's parsers first and with Spark's unsupported-operation
        check after (what `sluice validate` checks): PipelineInvalid naming each node, nothing started.
        `starting_offsets`, `counted_before_ms`: as compile_pipeline takes them (a query that took over from
        another checkpoint)."""
        problems = semantic_problems(
            config.pipeline, self.pipeline_path, sql=spark_sql_parser(self.spark), ddl=spark_ddl_parser(self.spark)
        )
        if problems:
            raise PipelineInvalid(problems)
        compiled = self._plans(config, starting_offsets=starting_offsets, counted_before_ms=counted_before_ms)
        problems = streaming_problems(self.spark, compiled, config.pipeline, self.pipeline_path)
        problems += real_time_slot_problems(self.spark, config.pipeline, self.pipeline_path, self.kafka_of(config))
        if problems:
            raise PipelineInvalid(problems)
        return compiled

    def _plans(
        self,
        config: RunnerConfig,
        starting_offsets: dict[str, str] | None = None,
        since_ms: int | None = None,
        counted_before_ms: int | None = None,
    ) -> CompiledPipeline:
        """The config's pipeline compiled on this run's Spark (compile_pipeline's options), unchecked."""
        return compile_pipeline(
            self.spark,
            config.pipeline,
            kafka=self.kafka_of(config),
            prefix=self.pipeline_path,
            app_name=config.app,
            starting_offsets=starting_offsets,
            since_ms=since_ms,
            counted_before_ms=counted_before_ms,
        )

    def checkpoint_of(self, query: str) -> str:
        """Where the query's checkpoint is in the revision that runs (a dead-letter query asks each batch)."""
        return self.config.checkpoint(query)

    def _taken_over(self, config: RunnerConfig, query: str, compiled: CompiledPipeline) -> Handover | None:
        """migration.taken_over, with this run's Kafka."""
        return taken_over(self.spark, config, query, compiled.sources, self.kafka_of(config))

    def _start_query(self, plan: QueryPlan, config: RunnerConfig, handover: Handover | None = None) -> StreamingQuery:
        """Start the plan; on a checkpoint that took over another's output (`handover`), from the offsets it
        was given while it has none of its own, and behind its output gate."""
        if handover is not None:
            last = committed_batch(self.spark, config.checkpoint(plan.name))
            offsets = handover.startingOffsets if last is None else {}  # Spark reads them only before batch 0
            counted = counted_before(self.spark, plan, config.checkpoint(plan.name), last, handover)
            if offsets or counted is not None:
                compiled = self._compile(config, offsets, counted_before_ms=counted)
                plan = next(p for p in compiled.queries if p.name == plan.name)
        if plan.final_grid_ms:
            OutputGrid(plan.final_grid_ms).write(self.spark, config.checkpoint(plan.name))
        query = start_query(
            plan,
            checkpoint_root=config.checkpointRoot,
            trigger=config.pipeline.trigger,
            kafka=self.kafka_of(config),
            spark_version=self.spark.version,
            on_dead_letters=self._count_dead_letters,
            app_id=f"{config.namespace}/{config.app}",
            checkpoint_of=self.checkpoint_of,
            gate_ms=handover.cutMs if handover is not None and plan.final_time is not None else None,
        )
        self.queries.append(query)
        self.query_revisions[plan.name] = config.revision
        self.metrics.up.labels(app=self.metrics.app, query=plan.name).set(1)
        self.metrics.query_started(plan.name, config.pipeline)
        interval = config.pipeline.trigger.interval_ms or 0
        self.metrics.trigger_interval.labels(app=self.metrics.app, query=plan.name).set(interval / 1000)
        return query

    # ------------------------------------------------------------------------------- hot swap
    def delete_checkpoints(self, folders: Sequence[str]) -> CheckpointsDeleted:
        """Delete checkpoint subfolders a finished migration left behind (the folder a migrated query moved
        from, or the one a rolled-back migration had made). Refused, nothing deleted, for a folder this
        revision still needs: one a query runs on, or the source of a migration its query has not completed
        a batch after (a driver starting it would hand over from there again)."""
        with self._changing:
            config = self.config
            names = [plan.name for plan in (self._standby_plan or self._compile(config)).queries]
            in_use = {config.checkpoints.get(name, name): name for name in names}
            for folder in folders:
                if folder in in_use:
                    raise SwapRefused(f"checkpoint {folder}: query {in_use[folder]} runs on it", "checkpoints")
                for query, migration in config.migrations.items():
                    taken_from = (migration.fromCheckpoint, migration.fallbackCheckpoint)
                    if folder in taken_from and not handed_over(self.spark, config, query, migration):
                        raise SwapRefused(
                            f"checkpoint {folder}: query {query} takes over from it and has not completed a "
                            "batch of its own since",
                            "checkpoints",
                        )
            deleted: list[str] = []
            absent: list[str] = []
            for folder in dict.fromkeys(folders):
                path = f"{config.checkpointRoot.rstrip('/')}/{folder}"
                (deleted if delete_folder(self.spark, path) else absent).append(folder)
            if deleted:
                log.info("checkpoints deleted: %s", deleted)
            return CheckpointsDeleted(deleted=deleted, absent=absent)

    def swap(self, config: RunnerConfig, steps: Sequence[QueryStep]) -> SwapResponse:
        """Run `config`'s revision in this driver: the steps' queries stop at a batch boundary and restart
        (on their checkpoints), move to another checkpoint (migrate, restore: see migration.py), start or stop;
        `keep` queries are not touched. Nothing changes when the request does not fit this run or the new
        pipeline does not compile (SwapRefused, PipelineInvalid). A query that fails to start on the new plan
        is started on the old one again, and its error raised."""
        with self._changing:
            if self._stopping.is_set():
                raise SwapRefused("the driver is stopping", "revision")
            if self._state != "running":
                raise SwapRefused(f"the driver is {self._state}: its queries run only after PUT /v1/state running")
            compiled = self._compile(config)
            plans = {plan.name: plan for plan in compiled.queries}
            revisions = {q.name: self.query_revisions.get(q.name) if q.isActive else None for q in self.queries}
            todo = still_to_do(steps, current=self.config, config=config, running=revisions)
            by_action = steps_by_action(todo, current=self.config, config=config, plans=plans, running=set(revisions))
            rewind = {step.name: step.rewindMs for step in todo}
            running = {query.name: query for query in self.queries}
            old_config, self.config = self.config, config
            started_at = time.monotonic()
            started: list[str] = []

            def change(name: str) -> None:
                """One query's part, beside the others': its pause is its own batch boundary and start only."""
                began = time.monotonic()
                if name in running:
                    self._stop_query(running[name])
                stopped = time.monotonic()
                if name in plans and name not in by_action["stop"]:
                    if name not in by_action["move"]:
                        handover = self._taken_over(config, name, compiled)  # a gate it was given stays
                    else:
                        handover = hand_over(
                            self.spark,
                            source_checkpoint=old_config.checkpoint(name),
                            target_checkpoint=config.checkpoint(name),
                            rewind_ms=rewind[name],
                            sources=compiled.sources,
                            kafka=self.kafka_of(config),
                            query=name,
                            fallback_checkpoint=fallback_of(config, name),
                        )
                    self._start_query(plans[name], config, handover)
                    started.append(name)
                log.info(
                    "swap to %s: query %s stopped in %.2f s, started in %.2f s",
                    config.revision,
                    name,
                    stopped - began,
                    time.monotonic() - stopped,
                )

            changing = by_action["stop"] + by_action["restart"] + by_action["move"] + by_action["start"]
            with ThreadPoolExecutor(max_workers=max(len(changing), 1), thread_name_prefix="sluice-swap") as pool:
                failures = [f.exception() for f in [pool.submit(change, name) for name in changing]]
            failure = next((f for f in failures if f is not None), None)
            if failure is not None:
                for name in started:
                    self._stop_query(self._query(name))
                self.config = old_config
                old_compiled = self._compile(old_config)  # compiled before
                old_plans = {plan.name: plan for plan in old_compiled.queries}
                for name in by_action["restart"] + by_action["move"] + by_action["stop"]:
                    self._start_query(old_plans[name], old_config, self._taken_over(old_config, name, old_compiled))
                raise failure
            return SwapResponse(
                revision=config.revision,
                restarted=by_action["restart"],
                moved=by_action["move"],
                started=by_action["start"],
                stopped=by_action["stop"],
                kept=by_action["keep"],
                tookMs=round((time.monotonic() - started_at) * 1000),
            )

    def _query(self, name: str) -> StreamingQuery:
        return next(query for query in reversed(self.queries) if query.name == name)

    def _stop_query(self, query: StreamingQuery, boundary_timeout: float = 30.0, forget: bool = True) -> None:
        """Stopped at a batch boundary: at once when no batch runs, else as soon as the running one completes
        (a query whose batches run back to back is never caught idle; the batch begun right after is stopped
        as it starts: its offsets are in the offset log, and a restart runs them). `forget`: no longer one of
        this run's queries (a swap), else it stays for its final state (the run stops)."""
        deadline = time.monotonic() + boundary_timeout
        running = _last_batch(query)
        while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
            if _last_batch(query) != running:
                break
            time.sleep(0.05)
        waited = time.monotonic() - deadline + boundary_timeout
        query.stop()
        close_connections(str(query.id))  # its stream thread has ended
        log.info(
            "query %s: %.2f s to a batch boundary, stopped %.2f s after",
            query.name,
            waited,
            time.monotonic() - deadline + boundary_timeout - waited,
        )
        self.metrics.up.labels(app=self.metrics.app, query=query.name).set(0)
        if forget and query in self.queries:
            self.queries.remove(query)
            self.query_revisions.pop(query.name, None)

    @staticmethod
    def _stop_all(queries: list[StreamingQuery], stop: Callable[[StreamingQuery], None]) -> None:
        """Each query stopped at its own batch boundary, side by side (the pause is the longest), the dead-letter
        queries first: a batch of theirs waits for the queries it checks to plan past its records, which a
        stopped query never does (the drain then waited 30 s for that batch's boundary)."""
        dead_letters = [q for q in queries if str(q.name).endswith(DEAD_LETTER_QUERY_SUFFIX)]
        for group in (dead_letters, [q for q in queries if q not in dead_letters]):
            if group:
                with ThreadPoolExecutor(max_workers=len(group), thread_name_prefix="sluice-stop") as pool:
                    list(pool.map(stop, group))

    def _log_first_batch(self, progress: dict[str, Any]) -> None:
        """A query run's first batch (after a start, a restart or a swap): what its pause was spent on."""
        if progress.get("runId") not in self._logged_runs:
            self._logged_runs.add(progress.get("runId"))
            log.info(
                "query %s: first batch %s of run %s: %s",
                progress.get("name"),
                progress.get("batchId"),
                progress.get("runId"),
                json.dumps(progress.get("durationMs", {}), sort_keys=True),
            )

    def _count_dead_letters(self, source: str, count: int) -> None:
        self.metrics.dead_letters.labels(app=self.metrics.app, source=source).inc(count)

    # ------------------------------------------------------------------------------- observing
    def states(self) -> list[QueryState]:
        out = []
        for query in self.queries:
            error = query.exception()
            out.append(
                QueryState(
                    query.name,
                    query.isActive,
                    error_summary(str(error)) if error else None,
                    query.lastProgress,
                    self.query_path(query.name),
                )
            )
        return out

    def query_path(self, name: str) -> str:
        """The sink node of a query (named after it), or the dead letter sink (`<source>-dead-letters`)."""
        return sink_path(self.spec, self.pipeline_path, name)

    def failed(self) -> list[QueryState]:
        return [s for s in self.states() if s.error]

    def request_stop(self) -> None:
        """Ask await_termination() to return (signal handlers call this); stop() does the stopping."""
        self._stopping.set()

    def stopping(self) -> bool:
        return self._stopping.is_set()

    def healthy(self) -> bool:
        waiting = self._state != "running"  # standby or drained: no queries, by request
        return (bool(self.queries) or waiting) and not self.failed() and not self._stopping.is_set()

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
            raise RuntimeError("; ".join(f"query failed: {s.failure()}" for s in failed))

    def await_termination(self, poll: float = 1.0) -> int:
        """Block until stop() is called or every query ends; non-zero when a query failed."""
        while not self._stopping.is_set():
            if self.failed():
                break
            if not self._changing.locked() and self.queries and not any(q.isActive for q in self.queries):
                break
            self._stopping.wait(poll)
        return 1 if self.failed() else 0

    # ------------------------------------------------------------------------------- stopping
    def stop(self, boundary_timeout: float = 30.0) -> None:
        """Stop every query, each between two micro-batches when it can be caught idle in time. The run reports
        itself draining meanwhile, then drained: it writes nothing more (a rollback resumes the driver it
        replaced without waiting for this one's pod to go)."""
        self._stopping.set()
        with self._changing:  # a swap under way ends first (none starts now): its queries are stopped too
            self._state = "draining"
            self._stop_all(list(self.queries), lambda query: self._stop_query(query, boundary_timeout, forget=False))
            release_kept_clients()  # exactly-once sinks writing from the driver keep their producers until now
            self._state = "drained"
        if self._listener is not None:
            self.spark.streams.removeListener(self._listener)
            self._listener = None
