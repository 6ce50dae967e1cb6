"""The `sluice` command: validate manifests, run an app locally with a live view, plan a change, draw a pipeline,
print the schema.

Exit codes (docs/cli.md): 0 done (valid, no change, the run ended, drawn, printed); 1 the answer is "problems"
(validate, an unreadable file among them), "changes" (plan) or a query failed (run); 2 it could not be done (usage,
invalid input elsewhere, no cluster or app); 141 the output's reader went away (`| head`), as for a command killed
by SIGPIPE."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from sluice.api.app import manifest_problems
from sluice.api.pipeline import PipelineSpec
from sluice.api.sqlcheck import static_ddl_parser, static_sql_parser, strictest
from sluice.api.validation import (
    DdlParser,
    PipelineDocument,
    PipelineInvalid,
    Problem,
    SqlParser,
    load_documents,
    validate,
)

from .cli_io import UsageError, add_input, add_output, emit, input_paths, one_app, skipped_line
from .control.backlog import topic_backlogs

BROKEN_PIPE = 128 + signal.SIGPIPE  # 141, what a shell reports for a command SIGPIPE ended
PlanChecker = Callable[[PipelineSpec, str], list[Problem]]  # a valid spec and its path -> what Spark would refuse

console = Console(stderr=True)


def _spark_available() -> bool:
    return shutil.which("java") is not None


def _spark_log(app_name: str) -> Path:
    """The file Spark logs to in this run (the terminal shows sluice's output only), named once."""
    from .session import spark_log_file

    path = spark_log_file(app_name)
    console.print(f"[dim]Spark's log: {path}[/]")
    return path


def cmd_validate(args: argparse.Namespace) -> int:
    paths = input_paths(args)
    sql: SqlParser = static_sql_parser
    ddl: DdlParser = static_ddl_parser
    spark = None
    plans: PlanChecker | None = None
    if args.spark and _spark_available():
        from .plancheck import plan_problems, spark_ddl_parser, spark_sql_parser
        from .session import build_session

        spark = build_session(
            "sluice-validate", {"spark.ui.enabled": "false"}, master="local[1]", log_file=_spark_log("sluice-validate")
        )
        sql, ddl = strictest(spark_sql_parser(spark), spark_ddl_parser(spark))
        plans = functools.partial(plan_problems, spark)
    elif args.spark:
        console.print("[yellow]note:[/] no Java found: SQL is checked without Spark, and again when the app starts")
    checked: list[Checked] = []
    try:
        for path in paths:
            found = _validate_file(path, sql, ddl, plans)
            checked += found
            if args.output == "text":  # as each file is checked: with Spark, a directory can take minutes
                for one in found:
                    print("\n".join(one.lines()), flush=True)
    finally:
        if spark is not None:
            spark.stop()
    if args.output != "text":
        emit([one.as_dict() for one in checked], args.output)
    return 1 if any(one.problems for one in checked) else 0


@dataclass
class Checked:
    """What `validate` found in one document (or in a file it could not read): `app` None for such a file,
    `skipped` naming an object of another kind."""

    file: str
    app: str | None = None
    problems: list[Problem] = field(default_factory=list)
    skipped: str | None = None

    def lines(self) -> list[str]:
        if self.skipped is not None:
            return [skipped_line(self.file, self.skipped)]
        if self.problems:  # a problem of the file itself names it already
            return [str(p) if p.path.startswith(self.file) else f"{self.file}: {p}" for p in self.problems]
        return [f"{self.file}: {self.app}: valid"]

    def as_dict(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"file": self.file, "skipped": self.skipped}
        return {
            "file": self.file,
            "app": self.app,
            "valid": not self.problems,
            "problems": [asdict(problem) for problem in self.problems],
        }


def _validate_file(path: str, sql: SqlParser, ddl: DdlParser, plans: PlanChecker | None = None) -> list[Checked]:
    """A StreamingApp is checked whole, as the operator checks it; a bare pipeline as the runner does. With
    `plans` (Spark present), a pipeline that passes is compiled and its queries analysed as the runner
    does before starting them (output modes, operator order)."""
    try:
        documents = load_documents(path)
    except (OSError, PipelineInvalid) as exc:
        problems = exc.problems if isinstance(exc, PipelineInvalid) else [Problem(path, str(exc))]
        return [Checked(path, problems=problems)]
    checked = []
    for document in documents:
        if document.other_kind is not None:
            checked.append(Checked(path, skipped=document.other_kind))
            continue
        if document.manifest is not None:
            problems = manifest_problems(document.manifest, sql=sql, ddl=ddl)
        else:
            try:
                validate(document.pipeline, document.prefix, sql=sql, ddl=ddl)
                problems = []
            except PipelineInvalid as exc:
                problems = exc.problems
        if not problems and plans is not None:
            problems = plans(validate(document.pipeline, document.prefix), document.prefix)
        checked.append(Checked(path, document.app_name, problems))
    return checked


def default_bootstrap(document: PipelineDocument, flag: str | None) -> str | None:
    """--bootstrap-servers, else the local broker (make local-kafka), else the manifest's."""
    if flag:
        return flag
    from .local.kafka import LOCAL_KAFKA_DIR, local_bootstrap

    return local_bootstrap(LOCAL_KAFKA_DIR)


def dead_letters(run, query: str) -> int | None:
    """Records a dead letter query wrote in this run (None for other queries)."""
    from .compiler import DEAD_LETTER_QUERY_SUFFIX

    if not query.endswith(DEAD_LETTER_QUERY_SUFFIX):
        return None
    source = query.removesuffix(DEAD_LETTER_QUERY_SUFFIX)
    return int(
        run.metrics.registry.get_sample_value(
            "sluice_dead_letter_records_total", {"app": run.metrics.app, "source": source}
        )
        or 0
    )


def progress_table(run) -> Table:
    table = Table(title=f"sluice run: {run.config.app}", expand=False)
    for column in (
        "query",
        "status",
        "in rows/s",
        "processed/s",
        "backlog",
        "batch ms",
        "watermark (UTC)",
        "state rows",
        "dead letters",
    ):
        table.add_column(column, justify="left" if column in ("query", "status") else "right")
    for state in run.states():
        progress = state.progress or {}
        backlog = sum(topic.backlog for topic in topic_backlogs([progress]))
        status = "[red]failed" if state.error else "[green]running" if state.active else "stopped"
        watermark = (progress.get("eventTime") or {}).get("watermark", "-")
        dead = dead_letters(run, state.name)
        table.add_row(
            state.name,
            status,
            f"{progress.get('inputRowsPerSecond', 0) or 0:,.0f}",
            f"{progress.get('processedRowsPerSecond', 0) or 0:,.0f}",
            f"{backlog:,.0f}",
            str(progress.get("batchDuration", "-")),
            watermark[11:19] if "T" in watermark else watermark,
            f"{sum(op.get('numRowsTotal', 0) for op in progress.get('stateOperators', [])):,}",
            "-" if dead is None else f"{dead:,}",
        )
    return table


def run_summary(run) -> list[str]:
    """What the run read (records by topic; a topic read by several queries counts once) and wrote (by sink)."""
    records = run.metrics.queries()
    read: dict[str, int] = {}
    for record in records.values():
        for topic, rows in record.source_rows.items():
            read[topic] = max(read.get(topic, 0), rows)
    lines = [f"read: {topic}: {rows:,} records" for topic, rows in sorted(read.items())] or ["read: nothing"]
    for query in run.queries:
        record = records.get(query.name)
        written = dead_letters(run, query.name)
        if written is None:
            written = None if record is None else record.output_rows if record.batches else 0
        count = "records not counted by the sink" if written is None else f"{written:,} records"
        lines.append(f"wrote: {query.name} ({run.query_path(query.name)}): {count}")
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    from .control.server import ControlServer
    from .local.spark import spark_kafka_jars
    from .local_config import config_from_document
    from .pipeline_run import PipelineRun
    from .session import local_session

    try:
        document = one_app(args)
        config = config_from_document(
            document,
            checkpoint_root=args.checkpoint_dir or str(Path(".sluice/checkpoints") / document.app_name),
            bootstrap_servers=default_bootstrap(document, args.bootstrap_servers),
            control_port=args.metrics_port,
        )
    except (OSError, PipelineInvalid) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    spark = local_session(
        f"sluice-{config.app}", spark_kafka_jars(), cores=args.cores, log_file=_spark_log(f"sluice-{config.app}")
    )
    run = PipelineRun(spark, config, pipeline_path=document.prefix)
    try:
        run.start()
    except PipelineInvalid as exc:
        print(f"error: {document.source}:\n{exc}", file=sys.stderr)
        spark.stop()
        return 2
    server = ControlServer(run).start() if config.controlPort else None
    signal.signal(signal.SIGTERM, lambda *_: run.request_stop())
    code = 0
    try:
        with Live(progress_table(run), console=console, refresh_per_second=2) as live:
            stable_since = None
            while not (run.failed() or run.stopping()):
                time.sleep(1)
                live.update(progress_table(run))
                if not any(q.isActive for q in run.queries):
                    break
                if args.until_caught_up:
                    if run.caught_up():
                        stable_since = stable_since or time.monotonic()
                        if time.monotonic() - stable_since > 3:
                            break
                    else:
                        stable_since = None
            live.update(progress_table(run))
        code = 1 if run.failed() else 0
    except KeyboardInterrupt:
        console.print("stopping at the next batch boundary…")
    finally:
        failed = run.failed()
        run.stop()
        if server:
            server.stop()
        spark.stop()
    console.print()
    for line in run_summary(run):
        console.print(line, highlight=False, soft_wrap=True)
    for state in failed:
        console.print(f"[red]query failed:[/] {state.failure()}", highlight=False, soft_wrap=True)
    return code


def cmd_schema(args: argparse.Namespace) -> int:
    """The StreamingApp manifest's JSON Schema on stdout (for editors: see docs/streamingapp.md)."""
    from sluice.api.schema import manifest_schema

    emit(manifest_schema(), args.output)
    return 0


def main(argv: list[str] | None = None) -> int:
    from importlib.metadata import version

    parser = argparse.ArgumentParser(prog="sluice", description="sluice streaming apps")
    parser.add_argument("--version", action="version", version=f"sluice {version('sluice')}")
    sub = parser.add_subparsers(dest="command", required=True)

    v = sub.add_parser("validate", help="check manifests; prints every error with its path (exit 1: problems)")
    add_input(v, "the manifests")
    add_output(v, ("text", "json", "yaml"))
    v.add_argument(
        "--no-spark",
        dest="spark",
        action="store_false",
        help="skip parsing SQL expressions with Spark (faster, less thorough)",
    )
    v.set_defaults(func=cmd_validate)

    r = sub.add_parser("run", help="run an app locally on PySpark (local[*])")
    add_input(r, "one StreamingApp manifest or bare pipeline")
    r.add_argument("--bootstrap-servers", help="Kafka to use (default: the local broker, else the manifest's)")
    r.add_argument("--checkpoint-dir", help="default: .sluice/checkpoints/<app>")
    r.add_argument("--until-caught-up", action="store_true", help="stop once every source is drained")
    r.add_argument("--cores", default="*", help="local Spark cores (default: all)")
    r.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve the control API (/metrics, /healthz, /v1/status; writes disabled) (0: off)",
    )
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("schema", help="print the StreamingApp manifest's JSON Schema (for editors)")
    add_output(s, ("json", "yaml"))
    s.set_defaults(func=cmd_schema)

    from .graph_command import add_graph_parser
    from .plan_command import add_plan_parser

    add_plan_parser(sub)
    add_graph_parser(sub)

    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"sluice {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `sluice schema | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
        return BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
