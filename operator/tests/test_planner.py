"""Pure decisions of the operator: spec parsing, children, topics, status."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from sluice.operator import children as ch
from sluice.operator.model import TopicSpec
from sluice.operator.planner import (
    Invalid,
    Observation,
    desired_state,
    merge_conditions,
    parse_driver_metrics,
    parse_spec,
    phase_of,
    status_for,
)
from sluice.operator.topics import ExistingTopic, plan_topics

EXAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "wordcount.yaml"


@pytest.fixture
def raw_spec() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())["spec"]


def test_invalid_spec_lists_every_problem_with_paths(raw_spec):
    raw_spec["executors"] = {"min": 5, "max": 2}
    raw_spec["pipeline"]["nodes"][1]["inputs"] = ["lnes"]
    raw_spec["kafka"] = {}
    result = parse_spec(raw_spec)
    assert isinstance(result, Invalid)
    text = result.message
    assert "spec.executors: min (5) must not exceed max (2)" in text
    assert "spec.pipeline.nodes[1].inputs[0]: unknown node 'lnes'" in text
    assert "spec.kafka: set exactly one of 'bootstrapServers' or 'strimziCluster'" in text


def test_children_of_an_app(raw_spec):
    desired = desired_state("wc", "apps", parse_spec(raw_spec))
    kinds = [c["kind"] for c in desired.children]
    assert kinds == ["ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "SparkApplication"]
    spark = desired.children[-1]
    assert spark["spec"]["type"] == "Python"
    assert spark["spec"]["mainApplicationFile"] == ch.RUNNER_FILE
    assert spark["spec"]["executor"]["instances"] == raw_spec["executors"]["instances"]
    assert spark["spec"]["restartPolicy"]["type"] == "Always"
    configmap = desired.children[3]
    driver = spark["spec"]["driver"]["template"]["spec"]
    assert ch.pipeline_configmap_of(spark) == configmap["metadata"]["name"]
    assert driver["containers"][0]["name"] == "spark-kubernetes-driver"  # the container Spark fills in
    assert {"name": "pipeline", "mountPath": ch.PIPELINE_MOUNT, "readOnly": True} in driver["containers"][0][
        "volumeMounts"]
    assert "volumes" not in spark["spec"]["executor"]["template"]["spec"]  # no checkpoint claim: nothing to mount
    runner_manifest = yaml.safe_load(configmap["data"]["app.yaml"])
    assert runner_manifest["spec"]["pipeline"]["nodes"][0]["name"] == "lines"
    assert runner_manifest["spec"]["kafka"]["bootstrapServers"] == raw_spec["kafka"]["bootstrapServers"]
    assert [t.name for t in desired.admin_topics] == [t["name"] for t in raw_spec["topics"]]


def test_revision_follows_the_pipeline_not_the_scale(raw_spec):
    base = desired_state("wc", "ns", parse_spec(raw_spec)).revision
    scaled = copy.deepcopy(raw_spec)
    scaled["executors"]["instances"] = 3
    assert desired_state("wc", "ns", parse_spec(scaled)).revision == base
    changed = copy.deepcopy(raw_spec)
    changed["pipeline"]["nodes"][2]["filter"] = "word != 'the'"
    assert desired_state("wc", "ns", parse_spec(changed)).revision != base


def test_suspend_drops_only_the_driver(raw_spec):
    raw_spec["suspend"] = True
    desired = desired_state("wc", "ns", parse_spec(raw_spec))
    assert "SparkApplication" not in [c["kind"] for c in desired.children]
    assert desired.admin_topics


def test_strimzi_topics_become_kafkatopics(raw_spec):
    raw_spec["kafka"] = {"strimziCluster": {"name": "my-cluster"}}
    raw_spec["topics"].append({"name": "Odd_Topic.Name", "partitions": 2})
    desired = desired_state("wc", "ns", parse_spec(raw_spec))
    assert desired.bootstrap == "my-cluster-kafka-bootstrap.ns.svc:9092"
    assert not desired.admin_topics
    odd = desired.strimzi_topics[-1]
    assert odd["apiVersion"] == ch.KAFKA_TOPIC_API
    assert odd["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
    assert odd["spec"]["topicName"] == "Odd_Topic.Name"
    assert odd["metadata"]["name"].startswith("odd-topic.name-")


def test_topic_plan_creates_grows_configures_and_refuses_shrinking():
    desired = [TopicSpec(name="new", partitions=3), TopicSpec(name="grow", partitions=8),
               TopicSpec(name="shrink", partitions=1), TopicSpec(name="conf", config={"retention.ms": "1000"})]
    existing = {"grow": ExistingTopic(4, {}), "shrink": ExistingTopic(6, {}),
                "conf": ExistingTopic(1, {"retention.ms": "604800000"})}
    plan = plan_topics(desired, existing)
    assert [t.name for t in plan.create] == ["new"]
    assert plan.grow == {"grow": 8}
    assert plan.configure == {"conf": {"retention.ms": "1000"}}
    assert "shrink" in plan.refused and "6 partitions" in plan.refused["shrink"]
    assert not plan_topics(desired[1:2], {"grow": ExistingTopic(8, {})}).changes


@pytest.mark.parametrize(("obs", "phase"), [
    (Observation(valid=Invalid([])), "Invalid"),
    (Observation(suspended=True), "Suspended"),
    (Observation(spark_state="RUNNING"), "Running"),
    (Observation(spark_state="SUBMITTED"), "Submitted"),
    (Observation(spark_state="FAILED"), "Failed"),
    (Observation(), "Pending"),
])
def test_phase(obs, phase):
    assert phase_of(obs) == phase


def test_conditions_keep_transition_time_while_unchanged():
    old = [{"type": "Valid", "status": "True", "lastTransitionTime": "t0"}]
    kept = merge_conditions(old, [{"type": "Valid", "status": "True", "reason": "Valid", "message": ""}], "t1")
    flipped = merge_conditions(old, [{"type": "Valid", "status": "False", "reason": "X", "message": ""}], "t1")
    assert kept[0]["lastTransitionTime"] == "t0"
    assert flipped[0]["lastTransitionTime"] == "t1"


def test_status_from_driver_metrics():
    text = ('sluice_input_rows_per_second{app="a",query="q1"} 100.0\n'
            'sluice_input_rows_per_second{app="a",query="q2"} 50.5\n'
            'sluice_kafka_records_behind_latest{app="a",query="q1",source="t",stat="max"} 7.0\n'
            'sluice_kafka_records_behind_latest{app="a",query="q1",source="t",stat="avg"} 3.0\n'
            'sluice_executors{app="a"} 3.0\n')
    metrics = parse_driver_metrics(text)
    assert metrics == {"input_rate": 150.5, "lag": 7.0, "executors": 3.0}
    status = status_for(Observation(spark_state="RUNNING", driver_metrics=metrics), generation=4, revision="r",
                        requested_executors=2, children=[], old_status={}, now="t")
    assert (status["phase"], status["executors"], status["lag"], status["inputRate"]) == ("Running", 3, 7, "150.5/s")
    assert status["observedGeneration"] == 4
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Valid": "True", "TopicsReady": "True", "DriverSubmitted": "True", "Running": "True"}


def test_checkpoint_claim_and_env_reach_both_pods_through_templates(raw_spec):
    raw_spec = copy.deepcopy(raw_spec)
    raw_spec["checkpoint"] = {"location": "/checkpoints", "volumeClaim": "wc-checkpoints"}
    raw_spec.setdefault("spark", {})["pod"] = {"env": {"TZ": "UTC"}}
    spark = desired_state("wc", "apps", parse_spec(raw_spec)).children[-1]
    for role in ("driver", "executor"):
        pod = spark["spec"][role]["template"]["spec"]
        container = pod["containers"][0]
        assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "wc-checkpoints"}} in pod["volumes"]
        assert {"name": "checkpoints", "mountPath": "/checkpoints"} in container["volumeMounts"]
        assert container["env"] == [{"name": "TZ", "value": "UTC"}]
    assert "volumes" not in spark["spec"], "volumes outside the templates need spark-operator's webhook"
