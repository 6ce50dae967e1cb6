"""Changes of the word count, one per class of change the rollout code knows, with what applying each does:
operator/tests/test_change_plan.py holds `sluice plan` and the operator's rollout to them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

WORDCOUNT = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "wordcount.yaml"
Edit = Callable[[dict[str, Any]], None]


def _nodes(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return spec["pipeline"]["nodes"]


def _add_sink(spec: dict[str, Any]) -> None:
    _nodes(spec).append({"name": "raw", "inputs": ["non-empty"], "toKafka": {"topic": "wordcount-raw"}})
    spec["topics"].append({"name": "wordcount-raw"})


def _stated(kind: str, *edits: Edit) -> Edit:
    def edit(spec: dict[str, Any]) -> None:
        for each in edits:
            each(spec)
        spec["updateStrategy"] = {"type": kind}

    return edit


def _filter(spec: dict[str, Any]) -> None:
    _nodes(spec)[2]["filter"] = "length(word) > 1"


def _window(spec: dict[str, Any]) -> None:
    _nodes(spec)[3]["aggregate"]["window"]["tumbling"] = "10s"


def _image(spec: dict[str, Any]) -> None:
    spec.setdefault("spark", {})["image"] = "sluice/spark:0.2.0"


def _explode(spec: dict[str, Any]) -> None:
    _nodes(spec)[1]["explode"]["from"] = "split(value, ' ')"


def _output_topic(spec: dict[str, Any]) -> None:
    _nodes(spec)[4]["toKafka"]["topic"] = "wordcount-counts-2"
    spec["topics"].append({"name": "wordcount-counts-2", "partitions": 4})


@dataclass(frozen=True)
class ChangeCase:
    name: str
    edit: Edit
    strategy: str | None  # what rolls out; None: no rollout, or refused
    actions: dict[str, str]  # per query, where something rolls out
    new_driver: bool = False
    refused: bool = False
    resubmit: bool = False  # the revision stays: spark-operator resubmits the driver with the new settings


CASES = (
    ChangeCase("nothing", lambda s: None, None, {}),
    ChangeCase("executors only", lambda s: s["executors"].update(instances=5), None, {}),
    ChangeCase("a filter", _filter, "hotSwap", {"out": "restart", "lines-dead-letters": "keep"}),
    ChangeCase("a window", _window, "checkpointMigration", {"out": "migrate", "lines-dead-letters": "restart"}),
    ChangeCase("the image", _image, "fencedHandover", {"out": "keep", "lines-dead-letters": "keep"}, new_driver=True),
    ChangeCase(
        "a window and the image",
        lambda s: (_window(s), _image(s)),
        "checkpointMigration",
        {"out": "migrate", "lines-dead-letters": "restart"},
        new_driver=True,
    ),
    ChangeCase("a new sink", _add_sink, "hotSwap", {"out": "keep", "raw": "start", "lines-dead-letters": "keep"}),
    ChangeCase(
        "no dead letters",
        lambda s: s["pipeline"].pop("deadLetter"),
        "hotSwap",
        {"out": "keep", "lines-dead-letters": "stop"},
    ),
    ChangeCase("Kafka login", lambda s: s["kafka"].update(tls={}), "fencedHandover", {"out": "keep"}, True),
    ChangeCase("a window, hotSwap stated", _stated("hotSwap", _window), None, {}, refused=True),
    ChangeCase("a window, fencedHandover stated", _stated("fencedHandover", _window), None, {}, refused=True),
    ChangeCase(
        "a filter, checkpointMigration stated",
        _stated("checkpointMigration", _filter),
        "checkpointMigration",
        {"out": "migrate", "lines-dead-letters": "keep"},
    ),
    ChangeCase("a filter, restart stated", _stated("restart", _filter), "restart", {"out": "restart"}, new_driver=True),
    # Spark's rules by where the change is (spark_rules.RuleKind) and what it touches (diff.py)
    ChangeCase("a projection ahead of the window", _explode, "checkpointMigration", {"out": "migrate"}),
    ChangeCase(
        "the watermark",
        lambda s: _nodes(s)[0]["fromKafka"].update(watermark="4s"),
        "checkpointMigration",
        {"out": "migrate"},
    ),
    ChangeCase(
        "the output mode of a stateful query",
        lambda s: _nodes(s)[4]["toKafka"].update(outputMode="update"),
        "checkpointMigration",
        {"out": "migrate", "lines-dead-letters": "keep"},
    ),
    ChangeCase(
        "another Kafka cluster",
        lambda s: s["kafka"].update(bootstrapServers="other-kafka:9092"),
        "checkpointMigration",
        {"out": "migrate", "lines-dead-letters": "migrate"},
    ),
    ChangeCase("the output topic", _output_topic, "hotSwap", {"out": "restart", "lines-dead-letters": "keep"}),
    ChangeCase(
        "the sink becomes files",
        lambda s: _nodes(s)[4].update(toKafka=None, toFiles={"path": "/data/counts", "format": "json"}),
        "checkpointMigration",
        {"out": "migrate", "lines-dead-letters": "keep"},
    ),
    ChangeCase(
        "the trigger's pace",
        lambda s: s["pipeline"].update(trigger={"processingTime": "5s"}),
        "hotSwap",
        {"out": "restart", "lines-dead-letters": "restart"},
    ),
    ChangeCase(
        "a rate limit",
        lambda s: _nodes(s)[0]["fromKafka"].update(maxRecordsPerTrigger=1000),
        "hotSwap",
        {"out": "restart", "lines-dead-letters": "restart"},
    ),
    ChangeCase(
        "late records no longer dead letters",
        lambda s: s["pipeline"]["deadLetter"].update(lateRecords=False),
        "hotSwap",
        {"out": "keep", "lines-dead-letters": "restart"},
    ),
    ChangeCase(
        "the checkpoint moves",
        lambda s: s.update(checkpoint={"location": "s3a://other/apps"}),
        "checkpointMigration",
        {"out": "migrate", "lines-dead-letters": "migrate"},
    ),
    ChangeCase(
        "sparkConf only",
        lambda s: s.setdefault("spark", {}).update(sparkConf={"spark.sql.shuffle.partitions": "7"}),
        None,
        {"out": "keep"},
        new_driver=True,
        resubmit=True,
    ),
)


def wordcount_spec() -> dict[str, Any]:
    return yaml.safe_load(WORDCOUNT.read_text())["spec"]


def changed(case: ChangeCase) -> dict[str, Any]:
    spec = copy.deepcopy(wordcount_spec())
    case.edit(spec)
    return spec
