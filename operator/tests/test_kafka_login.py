"""The app's Kafka login as the operator makes it (fakes at the reconciler's I/O seam, fakes.py): the driver mounts
the Secrets spec.kafka names and is told only where they are; a Secret that is missing makes nothing and names
the field; a new login is a new driver. Against a real broker and real pods: the e2e's secured_kafka step."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

from fakes import NAMESPACE, FakeKube, app_manifest, reconcile

from sluice.api.contract import RUNNER_CONFIG_FILE, RunnerConfig
from sluice.api.kafka_clients import KAFKA_SECRETS_MOUNT
from sluice.api.rollout import choose_strategy, classify
from sluice.operator import names
from sluice.operator.model import StreamingAppSpec
from sluice.testbed.kafka_security import scram_over_tls

PASSWORD = "s3cr3t-Pa55word"
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def secured(app: dict[str, Any]) -> dict[str, Any]:
    app["spec"]["kafka"] = scram_over_tls("kafka:9094", "wordcount", "wordcount-user", "kafka-ca")
    return app


def put_secret(kube: FakeKube, name: str, **data: str) -> None:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    kube.objects[("Secret", NAMESPACE, name)] = {"metadata": {"name": name, "namespace": NAMESPACE}, "data": encoded}


def test_a_missing_secret_makes_nothing_and_names_the_field(world) -> None:
    reconciler, kube, _ = world
    put_secret(kube, "kafka-ca", **{"ca.crt": CA})
    app = reconcile(reconciler, secured(app_manifest("word != ''")), clock=1000.0)
    made = {key for key in kube.objects if key[0] != "StreamingApp"}
    assert made == {("Secret", NAMESPACE, "kafka-ca")}, sorted(kube.objects)
    topics = next(c for c in app["status"]["conditions"] if c["type"] == "TopicsReady")
    assert topics["status"] == "False" and topics["reason"] == "KafkaLoginFailed", topics
    assert topics["message"] == "spec.kafka.authentication.passwordSecret: no Secret wordcount-user in namespace " + (
        NAMESPACE
    )
    assert app["status"]["children"] == []

    put_secret(kube, "wordcount-user", other="x")  # the Secret, without the key named
    app = reconcile(reconciler, app, clock=1010.0)
    assert "Secret wordcount-user has no key password" in app["status"]["message"]
    assert ("SparkApplication", NAMESPACE, app["metadata"]["name"]) not in kube.objects


def test_the_driver_mounts_the_secrets_and_no_object_holds_the_password(world) -> None:
    reconciler, kube, _ = world
    put_secret(kube, "kafka-ca", **{"ca.crt": CA, "ca.key": "not for the driver"})
    put_secret(kube, "wordcount-user", password=PASSWORD)
    app = reconcile(reconciler, secured(app_manifest("word != ''")), clock=1000.0)
    name = app["metadata"]["name"]
    spark = kube.objects[("SparkApplication", NAMESPACE, name)]
    pod = spark["spec"]["driver"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["sluice-kafka-0"]["secret"] == {
        "secretName": "kafka-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert volumes["sluice-kafka-1"]["secret"]["secretName"] == "wordcount-user"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["sluice-kafka-1"] == f"{KAFKA_SECRETS_MOUNT}/wordcount-user"
    executor = spark["spec"]["executor"]["template"]["spec"]
    assert not [
        v for v in executor.get("volumes", []) if v["name"].startswith("sluice-kafka-")
    ]  # the login goes inline
    runner = RunnerConfig.model_validate_json(
        kube.objects[("ConfigMap", NAMESPACE, names.runner_configmap_name(name))]["data"][RUNNER_CONFIG_FILE]
    )
    assert runner.kafkaSecurity.protocol == "SASL_SSL" and runner.kafkaSecurity.username == "wordcount"
    assert runner.kafkaSecurity.passwordFile == f"{KAFKA_SECRETS_MOUNT}/wordcount-user/password"
    assert spark["spec"]["sparkConf"]["spark.sql.redaction.options.regex"].count("jaas")
    written = json.dumps([obj for key, obj in kube.objects.items() if key[0] != "Secret"]) + json.dumps(app)
    assert PASSWORD not in written and base64.b64encode(PASSWORD.encode()).decode() not in written


def test_a_new_login_is_a_new_driver_on_the_same_checkpoints() -> None:
    old = secured(app_manifest("word != ''"))["spec"]
    new = copy.deepcopy(old)
    new["kafka"]["authentication"]["passwordSecret"]["secretName"] = "wordcount-user-2"
    diff = classify(StreamingAppSpec.model_validate(old), StreamingAppSpec.model_validate(new))
    assert [r.path for r in diff.runtime] == ["spec.kafka.authentication"] and not diff.changed
    assert choose_strategy("auto", diff) == "fencedHandover"


def test_a_strimzi_listener_address_comes_from_the_kafka_status(world) -> None:
    reconciler, kube, _ = world
    app = app_manifest("word != ''")
    app["spec"]["kafka"] = {"strimziCluster": {"name": "events", "listener": "scram"}, "tls": {}}
    put_secret(kube, "events-cluster-ca-cert", **{"ca.crt": CA})  # the cluster CA: tls {} trusts it
    kube.objects[("Kafka", NAMESPACE, "events")] = {
        "metadata": {"name": "events", "namespace": NAMESPACE},
        "status": {"listeners": [{"name": "scram", "bootstrapServers": "events-kafka-bootstrap.apps.svc:9096"}]},
    }
    reconcile(reconciler, app, clock=1000.0)
    runner = RunnerConfig.model_validate_json(
        kube.objects[("ConfigMap", NAMESPACE, names.runner_configmap_name(app["metadata"]["name"]))]["data"][
            RUNNER_CONFIG_FILE
        ]
    )
    assert runner.kafkaBootstrap == "events-kafka-bootstrap.apps.svc:9096"  # not the usual port of a listener
    assert runner.kafkaSecurity.protocol == "SSL"
    assert runner.kafkaSecurity.trustedCertificateFiles == [f"{KAFKA_SECRETS_MOUNT}/events-cluster-ca-cert/ca.crt"]
