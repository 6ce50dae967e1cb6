"""The Kafka source's options come from one place: sluice's defaults under the node's own options."""

from __future__ import annotations

from sluice.api.kafka_clients import KafkaClient
from sluice.api.pipeline import SOURCE_FETCH_MAX_WAIT_MS, SOURCE_MAX_POLL_RECORDS, FromKafka
from sluice.pipelines.kafka_source import kafka_source_options


def test_a_stream_reads_with_a_short_fetch_wait_and_the_nodes_settings() -> None:
    src = FromKafka(topic="lines", maxRecordsPerTrigger=1000, minPartitions=8, metadata=["headers"])
    options = kafka_source_options(src, KafkaClient("kafka:9092"), "earliest")
    assert options == {
        "kafka.bootstrap.servers": "kafka:9092",
        "kafka.isolation.level": "read_committed",
        "kafka.fetch.max.wait.ms": str(SOURCE_FETCH_MAX_WAIT_MS),
        "kafka.max.poll.records": str(SOURCE_MAX_POLL_RECORDS),
        "includeHeaders": "true",
        "startingOffsets": "earliest",
        "maxOffsetsPerTrigger": "1000",
        "subscribe": "lines",
        "minPartitions": "8",
    }


def test_the_nodes_own_options_win() -> None:
    src = FromKafka(
        pattern="lines-.*",
        isolationLevel="readUncommitted",
        options={"kafka.fetch.max.wait.ms": "500", "kafka.max.poll.records": "500", "failOnDataLoss": "false"},
    )
    options = kafka_source_options(src, KafkaClient("kafka:9092"), "latest")
    assert options["kafka.fetch.max.wait.ms"] == "500"
    assert options["kafka.max.poll.records"] == "500"
    assert options["failOnDataLoss"] == "false"
    assert options["subscribePattern"] == "lines-.*" and "subscribe" not in options
    assert options["kafka.isolation.level"] == "read_uncommitted"


def test_a_warm_up_streams_from_the_records_of_a_time() -> None:
    src = FromKafka(topic="lines", maxRecordsPerTrigger=1000)
    options = kafka_source_options(src, KafkaClient("kafka:9092"), "earliest", since_ms=1_700_000_000_000)
    assert options["startingTimestamp"] == "1700000000000"
    assert options["startingOffsetsByTimestampStrategy"] == "latest"
    assert "startingOffsets" not in options and options["maxOffsetsPerTrigger"] == "1000"
