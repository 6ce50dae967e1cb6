"""Spark session construction for the runner (cluster) and for local runs (CLI, tests, demo)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

# Settings every sluice query relies on; sparkConf from the app can override them.
BASE_CONF: dict[str, str] = {
    "spark.sql.streaming.stateStore.providerClass":
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
}


def build_session(app_name: str, conf: Mapping[str, str], master: str | None = None) -> SparkSession:
    # Python workers (executor-side code such as the exactly-once Kafka writer) run this interpreter, the one
    # with sluice installed, unless the environment names another; PySpark's default is any `python3`.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in {**BASE_CONF, **conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def local_session(app_name: str, jars: Sequence[Path], *, cores: int | str = "*", shuffle_partitions: int = 4,
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """Spark in this process (local mode) with `jars` on its classpath: the Kafka connector's, from
    sluice.pipelines.local.spark.spark_kafka_jars()."""
    local_conf = {
        "spark.jars": ",".join(str(jar) for jar in jars),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.driver.memory": "2g",
        **(conf or {}),
    }
    return build_session(app_name, local_conf, master=f"local[{cores}]")
