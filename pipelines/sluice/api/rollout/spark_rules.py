"""Spark's rules for restarting a streaming query on its checkpoint with a changed plan, as the Structured
Streaming guide states them ("Recovery Semantics after Changes in a Streaming Query"; for the realTime trigger,
its Real-time Mode page): each rule quotes it. diff.py applies them per query."""

from __future__ import annotations

import enum
from dataclasses import dataclass

STATEFUL_OPS = frozenset({"aggregate", "join", "dedupe"})
GUIDE = "Spark guide"
SOURCES_NOT_ALLOWED = f'{GUIDE}: "Changes in the number or type (i.e. different source) of input sources: not allowed"'
TOPICS_NOT_ALLOWED = (
    f'{GUIDE}: "Changes to subscribed topics/files are generally not allowed as the results are unpredictable"'
)
RATE_LIMITS_ALLOWED = f'{GUIDE}: "Addition/deletion/modification of rate limits is allowed"'
FILTERS_ALLOWED = f'{GUIDE}: "Addition / deletion of filters is allowed"'
PROJECTIONS_ALLOWED = (
    f'{GUIDE}: "Changes in projections with different output schema are conditionally '
    'allowed" (the sink takes the new rows)'
)
STATEFUL_NOT_ALLOWED = (
    f'{GUIDE}: "any changes (that is, additions, deletions, or schema modifications) to the '
    'stateful operations of a streaming query are not allowed"'
)
AGGREGATION_NOT_ALLOWED = (
    f'{GUIDE}: "Streaming aggregation: Any change in number or type of grouping keys or aggregates is not allowed"'
)
DEDUPE_NOT_ALLOWED = (
    f'{GUIDE}: "Streaming deduplication: Any change in number or type of deduplicating columns is not allowed"'
)
JOIN_NOT_ALLOWED = (
    f'{GUIDE}: "Stream-stream join: Changes in the schema or equi-joining columns are not allowed. '
    "Changes in join type (outer or inner) are not allowed. Other changes in the join condition are "
    'ill-defined"'
)
FOREACH_ALLOWED = (
    f'{GUIDE}: "Changes to the user-defined foreach sink (that is, the ForeachWriter code) are '
    'allowed" (top-N runs per micro-batch in foreachBatch, after the state)'
)
OUTPUT_TOPIC_ALLOWED = f'{GUIDE}: "Changes to output topic are allowed"'
FILE_DIRECTORY_NOT_ALLOWED = f'{GUIDE}: "Changes to output directory of a file sink are not allowed"'
FILE_TO_KAFKA_ALLOWED = f'{GUIDE}: "File sink to Kafka sink is allowed. Kafka will see only the new data"'
KAFKA_TO_FILE_NOT_ALLOWED = f'{GUIDE}: "Kafka sink to file sink is not allowed"'
KAFKA_FOREACH_ALLOWED = (
    f'{GUIDE}: "Kafka sink changed to foreach, or vice versa is allowed" (exactlyOnce writes through foreachBatch)'
)
SINK_TYPE_UNLISTED = (
    f'{GUIDE}: changes of sink type "need to be verified on a case-by-case basis"; this one is not listed'
)
REAL_TIME_CHECKPOINT = (
    "Spark Real-time Mode guide: a stateful query switched between micro-batch and real-time "
    'mode cannot start on the same checkpoint ("Use a fresh checkpoint location")'
)


class RuleKind(enum.Enum):
    COMPATIBLE = "compatible wherever it is"
    AHEAD_OF_STATE = "incompatible when a stateful operation follows in the query (its state schema)"
    IN_STATEFUL_QUERY = "incompatible when the query has a stateful operation"
    INCOMPATIBLE = "incompatible"
    ANOTHER_CLUSTER = "incompatible, and no offsets carry over"


@dataclass(frozen=True)
class Rule:
    kind: RuleKind
    why: str


MAP_LIKE = Rule(RuleKind.AHEAD_OF_STATE, f"a projection or map-like change; {PROJECTIONS_ALLOWED}")
STATEFUL = Rule(RuleKind.INCOMPATIBLE, STATEFUL_NOT_ALLOWED)
ARBITRARY_CODE = Rule(
    RuleKind.INCOMPATIBLE, "arbitrary code may hold state or change any column: Spark's table cannot vouch for it"
)

FIELD_RULES: dict[str, dict[str, Rule]] = {
    "fromKafka": {
        "topic": Rule(RuleKind.INCOMPATIBLE, TOPICS_NOT_ALLOWED),
        "pattern": Rule(RuleKind.INCOMPATIBLE, TOPICS_NOT_ALLOWED),
        "bootstrapServers": Rule(RuleKind.ANOTHER_CLUSTER, f"reads another Kafka cluster; {SOURCES_NOT_ALLOWED}"),
        "maxRecordsPerTrigger": Rule(RuleKind.COMPATIBLE, RATE_LIMITS_ALLOWED),
        "minPartitions": Rule(RuleKind.COMPATIBLE, "only splits Kafka partitions into more tasks; offsets stay"),
        "startingOffsets": Rule(RuleKind.COMPATIBLE, "applies only to a query without a checkpoint"),
        "isolationLevel": Rule(
            RuleKind.COMPATIBLE, "which records are read, like a filter; offsets stay. " + FILTERS_ALLOWED
        ),
        "watermark": Rule(
            RuleKind.AHEAD_OF_STATE, "the watermark delay decides when state is evicted and windows close"
        ),
        # format, schema, csvDelimiter, metadata, eventTime: the parsed rows change shape
    },
    "filter": {"": Rule(RuleKind.COMPATIBLE, FILTERS_ALLOWED)},
    "aggregate": {
        "window": Rule(RuleKind.INCOMPATIBLE, f"the window is a grouping key; {AGGREGATION_NOT_ALLOWED}"),
        "": Rule(RuleKind.INCOMPATIBLE, AGGREGATION_NOT_ALLOWED),
    },
    "join": {
        "select": Rule(
            RuleKind.AHEAD_OF_STATE, f"the join's output projection, after its state; {PROJECTIONS_ALLOWED}"
        ),
        "": Rule(RuleKind.INCOMPATIBLE, JOIN_NOT_ALLOWED),
    },
    "dedupe": {"": Rule(RuleKind.INCOMPATIBLE, DEDUPE_NOT_ALLOWED)},
    "lookup": {"broadcast": Rule(RuleKind.COMPATIBLE, "a join hint: the rows stay")},
    "topN": {"": Rule(RuleKind.COMPATIBLE, FOREACH_ALLOWED)},
    "python": {"": ARBITRARY_CODE},
    "toKafka": {
        "topic": Rule(RuleKind.COMPATIBLE, OUTPUT_TOPIC_ALLOWED),
        "bootstrapServers": Rule(RuleKind.COMPATIBLE, f"the output moves, as with a topic; {OUTPUT_TOPIC_ALLOWED}"),
        "delivery": Rule(RuleKind.COMPATIBLE, KAFKA_FOREACH_ALLOWED),
        "options": Rule(RuleKind.COMPATIBLE, "producer settings"),
        "": Rule(RuleKind.COMPATIBLE, f"a projection at the sink (Kafka takes any bytes); {PROJECTIONS_ALLOWED}"),
    },
    "toFiles": {
        "path": Rule(RuleKind.INCOMPATIBLE, FILE_DIRECTORY_NOT_ALLOWED),
        "": Rule(RuleKind.INCOMPATIBLE, "the layout of the file sink's directory changes; not in Spark's table"),
    },
    "toConsole": {"": Rule(RuleKind.COMPATIBLE, "display only")},
    "toMemory": {"": Rule(RuleKind.COMPATIBLE, "the in-memory table is rebuilt when the query starts")},
}
OUTPUT_MODE = Rule(
    RuleKind.IN_STATEFUL_QUERY,
    "the output mode decides what a stateful operation keeps and emits; not in Spark's table",
)
OP_DEFAULTS: dict[str, Rule] = {
    "fromKafka": MAP_LIKE,
    "select": MAP_LIKE,
    "withColumns": MAP_LIKE,
    "explode": MAP_LIKE,
    "lookup": MAP_LIKE,
    "union": MAP_LIKE,
}

# Kafka source options (beyond the fields above), by what they change.
SUBSCRIPTION_OPTIONS = frozenset({"subscribe", "subscribePattern", "assign", "kafka.bootstrap.servers"})
RATE_OPTIONS = frozenset({"maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "maxRecordsPerPartition"})
HARMLESS_OPTIONS = frozenset(
    {
        "startingOffsets",
        "startingOffsetsByTimestamp",
        "startingTimestamp",
        "startingOffsetsByTimestampStrategy",
        "failOnDataLoss",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "kafkaConsumer.pollTimeoutMs",
        "groupIdPrefix",
        "minPartitions",
    }
)


def source_option_rule(key: str) -> Rule:
    if key in SUBSCRIPTION_OPTIONS:
        return Rule(RuleKind.INCOMPATIBLE, TOPICS_NOT_ALLOWED)
    if key in RATE_OPTIONS:
        return Rule(RuleKind.COMPATIBLE, RATE_LIMITS_ALLOWED)
    if key in HARMLESS_OPTIONS or key.startswith("kafka."):
        return Rule(RuleKind.COMPATIBLE, "a Kafka client or start-only setting; offsets stay")
    if key == "includeHeaders":
        return MAP_LIKE
    return Rule(
        RuleKind.INCOMPATIBLE, "a Kafka source option Spark's table does not cover: results may be unpredictable"
    )


def field_rule(op: str, name: str) -> Rule:
    rules = FIELD_RULES.get(op, {})
    if name == "outputMode":
        return OUTPUT_MODE
    return rules.get(name) or rules.get("") or OP_DEFAULTS.get(op) or STATEFUL


def sink_type_rule(old_op: str, new_op: str) -> Rule:
    if (old_op, new_op) == ("toFiles", "toKafka"):
        return Rule(RuleKind.COMPATIBLE, FILE_TO_KAFKA_ALLOWED)
    if (old_op, new_op) == ("toKafka", "toFiles"):
        return Rule(RuleKind.INCOMPATIBLE, KAFKA_TO_FILE_NOT_ALLOWED)
    return Rule(RuleKind.INCOMPATIBLE, SINK_TYPE_UNLISTED)


def added_or_removed_rule(op: str) -> Rule:
    """A node that joins or leaves a query."""
    if op == "fromKafka":
        return Rule(RuleKind.INCOMPATIBLE, SOURCES_NOT_ALLOWED)
    if op in STATEFUL_OPS:
        return STATEFUL
    if op in ("filter", "topN", "python"):
        return field_rule(op, "")
    return MAP_LIKE
