"""Spark for tests and local runs: pyspark from PyPI plus the matching Kafka connector from Maven Central."""

from __future__ import annotations

from pathlib import Path

from .maven import artifact_name, fetch_jars
from .provision import cache_dir

SCALA_BINARY = "2.13"  # every pyspark 4.x is built for Scala 2.13


def spark_kafka_jars() -> list[Path]:
    """The Kafka connector for the installed pyspark version and the jars it needs beyond pyspark's own."""
    import pyspark

    version = pyspark.__version__
    provided = {artifact_name(jar.name) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return fetch_jars(
        "spark-kafka",
        [f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{version}"],
        cache_dir("spark-kafka", version) / "jars",
        skip_artifacts=provided,
    )
