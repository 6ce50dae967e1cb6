"""A real Spark job whose every Kafka client logs in by certificate (mTLS): the session broker's SSL listener takes
only clients with a certificate its CA signed. The driver's credential files are written as the operator mounts
them; Spark's source (Java), the at-least-once sink (Java) and the exactly-once sink (librdkafka, on executors)
all connect with the app's login (sluice.api.kafka_clients). SCRAM over TLS with real pods: the e2e's
secured_kafka step."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice.api.contract import RunnerConfig
from sluice.api.kafka_clients import kafka_security
from sluice.api.kafka_spec import KafkaSpec
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.local.kafka_io import consume_all, produce
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.testbed.kafka_security import client_certificate

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

RECORDS = 50


def mtls_login(kafka_secured, bootstrap: str, secrets: Path) -> RunnerConfig:
    """The RunnerConfig's Kafka as the operator makes it for type tls, with the Secrets' keys written where the
    driver pod would have them mounted."""
    kafka = KafkaSpec.model_validate(
        {
            "bootstrapServers": bootstrap,
            "tls": {"trustedCertificates": [{"secretName": "kafka-ca", "certificate": "ca.crt"}]},
            "authentication": {
                "type": "tls",
                "certificateAndKey": {"secretName": "app-user", "certificate": "user.crt", "key": "user.key"},
            },
        }
    )
    security, files = kafka_security(kafka, mount=str(secrets))
    certificate, key = client_certificate(kafka_secured, "sluice-app")
    values = {"ca.crt": kafka_secured.truststore.read_text(), "user.crt": certificate, "user.key": key}
    for path, source in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(values[source.key])
    return security


def test_a_spark_job_reads_and_writes_with_a_client_certificate(
    spark_session, kafka_broker, kafka_secured, new_topic, tmp_path
):
    source, exactly, at_least = new_topic(partitions=2), new_topic(partitions=2), new_topic(partitions=1)
    produce(kafka_broker.bootstrap, source, [f"record-{i}".encode() for i in range(RECORDS)])
    pipeline = PipelineSpec.model_validate(
        {
            "trigger": {"processingTime": "1s"},
            "nodes": [
                {"name": "lines", "fromKafka": {"topic": source, "format": "text"}},
                {"name": "eos", "inputs": ["lines"], "toKafka": {"topic": exactly, "value": "value"}},
                {
                    "name": "alo",
                    "inputs": ["lines"],
                    "toKafka": {"topic": at_least, "value": "value", "delivery": "atLeastOnce"},
                },
            ],
        }
    )
    config = RunnerConfig(
        app="mtls",
        revision="r1",
        kafkaBootstrap=kafka_broker.mtls_bootstrap,
        kafkaSecurity=mtls_login(kafka_secured, kafka_broker.mtls_bootstrap, tmp_path / "secrets"),
        pipeline=pipeline,
        checkpointRoot=str(tmp_path / "checkpoints"),
        controlPort=0,
    )
    run = PipelineRun(spark_session, config).start()
    try:
        wanted = sorted(f"record-{i}".encode() for i in range(RECORDS))
        for topic in (exactly, at_least):  # read back on the plaintext loopback listener
            got = consume_all(kafka_broker.bootstrap, topic, expected=RECORDS, timeout_s=120)
            assert sorted(r.value for r in got) == wanted, topic
        assert not [q.exception() for q in run.queries if q.exception() is not None]
    finally:
        run.stop()


def test_without_its_certificate_the_ssl_listener_refuses_a_client(kafka_broker, kafka_secured):
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors = []
    admin = AdminClient(
        {
            "bootstrap.servers": kafka_broker.mtls_bootstrap,
            "security.protocol": "ssl",
            "ssl.ca.pem": kafka_secured.truststore.read_text(),
            "error_cb": errors.append,
        }
    )
    with pytest.raises(KafkaException):  # no metadata: error_cb says why
        admin.list_topics(timeout=5)
    admin.poll(1)
    assert errors and not any(e.code() == 0 for e in errors), errors
