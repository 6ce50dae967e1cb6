"""Where an app's checkpoints go (pure): the operator's store, the location an app keeps, S3A's settings and
credentials in both pods, the one-node rule for a ReadWriteOnce claim, and what CheckpointReady says."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from sluice.operator import children as ch
from sluice.operator import names
from sluice.operator import spark_application as sparkapp
from sluice.operator.desired import Invalid, admissible_spec, desired_state, parse_spec, with_checkpoint_location
from sluice.operator.settings import CheckpointStore, ClaimDefaults, Settings
from sluice.operator.status import (
    CLAIM_NOT_FOUND,
    Observation,
    blocks_first_driver,
    checkpoint_condition,
    conditions_for,
    driver_unschedulable,
)

STORE_ENV = {
    "SLUICE_CHECKPOINT_LOCATION": "s3a://checkpoints/sluice/{namespace}",
    "SLUICE_CHECKPOINT_S3_ENDPOINT": "http://store.storage:9000",
    "SLUICE_CHECKPOINT_S3_REGION": "eu-west-1",
    "SLUICE_CHECKPOINT_S3_PATH_STYLE_ACCESS": "true",
    "SLUICE_CHECKPOINT_S3_CREDENTIALS_SECRET": "store-keys",
}


EXAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "wordcount.yaml"


@pytest.fixture
def raw_spec() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())["spec"]


def spark_application(spec) -> dict:
    return next(c for c in desired_state("wc", "apps", spec).children if c["kind"] == "SparkApplication")


def test_the_chart_names_the_store_and_its_s3_settings() -> None:
    store = Settings.from_env(STORE_ENV).checkpoint_store
    assert store.location_for("team-a") == "s3a://checkpoints/sluice/team-a"
    assert store.s3 is not None and store.s3.credentialsSecret is not None
    assert (store.s3.endpoint, store.s3.region, store.s3.pathStyleAccess) == (
        "http://store.storage:9000",
        "eu-west-1",
        True,
    )
    assert store.s3.credentialsSecret.secretName == "store-keys"
    assert Settings.from_env({}).checkpoint_store == CheckpointStore(), "no store: claims"
    with pytest.raises(ValueError, match=r"checkpoints\.location"):
        CheckpointStore.from_env({"SLUICE_CHECKPOINT_LOCATION": "/mnt/checkpoints"})


def test_an_app_naming_no_location_gets_the_store_and_keeps_the_one_it_ran_on(raw_spec) -> None:
    store = CheckpointStore.from_env(STORE_ENV)
    spec = with_checkpoint_location(parse_spec(raw_spec), "team-a", store, kept=None)
    assert spec.checkpoint.location == "s3a://checkpoints/sluice/team-a" and spec.checkpoint.s3 == store.s3
    assert ch.runner_config("wc", "team-a", spec, "k:9092").checkpointRoot == "s3a://checkpoints/sluice/team-a/wc"
    assert "PersistentVolumeClaim" not in [c["kind"] for c in desired_state("wc", "team-a", spec).children]
    # The store moved later: an app that ran keeps its checkpoints where they are.
    moved = CheckpointStore("s3a://elsewhere/{namespace}", store.s3)
    kept = with_checkpoint_location(parse_spec(raw_spec), "team-a", moved, kept="s3a://checkpoints/sluice/team-a")
    assert kept.checkpoint.location == "s3a://checkpoints/sluice/team-a"
    assert ch.revision(kept) == ch.revision(spec), "the same revision: nothing restarts"
    # No store, or a location the app names: as written.
    assert (
        with_checkpoint_location(parse_spec(raw_spec), "x", CheckpointStore(), None).checkpoint.location
        == "/checkpoints"
    )
    raw_spec["checkpoint"] = {"location": "hdfs://nn/cp"}
    assert with_checkpoint_location(parse_spec(raw_spec), "x", store, None).checkpoint.location == "hdfs://nn/cp"


def test_s3a_settings_and_the_key_pair_reach_both_pods_from_the_secret(raw_spec) -> None:
    spec = with_checkpoint_location(parse_spec(raw_spec), "team-a", CheckpointStore.from_env(STORE_ENV), None)
    spark = spark_application(spec)
    conf = spark["spec"]["sparkConf"]
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://store.storage:9000"
    assert conf["spark.hadoop.fs.s3a.endpoint.region"] == "eu-west-1"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"] == sparkapp.S3A_KEY_PAIR_PROVIDER
    for role in ("driver", "executor"):
        container = spark["spec"][role]["template"]["spec"]["containers"][0]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"] if "valueFrom" in e}
        assert refs == {
            "AWS_ACCESS_KEY_ID": {"name": "store-keys", "key": "AWS_ACCESS_KEY_ID"},
            "AWS_SECRET_ACCESS_KEY": {"name": "store-keys", "key": "AWS_SECRET_ACCESS_KEY"},
        }
        assert not [v for v in spark["spec"][role]["template"]["spec"]["volumes"] if v["name"] == "checkpoints"]
    assert "podAffinity" not in json.dumps(spark), "an object store: pods anywhere"


def test_without_a_key_pair_the_pods_identity_is_used(raw_spec) -> None:
    raw_spec["checkpoint"] = {"location": "s3a://bucket/apps", "s3": {"region": "us-east-2"}}
    spark = spark_application(parse_spec(raw_spec))
    conf = spark["spec"]["sparkConf"]
    assert conf["spark.hadoop.fs.s3a.aws.credentials.provider"] == sparkapp.S3A_POD_IDENTITY_PROVIDER
    assert "spark.hadoop.fs.s3a.endpoint" not in conf and conf["spark.hadoop.fs.s3a.path.style.access"] == "false"
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(spark)
    raw_spec.setdefault("spark", {})["sparkConf"] = {"spark.hadoop.fs.s3a.aws.credentials.provider": "mine"}
    assert (
        spark_application(parse_spec(raw_spec))["spec"]["sparkConf"]["spark.hadoop.fs.s3a.aws.credentials.provider"]
        == "mine"
    )


@pytest.mark.parametrize(
    ("checkpoint", "problem"),
    [
        ({"location": "/checkpoints", "s3": {}}, "s3 is for an s3a:// location"),
        ({"s3": {"region": "x"}}, "s3 is for an s3a:// location"),
        ({"location": "s3a://b/c", "volumeClaim": "mine"}, "volumeClaim is mounted at a path"),
    ],
)
def test_checkpoint_settings_that_cannot_work_are_refused_naming_the_field(raw_spec, checkpoint, problem) -> None:
    raw_spec["checkpoint"] = checkpoint
    refused = admissible_spec(raw_spec, Settings())
    assert isinstance(refused, Invalid)
    assert any(p.path == "spec.checkpoint" and problem in p.message for p in refused.problems), refused.message


def affinity(spark: dict, role: str) -> dict | None:
    return spark["spec"][role]["template"]["spec"].get("affinity")


def test_a_read_write_once_claim_keeps_the_apps_pods_on_one_node(raw_spec) -> None:
    raw_spec = copy.deepcopy(raw_spec)
    raw_spec.setdefault("spark", {})["pod"] = {
        "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    }
    spec = parse_spec(raw_spec)  # a path: the operator's claim, ReadWriteOnce by default
    spark = spark_application(spec)
    together = {"labelSelector": {"matchLabels": {names.APP_LABEL: "wc"}}, "topologyKey": "kubernetes.io/hostname"}
    for role in ("driver", "executor"):
        pod_affinity = affinity(spark, role)["podAffinity"]
        assert pod_affinity["requiredDuringSchedulingIgnoredDuringExecution"] == [together]
        assert pod_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [], "the app's own is kept"
    shared = desired_state("wc", "apps", spec, claims=ClaimDefaults(access_mode="ReadWriteMany")).children[-1]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in json.dumps(shared)
    # The app's own claim: by its access modes as observed; one not seen yet counts as ReadWriteOnce.
    raw_spec["checkpoint"] = {"location": "/checkpoints", "volumeClaim": "mine"}
    own = parse_spec(raw_spec)
    rwx = sparkapp.ClaimFacts("mine", True, "Bound", ("ReadWriteMany",))
    assert not sparkapp.pods_kept_together(own, ClaimDefaults(), rwx)
    assert sparkapp.pods_kept_together(own, ClaimDefaults(access_mode="ReadWriteMany"), None)
    assert sparkapp.pods_kept_together(
        own, ClaimDefaults(), sparkapp.ClaimFacts("mine", True, "Bound", ("ReadWriteOnce",))
    )


def test_checkpoint_ready_says_where_and_why_not(raw_spec) -> None:
    store = CheckpointStore.from_env(STORE_ENV)
    on_store = with_checkpoint_location(parse_spec(raw_spec), "team-a", store, None)
    assert checkpoint_condition("wc", on_store, None, False) == (
        True,
        "ObjectStore",
        "checkpoints in s3a://checkpoints/sluice/team-a/wc",
    )
    on_claim = parse_spec(raw_spec)
    made_now = checkpoint_condition("wc", on_claim, None, True)
    assert made_now[:2] == (False, "ClaimPending") and "wc-checkpoints" in made_now[2]
    pending = sparkapp.claim_facts(
        "wc-checkpoints", {"spec": {"accessModes": ["ReadWriteOnce"]}, "status": {"phase": "Pending"}}
    )
    ok, reason, message = checkpoint_condition("wc", on_claim, pending, True)
    assert (ok, reason) == (False, "ClaimPending") and "run on one node" in message
    bound = sparkapp.ClaimFacts("wc-checkpoints", True, "Bound", ("ReadWriteOnce",))
    assert checkpoint_condition("wc", on_claim, bound, True)[:2] == (True, "ClaimBound")
    raw_spec["checkpoint"] = {"location": "/checkpoints", "volumeClaim": "mine"}
    own = parse_spec(raw_spec)
    missing = checkpoint_condition("wc", own, sparkapp.claim_facts("mine", None), True)
    assert missing[:2] == (False, CLAIM_NOT_FOUND) and "spec.checkpoint.volumeClaim" in missing[2]
    assert blocks_first_driver(missing)
    one_pod = checkpoint_condition("wc", own, sparkapp.ClaimFacts("mine", True, "Bound", ("ReadWriteOncePod",)), True)
    assert one_pod[:2] == (False, "ClaimAccessModeRefused") and blocks_first_driver(one_pod)
    assert not blocks_first_driver(checkpoint_condition("wc", on_claim, pending, True)), "binds when the driver runs"


def test_a_pending_claim_makes_the_app_unready_with_its_reason() -> None:
    obs = Observation(checkpoint=(False, "ClaimPending", "claim wc-checkpoints is Pending: no volume bound yet"))
    ready = conditions_for(obs)[0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "ClaimPending")


def test_a_driver_the_scheduler_cannot_place_says_why() -> None:
    why = "0/3 nodes are available: 3 Insufficient memory."
    pod = {
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}],
        }
    }
    assert driver_unschedulable(pod) == why
    assert driver_unschedulable({"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}) is None
    running = next(
        c
        for c in conditions_for(Observation(spark_state="SUBMITTED", driver_unschedulable=why))
        if c["type"] == "Running"
    )
    assert (running["status"], running["reason"], running["message"]) == ("False", "DriverUnschedulable", why)


def test_a_tick_reads_a_pending_claim_again_until_it_binds(world) -> None:
    from fakes import NAMESPACE, app_manifest, reconcile

    reconciler, kube, _ = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    claim = kube.objects[("PersistentVolumeClaim", NAMESPACE, "wordcount-checkpoints")]
    pending = next(c for c in app["status"]["conditions"] if c["type"] == "CheckpointReady")
    assert (pending["status"], pending["reason"]) == ("False", "ClaimPending"), pending
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    claim["status"] = {"phase": "Bound"}  # the provisioner's part
    outcome = reconciler.reconcile(app_manifest("word != ''") | {"status": app["status"]}, full=False, clock=1005.0)
    bound = next(c for c in outcome.status["conditions"] if c["type"] == "CheckpointReady")
    assert (bound["status"], bound["reason"]) == ("True", "ClaimBound"), bound
    assert "run on one node" in bound["message"]


def test_a_full_pass_reads_the_claim_once_and_changes_only_its_owner(world, monkeypatch) -> None:
    """The claim the pass observed is the one it makes or re-owns: one read a pass (a resync's requests), and a
    deletionPolicy change moves only its owner."""
    from fakes import NAMESPACE, app_manifest, reconcile

    reconciler, kube, _ = world
    reads: list[str] = []
    get = kube.get

    def counting_get(api_version: str, kind: str, namespace: str | None, name: str) -> dict | None:
        if kind == "PersistentVolumeClaim":
            reads.append(name)
        return get(api_version, kind, namespace, name)

    monkeypatch.setattr(kube, "get", counting_get)
    key = ("PersistentVolumeClaim", NAMESPACE, "wordcount-checkpoints")
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    assert reads == ["wordcount-checkpoints"], "observed once, then made from that observation"
    assert not kube.objects[key]["metadata"].get("ownerReferences"), "retained by default: not owned"

    app["spec"]["checkpoint"]["deletionPolicy"] = "delete"
    reconcile(reconciler, app, clock=1300.0)
    assert reads == ["wordcount-checkpoints"] * 2
    assert [o["uid"] for o in kube.objects[key]["metadata"]["ownerReferences"]] == ["u-1"]
    assert [p[:3] for p in kube.patches if p[0] == "PersistentVolumeClaim"] == [
        ("PersistentVolumeClaim", "wordcount-checkpoints", None)
    ]

    reconcile(reconciler, app, clock=1600.0)
    assert len([p for p in kube.patches if p[0] == "PersistentVolumeClaim"]) == 1, "owned already: left as it is"
