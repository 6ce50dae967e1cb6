"""Spark session construction for the runner (cluster) and for local runs (CLI, tests, demo)."""

from __future__ import annotations

import atexit
import functools
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from pyspark.sql import SparkSession

# Settings every sluice query relies on; sparkConf from the app can override them.
STATE_STORE_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
BASE_CONF: dict[str, str] = {
    STATE_STORE_PROVIDER: ROCKSDB_PROVIDER,
    # Each batch's commit writes the changed keys only (a snapshot now and then), not a snapshot of the store.
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    # The driver's pools for query stages: Spark creates a thread per stage until the cap (1,024 by default),
    # and a driver running micro-batches back to back never leaves one idle long enough to end it: its thread
    # count (and RSS) grew until the pod's memory limit killed it. A streaming driver runs a few stages at once.
    "spark.sql.shuffleExchange.maxThreadThreshold": "16",
    "spark.sql.resultQueryStage.maxThreadThreshold": "16",
    "spark.sql.broadcastExchange.maxThreadThreshold": "16",
    # Spark's advice on HotSpot: a generated method over 8,000 bytes is never JIT-compiled and runs interpreted,
    # so such a stage runs operator by operator instead. It applies to every stage of an app; measured on the
    # exactly-once sink's partition column (2.7x faster) and on bench-peers' filter-projection.
    "spark.sql.codegen.hugeMethodLimit": "8000",
    # An app's queries share the executors' cores. In FIFO order every task of a job runs before any task of a
    # job submitted after it, so a stateless query's one-task batch waited behind a stateful query's stages.
    # In fair mode STATELESS_POOL takes the next free core while it runs no task (pipelines/README.md).
    "spark.scheduler.mode": "FAIR",
    # Hadoop 3.5's S3A reads through the S3 Analytics Accelerator by default: a pool of 96 threads in each JVM
    # (counted in make soak's driver), and a store that keeps an entry for each object read until the filesystem
    # closes (HADOOP-20058), while a checkpoint reads new objects every batch. The classic stream, as Flink pins it.
    "spark.hadoop.fs.s3a.input.stream.type": "classic",
}
POOLS_FILE = "spark.scheduler.allocation.file"
STATELESS_POOL = "sluice-stateless"
SCHEDULER_POOLS = f"""<?xml version="1.0"?>
<allocations>
  <pool name="{STATELESS_POOL}">
    <schedulingMode>FIFO</schedulingMode>
    <weight>1</weight>
    <minShare>1</minShare>
  </pool>
</allocations>
"""


# Where the local CLI and the demo send Spark's log4j2 output and the JVM's stderr (the runner keeps stdout).
LOG_DIR = Path(".sluice/logs")
_LOG4J2 = """\
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
"""


def spark_log_file(app_name: str, log_dir: Path = LOG_DIR) -> Path:
    """A fresh log file for one local run: <log_dir>/<app>-<UTC timestamp>.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return log_dir / f"{app_name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.log"


def _quiet_conf(log_file: Path, conf: Mapping[str, str]) -> dict[str, str]:
    """Settings that send log4j2 to `log_file` (its configuration is written next to it) and turn the console
    progress bar off; they take effect only if the driver JVM starts with the session (local mode)."""
    properties = log_file.resolve().with_suffix(".log4j2.properties")
    properties.write_text(_LOG4J2.format(path=log_file.resolve()))
    java_options = " ".join(
        filter(None, [conf.get("spark.driver.extraJavaOptions"), f"-Dlog4j2.configurationFile={properties}"])
    )
    return {"spark.ui.showConsoleProgress": "false", "spark.driver.extraJavaOptions": java_options}


def _query_errors_logged_to(log_file: Path) -> None:
    """PySpark logs every SQL error it raises, with the JVM's whole stack, as a JSON line on stderr (sluice reports
    the error itself, with its path): with a log file, those lines go there."""
    from pyspark.logger import PySparkLogger

    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logger = PySparkLogger.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.addHandler(logging.FileHandler(log_file))


@contextmanager
def _stderr_to(log_file: Path) -> Iterator[None]:
    """File descriptor 2 points at `log_file` meanwhile: the JVM started meanwhile (and its Python workers)
    keep writing their stderr there; this process gets its terminal back."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log_file, "ab") as sink:
        os.dup2(sink.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def build_session(
    app_name: str, conf: Mapping[str, str], master: str | None = None, log_file: Path | None = None
) -> SparkSession:
    """With `log_file`, Spark's log lines and the JVM's stderr go there instead of the terminal."""
    # Python workers (executor-side code such as the exactly-once Kafka writer) run this interpreter, the one
    # with sluice installed, unless the environment names another; PySpark's default is any `python3`.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    launched = _launch_settings()
    conf = {**{key: value for key, value in BASE_CONF.items() if key not in launched}, **conf}
    if POOLS_FILE not in launched and POOLS_FILE not in conf:
        conf[POOLS_FILE] = scheduler_pools_file().as_uri()  # a path without a scheme would be on fs.defaultFS
    if log_file is not None:
        conf |= _quiet_conf(log_file, conf)
    for key, value in conf.items():
        builder = builder.config(key, value)
    if log_file is None:
        session = builder.getOrCreate()
    else:
        with _stderr_to(log_file):
            session = builder.getOrCreate()
        _query_errors_logged_to(log_file)
    session.sparkContext.setLogLevel("WARN")
    return session


@functools.cache
def scheduler_pools_file() -> Path:
    """SCHEDULER_POOLS in a file, as Spark reads them: one per process, removed when it exits."""
    folder = tempfile.mkdtemp(prefix="sluice-spark-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = Path(folder) / "scheduler-pools.xml"
    path.write_text(SCHEDULER_POOLS)
    return path


def _launch_settings() -> set[str]:
    """What spark-submit set for the JVM this process runs under (on a cluster: the app's sparkConf, which
    overrides sluice's BASE_CONF; a builder's setting would override it). Empty when the JVM starts with the
    session (local runs: the session's settings are its launch settings)."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # set by spark-submit for the Python it runs
        return set()
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM
    return {key for key, _ in SparkConf().getAll()}


def local_conf(
    jars: Sequence[Path],
    cores: int | str = "*",
    shuffle_partitions: int | None = None,
    conf: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A local session's settings (see local_session). `shuffle_partitions` (stateful stages' tasks) defaults to
    the cores, as the operator's default is the task slots an app may get: each partition more than the cores
    adds a state store to commit per batch and runs after the others."""
    slots = (os.cpu_count() or 1) if cores == "*" else int(cores)
    return {
        "spark.jars": ",".join(str(jar) for jar in jars),
        "spark.sql.shuffle.partitions": str(shuffle_partitions or slots),
        "spark.ui.enabled": "false",
        "spark.driver.memory": "2g",
        **(conf or {}),
    }


def local_session(
    app_name: str,
    jars: Sequence[Path],
    *,
    cores: int | str = "*",
    shuffle_partitions: int | None = None,
    conf: Mapping[str, str] | None = None,
    log_file: Path | None = None,
) -> SparkSession:
    """Spark in this process (local mode) with `jars` on its classpath: the Kafka connector's, from
    sluice.pipelines.local.spark.spark_kafka_jars(). `log_file`: see build_session."""
    settings = local_conf(jars, cores, shuffle_partitions, conf)
    return build_session(app_name, settings, master=f"local[{cores}]", log_file=log_file)
