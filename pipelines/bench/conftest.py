"""Fixtures of the benchmarks (Kafka and Spark come from the sluice.testbed.fixtures plugin)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from bench_spark import ProgressLog


@pytest.fixture(scope="module")
def progress_log(spark_session) -> Iterator[ProgressLog]:
    log = ProgressLog()
    spark_session.streams.addListener(log)
    try:
        yield log
    finally:
        spark_session.streams.removeListener(log)
