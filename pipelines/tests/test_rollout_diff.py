"""Classification of spec changes per streaming query (Spark's table of changes on one checkpoint)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.api.app import StreamingAppSpec
from sluice.api.rollout import Change, SpecDiff, choose_strategy, classify, safe_strategies

EXAMPLES = Path(__file__).resolve().parents[2] / "pipelines" / "examples"
Edit = Callable[[dict[str, Any]], None]


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())["spec"]


def diff_of(raw: dict[str, Any], edit: Edit) -> SpecDiff:
    changed = copy.deepcopy(raw)
    edit(changed)
    return classify(StreamingAppSpec.model_validate(raw), StreamingAppSpec.model_validate(changed))


def nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["pipeline"]["nodes"]


def paths(diff: SpecDiff, query: str, change: Change) -> list[str]:
    return [r.path for r in diff.query(query).reasons if r.change is change]


@pytest.fixture
def wordcount() -> dict[str, Any]:
    return example("wordcount")


# ------------------------------------------------------------------------------------ wordcount


def test_filter_change_is_a_hot_swap_of_its_query_only(wordcount):
    diff = diff_of(wordcount, lambda s: nodes(s)[2].update(filter="word != '' AND length(word) > 1"))
    assert diff.query("out").change is Change.COMPATIBLE
    assert paths(diff, "out", Change.COMPATIBLE) == ["spec.pipeline.nodes[2].filter"]
    assert "Addition / deletion of filters is allowed" in diff.query("out").reasons[0].why
    assert diff.query("lines-dead-letters").change is Change.NONE
    assert choose_strategy("auto", diff) == "hotSwap"


def test_window_change_migrates_with_rewind_of_watermark_plus_window(wordcount):
    diff = diff_of(wordcount, lambda s: nodes(s)[3]["aggregate"]["window"].update(tumbling="10s"))
    out = diff.query("out")
    assert out.change is Change.INCOMPATIBLE
    assert paths(diff, "out", Change.INCOMPATIBLE) == ["spec.pipeline.nodes[3].aggregate.window"]
    assert "grouping keys or aggregates is not allowed" in out.reasons[0].why
    assert out.rewind_ms == 2_000 + 10_000  # watermark 2s + the new 10s window
    # The dead-letter query's late-record filter follows the window: a compatible change.
    assert diff.query("lines-dead-letters").change is Change.COMPATIBLE
    assert choose_strategy("auto", diff) == "checkpointMigration"


def test_image_change_is_a_fenced_handover(wordcount):
    diff = diff_of(wordcount, lambda s: s.setdefault("spark", {}).update(image="sluice/spark:0.2.0"))
    assert [r.path for r in diff.runtime] == ["spec.spark.image"]
    assert not diff.changed
    assert safe_strategies(diff) == ("fencedHandover", "checkpointMigration", "restart")
    assert choose_strategy("auto", diff) == "fencedHandover"


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s["spark"].update(version="4.3.0"),
        lambda s: s["spark"].update(driver={"cores": 2, "memory": "2g"}),
        lambda s: s["spark"].update(executor={"cores": 2}),
        lambda s: s["spark"].update(sparkConf={"spark.sql.streaming.stateStore.providerClass": "rocksdb"}),
    ],
    ids=["version", "driver", "executor", "sparkConf"],
)
def test_runtime_changes_need_a_new_driver(wordcount, edit):
    wordcount["spark"] = {}
    diff = diff_of(wordcount, edit)
    assert diff.runtime and not diff.changed
    assert choose_strategy("auto", diff) == "fencedHandover"


@pytest.mark.parametrize(
    "edit, path",
    [
        (lambda s: s["executors"].update(instances=3), "spec.executors"),
        (lambda s: s.update(autoscaling={"enabled": True}), "spec.autoscaling"),
        (lambda s: s.update(updateStrategy={"type": "restart"}), "spec.updateStrategy"),
        (lambda s: s["topics"].append({"name": "more"}), "spec.topics"),
    ],
)
def test_changes_the_driver_does_not_run_need_no_rollout(wordcount, edit, path):
    diff = diff_of(wordcount, edit)
    assert not diff.needs_rollout
    assert diff.unaffected == (path,)


def test_projection_ahead_of_an_aggregation_changes_its_state(wordcount):
    diff = diff_of(wordcount, lambda s: nodes(s)[1]["explode"].update(**{"from": "split(value, ' ')"}))
    reason = diff.query("out").reasons[0]
    assert reason.change is Change.INCOMPATIBLE and reason.path == "spec.pipeline.nodes[1].explode.from"
    assert "spec.pipeline.nodes[3] (aggregate)" in reason.why
    assert diff.query("lines-dead-letters").change is Change.NONE


def test_source_topic_change_needs_a_new_checkpoint(wordcount):
    diff = diff_of(wordcount, lambda s: nodes(s)[0]["fromKafka"].update(topic="wordcount-lines,more-lines"))
    for query in ("out", "lines-dead-letters"):
        assert paths(diff, query, Change.INCOMPATIBLE) == ["spec.pipeline.nodes[0].fromKafka.topic"]
        assert "generally not allowed as the results are unpredictable" in diff.query(query).reasons[0].why
    assert diff.query("lines-dead-letters").rewind_ms == 0  # stateless: from the old offsets as they are


def test_another_kafka_cluster_carries_no_offsets_over(wordcount):
    diff = diff_of(wordcount, lambda s: s["kafka"].update(bootstrapServers="elsewhere:9092"))
    out = diff.query("out")
    assert out.change is Change.INCOMPATIBLE and out.rewind_ms is None
    assert {r.path for r in out.reasons} == {"spec.kafka"}
    assert [r.change for r in out.reasons] == [Change.INCOMPATIBLE, Change.COMPATIBLE]  # the source, the sink


@pytest.mark.parametrize(
    "edit, change",
    [
        (lambda s: nodes(s)[0]["fromKafka"].update(maxRecordsPerTrigger=1000), Change.COMPATIBLE),
        (lambda s: nodes(s)[0]["fromKafka"].update(options={"maxOffsetsPerTrigger": "10"}), Change.COMPATIBLE),
        (lambda s: nodes(s)[0]["fromKafka"].update(options={"kafka.security.protocol": "SSL"}), Change.COMPATIBLE),
        (lambda s: nodes(s)[0]["fromKafka"].update(startingOffsets="latest"), Change.COMPATIBLE),
        (lambda s: nodes(s)[0]["fromKafka"].update(options={"subscribePattern": "lines-.*"}), Change.INCOMPATIBLE),
        (lambda s: nodes(s)[0]["fromKafka"].update(options={"someNewOption": "x"}), Change.INCOMPATIBLE),
        (lambda s: nodes(s)[0]["fromKafka"].update(watermark="10s"), Change.INCOMPATIBLE),
        (lambda s: nodes(s)[0]["fromKafka"].update(metadata=["key"]), Change.INCOMPATIBLE),
    ],
    ids=[
        "rate-limit",
        "rate-option",
        "client-option",
        "startingOffsets",
        "subscription",
        "unknown-option",
        "watermark-ahead-of-window",
        "parsed-columns-ahead-of-window",
    ],
)
def test_source_parameters(wordcount, edit, change):
    assert diff_of(wordcount, edit).query("out").change is change


@pytest.mark.parametrize(
    "edit, change",
    [
        (lambda s: nodes(s)[4]["toKafka"].update(topic="elsewhere"), Change.COMPATIBLE),
        (lambda s: nodes(s)[4]["toKafka"].update(key="upper(word)"), Change.COMPATIBLE),
        (lambda s: nodes(s)[4]["toKafka"].update(delivery="atLeastOnce"), Change.COMPATIBLE),
        (lambda s: nodes(s)[4].update(toKafka=None, toFiles={"path": "/out"}), Change.INCOMPATIBLE),
        (lambda s: nodes(s)[4]["toKafka"].update(outputMode="update"), Change.INCOMPATIBLE),
    ],
    ids=["topic", "key", "delivery", "kafka-to-files", "output-mode-of-stateful-query"],
)
def test_sink_changes(wordcount, edit, change):
    diff = diff_of(wordcount, edit)
    assert diff.query("out").change is change
    assert diff.query("lines-dead-letters").change is Change.NONE


def test_file_sinks_directory_and_type(wordcount):
    nodes(wordcount)[4] = {"name": "out", "inputs": ["counts"], "toFiles": {"path": "/data/counts"}}
    moved = diff_of(wordcount, lambda s: nodes(s)[4]["toFiles"].update(path="/data/other"))
    assert "Changes to output directory of a file sink are not allowed" in moved.query("out").reasons[0].why
    assert moved.query("out").change is Change.INCOMPATIBLE
    to_kafka = diff_of(wordcount, lambda s: nodes(s)[4].update(toFiles=None, toKafka={"topic": "counts"}))
    assert to_kafka.query("out").change is Change.COMPATIBLE
    assert "Kafka will see only the new data" in to_kafka.query("out").reasons[0].why


def test_inserting_a_filter_before_the_aggregation_is_compatible(wordcount):
    def insert(spec: dict[str, Any]) -> None:
        nodes(spec).insert(3, {"name": "short", "inputs": ["non-empty"], "filter": "length(word) < 20"})
        nodes(spec)[4]["inputs"] = ["short"]

    diff = diff_of(wordcount, insert)
    assert diff.query("out").change is Change.COMPATIBLE
    assert paths(diff, "out", Change.COMPATIBLE) == ["spec.pipeline.nodes[3]"]


def test_removing_the_filter_is_compatible_and_named_by_its_old_path(wordcount):
    def remove(spec: dict[str, Any]) -> None:
        del nodes(spec)[2]
        nodes(spec)[2]["inputs"] = ["words"]

    diff = diff_of(wordcount, remove)
    assert diff.query("out").change is Change.COMPATIBLE
    assert "node 'non-empty' (filter) leaves the query" in str(diff.query("out").reasons[0])


def test_reordering_stateless_nodes_is_still_a_change(wordcount):
    def reorder(spec: dict[str, Any]) -> None:
        words, non_empty = nodes(spec)[1], nodes(spec)[2]
        non_empty["inputs"], words["inputs"] = ["lines"], ["non-empty"]
        non_empty["filter"] = "value != ''"
        nodes(spec)[3]["inputs"] = ["words"]

    # The explode now reads the filter's rows, ahead of the aggregation.
    assert diff_of(wordcount, reorder).query("out").change is Change.INCOMPATIBLE


def test_added_and_removed_sinks_are_queries_of_their_own(wordcount):
    def add_sink(spec: dict[str, Any]) -> None:
        nodes(spec).append({"name": "raw", "inputs": ["non-empty"], "toConsole": {}})

    added = diff_of(wordcount, add_sink)
    assert added.query("raw").presence == "added"
    assert added.query("out").change is Change.NONE
    assert choose_strategy("auto", added) == "hotSwap"

    with_two = copy.deepcopy(wordcount)
    add_sink(with_two)
    removed = diff_of(with_two, lambda s: nodes(s).pop())
    assert removed.query("raw").presence == "removed"


def test_trigger_interval_is_compatible_but_real_time_needs_new_state(wordcount):
    interval = diff_of(wordcount, lambda s: s["pipeline"].update(trigger={"processingTime": "5s"}))
    assert {q.change for q in interval.queries} == {Change.COMPATIBLE}
    real_time = diff_of(wordcount, lambda s: s["pipeline"].update(trigger={"realTime": "5m"}))
    assert real_time.query("out").change is Change.INCOMPATIBLE
    assert real_time.query("lines-dead-letters").change is Change.COMPATIBLE  # stateless


def test_dead_letter_sink_change_touches_only_the_dead_letter_queries(wordcount):
    diff = diff_of(wordcount, lambda s: s["pipeline"]["deadLetter"]["toKafka"].update(topic="dlq"))
    assert paths(diff, "lines-dead-letters", Change.COMPATIBLE) == ["spec.pipeline.deadLetter.toKafka.topic"]
    assert diff.query("out").change is Change.NONE
    removed = diff_of(wordcount, lambda s: s["pipeline"].pop("deadLetter"))
    assert removed.query("lines-dead-letters").presence == "removed"


def test_checkpoint_moves(wordcount):
    location = diff_of(wordcount, lambda s: s.update(checkpoint={"location": "s3a://bucket/cp"}))
    assert {q.change for q in location.queries} == {Change.INCOMPATIBLE} and not location.runtime
    claim = diff_of(wordcount, lambda s: s.update(checkpoint={"volumeClaim": "mine"}))
    assert [r.path for r in claim.runtime] == ["spec.checkpoint.volumeClaim"]
    assert choose_strategy("auto", claim) == "checkpointMigration"  # the only one for new checkpoints + new driver
    size = diff_of(wordcount, lambda s: s.update(checkpoint={"size": "5Gi"}))
    assert not size.needs_rollout and size.unaffected == ("spec.checkpoint.size",)


# ------------------------------------------------------------------------------ other examples


def test_stateless_projection_reaching_the_sink_is_compatible():
    raw = {
        "kafka": {"bootstrapServers": "k:9092"},
        "pipeline": {
            "nodes": [
                {"name": "in", "fromKafka": {"topic": "a"}},
                {"name": "upper", "inputs": ["in"], "select": ["upper(value) AS value"]},
                {"name": "out", "inputs": ["upper"], "toKafka": {"topic": "b"}},
            ]
        },
    }
    diff = diff_of(raw, lambda s: nodes(s)[1].update(select=["lower(value) AS value", "length(value) AS n"]))
    assert diff.query("out").change is Change.COMPATIBLE
    assert "conditionally allowed" in diff.query("out").reasons[0].why


def test_running_counts_without_watermark_restart_from_the_beginning():
    raw = example("frequency-count")
    diff = diff_of(raw, lambda s: nodes(s)[1]["aggregate"]["aggregations"].update(total="sum(length(word))"))
    out = diff.query("out")
    assert out.change is Change.INCOMPATIBLE and out.rewind_ms is None  # the state holds everything ever read


def test_join_changes():
    raw = example("latency-correlation")
    within = diff_of(raw, lambda s: nodes(s)[2]["join"].update(within="2s"))
    assert paths(within, "out", Change.INCOMPATIBLE) == ["spec.pipeline.nodes[2].join.within"]
    assert "Other changes in the join condition are ill-defined" in within.query("out").reasons[0].why
    assert within.query("out").rewind_ms == 5_000 + 2_000 + 60_000  # watermark + join bound + 1m window
    # The join's output projection comes after its state, but the per-firm aggregation follows it.
    select = diff_of(raw, lambda s: nodes(s)[2]["join"]["select"].append("responses.id AS response_id"))
    assert "spec.pipeline.nodes[3] (aggregate)" in select.query("out").reasons[0].why
    assert within.query("requests-dead-letters").change is Change.NONE


def test_adtech_top_n_and_lookup():
    raw = example("adtech")
    top = diff_of(raw, lambda s: nodes(s)[4]["topN"].update(limit=10))
    assert top.query("out").change is Change.COMPATIBLE and "foreach" in top.query("out").reasons[0].why
    hint = diff_of(raw, lambda s: nodes(s)[2]["lookup"].update(broadcast=False))
    assert hint.query("out").change is Change.COMPATIBLE
    table = diff_of(raw, lambda s: nodes(s)[2]["lookup"].update(path="other.csv"))
    assert table.query("out").change is Change.INCOMPATIBLE  # enriched rows feed the aggregation


def test_dedupe_and_python_transforms():
    raw = {
        "kafka": {"bootstrapServers": "k:9092"},
        "pipeline": {
            "nodes": [
                {
                    "name": "in",
                    "fromKafka": {
                        "topic": "a",
                        "format": "json",
                        "schema": "id STRING, ts TIMESTAMP",
                        "eventTime": "ts",
                        "watermark": "10s",
                    },
                },
                {"name": "unique", "inputs": ["in"], "dedupe": {"keys": ["id"]}},
                {"name": "custom", "inputs": ["unique"], "python": {"function": "mod:fn"}},
                {"name": "out", "inputs": ["custom"], "toKafka": {"topic": "b"}},
            ]
        },
    }
    keys = diff_of(raw, lambda s: nodes(s)[1]["dedupe"].update(keys=["id", "ts"]))
    assert "deduplicating columns is not allowed" in keys.query("out").reasons[0].why
    assert keys.query("out").rewind_ms == 10_000
    code = diff_of(raw, lambda s: nodes(s)[2]["python"].update(args={"x": 1}))
    assert code.query("out").change is Change.INCOMPATIBLE
