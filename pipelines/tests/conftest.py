"""Fixtures of the pipeline tests (Kafka and Spark come from the sluice.testbed.fixtures plugin)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import Harness
from pyspark.sql import SparkSession


@pytest.fixture
def harness(spark_session: SparkSession, kafka_bootstrap: str, new_topic: Callable[..., str],
            tmp_path: Path) -> Harness:
    return Harness(spark_session, kafka_bootstrap, new_topic, tmp_path)
