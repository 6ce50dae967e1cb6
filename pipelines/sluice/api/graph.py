"""A StreamingApp's pipeline as a Graphviz DOT graph: sources, operations and sinks, the dead letters, which
nodes keep state, and which streaming queries each node is part of (one per sink, one per source's dead
letters). With a running driver's answer, figures per node: backlogs, rates, state rows, watermarks. Pure: `sluice
graph` renders it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from .contract import DriverStatus
from .pipeline import Node, PipelineSpec
from .rollout.diff import DEAD_LETTER_SUFFIX
from .rollout.spark_rules import STATEFUL_OPS

DEAD_LETTERS = "dead letters"
SHAPES = {"source": "shape=cylinder", "transform": "shape=box", "sink": "shape=box, peripheries=2"}


def queries_of(pipeline: PipelineSpec) -> dict[str, set[str]]:
    """Each node's streaming queries: a sink's query holds it and everything upstream; a source with dead
    letters also feeds `<source>-dead-letters`."""
    nodes = {node.name: node for node in pipeline.nodes}
    member: dict[str, set[str]] = {name: set() for name in nodes}

    def mark(name: str, query: str) -> None:
        if query not in member[name]:
            member[name].add(query)
            for upstream in nodes[name].inputs or []:
                mark(upstream, query)

    for node in pipeline.nodes:
        if node.kind == "sink":
            mark(node.name, node.name)
        if node.kind == "source" and pipeline.deadLetter is not None:
            member[node.name].add(node.name + DEAD_LETTER_SUFFIX)
    return member


def _quote(text: str) -> str:
    return json.dumps(text)  # a DOT ID in double quotes: JSON's escaping is DOT's


def _label(node: Node, queries: Iterable[str], live: Mapping[str, str]) -> str:
    lines = [node.name, node.operation + (" (state)" if node.operation in STATEFUL_OPS else "")]
    topic = getattr(node.config, "topic", None)
    if topic:
        lines.append(f"topic {topic}")
    if node.kind != "sink":
        lines.append("queries: " + ", ".join(sorted(queries)))
    if node.name in live:
        lines.append(live[node.name])
    return "\n".join(lines)


def live_figures(pipeline: PipelineSpec, status: DriverStatus) -> dict[str, str]:
    """Lines per node from a driver's answer: each source's backlog and read rate, each stateful node's state rows
    and watermark per query, each sink's query rates, batch time and watermark."""
    figures: dict[str, list[str]] = {}
    queries = {query.name: query for query in status.queries}
    backlogs = {topic.topic: topic.backlog for topic in status.topics}
    member = queries_of(pipeline)
    for node in pipeline.nodes:
        lines = figures.setdefault(node.name, [])
        fed = [queries[name] for name in sorted(member[node.name]) if name in queries]
        topic = getattr(node.config, "topic", None)
        if node.kind == "source" and topic:
            behind = sum(backlogs.get(t.strip(), 0) for t in topic.split(","))
            read = max((q.inputRowsPerSecond or 0.0 for q in fed), default=0.0)
            lines.append(f"backlog {behind:,} records, read {read:,.1f}/s")
        if node.operation in STATEFUL_OPS:
            lines += [
                f"{q.name}: state {q.stateRows or 0:,} rows, watermark {_clock(q.watermark)}" for q in fed if q.stateful
            ]
        query = queries.get(node.name)
        if node.kind == "sink" and query is not None:
            rate, done = query.inputRowsPerSecond or 0.0, query.processedRowsPerSecond or 0.0
            state = "running" if query.active else "stopped"
            batch = f", batch {query.lastBatchDurationMs:,} ms" if query.lastBatchDurationMs is not None else ""
            lines.append(f"{state}: in {rate:,.1f}/s, processed {done:,.1f}/s{batch}")
            if query.watermark:
                lines.append(f"watermark {_clock(query.watermark)}")
    return {name: "\n".join(lines) for name, lines in figures.items() if lines}


def _clock(watermark: str | None) -> str:
    """An RFC 3339 watermark as its time of day (UTC); '-' for none."""
    return f"{watermark[11:19]} UTC" if watermark and "T" in watermark else "-"


def pipeline_dot(app: str, pipeline: PipelineSpec, live: Mapping[str, str] | None = None) -> str:
    """The DOT graph of the app's pipeline, left to right; stateful nodes filled, dead letters dashed."""
    live = live or {}
    member = queries_of(pipeline)
    lines = [
        f"digraph {_quote(app)} {{",
        "  rankdir=LR;",
        '  node [fontname="Helvetica", fontsize=10];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    for node in pipeline.nodes:
        style = ', style=filled, fillcolor="#fde8c8"' if node.operation in STATEFUL_OPS else ""
        label = _label(node, member[node.name], live)
        lines.append(f"  {_quote(node.name)} [{SHAPES[node.kind]}, label={_quote(label)}{style}];")
    for node in pipeline.nodes:
        for upstream in node.inputs or []:
            lines.append(f"  {_quote(upstream)} -> {_quote(node.name)};")
    if pipeline.deadLetter is not None:
        dead = pipeline.deadLetter
        where = f"topic {dead.toKafka.topic}" if dead.toKafka else dead.sink_operation
        late = " and late records" if dead.lateRecords else ""
        lines.append(f"  {_quote(DEAD_LETTERS)} [shape=note, label={_quote(f'dead letters{late}: {where}')}];")
        for node in pipeline.nodes:
            drops_late = dead.lateRecords and node.operation in STATEFUL_OPS
            why = "malformed" if node.kind == "source" else "late" if drops_late else ""
            if why:
                lines.append(f"  {_quote(node.name)} -> {_quote(DEAD_LETTERS)} [style=dashed, label={_quote(why)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
