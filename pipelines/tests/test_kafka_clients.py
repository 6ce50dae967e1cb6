"""spec.kafka -> every client's settings (sluice.api.kafka_clients), and what the model refuses. Pure: the real
broker's side is e2e/tests/test_kafka.py (SCRAM over TLS against a broker) and the e2e's secured_kafka step."""

from __future__ import annotations

import pytest

from sluice.api.app import app_problems
from sluice.api.kafka_clients import (
    CredentialUnreadable,
    KafkaClient,
    kafka_security,
    read_credentials,
    read_file,
)
from sluice.api.kafka_spec import KafkaSpec
from sluice.testbed.kafka_security import scram_over_tls

CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n"
SCRAM = scram_over_tls("kafka:9094", "app", "app-user", "cluster-ca")
MTLS = {
    "strimziCluster": {"name": "events", "listener": "tls"},
    "tls": {},
    "authentication": {
        "type": "tls",
        "certificateAndKey": {"secretName": "app-user", "certificate": "user.crt", "key": "user.key"},
    },
}


def client(spec: dict, files: dict[str, str]) -> KafkaClient:
    security, _ = kafka_security(KafkaSpec.model_validate(spec))
    return KafkaClient("kafka:9094", security, read_credentials(security, files.__getitem__))


def test_scram_over_tls_gives_each_client_the_same_login() -> None:
    security, files = kafka_security(KafkaSpec.model_validate(SCRAM))
    assert security.protocol == "SASL_SSL" and security.saslMechanism == "SCRAM-SHA-512"
    assert {f.field for f in files.values()} == {
        "spec.kafka.tls.trustedCertificates[0]",
        "spec.kafka.authentication.passwordSecret",
    }
    login = client(SCRAM, {security.passwordFile: 'pa"ss\\word\n', security.trustedCertificateFiles[0]: CA})
    assert login.librdkafka() == {
        "bootstrap.servers": "kafka:9094",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": 'pa"ss\\word',
        "ssl.ca.pem": CA,
    }
    java = login.java()
    assert java["security.protocol"] == "SASL_SSL" and java["ssl.truststore.certificates"] == CA
    assert java["sasl.jaas.config"] == (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="app" password="pa\\"ss\\\\word";'
    )
    assert login.spark_options()["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    assert login.at("other:9094").librdkafka()["sasl.password"] == 'pa"ss\\word'  # a node's own cluster
    assert 'pa"ss' not in repr(login)


def test_mtls_with_a_strimzi_cluster_trusts_its_cluster_ca() -> None:
    security, files = kafka_security(KafkaSpec.model_validate(MTLS))
    assert security.protocol == "SSL" and security.saslMechanism is None
    assert [(f.secret, f.key) for f in files.values()] == [
        ("events-cluster-ca-cert", "ca.crt"),
        ("app-user", "user.crt"),
        ("app-user", "user.key"),
    ]
    login = client(MTLS, {path: KEY if path.endswith(".key") else CA for path in files})
    assert login.librdkafka()["ssl.key.pem"] == KEY and login.librdkafka()["ssl.certificate.pem"] == CA
    assert login.java()["ssl.keystore.type"] == "PEM" and login.java()["ssl.keystore.key"] == KEY
    assert "sasl.jaas.config" not in login.java()


def test_plaintext_is_the_default_and_sets_nothing_else() -> None:
    security, files = kafka_security(KafkaSpec(bootstrapServers="kafka:9092"))
    assert files == {}
    plain = KafkaClient("kafka:9092", security, read_credentials(security, read_file))
    assert plain.java() == plain.librdkafka() == {"bootstrap.servers": "kafka:9092"}


def test_a_certificate_that_is_not_pem_and_a_missing_file_are_named(tmp_path) -> None:
    security, _ = kafka_security(KafkaSpec.model_validate(SCRAM))
    with pytest.raises(CredentialUnreadable, match=r"trustedCertificates.*not PEM"):
        read_credentials(security, lambda path: "secret", name=lambda path: "spec.kafka.tls.trustedCertificates[0]")
    with pytest.raises(CredentialUnreadable, match="password: No such file"):
        read_file(str(tmp_path / "password"))


@pytest.mark.parametrize(
    ("kafka", "path", "message"),
    [
        ({"authentication": {"type": "tls", "certificateAndKey": {"secretName": "u", "certificate": "c", "key": "k"}}},
         "spec.kafka", "authentication type tls (mTLS) needs tls"),
        ({"authentication": {"type": "scram-sha-256", "username": "u"}},
         "spec.kafka.authentication", "type scram-sha-256 needs passwordSecret"),
        ({"authentication": {"type": "plain", "username": "u",
                             "passwordSecret": {"secretName": "Bad_Name", "password": "p"}}},
         "spec.kafka.authentication.passwordSecret.secretName", "should match pattern"),
        ({"authentication": {"type": "kerberos"}}, "spec.kafka.authentication.type", "tls"),
    ],
)  # fmt: skip
def test_refused_kafka_settings_name_their_field(kafka: dict, path: str, message: str) -> None:
    spec = {
        "kafka": {"bootstrapServers": "kafka:9092", **kafka},
        "pipeline": {"nodes": [{"name": "in", "fromKafka": {"topic": "t"}},
                               {"name": "out", "inputs": ["in"], "toConsole": {}}]},
    }  # fmt: skip
    _, problems = app_problems(spec)
    assert any(p.path == path and message in p.message for p in problems), problems


def test_credentials_in_options_are_refused_with_the_way_to_give_them() -> None:
    spec = {
        "kafka": {"bootstrapServers": "kafka:9092"},
        "pipeline": {"nodes": [
            {"name": "in", "fromKafka": {"topic": "t", "options": {"kafka.sasl.jaas.config": "x password=y"}}},
            {"name": "out", "inputs": ["in"], "toKafka": {"topic": "o", "options": {"kafka.sasl.password": "y"}}},
        ]},
    }  # fmt: skip
    _, problems = app_problems(spec)
    paths = {p.path for p in problems if "spec.kafka.authentication" in p.message}
    assert paths == {"spec.pipeline.nodes[0].fromKafka.options", "spec.pipeline.nodes[1].toKafka.options"}, problems
