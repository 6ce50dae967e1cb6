"""How an app's queries share its cores: Spark's fair scheduler, the jobs of queries without a shuffle in
sluice's pool (it takes the next free core while it runs no task), the others' and the dead-letter queries' in
Spark's default pool (on real Kafka and Spark)."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sluice.api.contract import RunnerConfig
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.local.kafka_io import produce
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.pipelines.session import STATELESS_POOL
from sluice.testbed.common import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def stage_pools(spark: SparkSession) -> dict[str, set[str]]:
    """Query name -> the scheduler pools its stages ran in (Spark's status store; the first line of a streaming
    job's description is its query's name)."""
    context = spark.sparkContext
    gateway = context._gateway
    assert gateway is not None
    no_quantiles = gateway.new_array(gateway.jvm.double, 0)
    stages = context._jsc.sc().statusStore().stageList(None, False, False, no_quantiles, None)  # type: ignore[union-attr]
    pools: dict[str, set[str]] = defaultdict(set)
    for index in range(stages.size()):
        stage = stages.apply(index)
        if stage.description().isDefined():
            pools[stage.description().get().split("\n")[0]].add(stage.schedulingPool())
    return pools


def test_stateless_queries_run_in_their_own_pool(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> None:
    context = spark_session.sparkContext
    assert context.getConf().get("spark.scheduler.mode") == "FAIR"
    pool = context._jsc.sc().getPoolForName(STATELESS_POOL).get()  # type: ignore[union-attr]
    assert (pool.minShare(), pool.weight()) == (1, 1)
    source, passed, dead_letters = new_topic(partitions=2), new_topic(partitions=1), new_topic(partitions=1)
    tag = uuid.uuid4().hex[:6]
    spec = PipelineSpec.model_validate(
        {
            "trigger": {"processingTime": "500ms"},
            "nodes": [
                {
                    "name": f"events-{tag}",
                    "fromKafka": {
                        "topic": source,
                        "format": "json",
                        "schema": "word STRING, ts TIMESTAMP",
                        "eventTime": "ts",
                        "watermark": "2s",
                        "startingOffsets": "earliest",
                    },
                },
                {"name": "kept", "inputs": [f"events-{tag}"], "filter": "word != ''"},
                {"name": f"passed-{tag}", "inputs": ["kept"], "toKafka": {"topic": passed}},  # exactly once
                {
                    "name": "counts",
                    "inputs": ["kept"],
                    "aggregate": {"groupBy": ["word"], "window": {"tumbling": "5s"}, "aggregations": {"n": "count(*)"}},
                },
                {"name": f"counted-{tag}", "inputs": ["counts"], "toMemory": {"table": f"counted_{tag}"}},
            ],
            "deadLetter": {"toKafka": {"topic": dead_letters}},
        }
    )
    records = [json.dumps({"word": w, "ts": "2026-01-01T00:00:00Z"}).encode() for w in ("a", "b", "")]
    produce(kafka_bootstrap, source, [*records, b"not json"])
    config = RunnerConfig(
        app="pools",
        revision="r1",
        kafkaBootstrap=kafka_bootstrap,
        pipeline=spec,
        checkpointRoot=str(tmp_path / "checkpoints"),
        controlPort=0,
    )
    run = PipelineRun(spark_session, config).start()
    try:
        wait_for(
            lambda: all(q.lastProgress and q.lastProgress["batchId"] >= 1 for q in run.queries),
            timeout=180,
            what="a second batch of each query",
        )
    finally:
        run.stop()
    pools = stage_pools(spark_session)
    assert pools[f"passed-{tag}"] == {STATELESS_POOL}, pools  # its writes too (foreachBatch)
    assert pools[f"counted_{tag}"] == {"default"}, pools
    assert pools[f"events-{tag}-dead-letters"] == {"default"}, pools
