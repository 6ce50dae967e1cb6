"""Pure decisions of the operator: spec parsing, children, topics, status."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from pydantic import create_model

from sluice.api.contract import (
    REVISION_SPEC_FILE,
    RUNNER_CONFIG_FILE,
    DriverStatus,
    ExecutorStatus,
    QueryStatus,
    RunnerConfig,
)
from sluice.operator import children as ch
from sluice.operator import names
from sluice.operator import spark_application as sparkapp
from sluice.operator.autoscaler.plan import plan_scaling
from sluice.operator.desired import (
    Invalid,
    checkpoint_problem,
    desired_state,
    parse_spec,
    with_checkpoint_location,
)
from sluice.operator.driver_client import DriverUnavailable
from sluice.operator.model import CheckpointSpec, TopicSpec
from sluice.operator.observer import Observer, submitted_executors
from sluice.operator.settings import CheckpointStore, ClaimDefaults, Settings
from sluice.operator.status import (
    Observation,
    driver_failure,
    last_driver_failure,
    merge_conditions,
    phase_of,
    status_for,
    status_write_due,
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
    assert kinds == [
        "ServiceAccount",
        "RoleBinding",
        "ConfigMap",
        "ConfigMap",
        "Service",
        "NetworkPolicy",
        "NetworkPolicy",
        "PersistentVolumeClaim",
        "SparkApplication",
    ]
    spark = desired.children[-1]
    assert spark["spec"]["type"] == "Python"
    assert spark["spec"]["mainApplicationFile"] == names.RUNNER_FILE
    assert spark["spec"]["arguments"] == [f"{names.PIPELINE_MOUNT}/{RUNNER_CONFIG_FILE}"]
    assert spark["spec"]["executor"]["instances"] == raw_spec["executors"]["instances"]
    assert spark["spec"]["restartPolicy"]["type"] == "Always"
    configmap, runner = desired.children[2:4]
    driver = spark["spec"]["driver"]["template"]["spec"]
    assert sparkapp.pipeline_configmap_of(spark) == runner["metadata"]["name"] == "wc-runner"
    assert runner["data"] == {RUNNER_CONFIG_FILE: configmap["data"][RUNNER_CONFIG_FILE]}
    assert parse_spec(json.loads(configmap["data"][REVISION_SPEC_FILE])) == parse_spec(raw_spec), "the revision's spec"
    assert driver["containers"][0]["name"] == "spark-kubernetes-driver"  # the container Spark fills in
    mounts = driver["containers"][0]["volumeMounts"]
    assert {"name": "pipeline", "mountPath": names.PIPELINE_MOUNT, "readOnly": True} in mounts
    assert {"name": "control", "mountPath": names.CONTROL_TOKEN_MOUNT, "readOnly": True} in mounts
    assert {"name": "control", "secret": {"secretName": "wc-control"}} in driver["volumes"]
    claim = {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "wc-checkpoints"}}
    scratch = [{"name": name, "emptyDir": {}} for name in sparkapp.SCRATCH_VOLUMES]  # the root filesystem is read-only
    assert spark["spec"]["executor"]["template"]["spec"]["volumes"] == [claim, *scratch]  # executors write state
    config = RunnerConfig.model_validate_json(configmap["data"][RUNNER_CONFIG_FILE])
    assert config.pipeline.nodes[0].name == "lines"
    assert config.kafkaBootstrap == raw_spec["kafka"]["bootstrapServers"]
    assert (config.app, config.namespace, config.revision) == ("wc", "apps", desired.revision)
    assert config.controlTokenFile == f"{names.CONTROL_TOKEN_MOUNT}/{names.CONTROL_TOKEN_KEY}"
    assert config.checkpointRoot == "/checkpoints/wc"
    assert [t.name for t in desired.admin_topics] == [t["name"] for t in raw_spec["topics"]]


def test_network_policies_admit_the_control_port_from_driver_clients_and_executors_from_their_app(raw_spec):
    desired = desired_state("wc", "apps", parse_spec(raw_spec))
    driver, executor = (c for c in desired.children if c["kind"] == "NetworkPolicy")
    assert driver["spec"]["podSelector"]["matchLabels"] == {names.APP_LABEL: "wc", "spark-role": "driver"}
    executors, clients = driver["spec"]["ingress"]
    assert executors == {"from": [{"podSelector": {"matchLabels": {names.APP_LABEL: "wc", "spark-role": "executor"}}}]}
    assert clients["ports"] == [{"protocol": "TCP", "port": names.CONTROL_PORT}]
    assert clients["from"][0]["podSelector"]["matchLabels"] == {names.DRIVER_CLIENT_LABEL: "true"}
    assert executor["spec"]["podSelector"]["matchLabels"] == {names.APP_LABEL: "wc", "spark-role": "executor"}
    assert [p["podSelector"]["matchLabels"]["spark-role"] for p in executor["spec"]["ingress"][0]["from"]] == [
        "driver",
        "executor",
    ]
    # Spark 4.2's own executor policy needs RBAC spark-operator lacks: it is left out at submission.
    conf = desired.children[-1]["spec"]["sparkConf"]
    assert conf["spark.kubernetes.driver.pod.excludedFeatureSteps"] == names.SPARK_NETWORK_POLICY_STEP


def test_a_checkpoint_path_gets_a_claim_the_app_retains_by_default(raw_spec):
    claims = ClaimDefaults(size="5Gi", storage_class="fast")
    desired = desired_state("wc", "apps", parse_spec(raw_spec), claims=claims)
    claim = next(c for c in desired.children if c["kind"] == "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == "wc-checkpoints"
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "5Gi"}},
        "storageClassName": "fast",
    }
    assert not ch.owned_by_app(claim, desired.spec), "retained: not garbage-collected with the app"
    raw_spec["checkpoint"] = {"deletionPolicy": "delete", "size": "2Gi"}
    doomed = desired_state("wc", "apps", parse_spec(raw_spec), claims=claims)
    claim = next(c for c in doomed.children if c["kind"] == "PersistentVolumeClaim")
    assert ch.owned_by_app(claim, doomed.spec) and claim["spec"]["resources"]["requests"]["storage"] == "2Gi"


@pytest.mark.parametrize("checkpoint", [{"volumeClaim": "mine"}, {"location": "s3a://bucket/checkpoints"}])
def test_no_claim_is_made_for_an_own_claim_or_a_hadoop_uri(raw_spec, checkpoint):
    raw_spec["checkpoint"] = checkpoint
    spec = parse_spec(raw_spec)
    kinds = [c["kind"] for c in desired_state("wc", "apps", spec).children]
    assert "PersistentVolumeClaim" not in kinds
    assert checkpoint_problem(spec, ClaimDefaults(create=False), CheckpointStore()) is None


def test_a_pod_local_checkpoint_is_refused_when_no_claims_may_be_made(raw_spec):
    problem = checkpoint_problem(parse_spec(raw_spec), ClaimDefaults(create=False), CheckpointStore())
    assert problem is not None and problem.path == "spec.checkpoint" and "volumeClaim" in problem.message
    assert checkpoint_problem(parse_spec(raw_spec), ClaimDefaults(), CheckpointStore()) is None
    store = CheckpointStore("s3a://b/{namespace}")
    assert checkpoint_problem(parse_spec(raw_spec), ClaimDefaults(create=False), store) is None, "the store's"
    raw_spec["checkpoint"] = {"location": "/checkpoints"}
    assert checkpoint_problem(parse_spec(raw_spec), ClaimDefaults(create=False), store) is not None


def test_claims_no_executor_could_mount_are_refused(raw_spec):
    problem = checkpoint_problem(parse_spec(raw_spec), ClaimDefaults(access_mode="ReadWriteOncePod"), CheckpointStore())
    assert problem is not None and "ReadWriteOncePod" in problem.message and problem.path == "spec.checkpoint"


def test_settings_resolve_from_the_environment():
    settings = Settings.from_env(
        {
            "SLUICE_TICK_SECONDS": "2",
            "SLUICE_STATUS_FIGURES_SECONDS": "0",
            "SLUICE_CHECKPOINT_CLAIMS": "false",
            "SLUICE_CHECKPOINT_STORAGE_CLASS": "",
        }
    )
    assert settings.tick_seconds == 2.0 and settings.resync_seconds == 300.0
    assert settings.status_figures_seconds == 0.0 and Settings.from_env({}).status_figures_seconds == 30.0
    assert settings.checkpoints == ClaimDefaults(create=False, storage_class=None)


def test_control_secret_carries_the_token():
    secret = ch.control_secret("wc", "apps", "s3cret")
    assert secret["metadata"]["name"] == "wc-control"
    assert secret["stringData"] == {names.CONTROL_TOKEN_KEY: "s3cret"}


def test_shuffle_partitions_default_to_the_scaling_ceiling_unless_set(raw_spec):
    raw_spec["executors"] = {"instances": 1, "min": 1, "max": 6}
    raw_spec["spark"] = {"executor": {"cores": 2}}
    conf = desired_state("wc", "ns", parse_spec(raw_spec)).children[-1]["spec"]["sparkConf"]
    assert conf["spark.sql.shuffle.partitions"] == "12"
    assert conf["spark.dynamicAllocation.enabled"] == "false"
    assert conf["spark.driver.minMemoryOverhead"] == "1g", "the JVM's non-heap and the Python runner"
    assert conf["spark.executor.minMemoryOverhead"] == "768m", "Python workers beside the JVM"
    ui = ("spark.ui.retainedJobs", "spark.ui.retainedStages", "spark.sql.ui.retainedExecutions")
    assert [conf[key] for key in ui] == ["100"] * 3, "the last minutes of batches in the UI, not an hour's"
    raw_spec["spark"]["sparkConf"] = {"spark.sql.shuffle.partitions": "7", "spark.ui.retainedJobs": "500"}
    conf = desired_state("wc", "ns", parse_spec(raw_spec)).children[-1]["spec"]["sparkConf"]
    assert conf["spark.sql.shuffle.partitions"] == "7" and conf["spark.ui.retainedJobs"] == "500", "the app's own win"


def test_scaling_never_edits_the_submitted_executor_count(raw_spec):
    spec = parse_spec(raw_spec)
    running = desired_state("wc", "ns", spec).children[-1]
    scaled = copy.deepcopy(raw_spec)
    scaled["executors"]["instances"] = 3
    spec3 = parse_spec(scaled)
    rev = ch.revision(spec)
    kept = desired_state("wc", "ns", spec3, submitted_executors=submitted_executors(running, rev)).children[-1]
    assert kept["spec"] == running["spec"], "a SparkApplication spec change makes spark-operator resubmit"
    edited = copy.deepcopy(running)
    edited["spec"]["executor"]["instances"] = 9  # by hand: repaired to the recorded submission count
    repaired = desired_state("wc", "ns", spec3, submitted_executors=submitted_executors(edited, rev)).children[-1]
    assert repaired["spec"]["executor"]["instances"] == raw_spec["executors"]["instances"]
    assert plan_scaling(spec3, {}, None, 0.0).desired == 3  # the driver is asked instead
    changed = copy.deepcopy(scaled)
    changed["pipeline"]["nodes"][2]["filter"] = "word != 'the'"
    spec_new = parse_spec(changed)
    swapped = desired_state(
        "wc", "ns", spec_new, submitted_executors=submitted_executors(running, rev), pin=sparkapp.DriverPin(rev, rev)
    ).children[-1]
    assert swapped["spec"] == running["spec"], "a new pipeline alone (a hot swap) does not touch the driver's spec"
    restart = sparkapp.DriverPin(ch.revision(spec_new), ch.revision(spec_new))
    resubmitted = desired_state(
        "wc", "ns", spec_new, submitted_executors=submitted_executors(running, restart.submitted), pin=restart
    ).children[-1]
    assert resubmitted["spec"]["executor"]["instances"] == 3, "a resubmitted driver starts with today's count"
    assert resubmitted["spec"]["driver"]["annotations"][names.SUBMITTED_REVISION_ANNOTATION] == restart.submitted


def test_revision_follows_what_the_user_wrote(raw_spec):
    base = desired_state("wc", "ns", parse_spec(raw_spec)).revision
    scaled = copy.deepcopy(raw_spec)
    scaled["executors"]["instances"] = 3
    scaled["autoscaling"] = {"enabled": True}
    assert desired_state("wc", "ns", parse_spec(scaled)).revision == base
    changed = copy.deepcopy(raw_spec)
    changed["pipeline"]["nodes"][2]["filter"] = "word != 'the'"
    assert desired_state("wc", "ns", parse_spec(changed)).revision != base
    # Writing out a default changes nothing the driver runs: the same revision. "/checkpoints" was the location's
    # default before the operator's store: apps stored with it keep their revision across the upgrade.
    explicit = copy.deepcopy(raw_spec)
    explicit["checkpoint"] = {"location": "/checkpoints"}
    explicit["pipeline"]["trigger"] = raw_spec["pipeline"].get("trigger", {"processingTime": "1s"})
    assert desired_state("wc", "ns", parse_spec(explicit)).revision == base
    resolved = with_checkpoint_location(parse_spec(raw_spec), "ns", CheckpointStore(), None)
    assert desired_state("wc", "ns", resolved).revision == base


def test_revision_ignores_a_field_a_new_release_adds_with_a_default(raw_spec):
    spec = parse_spec(raw_spec)
    newer_checkpoint = create_model("NewerCheckpointSpec", __base__=CheckpointSpec, retention=(str, "7d"))
    upgraded = spec.model_copy(update={"checkpoint": newer_checkpoint(**spec.checkpoint.model_dump())})
    assert upgraded.checkpoint.retention == "7d"
    assert ch.revision(upgraded) == ch.revision(spec)
    written = spec.model_copy(update={"checkpoint": newer_checkpoint(retention="1d")})
    assert ch.revision(written) != ch.revision(spec), "a value the user writes is part of the revision"


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
    assert odd["apiVersion"] == names.KAFKA_TOPIC_API
    assert odd["metadata"]["labels"]["strimzi.io/cluster"] == "my-cluster"
    assert odd["spec"]["topicName"] == "Odd_Topic.Name"
    assert odd["metadata"]["name"].startswith("odd-topic.name-")


def test_topic_plan_creates_grows_configures_and_refuses_shrinking():
    desired = [
        TopicSpec(name="new", partitions=3),
        TopicSpec(name="grow", partitions=8),
        TopicSpec(name="shrink", partitions=1),
        TopicSpec(name="conf", config={"retention.ms": "1000"}),
    ]
    existing = {
        "grow": ExistingTopic(4, {}),
        "shrink": ExistingTopic(6, {}),
        "conf": ExistingTopic(1, {"retention.ms": "604800000"}),
    }
    plan = plan_topics(desired, existing)
    assert [t.name for t in plan.create] == ["new"]
    assert plan.grow == {"grow": 8}
    assert plan.configure == {"conf": {"retention.ms": "1000"}}
    assert "shrink" in plan.refused and "6 partitions" in plan.refused["shrink"]
    assert not plan_topics(desired[1:2], {"grow": ExistingTopic(8, {})}).changes


@pytest.mark.parametrize(
    ("obs", "phase"),
    [
        (Observation(valid=Invalid([])), "Invalid"),
        (Observation(suspended=True), "Suspended"),
        (Observation(spark_state="RUNNING"), "Running"),
        (Observation(spark_state="SUBMITTED"), "Submitted"),
        (Observation(spark_state="FAILED"), "Failed"),
        (Observation(), "Pending"),
    ],
)
def test_phase(obs, phase):
    assert phase_of(obs) == phase


def test_conditions_keep_transition_time_while_unchanged():
    old = [{"type": "Valid", "status": "True", "lastTransitionTime": "t0"}]
    kept = merge_conditions(old, [{"type": "Valid", "status": "True", "reason": "Valid", "message": ""}], "t1")
    flipped = merge_conditions(old, [{"type": "Valid", "status": "False", "reason": "X", "message": ""}], "t1")
    assert kept[0]["lastTransitionTime"] == "t0"
    assert flipped[0]["lastTransitionTime"] == "t1"


def driver_answer(**overrides) -> DriverStatus:
    values = {
        "app": "a",
        "revision": "r",
        "observedAt": "2026-11-22T10:00:00Z",
        "queries": [
            QueryStatus(name="counts", active=True, inputRowsPerSecond=100.0, topics=["lines"]),
            QueryStatus(name="counts-dead-letters", active=True, inputRowsPerSecond=98.0, topics=["lines"]),
            QueryStatus(name="other", active=True, inputRowsPerSecond=50.5, topics=["clicks"]),
        ],
        "backlog": 7,
        "executors": [ExecutorStatus(id="1"), ExecutorStatus(id="2"), ExecutorStatus(id="3")],
    }
    return DriverStatus(**{**values, **overrides})


def test_status_from_the_driver_counts_each_topic_once():
    status = status_for(
        Observation(spark_state="RUNNING", driver=driver_answer()),
        generation=4,
        revision="r",
        children=[],
        old_status={},
        now="t",
    )
    assert (status["phase"], status["executors"], status["lag"], status["inputRate"]) == ("Running", 3, 7, "150.5/s")
    assert status["observedAt"] == "2026-11-22T10:00:00Z"
    assert status["observedGeneration"] == 4
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True",
        "Valid": "True",
        "TopicsReady": "True",
        "DriverSubmitted": "True",
        "Running": "True",
    }
    assert {c["observedGeneration"] for c in status["conditions"]} == {4}


def ready_of(obs: Observation) -> dict[str, str]:
    status = status_for(obs, generation=2, revision="r", children=[], old_status={}, now="t", selector="s")
    assert status["conditions"][0]["type"] == "Ready"  # first: what kubectl wait and GitOps tools read
    assert all(c["reason"] and c["reason"][0].isupper() for c in status["conditions"]), status["conditions"]
    return status["conditions"][0]


@pytest.mark.parametrize(
    ("obs", "status", "reason"),
    [
        (Observation(spark_state="RUNNING", driver=driver_answer()), "True", "Processing"),
        (Observation(spark_state="RUNNING", driver=driver_answer(state="standby")), "False", "DriverNotProcessing"),
        (Observation(spark_state="RUNNING"), "False", "DriverNotProcessing"),
        (Observation(spark_state="SUBMITTED"), "False", "Submitted"),
        (Observation(), "Unknown", "Pending"),
        (Observation(spark_state="RUNNING", driver=driver_answer(), topics_error="Kafka down"), "False", "TopicError"),
        (Observation(kafka_error="spec.kafka.authentication: refused"), "False", "KafkaLoginFailed"),
        (Observation(valid=Invalid([])), "False", "InvalidSpec"),
        (Observation(suspended=True), "False", "Suspended"),
    ],
)  # fmt: skip
def test_ready_sums_up_the_conditions_and_says_which_holds_it(obs: Observation, status: str, reason: str) -> None:
    ready = ready_of(obs)
    assert (ready["status"], ready["reason"]) == (status, reason), ready


def test_the_status_names_the_executors_for_the_scale_subresource() -> None:
    status = status_for(Observation(), generation=1, revision=None, children=[], old_status={}, now="t", selector="x")
    assert status["selector"] == "x"
    assert names.executor_selector("wc") == "sluice.dev/app=wc,app.kubernetes.io/component=executor"
    assert set(names.labels("wc", "executor").items()) >= {
        ("sluice.dev/app", "wc"),
        ("app.kubernetes.io/component", "executor"),
    }


def test_a_stopped_driver_clears_its_figures():
    stale = {"lag": 9, "inputRate": "5.0/s", "observedAt": "earlier", "executors": 4}
    status = status_for(
        Observation(spark_state="SUBMITTED"), generation=1, revision="r", children=[], old_status=stale, now="t"
    )
    assert {k: status[k] for k in stale} == {"lag": None, "inputRate": None, "observedAt": None, "executors": None}
    suspended = status_for(
        Observation(suspended=True), generation=1, revision="r", children=[], old_status=stale, now="t"
    )
    assert suspended["executors"] == 0 and suspended["lag"] is None


def merge_patched(stored: object, patch: object) -> object:
    """RFC 7386: what the API server stores when `patch` is merge-patched onto `stored`."""
    if not isinstance(patch, dict):
        return patch
    result = dict(stored) if isinstance(stored, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patched(result.get(key), value)
    return result


def test_a_new_rollout_keeps_nothing_of_the_last_one_in_the_stored_status():
    """The last rollout's finishedAt, message and failure, and a checkpoint folder its plan named, are gone once
    a new rollout is written over it (a merge patch keeps what it does not name: a running rollout with a
    finishedAt reads as ended)."""
    last = {
        "fromRevision": "a",
        "toRevision": "b",
        "phase": "Complete",
        "finishedAt": "2026-11-29T15:00:00Z",
        "message": "checkpointMigration: migrate out",
        "lastDriverFailure": "OOMKilled",
        "fromCheckpoints": {"out": "out@a", "seen": "seen@a"},
    }
    stored = {"rollout": last, "checkpoints": {"out": "out@b", "seen": "seen@b"}}
    planned = {"fromRevision": "b", "toRevision": "c", "phase": "Draining", "fromCheckpoints": {"out": "out@b"}}

    def status_over(old_status: dict) -> dict:
        observation = Observation(spark_state="RUNNING", driver=driver_answer())
        rollout = {"rollout": planned, "checkpoints": {"out": "out@b"}}
        return status_for(observation, generation=5, revision="b", children=[], old_status=old_status, now="t",
                          rollout=rollout)  # fmt: skip

    written = merge_patched(stored, status_over(stored))
    assert isinstance(written, dict)
    assert written["rollout"] == planned
    assert written["checkpoints"] == {"out": "out@b"}
    again = status_over(written)
    assert not status_write_due(written, again, 60.0), "written once, the same rollout is not written again"


def running_status(at: str, **changes: object) -> dict:
    status = {
        "phase": "Running",
        "executors": 3,
        "lag": 7,
        "inputRate": "150.5/s",
        "observedAt": at,
        "autoscaler": {"desiredExecutors": 3, "backlog": 7, "ratePerExecutor": 50.0, "message": "hold at 3: ok"},
    }
    return {**status, **changes}


def test_a_running_apps_figures_alone_are_written_every_figures_seconds():
    stored = running_status("2026-11-22T10:00:00Z")
    fresher = running_status(
        "2026-11-22T10:00:25Z",
        lag=900,
        inputRate="99.0/s",
        autoscaler={"desiredExecutors": 3, "backlog": 900, "ratePerExecutor": 61.0, "message": "hold at 3: 9 s left"},
    )
    assert not status_write_due(stored, fresher, figures_every=30)
    assert status_write_due(stored, {**fresher, "observedAt": "2026-11-22T10:00:30Z"}, figures_every=30)
    assert status_write_due(stored, fresher, figures_every=0)
    assert not status_write_due(stored, dict(stored), figures_every=0)  # nothing changed: never a write


@pytest.mark.parametrize(
    "change",
    [
        {"phase": "Failed"},
        {"executors": 4},
        {"autoscaler": {"desiredExecutors": 4, "backlog": 7, "ratePerExecutor": 50.0, "message": None}},
        {"observedAt": None, "lag": None, "inputRate": None},  # the driver stopped: its figures go at once
        {"conditions": [{"type": "Running", "status": "False"}]},
    ],
    ids=["phase", "executors", "autoscaler-decision", "figures-cleared", "condition"],
)
def test_anything_but_the_figures_is_written_at_once(change):
    stored = running_status("2026-11-22T10:00:00Z")
    assert status_write_due(stored, running_status("2026-11-22T10:00:05Z", **change), figures_every=30)


def test_figures_appearing_or_an_unreadable_stored_time_are_written_at_once():
    fresh = running_status("2026-11-22T10:00:05Z")
    assert status_write_due(running_status(None, lag=None, inputRate=None), fresh, figures_every=30)
    assert status_write_due(running_status("yesterday"), fresh, figures_every=30)
    assert status_write_due(running_status("2026-11-22T10:01:00Z"), fresh, figures_every=30)  # a clock behind


def test_nones_compare_as_the_merge_patch_stored_them():
    """A None in the status deletes its key when written: stored without it, the next pass is no change."""
    decided = {"desiredExecutors": 3, "lastDecision": None, "backlog": 7, "ratePerExecutor": None, "message": "m"}
    stored = running_status("2026-11-22T10:00:00Z", autoscaler={"desiredExecutors": 3, "backlog": 7, "message": "m"})
    stored.pop("lag")
    assert not status_write_due(stored, running_status("2026-11-22T10:00:00Z", lag=None, autoscaler=decided), 30)
    assert not status_write_due(stored, running_status("2026-11-22T10:00:05Z", autoscaler=decided), 30)


def test_manual_scaling_asks_for_the_spec_count(raw_spec):
    raw_spec["executors"] = {"instances": 2, "min": 1, "max": 3}
    plan = plan_scaling(parse_spec(raw_spec), {}, driver_answer(), 100.0)
    assert plan.desired == 2
    assert plan.status == {"desiredExecutors": 2, "scaling": "manual", "autoscaler": None}
    raw_spec["suspend"] = True
    assert plan_scaling(parse_spec(raw_spec), {}, None, 100.0).desired is None


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


def test_driver_and_executor_pods_meet_pod_security_restricted(raw_spec):
    raw_spec = copy.deepcopy(raw_spec)
    raw_spec.setdefault("spark", {})["pod"] = {"runAsUser": 1000, "fsGroup": 2000}
    spark = desired_state("wc", "apps", parse_spec(raw_spec)).children[-1]
    for role in ("driver", "executor"):
        pod = spark["spec"][role]["template"]["spec"]
        assert pod["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "fsGroup": 2000,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/tmp", "/opt/spark/work-dir"}
    default = desired_state("wc", "apps", parse_spec({**raw_spec, "spark": {}})).children[-1]
    assert default["spec"]["driver"]["template"]["spec"]["securityContext"]["runAsUser"] == 185
    raw_spec["spark"]["pod"] = {"readOnlyRootFilesystem": False}
    writable = desired_state("wc", "apps", parse_spec(raw_spec)).children[-1]["spec"]["executor"]["template"]["spec"]
    assert writable["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False
    assert not [v for v in writable.get("volumes", []) if v["name"] in sparkapp.SCRATCH_VOLUMES]


SCHEDULING = {
    "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}],
    "priorityClassName": "streaming",
    "imagePullSecrets": ["registry-login"],
    "envFrom": [{"secretRef": {"name": "app-secrets"}}, {"configMapRef": {"name": "app-settings"}, "prefix": "APP_"}],
    "volumes": [{"name": "certs", "secret": {"secretName": "app-certs"}}, {"name": "scratch", "emptyDir": {}}],
    "volumeMounts": [
        {"name": "certs", "mountPath": "/etc/certs", "readOnly": True},
        {"name": "scratch", "mountPath": "/x"},
    ],
}


def test_pod_scheduling_env_sources_and_volumes_reach_both_pods_through_templates(raw_spec):
    raw_spec = copy.deepcopy(raw_spec)
    raw_spec.setdefault("spark", {})["pod"] = copy.deepcopy(SCHEDULING)
    raw_spec["checkpoint"] = {"location": "s3a://bucket/apps"}  # no claim: the pods go where they may
    spark = desired_state("wc", "apps", parse_spec(raw_spec)).children[-1]
    for role in ("driver", "executor"):
        pod = spark["spec"][role]["template"]["spec"]
        container = pod["containers"][0]
        for key in ("tolerations", "affinity", "topologySpreadConstraints", "priorityClassName"):
            assert pod[key] == SCHEDULING[key], key
        assert pod["imagePullSecrets"] == [{"name": "registry-login"}]
        assert container["envFrom"] == SCHEDULING["envFrom"]
        assert SCHEDULING["volumes"] == [v for v in pod["volumes"] if v["name"] in ("certs", "scratch")]
        assert SCHEDULING["volumeMounts"] == [m for m in container["volumeMounts"] if m["name"] in ("certs", "scratch")]


@pytest.mark.parametrize(
    ("pod", "problem"),
    [
        ({"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}, "spec.spark.pod.volumes[0]: "),
        ({"volumes": [{"name": "checkpoints", "emptyDir": {}}]}, "is the pods' own"),
        ({"volumes": [{"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}]}, "exactly one source"),
        ({"volumeMounts": [{"name": "nowhere", "mountPath": "/x"}]}, "volumeMounts[0]: no volume named 'nowhere'"),
        ({"envFrom": [{"secretRef": {"name": "a"}, "configMapRef": {"name": "b"}}]}, "spec.spark.pod.envFrom[0]"),
        ({"affinity": {"nodeAffinty": {}}}, "unknown affinity nodeAffinty"),
        ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "[0] needs topologyKey, whenUnsatisfiable"),
        ({"imagePullSecrets": ["Not_A_Name"]}, "spec.spark.pod.imagePullSecrets[0]"),
    ],
)
def test_pod_settings_that_kubernetes_or_restricted_would_refuse_are_invalid_by_field(raw_spec, pod, problem):
    raw_spec = copy.deepcopy(raw_spec)
    raw_spec.setdefault("spark", {})["pod"] = pod
    invalid = parse_spec(raw_spec)
    assert isinstance(invalid, Invalid)
    assert problem in invalid.message, invalid.message


def test_a_root_uid_for_spark_pods_is_refused_by_field(raw_spec):
    raw_spec = copy.deepcopy(raw_spec)
    raw_spec.setdefault("spark", {})["pod"] = {"runAsUser": 0}
    invalid = parse_spec(raw_spec)
    assert isinstance(invalid, Invalid)
    assert "spec.spark.pod.runAsUser: " in invalid.message, invalid.message


# ------------------------------------------------------------------------------------- driver failures

status_args = {"generation": 1, "revision": "r", "children": [], "now": "t"}
START_ERROR = "failed at start: spec.pipeline.nodes[2].filter: [UNRESOLVED_COLUMN.WITH_SUGGESTION] wrd"


def driver_pod(**driver: dict) -> dict:
    sidecar = {"name": "sidecar", "state": {"terminated": {"exitCode": 1, "message": "not the driver"}}}
    return {"status": {"containerStatuses": [sidecar, {"name": "spark-kubernetes-driver", **driver}]}}


def test_the_driver_failure_is_its_containers_termination_message():
    terminated = {"terminated": {"exitCode": 2, "reason": "Error", "message": START_ERROR + "\n"}}
    assert driver_failure(driver_pod(state=terminated)) == f"driver {START_ERROR}"
    restarted = driver_pod(state={"running": {}}, lastState=terminated)
    assert driver_failure(restarted) == f"driver {START_ERROR}"
    other = {"terminated": {"exitCode": 137, "message": "killed\n  by the OOM killer"}}
    assert driver_failure(driver_pod(state=other)) == "driver terminated: killed by the OOM killer"
    assert driver_failure(driver_pod(state={"terminated": {"exitCode": 1, "reason": "Error"}})) is None
    assert driver_failure(driver_pod(state={"running": {}})) is None
    assert driver_failure({"status": {}}) is None and driver_failure(None) is None


def test_a_driver_failure_lands_in_the_status_message_and_running_condition():
    failure = f"driver {START_ERROR}"
    status = status_for(
        Observation(
            spark_state="FAILED", spark_error="driver container failed with ExitCode: 2", driver_failure=failure
        ),
        generation=1,
        revision="r",
        children=[],
        old_status={},
        now="t",
    )
    assert status["phase"] == "Failed"
    assert status["message"] == failure
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert (running["status"], running["reason"], running["message"]) == ("False", "DriverFailed", failure)
    assert status_for(Observation(spark_state="RUNNING"), old_status={}, **status_args)["message"] is None


def test_a_driver_failure_stands_while_no_driver_answers_the_same_revision():
    failed = status_for(
        Observation(spark_state="FAILED", driver_failure=f"driver {START_ERROR}"), old_status={}, **status_args
    )
    assert last_driver_failure(failed, "r") == f"driver {START_ERROR}"  # its pod deleted, the next one starting
    assert last_driver_failure(failed, "r2") is None  # a new revision: the old error is not its
    assert last_driver_failure(failed, None) is None
    running = status_for(Observation(spark_state="RUNNING"), old_status=failed, **status_args)
    assert last_driver_failure(running, "r") is None


class _Cluster:
    """What the observer reads: the driver pod, and the driver's answer (here: none)."""

    def __init__(self, pod: dict) -> None:
        self.pod = pod

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict:
        assert (kind, name) == ("Pod", "app-driver")
        return self.pod

    def address(self, ip: str, port: int) -> str:
        return f"http://{ip}:{port}"

    def status(self, address: str) -> DriverStatus:
        raise DriverUnavailable("connection refused")


@pytest.mark.parametrize("state", ["FAILED", "FAILING", "RUNNING"])
def test_observing_a_driver_that_does_not_answer_reads_its_pod(state):
    pod = driver_pod(state={"terminated": {"exitCode": 2, "message": START_ERROR}})
    pod["status"]["podIP"] = "10.0.0.9"
    spark_app = {"status": {"applicationState": {"state": state}, "driverInfo": {"podName": "app-driver"}}}
    obs = Observation()
    cluster = _Cluster(pod)
    Observer(cluster, cluster).app_driver(spark_app, "ns", obs)  # type: ignore[arg-type]
    assert (obs.spark_state, obs.driver, obs.driver_failure) == (state, None, f"driver {START_ERROR}")
