"""Fixtures of the per-operation tests: rows batches on the session's shared local Spark."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from rows import Rows


@pytest.fixture
def rows(spark_session: SparkSession, tmp_path: Path) -> Rows:
    return Rows(spark_session, tmp_path / "sources")
