"""Validation of pipeline specs: every error at once, each with its path in the manifest.

Three layers, all reporting `path: message`:
1. shape and types (the pydantic model),
2. the DAG (names, inputs, arity, cycles, unused nodes) — on the raw data, so it runs even when a
   node's body is invalid,
3. Spark SQL expressions and DDL schemas, parsed by Spark when a parser is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from .contract import API_VERSION, RUNNER_CONFIG_KIND
from .pipeline import OPERATIONS, SINK_OPS, SOURCE_OPS, Node, PipelineSpec
from .times import DURATION_PATTERN, SIGNED_DURATION_PATTERN


@dataclass(frozen=True, order=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class PipelineInvalid(ValueError):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(map(str, problems)))


@dataclass
class PipelineDocument:
    """A pipeline as found in a file: a StreamingApp manifest or a bare pipeline; or an object of another kind,
    skipped (`other_kind` names it, e.g. ConfigMap/settings)."""

    source: str
    pipeline: Any
    prefix: str  # path of the pipeline inside the document, e.g. "spec.pipeline"
    manifest: dict[str, Any] | None = None
    other_kind: str | None = None

    @property
    def app_name(self) -> str:
        if self.manifest:
            return str(self.manifest.get("metadata", {}).get("name", "app"))
        return Path(self.source).stem


MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"


def manifest_files(path: str | Path) -> list[str]:
    """`path` itself, `-` (stdin), or a directory's manifests (*.yaml, *.yml, *.json) in name order."""
    if str(path) != STDIN and Path(path).is_dir():
        return [str(p) for p in sorted(Path(path).iterdir()) if p.suffix in MANIFEST_SUFFIXES and p.is_file()]
    return [str(path)]


def load_documents(path: str | Path) -> list[PipelineDocument]:
    """All documents of a YAML (or JSON) file, multi-document files allowed; `-` reads stdin."""
    import sys

    text = sys.stdin.read() if str(path) == STDIN else Path(path).read_text()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise PipelineInvalid([Problem(f"{path}:{where}", f"not valid YAML: {exc}")]) from exc
    if not docs:
        raise PipelineInvalid([Problem(str(path), "file holds no document")])
    return [document_from(doc, str(path)) for doc in docs]


def document_from(doc: Any, source: str) -> PipelineDocument:
    """A StreamingApp (also one of sluice's group with a mistyped kind: its manifest check names the kind), an
    object of another API group's kind (skipped, named), or else pipeline data: a bare pipeline, or a
    RunnerConfig, the runner's to read whole."""
    kind = doc.get("kind") if isinstance(doc, dict) else None
    ours = isinstance(doc, dict) and str(doc.get("apiVersion", "")).split("/")[0] == API_VERSION.split("/")[0]
    if kind == "StreamingApp" or (ours and kind != RUNNER_CONFIG_KIND):
        spec = doc.get("spec") or {}
        pipeline = spec.get("pipeline") if isinstance(spec, dict) else None
        return PipelineDocument(source, pipeline, "spec.pipeline", doc)
    if isinstance(doc, dict) and "apiVersion" in doc and kind is not None and kind != RUNNER_CONFIG_KIND:
        name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), dict) else None
        return PipelineDocument(source, None, "", doc, other_kind=f"{kind}/{name or '?'}")
    return PipelineDocument(source, doc, "")


def join_path(prefix: str, *parts: str | int) -> str:
    out = prefix
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


# --------------------------------------------------------------------------- layer 1: the model


def _friendly(error: ErrorDetails) -> tuple[tuple[Any, ...], str]:
    loc = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        return loc, f"unknown key '{loc[-1]}'"
    if kind == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == DURATION_PATTERN:
        return loc, (f"invalid duration {error['input']!r}: use a number and a unit (ms, s, m, h, d), e.g. 5s")
    if kind == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == SIGNED_DURATION_PATTERN:
        return loc, (
            f"invalid duration {error['input']!r}: use a number and a unit (ms, s, m, h, d), "
            "negative for before, e.g. -5s"
        )
    if kind == "missing":
        return loc, "required"
    message = error["msg"].removeprefix("Value error, ")
    if kind not in ("value_error", "assertion_error") and "input" in error:
        message += f" (got {error['input']!r})"[:200]
    return loc, message


def model_problems(data: Any, prefix: str, model: type[BaseModel] = PipelineSpec) -> tuple[Any, list[Problem]]:
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            loc, message = _friendly(error)
            # Operation bodies like fromKafka sit behind unions in some types; drop pydantic's tags.
            clean = [p for p in loc if isinstance(p, int) or not str(p).startswith(("function-", "union["))]
            problems.append(Problem(join_path(prefix, *clean) or "pipeline", message))
        return None, problems


# ----------------------------------------------------------------------------- layer 2: the DAG


def graph_problems(data: Any, prefix: str) -> list[Problem]:
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        return []  # the model layer reports the missing/invalid list
    nodes = [n for n in data["nodes"] if isinstance(n, dict)]
    indexed = [(i, n) for i, n in enumerate(data["nodes"]) if isinstance(n, dict)]
    problems: list[Problem] = []
    first_index: dict[str, int] = {}
    for i, node in indexed:
        name = node.get("name")
        if isinstance(name, str):
            if name in first_index:
                problems.append(
                    Problem(
                        join_path(prefix, "nodes", i, "name"),
                        f"duplicate node name '{name}' (also nodes[{first_index[name]}])",
                    )
                )
            else:
                first_index[name] = i

    operation_of = {n.get("name"): _operation(n) for n in nodes}
    consumers: dict[str, int] = {}
    edges: dict[str, list[str]] = {}
    for i, node in indexed:
        problems += _input_problems(prefix, i, node, first_index, operation_of, consumers, edges)

    for name, i in first_index.items():
        operation = operation_of.get(name)
        if operation and operation not in SINK_OPS and not consumers.get(name):
            problems.append(
                Problem(
                    join_path(prefix, "nodes", i),
                    f"the output of '{name}' is not used by any node (connect it to a sink)",
                )
            )
    if nodes and not any(op in SINK_OPS for op in operation_of.values()):
        problems.append(Problem(join_path(prefix, "nodes"), "the pipeline has no sink"))
    cycle = _find_cycle(edges)
    if cycle:
        problems.append(
            Problem(join_path(prefix, "nodes", first_index[cycle[0]], "inputs"), f"cycle: {' -> '.join(cycle)}")
        )
    return problems


def _operation(node: dict[str, Any]) -> str | None:
    present = [op for op in OPERATIONS if op in node]
    return present[0] if len(present) == 1 else None


def _input_problems(
    prefix: str,
    i: int,
    node: dict[str, Any],
    known: dict[str, int],
    operation_of: dict[Any, str | None],
    consumers: dict[str, int],
    edges: dict[str, list[str]],
) -> Iterator[Problem]:
    name, operation, inputs = node.get("name"), _operation(node), node.get("inputs")
    path = join_path(prefix, "nodes", i, "inputs")
    if inputs is not None and not isinstance(inputs, list):
        return  # a type error the model layer reports
    inputs = [x for x in inputs or [] if isinstance(x, str)]
    if operation:
        low, high = Node.ARITY[operation]
        if operation in SOURCE_OPS and inputs:
            yield Problem(path, f"a source ({operation}) takes no inputs")
        elif len(inputs) < low or (high is not None and len(inputs) > high):
            wanted = f"{low}" if low == high else f"at least {low}" if high is None else f"{low}-{high}"
            yield Problem(path, f"{operation} needs {wanted} input(s), got {len(inputs)}")
    for j, upstream in enumerate(inputs):
        if upstream not in known:
            yield Problem(join_path(path, j), f"unknown node '{upstream}'")
            continue
        if operation_of.get(upstream) in SINK_OPS:
            yield Problem(join_path(path, j), f"'{upstream}' is a sink and has no output")
        if upstream == name:
            yield Problem(join_path(path, j), f"'{name}' reads its own output")
        consumers[upstream] = consumers.get(upstream, 0) + 1
        if isinstance(name, str):
            edges.setdefault(name, []).append(upstream)


def _find_cycle(edges: dict[str, list[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for upstream in edges.get(node, []):
            if upstream == node:
                continue  # reported as reading its own output
            if state.get(upstream) == 1:
                return [*stack[stack.index(upstream) :], upstream]
            if upstream not in state and (found := visit(upstream)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)):
            return found
    return None


# ---------------------------------------------------------------- layer 3: semantics and SQL

SqlParser = Callable[[str], str | None]  # expression -> error message, or None when it parses
DdlParser = Callable[[str], list[str] | str]  # DDL -> field names, or an error message

_ORDER_SUFFIX = re.compile(r"\s+(ASC|DESC)(\s+NULLS\s+(FIRST|LAST))?\s*$", re.IGNORECASE)


def node_expressions(node: Node) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Every Spark SQL expression of a node with its path below the node."""
    op, cfg = node.operation, node.config
    if op == "fromKafka" and cfg.eventTimeExpr is not None:
        yield (op, "eventTimeExpr"), cfg.eventTimeExpr
    elif op == "select":
        yield from (((op, k), e) for k, e in enumerate(cfg))
    elif op == "filter":
        yield (op,), cfg
    elif op == "withColumns":
        yield from (((op, k), e) for k, e in cfg.items())
    elif op == "explode":
        yield (op, "from"), cfg.from_
    elif op == "aggregate":
        yield from (((op, "groupBy", k), e) for k, e in enumerate(cfg.groupBy))
        yield from (((op, "aggregations", k), e) for k, e in cfg.aggregations.items())
    elif op == "join":
        yield (op, "condition"), cfg.condition
        yield from (((op, "select", k), e) for k, e in enumerate(cfg.select))
    elif op == "topN":
        yield from (((op, "orderBy", k), _ORDER_SUFFIX.sub("", e)) for k, e in enumerate(cfg.orderBy))
    elif op == "toKafka":
        for field in ("key", "value", "headers"):
            if getattr(cfg, field):
                yield (op, field), getattr(cfg, field)


def semantic_problems(
    spec: PipelineSpec, prefix: str, sql: SqlParser | None = None, ddl: DdlParser | None = None
) -> list[Problem]:
    problems: list[Problem] = []
    for i, node in enumerate(spec.nodes):
        at = lambda *parts, i=i: join_path(prefix, "nodes", i, *parts)  # noqa: E731
        if node.fromKafka is not None:
            problems += _source_problems(node, at, ddl)
        if sql is not None:
            for sub, expression in node_expressions(node):
                if (error := sql(expression)) is not None:
                    problems.append(Problem(at(*sub), f"bad SQL expression {expression!r}: {error}"))
    return problems + real_time_problems(spec, prefix)


# Spark 4.2 runs a real-time query only when each of its physical operators and its sink is on an allowlist
# (checked as the query runs): no stateful operator, no shuffle, no Python UDF; Kafka and console sinks (memory,
# files and foreachBatch refused). What sluice compiles each operation to decides whether it can be there.
_REAL_TIME_REFUSED = {
    "aggregate": "an aggregation keeps state (a shuffle and a state store)",
    "join": "a stream-stream join keeps state (a shuffle and a state store)",
    "dedupe": "dedupe keeps state (a shuffle and a state store)",
    "topN": "topN runs once per micro-batch",
    "python": "a python transform cannot be proven stateless before it runs, and Spark runs no Python UDF",
    "toFiles": "Spark's file sink is not one of real-time mode's sinks (toKafka, toConsole)",
    "toMemory": "Spark's memory sink is not one of real-time mode's sinks (toKafka, toConsole)",
}
_REAL_TIME_SOURCE_REFUSED = {
    "maxRecordsPerTrigger": "a batch reads what arrives during its interval (Spark refuses maxOffsetsPerTrigger)",
    "minPartitions": "one task reads each Kafka partition for the whole interval (Spark refuses minPartitions)",
}
REAL_TIME = "in real-time mode (trigger.realTime)"


def real_time_problems(spec: PipelineSpec, prefix: str) -> list[Problem]:
    """With trigger.realTime, every node (and field) that keeps Spark from running the pipeline in real-time
    mode: there each query runs stateless, long-lived tasks writing through Spark's own sinks, in update mode."""
    if not spec.trigger.realTime:
        return []
    problems = []
    for i, node in enumerate(spec.nodes):
        op, cfg = node.operation, node.config
        at = lambda *parts, i=i: join_path(prefix, "nodes", i, *parts)  # noqa: E731
        if op in _REAL_TIME_REFUSED:
            problems.append(Problem(at(op), f"not supported {REAL_TIME}: {_REAL_TIME_REFUSED[op]}"))
        elif op == "fromKafka":
            for field, why in _REAL_TIME_SOURCE_REFUSED.items():
                if getattr(cfg, field) is not None:
                    problems.append(Problem(at(op, field), f"not supported {REAL_TIME}: {why}"))
        elif op == "lookup" and not cfg.broadcast:
            problems.append(
                Problem(
                    at(op, "broadcast"), f"a lookup {REAL_TIME} must be broadcast (a shuffled join is not supported)"
                )
            )
        elif op == "toKafka" and cfg.delivery == "exactlyOnce":
            problems.append(
                Problem(
                    at(op, "delivery"),
                    f"set delivery: atLeastOnce: {REAL_TIME} records go through Spark's Kafka sink, which is "
                    "at-least-once (the exactlyOnce sink commits per micro-batch, through foreachBatch, which "
                    "real-time mode does not run)",
                )
            )
        if node.kind == "sink" and cfg.outputMode not in (None, "update"):
            problems.append(Problem(at(op, "outputMode"), f"{REAL_TIME} the output mode is update (the default there)"))
    if spec.deadLetter is not None:
        problems.append(
            Problem(
                join_path(prefix, "deadLetter"),
                f"not supported {REAL_TIME}: the dead-letter query runs per micro-batch (foreachBatch), which "
                "real-time mode does not run",
            )
        )
    return problems


def _source_problems(node: Node, at: Callable[..., str], ddl: DdlParser | None) -> list[Problem]:
    src = node.fromKafka
    assert src is not None
    problems = []
    fields: list[str] | None = None
    if src.schema_ and ddl is not None:
        parsed = ddl(src.schema_)
        if isinstance(parsed, str):
            problems.append(Problem(at("fromKafka", "schema"), f"bad schema: {parsed}"))
        else:
            fields = parsed
    if src.eventTimeExpr is not None:
        pass  # eventTime names the column the expression computes; the compiler checks the expression's type
    elif src.eventTime and src.format == "text" and src.eventTime != "kafka_timestamp":
        problems.append(
            Problem(
                at("fromKafka", "eventTime"),
                "text records have no fields; use eventTime: kafka_timestamp, or compute it with eventTimeExpr",
            )
        )
    elif src.eventTime and fields is not None and src.eventTime not in (*fields, "kafka_timestamp"):
        problems.append(
            Problem(
                at("fromKafka", "eventTime"),
                f"'{src.eventTime}' is not a schema field ({', '.join(fields)}) nor kafka_timestamp",
            )
        )
    return problems


def validate(data: Any, prefix: str = "", sql: SqlParser | None = None, ddl: DdlParser | None = None) -> PipelineSpec:
    """The parsed spec, or PipelineInvalid listing every problem found."""
    spec, problems = model_problems(data, prefix)
    problems += graph_problems(data, prefix)
    if spec is not None:
        problems += semantic_problems(spec, prefix, sql, ddl)
    if problems:
        raise PipelineInvalid(sorted(set(problems), key=natural_key))
    assert spec is not None
    return spec


def natural_key(problem: Problem) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", problem.path)), problem.message
