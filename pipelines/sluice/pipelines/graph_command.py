"""`sluice graph FILE [-o dot|svg|png] [--live]`: a picture of an app's pipeline (sluice.api.graph). svg and png
are drawn by Graphviz's `dot`; `--live` adds the running driver's rates and backlog, read with kubectl exec
(the driver's control API answers reads on its own pod's loopback). Exit codes: 0 drawn, 2 error."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sluice.api.app import parsed_manifest
from sluice.api.contract import DEFAULT_CONTROL_PORT, DriverStatus
from sluice.api.graph import live_figures, pipeline_dot
from sluice.api.pipeline import PipelineSpec
from sluice.api.sqlcheck import static_ddl_parser, static_sql_parser
from sluice.api.validation import PipelineInvalid, validate

from .cli_io import add_input, add_output, one_app
from .kubectl import KubectlError, add_cluster_flags, kubectl, kubectl_json

DRIVER_CONTAINER = "spark-kubernetes-driver"
READ_STATUS = (
    "import sys, urllib.request; "
    f"sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:{DEFAULT_CONTROL_PORT}/v1/status', timeout=10)"
    ".read().decode())"
)


class GraphError(Exception):
    """What stops a drawing, said for the user."""


def add_graph_parser(sub: Any) -> None:
    p = sub.add_parser(
        "graph", help="draw an app's pipeline: sources, operations, sinks, queries, state (exit 2: error)"
    )
    add_input(p, "one StreamingApp manifest or bare pipeline")
    add_output(p, ("dot", "svg", "png"))  # svg and png need Graphviz
    p.add_argument("--to", dest="path", help="write it there (default: stdout)")
    p.add_argument("--live", action="store_true", help="add the running app's rates and backlog (kubectl exec)")
    add_cluster_flags(p)
    p.set_defaults(func=cmd_graph)


def cmd_graph(args: argparse.Namespace) -> int:
    try:
        name, namespace, pipeline = read_pipeline(args)
        live = live_figures(pipeline, driver_status(args, name, namespace or args.namespace)) if args.live else {}
        drawing = render(pipeline_dot(name, pipeline, live), args.output)
    except (GraphError, KubectlError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.path:
        Path(args.path).write_bytes(drawing)
    else:
        sys.stdout.buffer.write(drawing)
    return 0


def read_pipeline(args: argparse.Namespace) -> tuple[str, str | None, PipelineSpec]:
    """The one StreamingApp (or bare pipeline) of the input: its name, namespace and valid pipeline."""
    try:
        document = one_app(args)
    except (OSError, PipelineInvalid) as exc:
        raise GraphError(str(exc)) from exc
    path = document.source
    if document.manifest is None:
        try:
            return document.app_name, None, validate(document.pipeline, document.prefix)
        except PipelineInvalid as exc:
            raise GraphError(f"{path} is not valid:\n{exc}") from exc
    spec, problems = parsed_manifest(document.manifest, static_sql_parser, static_ddl_parser)
    if spec is None:
        raise GraphError(f"{path} is not valid:\n" + "\n".join(f"  {p}" for p in problems))
    return document.app_name, (document.manifest.get("metadata") or {}).get("namespace"), spec.pipeline


def driver_status(args: argparse.Namespace, app: str, namespace: str | None) -> DriverStatus:
    """The running driver's /v1/status, asked from inside its pod."""
    status = kubectl_json(args, namespace, "get", "streamingapp", app).get("status") or {}
    pod = f"{status.get('driver') or app}-driver"
    answer = kubectl(args, namespace, "exec", pod, "-c", DRIVER_CONTAINER, "--", "python3", "-c", READ_STATUS)
    try:
        return DriverStatus.model_validate_json(answer)
    except ValueError as exc:
        raise GraphError(f"the driver {pod} answered no status: {answer[:200]}") from exc


def render(dot: str, output: str) -> bytes:
    if output == "dot":
        return dot.encode()
    binary = shutil.which("dot")
    if binary is None:
        raise GraphError("Graphviz's dot is not on PATH: install graphviz (apt install graphviz), or use -o dot")
    result = subprocess.run([binary, f"-T{output}"], input=dot.encode(), capture_output=True)
    if result.returncode != 0:
        raise GraphError(f"dot -T{output}: {result.stderr.decode().strip()}")
    return result.stdout
