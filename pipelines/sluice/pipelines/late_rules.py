"""Which of a source's records a query drops as late (the dead-letter queue's `lateRecords`): per sink query,
the first stateful operation on the way from the source, and the filters met before it. Pure: read from the
pipeline spec."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sluice.api.pipeline import Node, PipelineSpec
from sluice.api.times import duration_ms


@dataclass(frozen=True)
class LateRule:
    """How the first stateful operation of query `query` after a source compares a record with the watermark
    Spark used for the record's batch (read from that query's offset log at run time).

    A windowed aggregation drops a record only once its latest window has closed (window end <= watermark);
    other stateful operations drop it when its event time is at or before the watermark.
    """

    query: str  # the sink node whose query drops the rows (its checkpoint is <root>/<query>)
    window_ms: int = 0  # tumbling/sliding size, or session gap
    slide_ms: int | None = None  # None: the bound is event time + window_ms
    filters: tuple[str, ...] = ()  # conditions of the filters right after the source on the way there


def reach_column(i: int) -> str:
    """The dead-letter query's column telling whether a record passes the filters of late_rules[i]."""
    return f"_reaches_{i}"


def late_rules(spec: PipelineSpec, source: str) -> tuple[LateRule, ...]:
    """Per sink query reading the source through a stateful operation, the rule of the first such
    operation on the way from the source to the sink (queries without one drop nothing)."""
    consumers: dict[str, list[Node]] = {}
    for node in spec.nodes:
        for upstream in node.inputs or []:
            consumers.setdefault(upstream, []).append(node)
    nodes = {node.name: node for node in spec.nodes}
    event_time = nodes[source].fromKafka.eventTime  # type: ignore[union-attr]
    rules = []
    for sink in spec.nodes:
        if sink.kind == "sink":
            rule = _first_stateful(source, event_time, _ancestors(nodes, sink.name), consumers, sink.name)
            if rule is not None:
                rules.append(rule)
    return tuple(rules)


def _ancestors(nodes: Mapping[str, Node], name: str) -> set[str]:
    out, stack = set(), [name]
    while stack:
        for upstream in nodes[stack.pop()].inputs or []:
            if upstream not in out:
                out.add(upstream)
                stack.append(upstream)
    return out


def _first_stateful(
    source: str, event_time: str | None, ancestors: set[str], consumers: dict[str, list[Node]], query: str
) -> LateRule | None:
    """None when the query drops none of the source's rows as late."""
    if source not in ancestors:
        return None
    # Breadth first, each node with the conditions of the filters met before any other step.
    queue: list[tuple[str, tuple[str, ...], bool]] = [(source, (), True)]
    seen = {source}
    while queue:
        upstream, filters, only_filters = queue.pop(0)
        for node in consumers.get(upstream, []):
            if node.name not in ancestors:
                continue
            rule = LateRule(query, filters=filters)
            if node.aggregate is not None and node.aggregate.window is not None:
                window = node.aggregate.window
                if window.tumbling:
                    size = duration_ms(window.tumbling)
                    return replace(rule, window_ms=size, slide_ms=size)
                if window.sliding:
                    size, slide = duration_ms(window.sliding.size), duration_ms(window.sliding.slide)
                    return replace(rule, window_ms=size, slide_ms=slide)
                return replace(rule, window_ms=duration_ms(window.session or "0s"))
            if node.aggregate is not None:  # Spark drops late rows only when the event time is a key
                return rule if event_time in node.aggregate.groupBy else None
            if node.operation in ("join", "dedupe"):
                return rule
            if node.name not in seen:
                seen.add(node.name)
                more = only_filters and node.filter is not None
                queue.append((node.name, (*filters, node.filter) if more else filters, more))  # type: ignore[arg-type]
    return None
