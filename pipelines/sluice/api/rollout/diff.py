"""Classify a change of a StreamingApp's spec, per streaming query, by what Spark allows on one checkpoint.

Each sink node is one query with its own checkpoint, and with `deadLetter` each source has one more,
`<source>-dead-letters`. Whether a query may restart on its checkpoint with a new plan is Spark's call:
the Structured Streaming guide, "Recovery Semantics after Changes in a Streaming Query" (and, for the
realTime trigger, its Real-time Mode page). The rules below quote it. Where it calls a change
unpredictable or ill-defined, or does not cover it, the query gets a checkpoint of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from sluice.api.app import StreamingAppSpec
from sluice.api.pipeline import Node, PipelineSpec
from sluice.api.times import duration_ms

from .spark_rules import (
    FILTERS_ALLOWED,
    MAP_LIKE,
    REAL_TIME_CHECKPOINT,
    STATEFUL,
    STATEFUL_NOT_ALLOWED,
    STATEFUL_OPS,
    Rule,
    RuleKind,
    added_or_removed_rule,
    field_rule,
    sink_type_rule,
    source_option_rule,
)

DEAD_LETTER_SUFFIX = "-dead-letters"


class Change(enum.IntEnum):
    """What a query needs, cheapest first."""

    NONE = 0
    COMPATIBLE = 1  # restarts on its own checkpoint with the new plan
    INCOMPATIBLE = 2  # Spark does not allow it on the same checkpoint: a stateful operation or a source changed


@dataclass(frozen=True)
class Reason:
    path: str  # spec.pipeline.nodes[3].aggregate.window
    change: Change
    why: str
    offsets_carry_over: bool = True  # False: a new checkpoint cannot start from the old query's offsets

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


@dataclass(frozen=True)
class QueryChange:
    name: str
    change: Change
    reasons: tuple[Reason, ...] = ()
    presence: Literal["kept", "added", "removed"] = "kept"
    # For a new checkpoint: event time re-read before the old query's position (watermark delay + the longest
    # chain of windows and join bounds); None: nothing carries over (unbounded state, another Kafka cluster).
    rewind_ms: int | None = 0
    back_rewind_ms: int | None = 0  # the same for the old plan, when a rollback moves it onto a new checkpoint


@dataclass(frozen=True)
class SpecDiff:
    queries: tuple[QueryChange, ...] = ()
    runtime: tuple[Reason, ...] = ()  # what only a new driver applies: image, Spark version, resources, sparkConf
    unaffected: tuple[str, ...] = ()  # changed paths the driver does not run (executors, autoscaling, topics…)

    @property
    def needs_rollout(self) -> bool:
        return bool(self.runtime) or any(q.change > Change.NONE for q in self.queries)

    @property
    def changed(self) -> tuple[QueryChange, ...]:
        return tuple(q for q in self.queries if q.change > Change.NONE)

    @property
    def incompatible(self) -> tuple[QueryChange, ...]:
        return tuple(q for q in self.queries if q.change is Change.INCOMPATIBLE)

    def query(self, name: str) -> QueryChange:
        return next(q for q in self.queries if q.name == name)


# --------------------------------------------------------------------------------------- the DAG


@dataclass(frozen=True)
class _Query:
    name: str
    sink: str | None = None  # the sink node; None for a dead-letter query
    source: str | None = None  # the dead-letter query's source


@dataclass
class _Graph:
    spec: StreamingAppSpec
    _feeds: dict[str, frozenset[str]] = field(default_factory=dict)

    @property
    def pipeline(self) -> PipelineSpec:
        return self.spec.pipeline

    @cached_property
    def nodes(self) -> dict[str, Node]:
        return {node.name: node for node in self.pipeline.nodes}

    @cached_property
    def index(self) -> dict[str, int]:
        return {node.name: i for i, node in enumerate(self.pipeline.nodes)}

    @cached_property
    def queries(self) -> dict[str, _Query]:
        queries = {n.name: _Query(n.name, sink=n.name) for n in self.pipeline.nodes if n.kind == "sink"}
        if self.pipeline.deadLetter is not None:
            for node in self.pipeline.nodes:
                if node.fromKafka is not None:
                    name = node.name + DEAD_LETTER_SUFFIX
                    queries[name] = _Query(name, source=node.name)
        return queries

    def feeds(self, name: str) -> frozenset[str]:
        """The node and every node upstream of it."""
        if name not in self._feeds:
            node = self.nodes[name]
            self._feeds[name] = frozenset({name}).union(*(self.feeds(i) for i in node.inputs or []))
        return self._feeds[name]

    def members(self, query: _Query) -> frozenset[str]:
        return self.feeds(query.sink) if query.sink else frozenset({query.source or ""})

    def stateful_after(self, name: str, members: frozenset[str]) -> str | None:
        """The first stateful node of the query that `name` feeds (not `name` itself)."""
        after = [m for m in members if m != name and self.nodes[m].operation in STATEFUL_OPS and name in self.feeds(m)]
        return min(after, key=self.index.__getitem__, default=None)

    def stateful_in(self, members: frozenset[str]) -> str | None:
        return min(
            (m for m in members if self.nodes[m].operation in STATEFUL_OPS), key=self.index.__getitem__, default=None
        )

    def path(self, name: str, *parts: str) -> str:
        return ".".join([f"spec.pipeline.nodes[{self.index[name]}]", *parts])

    def config_of(self, operation: str, config: Any) -> Any:
        """An operation's configuration as plain values; Kafka nodes with the cluster they use (theirs or the
        app's)."""
        plain = _dump(config)
        if operation in ("fromKafka", "toKafka") and not config.bootstrapServers:
            plain["bootstrapServers"] = self.spec.kafka.address()
        return plain

    # ------------------------------------------------------------------ rewind of a new checkpoint
    def rewind_ms(self, members: frozenset[str]) -> int | None:
        """Watermark delay + the longest chain of window sizes, session gaps and join bounds; None when some
        state is not bounded by a watermark (it holds everything since the query began)."""
        stateful = [m for m in members if self.nodes[m].operation in STATEFUL_OPS]
        if not stateful:
            return 0
        if any(not self._bounded(m) for m in stateful):
            return None
        delays = [self.watermark_ms(m) or 0 for m in members]
        return max(delays) + max(self._span(m, members) for m in members)

    def watermark_ms(self, name: str) -> int | None:
        source = self.nodes[name].fromKafka
        return duration_ms(source.watermark) if source is not None and source.watermark else None

    def _bounded(self, name: str) -> bool:
        node = self.nodes[name]
        watermarked = any(self.watermark_ms(m) is not None for m in self.feeds(name))
        if node.aggregate is not None:
            return node.aggregate.window is not None and watermarked
        return watermarked  # joins and dedupe keep state within the watermark

    def _span(self, name: str, members: frozenset[str]) -> int:
        node = self.nodes[name]
        upstream = max((self._span(i, members) for i in node.inputs or [] if i in members), default=0)
        own = 0
        if node.join is not None:
            own = node.join.span_ms()
        elif node.aggregate is not None and node.aggregate.window is not None:
            window = node.aggregate.window
            own = duration_ms(window.tumbling or window.session or (window.sliding.size if window.sliding else "0s"))
        return upstream + own


def _both_inherit_kafka(old_config: Any, new_config: Any) -> bool:
    return not (old_config.bootstrapServers or new_config.bootstrapServers)


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True) if hasattr(model, "model_dump") else model


# ------------------------------------------------------------------------------- classification


def classify(old: StreamingAppSpec, new: StreamingAppSpec) -> SpecDiff:
    """How `new` differs from `old` (the running revision's spec), per query, plus what only a new driver
    applies. Pure; the reasons name spec paths. Both specs passed validation (no cycles, no unknown inputs)."""
    before, after = _Graph(old), _Graph(new)
    names = sorted(before.queries.keys() | after.queries.keys())
    queries = tuple(_classify_query(name, before, after) for name in names)
    return SpecDiff(queries=queries, runtime=tuple(_runtime_reasons(old, new)), unaffected=tuple(_unaffected(old, new)))


def _classify_query(name: str, before: _Graph, after: _Graph) -> QueryChange:
    old_query, new_query = before.queries.get(name), after.queries.get(name)
    if new_query is None:
        return QueryChange(
            name,
            Change.COMPATIBLE,
            (
                Reason(
                    _query_path(before, old_query),
                    Change.COMPATIBLE,
                    "the query is removed: it stops; its checkpoint is kept until the new revision is healthy",
                ),
            ),
            presence="removed",
        )
    if old_query is None:
        return QueryChange(
            name,
            Change.COMPATIBLE,
            (
                Reason(
                    _query_path(after, new_query),
                    Change.COMPATIBLE,
                    "a new query: it starts on a checkpoint of its own, from its sources' startingOffsets",
                ),
            ),
            presence="added",
        )
    context = _QueryContext(before, after, old_query, new_query)
    reasons = tuple(context.reasons())
    change = max((r.change for r in reasons), default=Change.NONE)
    carry_over = all(r.offsets_carry_over for r in reasons)
    rewind = after.rewind_ms(context.new_members) if carry_over else None
    back = before.rewind_ms(context.old_members) if carry_over else None
    return QueryChange(name, change, reasons, rewind_ms=rewind if change else 0, back_rewind_ms=back if change else 0)


def _query_path(graph: _Graph, query: _Query | None) -> str:
    assert query is not None
    return graph.path(query.sink) if query.sink else "spec.pipeline.deadLetter"


@dataclass
class _QueryContext:
    before: _Graph
    after: _Graph
    old_query: _Query
    new_query: _Query

    @cached_property
    def old_members(self) -> frozenset[str]:
        return self.before.members(self.old_query)

    @cached_property
    def new_members(self) -> frozenset[str]:
        return self.after.members(self.new_query)

    def reasons(self) -> Iterator[Reason]:
        for name in sorted(self.old_members | self.new_members, key=self._order):
            yield from self._node(name)
        yield from self._pipeline()

    def _order(self, name: str) -> tuple[int, int]:
        """Nodes in the new spec's order, then the removed ones."""
        return (0, self.after.index[name]) if name in self.after.index else (1, self.before.index[name])

    # --------------------------------------------------------------------------- nodes
    def _node(self, name: str) -> Iterator[Reason]:
        in_old, in_new = name in self.old_members, name in self.new_members
        if not in_old:
            node = self.after.nodes[name]
            yield self._reason(
                self.after,
                name,
                added_or_removed_rule(node.operation),
                self.after.path(name),
                f"node '{name}' ({node.operation}) joins the query",
            )
            return
        if not in_new:
            node = self.before.nodes[name]
            yield self._reason(
                self.before,
                name,
                added_or_removed_rule(node.operation),
                self.before.path(name),
                f"node '{name}' ({node.operation}) leaves the query",
            )
            return
        old, new = self.before.nodes[name], self.after.nodes[name]
        if old.operation != new.operation:
            yield from self._operation_changed(name, old, new)
            return
        yield from self._inputs(name, old, new)
        yield from self._fields(name, old, new)

    def _operation_changed(self, name: str, old: Node, new: Node) -> Iterator[Reason]:
        path = self.after.path(name, new.operation)
        if old.kind == new.kind == "sink":
            yield self._reason(
                self.after,
                name,
                sink_type_rule(old.operation, new.operation),
                path,
                f"the sink changes from {old.operation} to {new.operation}",
            )
            return
        for graph, node, verb in ((self.before, old, "leaves"), (self.after, new, "joins")):
            yield self._reason(
                graph,
                name,
                added_or_removed_rule(node.operation),
                graph.path(name, node.operation),
                f"operation {node.operation} {verb} node '{name}'",
            )

    def _inputs(self, name: str, old: Node, new: Node) -> Iterator[Reason]:
        if (old.inputs or []) == (new.inputs or []):
            return
        rewired_around_other_changes = self.old_members != self.new_members and len(new.inputs or []) == 1
        if rewired_around_other_changes:
            return  # the nodes that joined or left the query carry the classification
        rule = STATEFUL if new.operation in STATEFUL_OPS else added_or_removed_rule(new.operation)
        if new.kind == "sink":
            rule = MAP_LIKE
        yield self._reason(self.after, name, rule, self.after.path(name, "inputs"), "its inputs change")

    def _fields(self, name: str, old: Node, new: Node) -> Iterator[Reason]:
        op = new.operation
        old_config, new_config = self.before.config_of(op, old.config), self.after.config_of(op, new.config)
        if not isinstance(new_config, dict):  # select and filter: the value is the configuration
            if old_config != new_config:
                yield self._reason(self.after, name, field_rule(op, ""), self.after.path(name, op), f"{op} changes")
            return
        for key in sorted(k for k in new_config if old_config.get(k) != new_config.get(k)):
            if op == "fromKafka" and key == "options":
                yield from self._source_options(name, old_config[key], new_config[key])
            elif key == "bootstrapServers" and _both_inherit_kafka(old.config, new.config):
                yield self._reason(
                    self.after,
                    name,
                    field_rule(op, key),
                    "spec.kafka",
                    f"the app's Kafka changes and {op} node '{name}' uses it",
                )
            else:
                yield self._reason(
                    self.after, name, field_rule(op, key), self.after.path(name, op, key), f"{op}.{key} changes"
                )

    def _source_options(self, name: str, old: dict[str, str], new: dict[str, str]) -> Iterator[Reason]:
        for key in sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)):
            yield self._reason(
                self.after,
                name,
                source_option_rule(key),
                self.after.path(name, "fromKafka", "options", key),
                f"option {key} changes",
            )

    # ------------------------------------------------------------------------ pipeline
    def _pipeline(self) -> Iterator[Reason]:
        old, new = self.before.spec, self.after.spec
        if old.pipeline.trigger != new.pipeline.trigger:
            real_time_switch = bool(old.pipeline.trigger.realTime) != bool(new.pipeline.trigger.realTime)
            rule = (
                Rule(RuleKind.IN_STATEFUL_QUERY, REAL_TIME_CHECKPOINT)
                if real_time_switch
                else Rule(RuleKind.COMPATIBLE, "the trigger only paces batches; the checkpoint does not depend on it")
            )
            yield self._reason(self.after, None, rule, "spec.pipeline.trigger", "the trigger changes")
        for key in ("location", "volumeClaim"):
            if getattr(old.checkpoint, key) != getattr(new.checkpoint, key):
                yield Reason(
                    f"spec.checkpoint.{key}",
                    Change.INCOMPATIBLE,
                    "the checkpoint moves: the query continues on a new one",
                )
        if self.new_query.source is not None:
            yield from self._dead_letter()

    def _dead_letter(self) -> Iterator[Reason]:
        old, new = self.before.pipeline.deadLetter, self.after.pipeline.deadLetter
        assert old is not None and new is not None
        base = "spec.pipeline.deadLetter"
        old_op, new_op = old.sink_operation, new.sink_operation
        if old_op != new_op:
            yield self._reason(
                self.after,
                None,
                sink_type_rule(old_op, new_op),
                f"{base}.{new_op}",
                f"the dead-letter sink changes from {old_op} to {new_op}",
            )
        else:
            old_model, new_model = getattr(old, old_op), getattr(new, new_op)
            old_sink, new_sink = self.before.config_of(old_op, old_model), self.after.config_of(new_op, new_model)
            for key in sorted(k for k in new_sink if old_sink.get(k) != new_sink.get(k)):
                inherited = key == "bootstrapServers" and _both_inherit_kafka(old_model, new_model)
                yield self._reason(
                    self.after,
                    None,
                    field_rule(new_op, key),
                    "spec.kafka" if inherited else f"{base}.{new_op}.{key}",
                    f"{new_op}.{key} changes",
                )
        if old.lateRecords != new.lateRecords:
            yield Reason(
                f"{base}.lateRecords", Change.COMPATIBLE, f"the dead-letter query's filter changes; {FILTERS_ALLOWED}"
            )
        if new.lateRecords:
            yield from self._late_rule()

    def _late_rule(self) -> Iterator[Reason]:
        """Late records are those the first stateful operations after the source would drop."""
        source = self.new_query.source
        for name in sorted(self.after.nodes, key=self.after.index.__getitem__):
            node, old = self.after.nodes[name], self.before.nodes.get(name)
            if (
                node.operation in STATEFUL_OPS
                and source in self.after.feeds(name)
                and (old is None or _dump(old.config) != _dump(node.config))
            ):
                yield Reason(
                    self.after.path(name),
                    Change.COMPATIBLE,
                    f"the dead-letter query's late-record filter follows it; {FILTERS_ALLOWED}",
                )

    # --------------------------------------------------------------------------- rules
    def _reason(self, graph: _Graph, name: str | None, rule: Rule, path: str, what: str) -> Reason:
        members = self.new_members if graph is self.after else self.old_members
        if rule.kind is RuleKind.AHEAD_OF_STATE:
            stateful = graph.stateful_after(name, members) if name else None
            if stateful is not None:
                return Reason(
                    path,
                    Change.INCOMPATIBLE,
                    f"{what} ahead of {graph.path(stateful)} "
                    f"({graph.nodes[stateful].operation}), whose state schema follows from its rows; "
                    f"{STATEFUL_NOT_ALLOWED}",
                )
            return Reason(path, Change.COMPATIBLE, f"{what}: {rule.why}")
        if rule.kind is RuleKind.IN_STATEFUL_QUERY:
            stateful = graph.stateful_in(members)
            if stateful is not None:
                return Reason(
                    path,
                    Change.INCOMPATIBLE,
                    f"{what} in a query with {graph.path(stateful)} ({graph.nodes[stateful].operation}): {rule.why}",
                )
            return Reason(path, Change.COMPATIBLE, f"{what} in a stateless query")
        if rule.kind is RuleKind.ANOTHER_CLUSTER:
            return Reason(path, Change.INCOMPATIBLE, f"{what}: {rule.why}", offsets_carry_over=False)
        change = Change.COMPATIBLE if rule.kind is RuleKind.COMPATIBLE else Change.INCOMPATIBLE
        return Reason(path, change, f"{what}: {rule.why}")


# --------------------------------------------------------------------------------- the runtime

_RUNTIME_WHY = {
    "image": "the driver and executors run another image",
    "imagePullPolicy": "the pods are made anew",
    "version": "another Spark version",
    "driver": "the driver's resources are set when it starts",
    "executor": "executors get their resources from the driver's start",
    "sparkConf": "Spark reads its configuration when the driver starts",
    "serviceAccount": "the pods run as another account",
    "pod": "the pods' labels, annotations, node selector or environment",
}
_UNAFFECTED = ("topics", "executors", "autoscaling", "updateStrategy", "suspend")


def _runtime_reasons(old: StreamingAppSpec, new: StreamingAppSpec) -> Iterator[Reason]:
    for key, why in _RUNTIME_WHY.items():
        if _dump(getattr(old.spark, key)) != _dump(getattr(new.spark, key)):
            yield Reason(f"spec.spark.{key}", Change.COMPATIBLE, f"{why}: a new driver, on the same checkpoints")
    for key in ("tls", "authentication"):
        if _dump(getattr(old.kafka, key)) != _dump(getattr(new.kafka, key)):
            why = "the clients log in to Kafka another way (the driver mounts its Secrets when it starts)"
            yield Reason(f"spec.kafka.{key}", Change.COMPATIBLE, f"{why}: a new driver, on the same checkpoints")
    if old.checkpoint.volumeClaim != new.checkpoint.volumeClaim:
        yield Reason("spec.checkpoint.volumeClaim", Change.COMPATIBLE, "the driver mounts another claim")


def _unaffected(old: StreamingAppSpec, new: StreamingAppSpec) -> Iterable[str]:
    paths = [f"spec.{key}" for key in _UNAFFECTED if _dump(getattr(old, key)) != _dump(getattr(new, key))]
    paths += [
        f"spec.checkpoint.{key}"
        for key in ("size", "storageClassName", "deletionPolicy")
        if getattr(old.checkpoint, key) != getattr(new.checkpoint, key)
    ]
    return paths
