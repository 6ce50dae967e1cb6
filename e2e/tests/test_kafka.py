"""The real KRaft broker: bulk round trip, ordering per partition, and clean provisioning errors."""

from __future__ import annotations

import hashlib
import time

import pytest

from sluice.api.kafka_clients import KafkaClient, kafka_security, read_credentials
from sluice.api.kafka_spec import KafkaSpec
from sluice.pipelines.local import kafka as kafka_mod
from sluice.pipelines.local.kafka_io import consume_all, create_topic, end_offsets, produce
from sluice.testbed.common import ProvisionError
from sluice.testbed.kafka_security import scram_client_settings, scram_over_tls, write_kafka_pki

pytestmark = pytest.mark.kafka

N = 100_000


def test_100k_records_round_trip(kafka_bootstrap, new_topic):
    topic = new_topic(partitions=4)
    records = [
        (f"k{i % 97}".encode(), f"value-{i}-{hashlib.sha1(str(i).encode()).hexdigest()}".encode()) for i in range(N)
    ]
    assert produce(kafka_bootstrap, topic, records) == N
    assert sum(end_offsets(kafka_bootstrap, topic).values()) == N

    consumed = consume_all(kafka_bootstrap, topic, expected=N)

    assert len(consumed) == N
    assert sorted((r.key, r.value) for r in consumed) == sorted(records)
    # Same key -> same partition, in produce order.
    for key in (b"k0", b"k42"):
        sent = [v for k, v in records if k == key]
        got = sorted((r for r in consumed if r.key == key), key=lambda r: r.offset)
        assert {r.partition for r in got} == {got[0].partition}
        assert [r.value for r in got] == sent


def test_reading_to_the_end_of_transactionally_written_partitions(kafka_bootstrap, new_topic):
    """An exactly-once writer's last offset in a partition is a commit marker no consumer is given: reading
    "to the end offsets" ends there all the same, with the committed records and without the aborted ones."""
    from confluent_kafka import Producer

    topic = new_topic(partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-writer"})
    producer.init_transactions(30)
    for batch, commit in ((b"first", True), (b"aborted", False), (b"second", True)):
        producer.begin_transaction()
        for partition in (0, 1):
            producer.produce(topic, batch, partition=partition)
        producer.flush(30)
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)

    records = consume_all(kafka_bootstrap, topic, timeout_s=30)

    assert sorted((r.partition, r.value) for r in records) == [(p, v) for p in (0, 1) for v in (b"first", b"second")]


def test_reading_to_the_end_stops_before_an_open_transaction(kafka_bootstrap, new_topic):
    """The end of a read_committed reader is the last stable offset: the records before a transaction still
    open, at once; it moves past the transaction's records when it commits."""
    from confluent_kafka import Producer

    topic = new_topic(partitions=1)
    produce(kafka_bootstrap, topic, [b"committed"])
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "transactional.id": f"{topic}-writer"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"open")
    producer.flush(30)
    try:
        assert [r.value for r in consume_all(kafka_bootstrap, topic, timeout_s=10)] == [b"committed"]
        assert end_offsets(kafka_bootstrap, topic) == {0: 1}, "an open transaction's records are not visible yet"
    finally:
        producer.commit_transaction(30)
    assert end_offsets(kafka_bootstrap, topic) == {0: 3}, "visible at the commit (the record and its marker)"


def test_port_in_use_is_a_clear_error(kafka_broker, tmp_path):
    taken = kafka_broker.nodes[0]
    clash = kafka_mod.KafkaCluster(tmp_path, [kafka_mod.KafkaNode(1, taken.port, taken.controller_port)])
    with pytest.raises(ProvisionError, match=f"port {taken.port}.*in use"):
        clash.start()


def test_missing_java_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ProvisionError) as err:
        kafka_mod.java_binary()
    assert "'java' is not on PATH" in str(err.value)
    assert "openjdk" in str(err.value)
    assert "\n" not in str(err.value)


def test_server_properties_for_three_nodes(tmp_path):
    nodes = [kafka_mod.KafkaNode(i, 19000 + i, 19100 + i) for i in (1, 2, 3)]
    props = dict(line.split("=", 1) for line in kafka_mod.server_properties(nodes[1], nodes, tmp_path).splitlines())
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19101,2@127.0.0.1:19102,3@127.0.0.1:19103"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19002,CONTROLLER://127.0.0.1:19102"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["min.insync.replicas"] == "2"


def test_three_broker_cluster_survives_losing_a_broker(tmp_path):
    cluster = kafka_mod.KafkaCluster.on_free_ports(tmp_path / "kafka3", size=3)
    cluster.heap = "384m"
    try:
        cluster.start()
        create_topic(cluster.bootstrap, "replicated", partitions=3, replicas=3, config={"min.insync.replicas": "2"})
        records = [f"r{i}".encode() for i in range(3_000)]
        produce(cluster.bootstrap, "replicated", records)
        cluster.processes[2].stop()  # broker 3 goes away
        survivors = ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes[:2])
        produce(survivors, "replicated", [b"after"])
        assert sorted(r.value for r in consume_all(survivors, "replicated", expected=3_001)) == sorted(
            [*records, b"after"]
        )
    finally:
        cluster.stop()


def test_cluster_ids_never_look_like_options():
    ids = {kafka_mod.new_cluster_id() for _ in range(5_000)}
    assert len(ids) == 5_000
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def _errors_of(settings: dict, seconds: float = 10.0) -> list:
    """The errors a client with `settings` meets asking the cluster for its topics."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list = []
    admin = AdminClient({**settings, "error_cb": errors.append, "log_level": 0})
    try:
        admin.list_topics(timeout=seconds)
    except KafkaException as exc:
        errors.append(exc.args[0])
    admin.poll(1)  # serves error_cb, where librdkafka reports why it could not connect
    return errors


def test_scram_login_over_tls_reads_and_writes(kafka_broker, kafka_secured, new_topic):
    from confluent_kafka import Consumer, Producer

    topic = new_topic(partitions=1)
    login = {"bootstrap.servers": kafka_broker.secured_bootstrap, **scram_client_settings(kafka_secured, "sluice-app")}
    producer = Producer(login)
    for i in range(10):
        producer.produce(topic, f"secret-{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({**login, "group.id": f"{topic}-reader", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(values) < 10 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()

    assert values == [f"secret-{i}".encode() for i in range(10)]


def test_a_wrong_password_is_refused(kafka_broker, kafka_secured):
    from confluent_kafka import KafkaError

    settings = scram_client_settings(kafka_secured, "sluice-app", password="not-the-password")
    errors = _errors_of({"bootstrap.servers": kafka_broker.secured_bootstrap, **settings})

    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    assert "Authentication failed" in " ".join(e.str() for e in errors)


def test_an_unknown_user_and_a_plaintext_client_are_refused_on_the_secured_listener(kafka_broker, kafka_secured):
    from confluent_kafka import KafkaError

    settings = scram_client_settings(kafka_secured, "sluice-app") | {"sasl.username": "mallory"}
    unknown = _errors_of({"bootstrap.servers": kafka_broker.secured_bootstrap, **settings})
    plaintext = _errors_of({"bootstrap.servers": kafka_broker.secured_bootstrap}, seconds=5)

    assert any(e.code() == KafkaError._AUTHENTICATION for e in unknown), unknown
    assert plaintext and not any(e.code() == KafkaError.NO_ERROR for e in plaintext)


def test_a_broker_certificate_from_another_ca_is_refused(kafka_broker, kafka_secured, tmp_path):
    from confluent_kafka import KafkaError

    other_ca, _ = write_kafka_pki(tmp_path / "other", ["127.0.0.1"])
    settings = scram_client_settings(kafka_secured, "sluice-app") | {"ssl.ca.location": str(other_ca)}
    errors = _errors_of({"bootstrap.servers": kafka_broker.secured_bootstrap, **settings})

    assert any(e.code() == KafkaError._SSL for e in errors), errors
    assert "certificate verify failed" in " ".join(e.str() for e in errors)


def test_secured_server_properties_keep_plaintext_on_loopback(tmp_path):
    listener = kafka_mod.SecuredListener(tmp_path / "k.pem", tmp_path / "ca.pem", {"app": "pw"})
    node = kafka_mod.KafkaNode(1, 19001, 19101, 19201)
    props = dict(
        line.split("=", 1)
        for line in kafka_mod.server_properties(node, [node], tmp_path, "10.245.0.1", listener).splitlines()
    )

    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19001,SASL_SSL://10.245.0.1:19201,CONTROLLER://127.0.0.1:19101"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19001,SASL_SSL://10.245.0.1:19201"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert "pw" not in "".join(props.values()), "passwords live in the storage's SCRAM records, not the config"


def app_login(bootstrap: str, password: str, ca_pem: str) -> KafkaClient:
    """The login an app with SCRAM over TLS gets (sluice.api.kafka_clients), its Secrets' values given."""
    security, _ = kafka_security(KafkaSpec.model_validate(scram_over_tls(bootstrap, "sluice-app", "user", "ca")))
    values = {security.passwordFile: password, **dict.fromkeys(security.trustedCertificateFiles, ca_pem)}
    return KafkaClient(bootstrap, security, read_credentials(security, values.__getitem__))


def test_the_apps_login_manages_topics_and_writes_over_scram_and_tls(kafka_broker, kafka_secured, new_topic):
    from confluent_kafka import Producer

    from sluice.operator.topics import AdminTopics

    topic = new_topic(partitions=2)
    login = app_login(
        kafka_broker.secured_bootstrap, kafka_secured.users["sluice-app"], kafka_secured.truststore.read_text()
    )
    assert AdminTopics(login, timeout=15).existing([topic])[topic].partitions == 2
    producer = Producer(login.librdkafka())
    producer.produce(topic, b"through the app's login")
    assert producer.flush(30) == 0
    assert sum(end_offsets(kafka_broker.bootstrap, topic).values()) == 1


@pytest.mark.parametrize("wrong", ["password", "ca"])
def test_a_refused_login_names_the_field_that_gave_it(kafka_broker, kafka_secured, tmp_path, wrong):
    from sluice.operator.topics import AdminTopics, KafkaLoginRefused

    password, ca = kafka_secured.users["sluice-app"], kafka_secured.truststore.read_text()
    if wrong == "password":
        password = "not-the-password"
    else:
        ca = write_kafka_pki(tmp_path / "other", ["127.0.0.1"])[0].read_text()
    login = app_login(kafka_broker.secured_bootstrap, password, ca)
    with pytest.raises(KafkaLoginRefused) as refused:
        AdminTopics(login, timeout=10).existing(["any"])
    field = "spec.kafka.authentication" if wrong == "password" else "spec.kafka.tls"
    assert str(refused.value).startswith(f"{field}: Kafka at {kafka_broker.secured_bootstrap} refused the login: ")
    assert password not in str(refused.value)
