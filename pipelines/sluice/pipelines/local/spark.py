"""Spark for tests, local runs and the Spark image: pyspark from PyPI plus, from Maven Central, the matching
Kafka connector and Hadoop's S3 filesystem (s3a://) with the AWS SDK v2 modules it uses."""

from __future__ import annotations

from pathlib import Path

from .maven import artifact_name, fetch_jars
from .provision import ProvisionError, cache_dir

SCALA_BINARY = "2.13"  # every pyspark 4.x is built for Scala 2.13

# The AWS SDK v2 each Hadoop release builds hadoop-aws against (hadoop-project's aws-java-sdk-v2.version).
# hadoop-aws depends on the SDK's ~600 MB `bundle`; these modules are what s3a loads (~19 MB): the S3 client
# and its transfer manager, and STS for web identity (IRSA) and assumed roles.
AWS_SDK_FOR_HADOOP = {"3.5.0": "2.35.4"}
AWS_SDK_MODULES = ("s3", "s3-transfer-manager", "sts")


def _pyspark_jars() -> dict[str, Path]:
    import pyspark

    return {artifact_name(jar.name): jar for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def pyspark_hadoop_version() -> str:
    """The Hadoop client pyspark carries (hadoop-client-api-X.jar)."""
    jar = _pyspark_jars()["hadoop-client-api"]
    return jar.name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def spark_kafka_jars() -> list[Path]:
    """The Kafka connector for the installed pyspark version and the jars it needs beyond pyspark's own."""
    import pyspark

    version = pyspark.__version__
    return fetch_jars(
        "spark-kafka",
        [f"org.apache.spark:spark-sql-kafka-0-10_{SCALA_BINARY}:{version}"],
        cache_dir("spark-kafka", version) / "jars",
        skip_artifacts=set(_pyspark_jars()),
    )


def spark_s3a_jars() -> list[Path]:
    """hadoop-aws matching pyspark's Hadoop client, with the AWS SDK v2 modules instead of its bundle."""
    hadoop = pyspark_hadoop_version()
    if (sdk := AWS_SDK_FOR_HADOOP.get(hadoop)) is None:
        raise ProvisionError(
            f"pyspark carries Hadoop {hadoop}; sluice.pipelines.local.spark.AWS_SDK_FOR_HADOOP names the AWS SDK of "
            f"{', '.join(AWS_SDK_FOR_HADOOP)} only: add {hadoop}'s (hadoop-project's aws-java-sdk-v2.version)"
        )
    return fetch_jars(
        "spark-s3a",
        [f"org.apache.hadoop:hadoop-aws:{hadoop}", *(f"software.amazon.awssdk:{m}:{sdk}" for m in AWS_SDK_MODULES)],
        cache_dir("spark-s3a", f"{hadoop}-{sdk}") / "jars",
        skip_artifacts=set(_pyspark_jars()),
        excluding=["software.amazon.awssdk:bundle"],
    )


def spark_image_jars() -> list[Path]:
    """What the Spark image adds to Spark's own jars: the Kafka connector and s3a."""
    return [*spark_kafka_jars(), *spark_s3a_jars()]
