"""Real Spark reading real Kafka through the connector fetched from Maven Central."""

from __future__ import annotations

import pytest

from sluice.pipelines.local.kafka_io import produce

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def test_structured_streaming_kafka_to_memory_equals_input(spark_session, kafka_bootstrap, new_topic, tmp_path):
    topic = new_topic(partitions=3)
    records = [(f"key-{i % 10}".encode(), f"line {i}".encode()) for i in range(5_000)]
    produce(kafka_bootstrap, topic, records)

    stream = (
        spark_session.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value")
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("roundtrip")
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    assert query.exception() is None

    rows = spark_session.sql("SELECT key, value FROM roundtrip").collect()
    assert sorted((r.key, r.value) for r in rows) == sorted((k.decode(), v.decode()) for k, v in records)


def test_connector_jars_do_not_duplicate_pyspark(spark_session):
    from pathlib import Path

    import pyspark

    from sluice.pipelines.local.maven import artifact_name
    from sluice.pipelines.local.spark import spark_image_jars

    ours = [artifact_name(j.name) for j in spark_image_jars()]
    theirs = {artifact_name(j.name) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert {"spark-sql-kafka-0-10_2.13", "kafka-clients", "hadoop-aws", "s3", "sts"} <= set(ours)
    assert "bundle" not in ours  # the AWS SDK's 600 MB jar: s3a needs only its modules
    assert not set(ours) & theirs
    assert len(ours) == len(set(ours))
