"""The sluice runner: what the Spark driver runs. `python -m sluice.pipelines.runner MANIFEST`.

Validates the pipeline (SQL parsed by Spark), compiles it, starts one streaming query per sink (and
the dead-letter queries), serves /metrics and /healthz on one port, and stops at a batch boundary on
SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from .compiler import compile_pipeline
from .metrics import PipelineMetrics, ProgressListener
from .queries import UnsupportedTrigger, start_query
from .spec import PipelineSpec
from .validation import PipelineDocument, PipelineInvalid, Problem, load_documents, validate

log = logging.getLogger("sluice.runner")
DEFAULT_METRICS_PORT = 9090


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


def bootstrap_of(document: PipelineDocument, override: str | None) -> str | None:
    if override:
        return override
    kafka = ((document.manifest or {}).get("spec") or {}).get("kafka") or {}
    return kafka.get("bootstrapServers") or os.environ.get("SLUICE_KAFKA_BOOTSTRAP")


@dataclass
class QueryState:
    name: str
    active: bool
    error: str | None
    progress: dict[str, Any] | None


class PipelineRun:
    """One running pipeline: its queries, metrics and lifecycle. Used by the runner, the CLI and tests."""

    def __init__(self, spark: SparkSession, document: PipelineDocument, *, checkpoint_root: str,
                 bootstrap_servers: str | None = None, metrics: PipelineMetrics | None = None) -> None:
        self.spark = spark
        self.document = document
        self.checkpoint_root = checkpoint_root
        self.bootstrap = bootstrap_of(document, bootstrap_servers)
        self.metrics = metrics or PipelineMetrics(document.app_name)
        self.queries: list[StreamingQuery] = []
        self.spec: PipelineSpec | None = None
        self._listener: ProgressListener | None = None
        self._stopping = threading.Event()

    def start(self) -> PipelineRun:
        self.spec = validate(self.document.pipeline, self.document.prefix,
                             sql=spark_sql_parser(self.spark), ddl=spark_ddl_parser(self.spark))
        compiled = compile_pipeline(self.spark, self.spec, bootstrap_servers=self.bootstrap,
                                    prefix=self.document.prefix, app_name=self.document.app_name)
        self._listener = ProgressListener(self.metrics.record_progress)
        self.spark.streams.addListener(self._listener)
        try:
            for plan in compiled.queries:
                self.queries.append(start_query(plan, checkpoint_root=self.checkpoint_root,
                                                trigger=self.spec.trigger, bootstrap=self.bootstrap,
                                                spark_version=self.spark.version,
                                                on_dead_letters=self._count_dead_letters))
                self.metrics.up.labels(app=self.metrics.app, query=plan.name).set(1)
        except UnsupportedTrigger as exc:
            self.stop()
            raise PipelineInvalid([Problem(f"{self.document.prefix}.trigger".lstrip("."), str(exc))]) from exc
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

    def executors(self) -> int:
        count = self.spark.sparkContext._jsc.sc().getExecutorIds().size()
        self.metrics.executors.labels(app=self.metrics.app).set(count)
        return count

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
        raise TimeoutError(f"pipeline {self.document.app_name} did not catch up within {timeout}s")

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


class ControlServer:
    """/metrics (Prometheus) and /healthz on one port; later the operator's control API lives here too."""

    def __init__(self, run: PipelineRun, port: int, host: str = "0.0.0.0") -> None:
        run_ref = run

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    run_ref.executors()
                    self._send(200, generate_latest(run_ref.metrics.registry), CONTENT_TYPE_LATEST)
                elif self.path.startswith("/healthz"):
                    states = [s.__dict__ | {"progress": None} for s in run_ref.states()]
                    body = json.dumps({"healthy": run_ref.healthy(), "queries": states}).encode()
                    self._send(200 if run_ref.healthy() else 503, body, "application/json")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="sluice-control", daemon=True)

    def start(self) -> ControlServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sluice.pipelines.runner",
                                     description="Run a StreamingApp pipeline on Spark Structured Streaming")
    parser.add_argument("manifest", help="StreamingApp manifest or bare pipeline YAML")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("SLUICE_CHECKPOINT_DIR"),
                        help="checkpoint root (one folder per query); default /tmp/sluice/<app>")
    parser.add_argument("--bootstrap-servers", default=None, help="Kafka bootstrap (overrides the manifest)")
    parser.add_argument("--metrics-port", type=int,
                        default=int(os.environ.get("SLUICE_METRICS_PORT", DEFAULT_METRICS_PORT)))
    parser.add_argument("--master", default=None,
                        help="Spark master (default: from spark-submit); local[N] adds the Kafka connector jars")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = parse_args(argv)
    try:
        documents = load_documents(args.manifest)
    except (OSError, PipelineInvalid) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    document = documents[0]
    from .session import build_session, local_session

    if args.master and args.master.startswith("local"):
        spark = local_session(f"sluice-{document.app_name}", cores=args.master[6:-1] or "*")
    else:
        spark = build_session(f"sluice-{document.app_name}", {}, master=args.master)
    run = PipelineRun(spark, document, checkpoint_root=args.checkpoint_dir or f"/tmp/sluice/{document.app_name}",
                      bootstrap_servers=args.bootstrap_servers)
    signal.signal(signal.SIGTERM, lambda *_: run.request_stop())
    try:
        run.start()
    except PipelineInvalid as exc:
        print(f"error: invalid pipeline in {args.manifest}:\n{exc}", file=sys.stderr)
        return 2
    server = ControlServer(run, args.metrics_port).start() if args.metrics_port else None
    log.info("started %d queries; metrics on :%s", len(run.queries), server.port if server else "-")
    code = run.await_termination()
    run.stop()
    if server:
        server.stop()
    for state in run.failed():
        log.error("query %s failed: %s", state.name, state.error)
    return code


if __name__ == "__main__":
    sys.exit(main())
