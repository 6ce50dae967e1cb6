"""The operator for real: a kube-apiserver with the CRDs, the operator as a process, a Kafka broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cluster_helpers import example, wait_for

from sluice.api.contract import REVISION_SPEC_FILE, RUNNER_CONFIG_FILE, RunnerConfig, revision_configmap_name
from sluice.operator import names
from sluice.operator import spark_application as sparkapp
from sluice.pipelines.local.kafka_io import create_topic
from sluice.testbed.kube import kubernetes_binaries

pytestmark = [pytest.mark.kube, pytest.mark.kafka]

EXAMPLE_NAMES = ["wordcount", "frequency-count", "latency-correlation", "adtech"]


def get(cluster, kind: str, name: str, namespace: str) -> dict | None:
    result = cluster.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def apply(cluster, manifest: dict, namespace: str, check: bool = True):
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=check)


def sluice_plan(cluster, manifest: dict, namespace: str, tmp_path: Path) -> tuple[int, dict]:
    """`sluice plan` as a user runs it against the cluster (kubectl on PATH, the cluster's kubeconfig): its exit
    code and its JSON plan."""
    kubectl = kubernetes_binaries("kubectl")["kubectl"]
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(manifest))
    env = {**os.environ, "PATH": f"{kubectl.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.cli", "plan", str(changed), "-n", namespace, "-o", "json",
         f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    (plan,) = json.loads(result.stdout)
    return result.returncode, plan


def condition(app: dict | None, kind: str) -> dict:
    return next((c for c in ((app or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), {})


def topic_partitions(bootstrap: str, topic: str) -> int | None:
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    return len(topics[topic].partitions) if topic in topics else None


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_gets_its_children_and_loses_them_on_delete(
    name, operator_process, kube_cluster, namespace, kafka_bootstrap
):
    manifest = example(name, kafka_bootstrap, namespace)
    apply(kube_cluster, manifest, namespace)

    spark = wait_for(lambda: get(kube_cluster, "sparkapplication", name, namespace), what="SparkApplication")
    assert spark["spec"]["type"] == "Python"
    assert spark["spec"]["executor"]["instances"] == manifest["spec"].get("executors", {}).get("instances", 1)
    owner = spark["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("StreamingApp", name, True)
    configmap_name = sparkapp.pipeline_configmap_of(spark)
    configmap = get(kube_cluster, "configmap", configmap_name, namespace)
    shipped = RunnerConfig.model_validate_json(configmap["data"][RUNNER_CONFIG_FILE])
    assert [n.name for n in shipped.pipeline.nodes] == [n["name"] for n in manifest["spec"]["pipeline"]["nodes"]]
    assert shipped.kafkaBootstrap == kafka_bootstrap
    for kind, child in (
        ("service", f"{name}-driver"),
        ("serviceaccount", f"{name}-spark"),
        ("rolebinding", f"{name}-spark"),  # to the chart's driver ClusterRole
        ("networkpolicy", f"{name}-driver"),
        ("networkpolicy", f"{name}-executor"),
        ("secret", f"{name}-control"),
    ):
        assert get(kube_cluster, kind, child, namespace), f"{kind}/{child} missing"
    app = wait_for(
        lambda: (a := get(kube_cluster, "sapp", name, namespace)) and a.get("status", {}).get("phase") and a,
        what="status",
    )
    assert condition(app, "Valid")["status"] == "True"
    assert condition(app, "TopicsReady")["status"] == "True", condition(app, "TopicsReady")
    for topic in manifest["spec"]["topics"]:
        assert topic_partitions(kafka_bootstrap, topic["name"]) == topic.get("partitions", 1)

    kube_cluster.kubectl("delete", "sapp", name, "-n", namespace)
    wait_for(
        lambda: (
            get(kube_cluster, "sparkapplication", name, namespace) is None
            and get(kube_cluster, "configmap", configmap_name, namespace) is None
        ),
        timeout=60,
        what="garbage collection of the children",
    )
    assert all(topic_partitions(kafka_bootstrap, t["name"]) for t in manifest["spec"]["topics"]), (
        "topics with deletionPolicy retain must outlive the app"
    )
    claim = get(kube_cluster, "pvc", f"{name}-checkpoints", namespace)
    assert claim is not None and not claim["metadata"].get("ownerReferences"), (
        "the checkpoint claim (deletionPolicy retain) must outlive the app"
    )


def test_update_makes_a_new_revision_without_resubmitting_and_drift_is_repaired(
    operator_process, kube_cluster, namespace, kafka_bootstrap
):
    """No driver runs here (no spark-operator): a pipeline change is adopted for the next driver to start, and
    the SparkApplication is left alone (spark-operator would resubmit on any change of its spec)."""
    manifest = example("wordcount", kafka_bootstrap, namespace)
    apply(kube_cluster, manifest, namespace)
    first = wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="driver")
    runner_cm = sparkapp.pipeline_configmap_of(first)
    assert runner_cm == names.runner_configmap_name("wordcount")
    old = wait_for(
        lambda: (a := get(kube_cluster, "sapp", "wordcount", namespace)).get("status", {}).get("stableRevision") and a,
        what="the first stable revision",
    )["status"]["stableRevision"]

    manifest["spec"]["pipeline"]["nodes"][2]["filter"] = "word != '' AND length(word) > 2"
    manifest["spec"]["executors"]["instances"] = 3
    apply(kube_cluster, manifest, namespace)

    def runs_new_revision():
        config = RunnerConfig.model_validate_json(
            get(kube_cluster, "configmap", runner_cm, namespace)["data"][RUNNER_CONFIG_FILE]
        )
        return config.revision != old and config

    config = wait_for(runs_new_revision, what="the runner ConfigMap on the new revision")
    assert "length(word) > 2" in config.pipeline.model_dump_json()
    kept = get(kube_cluster, "configmap", revision_configmap_name("wordcount", config.revision), namespace)
    assert "length(word) > 2" in kept["data"][REVISION_SPEC_FILE], "a revision keeps its spec (the diff base)"
    app = wait_for(
        lambda: (
            (a := get(kube_cluster, "sapp", "wordcount", namespace))["status"].get("stableRevision") == config.revision
            and a
        ),
        what="status.stableRevision",
    )
    status = app["status"]
    assert status["revision"] == config.revision and status["observedGeneration"] == app["metadata"]["generation"]
    assert (status["rollout"]["strategy"], status["rollout"]["phase"]) == ("restart", "Complete")
    # Submitted, not answering (no spark-operator here): a driver is starting, restarted if it read revision `old`.
    assert "a driver is starting: it runs this revision" in status["rollout"]["message"]
    assert condition(app, "Rollout")["status"] == "True"
    spark = get(kube_cluster, "sparkapplication", "wordcount", namespace)
    assert spark["spec"] == first["spec"], f"no resubmission (executors go live, the pipeline by ConfigMap): {status}"

    # Drift: a child deleted by hand comes back; a field edited by hand is restored.
    kube_cluster.kubectl("delete", "configmap", runner_cm, "-n", namespace)
    kube_cluster.kubectl(
        "patch",
        "sparkapplication",
        "wordcount",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"executor": {"instances": 9}}}),
    )
    restored = wait_for(lambda: get(kube_cluster, "configmap", runner_cm, namespace), timeout=30, what="ConfigMap")
    assert RunnerConfig.model_validate_json(restored["data"][RUNNER_CONFIG_FILE]).revision == config.revision
    wait_for(
        lambda: (
            get(kube_cluster, "sparkapplication", "wordcount", namespace)["spec"]["executor"]["instances"]
            == first["spec"]["executor"]["instances"]
        ),
        timeout=30,
        what="executor instances restored",
    )


def test_a_strategy_that_cannot_roll_out_the_change_is_refused_and_nothing_changes(
    operator_process, kube_cluster, namespace, kafka_bootstrap, tmp_path
):
    """`sluice plan` against the cluster said so before: the same refusal, word for word."""
    manifest = example("wordcount", kafka_bootstrap, namespace)
    apply(kube_cluster, manifest, namespace)
    first = wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="driver")
    stable = wait_for(
        lambda: get(kube_cluster, "sapp", "wordcount", namespace).get("status", {}).get("stableRevision"),
        what="the first stable revision",
    )
    manifest["spec"]["pipeline"]["nodes"][3]["aggregate"]["window"]["tumbling"] = "10s"
    manifest["spec"]["updateStrategy"] = {"type": "hotSwap"}  # the window's state cannot be swapped in
    code, plan = sluice_plan(kube_cluster, manifest, namespace, tmp_path)
    assert code == 1 and plan["against"] == f"revision {stable} of streamingapp {namespace}/wordcount", plan
    apply(kube_cluster, manifest, namespace)
    app = wait_for(
        lambda: (
            (a := get(kube_cluster, "sapp", "wordcount", namespace))
            and condition(a, "Rollout").get("reason") == "UnsafeUpdateStrategy"
            and a
        ),
        what="the Rollout condition",
    )
    message = condition(app, "Rollout")["message"]
    assert "spec.pipeline.nodes[3].aggregate.window" in message and "checkpointMigration" in message, message
    assert message == plan["refusal"], "sluice plan says what the operator says"
    assert condition(app, "Rollout")["status"] == "False"
    assert app["status"]["stableRevision"] == stable and app["status"]["revision"] == stable
    runner = get(kube_cluster, "configmap", names.runner_configmap_name("wordcount"), namespace)
    assert RunnerConfig.model_validate_json(runner["data"][RUNNER_CONFIG_FILE]).revision == stable
    assert get(kube_cluster, "sparkapplication", "wordcount", namespace)["spec"] == first["spec"]
    events = kube_cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "reason=UnsafeUpdateStrategy", "-o", "name"
    ).stdout.split()
    assert len(events) == 1, "one event for the refusal, not one per pass"


def test_a_window_change_moves_the_query_to_a_checkpoint_of_the_new_revision(
    operator_process, kube_cluster, namespace, kafka_bootstrap, tmp_path
):
    """No driver answers here (no spark-operator): the next driver to start runs the new revision, and the
    runner config tells it where the query's new checkpoint takes over from. `sluice plan` against the cluster
    said so before: the strategy and each query's step."""
    manifest = example("wordcount", kafka_bootstrap, namespace)
    apply(kube_cluster, manifest, namespace)
    first = wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="driver")
    wait_for(
        lambda: get(kube_cluster, "sapp", "wordcount", namespace).get("status", {}).get("stableRevision"),
        what="the first stable revision",
    )
    manifest["spec"]["pipeline"]["nodes"][3]["aggregate"]["window"]["tumbling"] = "10s"
    unchanged_code, _ = sluice_plan(kube_cluster, example("wordcount", kafka_bootstrap, namespace), namespace, tmp_path)
    code, plan = sluice_plan(kube_cluster, manifest, namespace, tmp_path)
    assert (unchanged_code, code, plan["strategy"]) == (0, 1, "checkpointMigration"), plan
    apply(kube_cluster, manifest, namespace)
    app = wait_for(
        lambda: (
            (a := get(kube_cluster, "sapp", "wordcount", namespace))
            and (a["status"].get("rollout") or {}).get("strategy") == "checkpointMigration"
            and a["status"].get("checkpoints")
            and a
        ),
        what="the checkpoint migration",
    )
    rollout, revision = app["status"]["rollout"], app["status"]["stableRevision"]
    assert rollout["phase"] == "Complete" and rollout["toRevision"] == revision, rollout
    assert app["status"]["checkpoints"] == {"out": f"out@{revision}"}
    steps = {q["name"]: (q["action"], q.get("rewindMs")) for q in rollout["queries"]}
    assert steps == {q["name"]: (q["action"], q["rewind_ms"]) for q in plan["queries"]}, plan
    runner = get(kube_cluster, "configmap", names.runner_configmap_name("wordcount"), namespace)
    config = RunnerConfig.model_validate_json(runner["data"][RUNNER_CONFIG_FILE])
    assert config.revision == revision and config.checkpoint("out").endswith(f"/wordcount/out@{revision}")
    assert config.migrations["out"].fromCheckpoint == "out" and config.migrations["out"].rewindMs == 12_000
    assert config.checkpoint("lines-dead-letters").endswith("/wordcount/lines-dead-letters")
    assert get(kube_cluster, "sparkapplication", "wordcount", namespace)["spec"] == first["spec"], "no resubmission"


def test_scale_suspend_and_resume(operator_process, kube_cluster, namespace, kafka_bootstrap):
    manifest = example("wordcount", kafka_bootstrap, namespace)
    apply(kube_cluster, manifest, namespace)
    wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="driver")

    submitted = wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="driver")
    kube_cluster.kubectl("scale", "sapp", "wordcount", "-n", namespace, "--replicas=4")
    wait_for(
        lambda: get(kube_cluster, "sapp", "wordcount", namespace)["status"].get("desiredExecutors") == 4,
        what="4 executors desired",
    )
    # The driver is asked live (control API); the SparkApplication's spec is untouched: no resubmission.
    spark = get(kube_cluster, "sparkapplication", "wordcount", namespace)
    assert spark["spec"] == submitted["spec"] and spark["metadata"]["generation"] == submitted["metadata"]["generation"]
    too_many = kube_cluster.kubectl("scale", "sapp", "wordcount", "-n", namespace, "--replicas=400", check=False)
    assert too_many.returncode != 0 and "instances must not exceed max" in too_many.stderr
    # The scale subresource names the executors (labelSelectorPath), and an HPA may target the app.
    scale = json.loads(
        kube_cluster.kubectl(
            "get", "--raw", f"/apis/sluice.dev/v1alpha1/namespaces/{namespace}/streamingapps/wordcount/scale"
        ).stdout
    )
    assert (scale["spec"]["replicas"], scale["status"]["selector"]) == (4, names.executor_selector("wordcount"))
    hpa = {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "wordcount", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "sluice.dev/v1alpha1", "kind": "StreamingApp", "name": "wordcount"},
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [{"type": "Resource",
                         "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}}}],
        },
    }  # fmt: skip
    kube_cluster.kubectl("create", "-f", "-", input=json.dumps(hpa))
    kube_cluster.kubectl("delete", "hpa", "wordcount", "-n", namespace)

    kube_cluster.kubectl(
        "patch", "sapp", "wordcount", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": true}}'
    )
    wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace) is None, what="driver removed")
    app = wait_for(
        lambda: (a := get(kube_cluster, "sapp", "wordcount", namespace))["status"]["phase"] == "Suspended" and a,
        what="Suspended",
    )
    assert app["status"]["executors"] == 0
    assert get(kube_cluster, "service", "wordcount-driver", namespace), "suspend keeps everything but the driver"
    assert topic_partitions(kafka_bootstrap, manifest["spec"]["topics"][0]["name"])

    kube_cluster.kubectl(
        "patch", "sapp", "wordcount", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": false}}'
    )
    spark = wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="driver back")
    # The same checkpoint location (and claim), so the driver resumes where it stopped.
    config = RunnerConfig.model_validate_json(
        get(kube_cluster, "configmap", sparkapp.pipeline_configmap_of(spark), namespace)["data"][RUNNER_CONFIG_FILE]
    )
    assert config.checkpointRoot == "/checkpoints/wordcount"
    assert spark["spec"]["executor"]["instances"] == 4, "a new submission starts with today's count"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s["pipeline"]["nodes"][0].update(bogus=1), 'unknown field "spec.pipeline.nodes[0].bogus"'),
        (lambda s: s["executors"].update(min=5, max=2), "min must not exceed max"),
        (
            lambda s: s["pipeline"]["nodes"][3]["aggregate"]["window"].update(tumbling="5 sec"),
            "spec.pipeline.nodes[3].aggregate.window.tumbling",
        ),
        (
            lambda s: s["pipeline"]["nodes"][0]["fromKafka"].update(maxRecordsPerTrigger="lots"),
            "spec.pipeline.nodes[0].fromKafka.maxRecordsPerTrigger",
        ),
        (lambda s: s["pipeline"]["nodes"][1].update(select=["x"]), "a node needs exactly one operation key"),
    ],
)
def test_invalid_manifests_are_rejected_at_apply_time(mutate, message, crds_installed, namespace, kafka_bootstrap):
    manifest = example("wordcount", kafka_bootstrap, namespace)
    mutate(manifest["spec"])
    result = apply(crds_installed, manifest, namespace, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("mutate", "path"),
    [
        (lambda s: s["pipeline"]["nodes"][1].update(inputs=["lnes"]), "spec.pipeline.nodes[1].inputs[0]: unknown node"),
        (lambda s: s["pipeline"]["nodes"][1].update(inputs=["non-empty"]), "cycle"),
    ],
)
def test_semantic_errors_are_reported_in_status_and_nothing_is_created(
    mutate, path, operator_process, kube_cluster, namespace, kafka_bootstrap
):
    manifest = example("wordcount", kafka_bootstrap, namespace)
    mutate(manifest["spec"])
    apply(kube_cluster, manifest, namespace)
    app = wait_for(
        lambda: (
            (a := get(kube_cluster, "sapp", "wordcount", namespace))
            and a.get("status", {}).get("phase") == "Invalid"
            and a
        ),
        what="Invalid status",
    )
    assert condition(app, "Valid")["status"] == "False"
    assert path in condition(app, "Valid")["message"]
    assert get(kube_cluster, "sparkapplication", "wordcount", namespace) is None
    events = kube_cluster.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    assert "InvalidSpec" in events

    # The operator keeps serving other apps.
    other = example("frequency-count", kafka_bootstrap, namespace)
    apply(kube_cluster, other, namespace)
    wait_for(lambda: get(kube_cluster, "sparkapplication", other["metadata"]["name"], namespace), what="other app")


def test_admin_topics_grow_and_refuse_to_shrink(operator_process, kube_cluster, namespace, kafka_bootstrap):
    manifest = example("wordcount", kafka_bootstrap, namespace)
    topic = manifest["spec"]["topics"][0]
    topic.update(partitions=2, config={"retention.ms": "3600000"})
    apply(kube_cluster, manifest, namespace)
    wait_for(lambda: topic_partitions(kafka_bootstrap, topic["name"]) == 2, what="topic created")

    topic["partitions"] = 5
    apply(kube_cluster, manifest, namespace)
    wait_for(lambda: topic_partitions(kafka_bootstrap, topic["name"]) == 5, what="partitions grown")

    topic["partitions"] = 1
    apply(kube_cluster, manifest, namespace)
    app = wait_for(
        lambda: (
            (a := get(kube_cluster, "sapp", "wordcount", namespace))
            and condition(a, "TopicsReady").get("status") == "False"
            and a
        ),
        what="shrink refused",
    )
    assert condition(app, "TopicsReady")["reason"] == "PartitionShrinkRefused"
    assert topic["name"] in condition(app, "TopicsReady")["message"]
    assert topic_partitions(kafka_bootstrap, topic["name"]) == 5


def test_existing_topic_is_adopted_without_recreating(operator_process, kube_cluster, namespace, kafka_bootstrap):
    manifest = example("wordcount", kafka_bootstrap, namespace)
    name = manifest["spec"]["topics"][0]["name"]
    create_topic(kafka_bootstrap, name, partitions=6)
    manifest["spec"]["topics"][0]["partitions"] = 6
    apply(kube_cluster, manifest, namespace)
    app = wait_for(
        lambda: (
            (a := get(kube_cluster, "sapp", "wordcount", namespace))
            and condition(a, "TopicsReady").get("status") == "True"
            and a
        ),
        what="TopicsReady",
    )
    assert app and topic_partitions(kafka_bootstrap, name) == 6


def test_strimzi_topics_are_kafkatopic_resources(
    operator_process, kube_cluster, namespace, kafka_bootstrap, strimzi_topic_operator
):
    manifest = example("wordcount", kafka_bootstrap, namespace)
    manifest["spec"]["kafka"] = {"strimziCluster": {"name": "events"}}
    manifest["spec"]["topics"][1]["deletionPolicy"] = "delete"
    apply(kube_cluster, manifest, namespace)
    items = wait_for(
        lambda: json.loads(kube_cluster.kubectl("get", "kafkatopics", "-n", namespace, "-o", "json").stdout)["items"],
        what="KafkaTopics",
    )
    wait_for(
        lambda: (
            len(json.loads(kube_cluster.kubectl("get", "kafkatopics", "-n", namespace, "-o", "json").stdout)["items"])
            == 3
        ),
        what="3 KafkaTopics",
    )
    items = json.loads(kube_cluster.kubectl("get", "kafkatopics", "-n", namespace, "-o", "json").stdout)["items"]
    by_topic = {i["spec"]["topicName"]: i for i in items}
    assert set(by_topic) == {t["name"] for t in manifest["spec"]["topics"]}
    for item in items:
        assert item["metadata"]["labels"]["strimzi.io/cluster"] == "events"
    # Only a topic the app may delete is owned by it (garbage collection of a KafkaTopic deletes the topic).
    assert "ownerReferences" not in by_topic[manifest["spec"]["topics"][0]["name"]]["metadata"]
    assert by_topic[manifest["spec"]["topics"][1]["name"]]["metadata"]["ownerReferences"][0]["name"] == "wordcount"
    spark = wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="the driver")
    cm = get(kube_cluster, "configmap", sparkapp.pipeline_configmap_of(spark), namespace)
    config = RunnerConfig.model_validate_json(cm["data"][RUNNER_CONFIG_FILE])
    assert config.kafkaBootstrap == f"events-kafka-bootstrap.{namespace}.svc:9092"


def test_no_driver_before_strimzi_made_the_topics_ready(
    operator_process, kube_cluster, namespace, kafka_bootstrap, strimzi_topic_operator
):
    """TopicsReady waits for each KafkaTopic's Ready (Strimzi's message while not), and the first driver with it."""
    manifest = example("wordcount", kafka_bootstrap, namespace)
    manifest["spec"]["kafka"] = {"strimziCluster": {"name": "events"}}
    manifest["spec"]["topics"][0]["replicas"] = 3  # the session's Kafka has one broker: Kafka refuses it
    apply(kube_cluster, manifest, namespace)
    app = wait_for(
        lambda: (
            (a := get(kube_cluster, "sapp", "wordcount", namespace))
            and "KafkaError" in condition(a, "TopicsReady").get("message", "")
            and a
        ),
        what="TopicsReady naming Strimzi's error",
    )
    topics = condition(app, "TopicsReady")
    assert (topics["status"], topics["reason"]) == ("False", "TopicNotReady"), topics
    assert "replication factor of 3" in topics["message"], topics  # Kafka's words, as Strimzi passes them on
    assert condition(app, "Ready")["reason"] == "TopicNotReady"
    assert get(kube_cluster, "sparkapplication", "wordcount", namespace) is None
    assert get(kube_cluster, "configmap", names.runner_configmap_name("wordcount"), namespace) is not None

    manifest["spec"]["topics"][0]["replicas"] = 1
    apply(kube_cluster, manifest, namespace)
    wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="the driver once Ready")
    app = get(kube_cluster, "sapp", "wordcount", namespace)
    assert condition(app, "TopicsReady")["status"] == "True", condition(app, "TopicsReady")


def test_operator_metrics(operator_process, kube_cluster, namespace, kafka_bootstrap):
    apply(kube_cluster, example("wordcount", kafka_bootstrap, namespace), namespace)
    wait_for(lambda: get(kube_cluster, "sparkapplication", "wordcount", namespace), what="driver")
    text = wait_for(
        lambda: (t := operator_process.metrics()) and "sluice_operator_reconciles_total{" in t and t,
        what="reconcile metrics",
    )
    assert 'trigger="create"' in text or 'trigger="resync"' in text
    assert "sluice_operator_reconcile_duration_seconds_bucket" in text
    assert 'sluice_operator_apps{phase="Pending"}' in text


def test_examples_are_valid_for_the_crd(crds_installed, namespace):
    for path in sorted(Path(__file__).resolve().parents[2].glob("pipelines/examples/*.yaml")):
        result = crds_installed.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path), check=False)
        assert result.returncode == 0, f"{path.name}: {result.stderr}"


def test_two_replicas_with_peering_one_active_then_failover(
    operator_process, crds_installed, kafka_bootstrap, tmp_path
):
    from conftest import HA_NAMESPACE_PREFIX, OperatorProcess

    namespace = f"{HA_NAMESPACE_PREFIX}{tmp_path.name[-8:].strip('_').lower()}".replace("_", "-")
    crds_installed.kubectl("create", "namespace", namespace)

    def replica(priority: int) -> OperatorProcess:
        return OperatorProcess(
            crds_installed.kubeconfig,
            tmp_path / f"op-{priority}.log",
            extra_args=("--peering", "sluice-ha", "--priority", str(priority), "--verbose", "--log-format", "full"),
            scope=("--namespace", namespace),
        )

    def peers() -> dict:
        result = crds_installed.kubectl("get", "kopfpeering", "sluice-ha", "-n", namespace, "-o", "json", check=False)
        return json.loads(result.stdout).get("status", {}) if result.returncode == 0 else {}

    active = replica(200)
    standby = None
    try:
        active.wait_alive()
        wait_for(lambda: [p for p in peers().values() if p["priority"] == 200], what="the first replica's lease")
        standby = replica(100)
        standby.wait_alive()
        wait_for(lambda: len(peers()) == 2, what="both replicas in the peering")
        first = example("wordcount", kafka_bootstrap, f"{namespace}-a")
        apply(crds_installed, first, namespace)
        wait_for(lambda: get(crds_installed, "sparkapplication", "wordcount", namespace), what="the active replica")
        # kopf logs success only after the handler's status patch, a moment after the child exists.
        wait_for(lambda: "Handler 'reconcile' succeeded" in active.log.read_text(), what="the active replica's log")
        assert "Handler 'reconcile' succeeded" not in standby.log.read_text(), "the standby must not act"
        # The periodic passes are kopf timers: they run on the active replica only (peering pauses the standby).
        # No driver runs here, so the timer that fires is the resync.
        wait_for(lambda: "Timer 'resync' succeeded" in active.log.read_text(), what="the active replica's resync")
        assert "Timer '" not in standby.log.read_text(), "a paused standby must not run timers"

        active.stop()
        second = example("frequency-count", kafka_bootstrap, f"{namespace}-b")
        apply(crds_installed, second, namespace)
        wait_for(
            lambda: get(crds_installed, "sparkapplication", second["metadata"]["name"], namespace),
            timeout=120,
            what="the standby to take over",
        )
        wait_for(lambda: "Handler 'reconcile' succeeded" in standby.log.read_text(), what="the standby's log")
    finally:
        active.stop()
        if standby is not None:
            standby.stop()
        crds_installed.kubectl("delete", "namespace", namespace, "--wait=false")


def test_finalizer_only_while_a_driver_runs_or_topics_must_be_deleted(
    operator_process, kube_cluster, namespace, kafka_bootstrap
):
    """The periodic passes (kopf timers) need a finalizer on apps that run a driver; a suspended app keeps
    none unless Admin-API topics must be deleted with it."""

    def finalizers(name: str) -> list[str]:
        return ((get(kube_cluster, "sapp", name, namespace) or {}).get("metadata") or {}).get("finalizers") or []

    plain = example("wordcount", kafka_bootstrap, namespace)
    apply(kube_cluster, plain, namespace)
    wait_for(lambda: finalizers("wordcount"), what="the running app's finalizer")
    kube_cluster.kubectl(
        "patch", "sapp", "wordcount", "-n", namespace, "--type=merge", "-p", '{"spec": {"suspend": true}}'
    )
    wait_for(lambda: not finalizers("wordcount"), what="a suspended app's finalizer removed")

    doomed = example("frequency-count", kafka_bootstrap, namespace)
    name = doomed["metadata"]["name"]
    doomed["spec"]["topics"][0]["deletionPolicy"] = "delete"
    doomed["spec"]["suspend"] = True
    topic = doomed["spec"]["topics"][0]["name"]
    apply(kube_cluster, doomed, namespace)
    wait_for(lambda: topic_partitions(kafka_bootstrap, topic), what="topic created")
    wait_for(lambda: finalizers(name), what="the finalizer")
    kube_cluster.kubectl("delete", "sapp", name, "-n", namespace, "--timeout=60s")
    wait_for(lambda: topic_partitions(kafka_bootstrap, topic) is None, what="the topic deleted with its app")
    assert all(topic_partitions(kafka_bootstrap, t["name"]) for t in doomed["spec"]["topics"][1:])


def test_operator_killed_mid_reconcile_converges_without_duplicates(crds_installed, kafka_bootstrap, tmp_path):
    """SIGKILL at random moments while apps are created and updated: after a restart every app converges,
    with one child of each kind, the pipeline ConfigMaps of its revision and its last rollout, and its topics."""
    import random
    import time

    from conftest import HA_NAMESPACE_PREFIX, OperatorProcess  # a namespace the shared operator leaves alone

    namespace = f"{HA_NAMESPACE_PREFIX}kill-{tmp_path.name[-6:].strip('_').lower()}".replace("_", "-")
    crds_installed.kubectl("create", "namespace", namespace)
    rng = random.Random(11)
    apps = [example(name, kafka_bootstrap, f"{namespace}-{name}") for name in ("wordcount", "frequency-count")]
    kills = 0
    try:
        for round_ in range(6):
            operator = OperatorProcess(
                crds_installed.kubeconfig, tmp_path / f"op-{round_}.log", scope=("--namespace", namespace)
            )
            operator.wait_alive()
            if round_ == 0:
                for app in apps:
                    apply(crds_installed, app, namespace)
            elif round_ == 3:
                apps[0]["spec"]["pipeline"]["nodes"][2]["filter"] = "word != '' AND length(word) > 1"
                apply(crds_installed, apps[0], namespace)
            time.sleep(rng.uniform(0.2, 2.5))
            operator.proc.kill()  # SIGKILL: no cleanup, whatever it was doing
            operator.proc.wait()
            kills += 1
        survivor = OperatorProcess(
            crds_installed.kubeconfig, tmp_path / "op-final.log", scope=("--namespace", namespace)
        )
        try:
            survivor.wait_alive()
            for app in apps:
                name = app["metadata"]["name"]
                converged = wait_for(
                    lambda n=name: (
                        (a := get(crds_installed, "sapp", n, namespace))
                        and a.get("status", {}).get("observedGeneration") == a["metadata"]["generation"]
                        and a["status"].get("phase") == "Pending"
                        and a
                    ),
                    timeout=90,
                    what=f"{name} converged after {kills} kills",
                )
                status = converged["status"]
                rollout = status.get("rollout") or {}
                # The revision that runs, and the last rollout's two (kept until the next one): nothing else.
                revisions = {status["revision"], *(rollout.get(k) for k in ("fromRevision", "toRevision") if rollout)}
                expected = sorted(f"configmap/{revision_configmap_name(name, rev)}" for rev in revisions)
                wait_for(
                    lambda n=name, e=expected: (
                        sorted(
                            crds_installed.kubectl(
                                "get",
                                "configmap",
                                "-n",
                                namespace,
                                "-l",
                                f"sluice.dev/app={n},app.kubernetes.io/component=pipeline",
                                "-o",
                                "name",
                            ).stdout.split()
                        )
                        == e
                    ),
                    timeout=60,
                    what=f"the pipeline ConfigMaps {expected} of {name}",
                )
                for kind, count in (
                    ("sparkapplication", 1),
                    ("networkpolicy", 2),
                    ("secret", 1),
                    ("pvc", 1),
                    ("service", 1),
                ):
                    found = crds_installed.kubectl(
                        "get", kind, "-n", namespace, "-l", f"sluice.dev/app={name}", "-o", "name"
                    ).stdout.split()
                    assert len(found) == count, (kind, found)
                for topic in app["spec"]["topics"]:
                    assert topic_partitions(kafka_bootstrap, topic["name"]) == topic.get("partitions", 1)
        finally:
            survivor.stop()
    finally:
        crds_installed.kubectl("delete", "namespace", namespace, "--wait=false")
