"""Fixtures of the pipeline tests (Kafka and Spark come from the sluice.testbed.fixtures plugin)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import Harness
from pyspark.sql import SparkSession

from sluice.testbed.common import REPO_ROOT

# The benchmark's modules (pipelines/bench) are imported by their own names, once for every test: a class loaded
# twice is two objects, and a spawned process pickles an object by its class's name.
sys.path.insert(0, str(REPO_ROOT / "pipelines/bench"))


@pytest.fixture
def harness(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic: Callable[..., str], tmp_path: Path
) -> Harness:
    return Harness(spark_session, kafka_bootstrap, new_topic, tmp_path)


@pytest.fixture
def rows(spark_session: SparkSession, tmp_path: Path):  # -> ops/rows.Rows
    """Rows batches for the per-operation tests (pipelines/tests/ops) on the session's shared local Spark.
    Here rather than in ops/conftest.py: a second module named `conftest` shadows the operator tests' one."""
    from rows import Rows  # pipelines/tests/ops is on sys.path once its tests are collected

    return Rows(spark_session, tmp_path / "sources")
