"""Which queries pass through a shuffle, and so which scheduler pool their jobs run in and whether their
Kafka sink keeps a stage of its own (compiled plans)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.api.kafka_clients import KafkaClient
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.compiler import compile_pipeline
from sluice.pipelines.queries import DEFAULT_POOL, pool_of
from sluice.pipelines.session import STATELESS_POOL

pytestmark = pytest.mark.spark


def test_queries_with_a_shuffle_run_in_the_default_pool(spark_session: SparkSession, tmp_path: Path) -> None:
    """A shuffle upstream (a stateful operation, a lookup without broadcast, a python step: it may shuffle)
    puts a query in Spark's default pool and keeps its sink's last stage; without one, sluice's pool."""
    table = tmp_path / "items.csv"
    table.write_text("word,label\na,A\n")
    source = {"topic": "words", "format": "json", "schema": "word STRING, ts TIMESTAMP", "eventTime": "ts"}
    lookup = {"path": str(table), "format": "csv", "keys": ["word"]}
    spec = PipelineSpec.model_validate(
        {
            "nodes": [
                {"name": "words", "fromKafka": {**source, "watermark": "2s"}},
                {"name": "kept", "inputs": ["words"], "filter": "word != ''"},
                {"name": "plain", "inputs": ["kept"], "toMemory": {"table": "plain"}},
                {"name": "labelled", "inputs": ["kept"], "lookup": lookup},
                {"name": "broadcast", "inputs": ["labelled"], "toMemory": {"table": "broadcast"}},
                {"name": "sorted", "inputs": ["kept"], "lookup": {**lookup, "broadcast": False}},
                {"name": "merged", "inputs": ["sorted"], "toMemory": {"table": "merged"}},
                {
                    "name": "py",
                    "inputs": ["kept"],
                    "python": {"function": "transforms:labelled", "args": {"label": "x"}},
                },
                {"name": "python", "inputs": ["py"], "toMemory": {"table": "python"}},
                {"name": "unique", "inputs": ["kept"], "dedupe": {"keys": ["word"]}},
                {"name": "deduped", "inputs": ["unique"], "toMemory": {"table": "deduped"}},
            ],
            "deadLetter": {"toMemory": {"table": "dead"}},
        }
    )
    plans = compile_pipeline(spark_session, spec, kafka=KafkaClient("127.0.0.1:9")).queries
    shuffled = {plan.name: plan.shuffled for plan in plans}
    assert shuffled == {
        "plain": False,
        "broadcast": False,
        "merged": True,
        "python": True,
        "deduped": True,
        "words-dead-letters": False,
    }
    assert {plan.name: pool_of(plan) for plan in plans} == {
        "plain": STATELESS_POOL,
        "broadcast": STATELESS_POOL,
        "merged": DEFAULT_POOL,
        "python": DEFAULT_POOL,
        "deduped": DEFAULT_POOL,
        "words-dead-letters": DEFAULT_POOL,
    }
