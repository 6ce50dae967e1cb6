"""The sluice runner: what the Spark driver runs.

    python -m sluice.pipelines.runner /etc/sluice/runner.json

FILE is a RunnerConfig (JSON or YAML, `kind: RunnerConfig`), as the operator writes it: then it is the only
input. For local runs FILE may instead be a StreamingApp manifest or a bare pipeline, with flags for what a
RunnerConfig carries. The runner validates the pipeline (SQL parsed by Spark), starts one streaming query
per sink (and the dead-letter queries; with `standby: true` it warms up and waits for PUT /v1/state), serves
the control API (/metrics, /healthz, /v1/status, /v1/executors, /v1/pipeline, /v1/state) on the control port,
and stops at a batch boundary on SIGTERM. A run that fails (at start, or a
query later) also leaves its error, with the node path, as the container's termination message, which the
operator puts in the StreamingApp's status.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterable
from typing import Any

from sluice.api.contract import DEFAULT_CONTROL_PORT, RUNNER_CONFIG_KIND, RunnerConfig, in_app
from sluice.api.validation import (
    PipelineInvalid,
    Problem,
    graph_problems,
    load_documents,
    model_problems,
    semantic_problems,
)

from .control.server import ControlServer
from .local_config import config_from_document
from .pipeline_run import PipelineRun
from .plancheck import error_summary, java_message

log = logging.getLogger("sluice.runner")
# Flags for local runs whose values a RunnerConfig carries itself: argparse dest -> flag.
CONFIG_FLAGS = {
    "bootstrap_servers": "--bootstrap-servers",
    "checkpoint_dir": "--checkpoint-dir",
    "control_port": "--control-port",
    "control_token_file": "--control-token-file",
}
# Kubernetes' default terminationMessagePath: the kubelet creates the file before the container starts and
# keeps at most TERMINATION_MESSAGE_LIMIT bytes of it in the pod's containerStatuses[*].state.terminated.message.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096
# A failed run keeps answering /v1/status this long before the driver exits: the operator (a tick every 5 s by
# default) reads which query failed and why, rather than only seeing restarts (spark-operator deletes a failed
# driver's pod, and its termination message, within seconds).
FAILURE_REPORT_SECONDS = 15.0


def termination_message(what: str, errors: Iterable[str]) -> str:
    """One paragraph: `what` ("failed at start", "failed") and the first line of each error (its node path in
    the StreamingApp and Spark's message), cut to the bytes Kubernetes keeps."""
    lines = (in_app(next((line.strip() for line in e.splitlines() if line.strip()), "")) for e in errors)
    text = f"{what}: {'; '.join(line for line in lines if line)}"
    encoded = text.encode()
    if len(encoded) <= TERMINATION_MESSAGE_LIMIT:
        return text
    return encoded[: TERMINATION_MESSAGE_LIMIT - len("…".encode())].decode(errors="ignore") + "…"


def write_termination_message(message: str) -> None:
    """Written only where Kubernetes made the file (a local run has none: nothing is written)."""
    path = TERMINATION_MESSAGE_PATH
    if not os.path.isfile(path):
        return
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(message)
    except OSError as exc:
        log.warning("cannot write the termination message to %s: %s", path, exc)


def parse_runner_config(data: Any) -> RunnerConfig:
    """A RunnerConfig document, or PipelineInvalid with every problem and its field path."""
    config, problems = model_problems(data, "", RunnerConfig)
    problems += graph_problems(data.get("pipeline") if isinstance(data, dict) else None, "pipeline")
    if config is not None:
        problems += semantic_problems(config.pipeline, "pipeline")
    if problems:
        raise PipelineInvalid(sorted(set(problems)))
    return config


def runner_config(args: argparse.Namespace) -> tuple[RunnerConfig, str]:
    """What to run, and where its pipeline sits in the file (the prefix of error paths)."""
    document = load_documents(args.file)[0]
    data = document.pipeline
    if isinstance(data, dict) and data.get("kind") == RUNNER_CONFIG_KIND:
        given = [flag for dest, flag in CONFIG_FLAGS.items() if getattr(args, dest) is not None]
        if given:
            raise PipelineInvalid(
                [Problem(flag, "not allowed with a RunnerConfig (it carries this setting)") for flag in given]
            )
        return parse_runner_config(data), "pipeline"
    checkpoint = args.checkpoint_dir or os.environ.get("SLUICE_CHECKPOINT_DIR") or f"/tmp/sluice/{document.app_name}"
    port = (
        args.control_port
        if args.control_port is not None
        else int(os.environ.get("SLUICE_METRICS_PORT", DEFAULT_CONTROL_PORT))
    )
    config = config_from_document(
        document,
        checkpoint_root=checkpoint,
        bootstrap_servers=args.bootstrap_servers,
        control_port=port,
        control_token_file=args.control_token_file,
    )
    return config, document.prefix


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m sluice.pipelines.runner",
        description="Run a StreamingApp pipeline on Spark Structured Streaming",
    )
    parser.add_argument("file", help="a RunnerConfig (JSON or YAML), or a StreamingApp manifest or bare pipeline")
    local = parser.add_argument_group("local runs (a manifest or bare pipeline; a RunnerConfig carries these)")
    local.add_argument(
        "--checkpoint-dir",
        help="checkpoint root, one folder per query (default: $SLUICE_CHECKPOINT_DIR, else /tmp/sluice/<app>)",
    )
    local.add_argument(
        "--bootstrap-servers",
        help="Kafka bootstrap (default: the manifest's spec.kafka.bootstrapServers, else $SLUICE_KAFKA_BOOTSTRAP)",
    )
    local.add_argument(
        "--control-port",
        "--metrics-port",
        dest="control_port",
        type=int,
        help=f"control API port (default: $SLUICE_METRICS_PORT, else {DEFAULT_CONTROL_PORT}; 0: none)",
    )
    local.add_argument(
        "--control-token-file", help="file holding the bearer token writes need (default: none, writes are refused)"
    )
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master (default: from spark-submit); local[N] adds the Kafka connector jars",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    args = parse_args(argv)
    try:
        config, pipeline_path = runner_config(args)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        write_termination_message(termination_message("failed at start", [str(exc)]))
        return 2
    except PipelineInvalid as exc:
        print(f"error: invalid {args.file}:\n{exc}", file=sys.stderr)
        write_termination_message(termination_message("failed at start", map(str, exc.problems)))
        return 2
    from .session import build_session, local_session

    if args.master and args.master.startswith("local"):
        from .local.spark import spark_kafka_jars

        spark = local_session(f"sluice-{config.app}", spark_kafka_jars(), cores=args.master[6:-1] or "*")
    else:
        spark = build_session(f"sluice-{config.app}", {}, master=args.master)
    run = PipelineRun(spark, config, pipeline_path=pipeline_path)
    terminated = threading.Event()

    def on_sigterm(*_: object) -> None:
        terminated.set()
        run.request_stop()

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        run.start()
    except PipelineInvalid as exc:
        print(f"error: invalid pipeline in {args.file}:\n{exc}", file=sys.stderr)
        write_termination_message(termination_message("failed at start", map(str, exc.problems)))
        return 2
    except Exception as exc:
        log.exception("the pipeline did not start")
        write_termination_message(termination_message("failed at start", [error_summary(java_message(exc))]))
        return 1
    server = ControlServer(run).start() if config.controlPort else None
    log.info(
        "%s (revision %s): started %d queries; control API on :%s",
        config.app,
        config.revision,
        len(run.queries),
        server.port if server else "-",
    )
    code = run.await_termination()
    run.stop()
    failed = run.failed()
    for state in failed:
        log.error("query failed: %s", state.failure())
    if code:
        write_termination_message(termination_message("failed", [state.failure() for state in failed]))
    if server:
        if code and not terminated.is_set():
            log.info(
                "the control API answers %.0f s more, so the failure is read before the driver exits",
                FAILURE_REPORT_SECONDS,
            )
            terminated.wait(FAILURE_REPORT_SECONDS)
        server.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
