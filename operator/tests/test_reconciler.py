"""Whole reconcile passes with fakes at the reconciler's I/O seam (fakes.py: the API server's objects, the driver's
control API): what a pass applies, asks the driver and records. Real components: test_operator_cluster.py (a
kube-apiserver and the operator as a process) and the e2e suite (real pods)."""

from __future__ import annotations

from fakes import (
    APP,
    NAMESPACE,
    POD,
    FakeKube,
    app_manifest,
    driver_pod_started,
    reconcile,
    runner_revision,
)

from sluice.api.contract import revision_configmap_name
from sluice.operator import names


def kinds(kube: FakeKube) -> set[tuple[str, str]]:
    return {(kind, name) for kind, _, name in kube.objects}


def test_a_new_app_gets_its_children_and_its_first_stable_revision(world) -> None:
    reconciler, kube, _ = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    revision = app["status"]["stableRevision"]
    assert {
        ("SparkApplication", APP),
        ("ConfigMap", names.runner_configmap_name(APP)),
        ("ConfigMap", revision_configmap_name(APP, revision)),
        ("Secret", names.control_secret_name(APP)),
        ("Service", f"{APP}-driver"),
    } <= kinds(kube)
    assert runner_revision(kube) == revision == app["status"]["revision"]
    assert app["status"]["phase"] == "Pending"  # spark-operator has not picked it up
    conditions = {c["type"]: c["status"] for c in app["status"]["conditions"]}
    assert conditions["Valid"] == "True" and conditions["DriverSubmitted"] == "True"


def test_an_invalid_spec_creates_nothing_and_names_the_field(world) -> None:
    reconciler, kube, _ = world
    manifest = app_manifest("word != ''")
    manifest["spec"]["pipeline"]["nodes"][1]["inputs"] = ["lnes"]
    app = reconcile(reconciler, manifest, clock=1000.0)
    assert kinds(kube) == {("StreamingApp", APP)}, "nothing but the app itself"
    assert app["status"]["phase"] == "Invalid"
    valid = next(c for c in app["status"]["conditions"] if c["type"] == "Valid")
    assert valid["status"] == "False" and "spec.pipeline.nodes[1].inputs[0]" in valid["message"], valid


def test_a_filter_change_is_swapped_into_the_running_driver(world) -> None:
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    first = app["status"]["stableRevision"]
    driver_pod_started(kube)
    driver.revision = first
    spark_before = kube.objects[("SparkApplication", NAMESPACE, APP)]["spec"]
    recorded_at_swap: list[dict] = []
    swap = driver.swap
    driver.swap = lambda *args: (
        recorded_at_swap.append(  # type: ignore[method-assign]
            kube.objects[("StreamingApp", NAMESPACE, APP)]["status"].get("rollout") or {}
        )
        or swap(*args)
    )

    app = reconcile(reconciler, app_manifest("word != '' AND word != 'zeta'") | {"status": app["status"]}, 1005.0)
    rollout = app["status"]["rollout"]
    assert [(r.get("phase"), r.get("toRevision")) for r in recorded_at_swap] == [("Draining", rollout["toRevision"])]
    assert rollout["strategy"] == "hotSwap" and rollout["fromRevision"] == first
    assert len(driver.swaps) == 1 and driver.swaps[0].config.revision == rollout["toRevision"]
    assert {s.name: s.action for s in driver.swaps[0].steps} == {"out": "restart", "lines-dead-letters": "keep"}
    assert "zeta" in driver.swaps[0].config.pipeline.model_dump_json()
    assert any(reason == "Swapped" for _, reason, _ in app["events"]), app["events"]
    spark_app = kube.objects[("SparkApplication", NAMESPACE, APP)]
    assert spark_app["spec"] == spark_before, "no resubmission"
    assert spark_app["metadata"]["labels"][names.REVISION_LABEL] == first, "labelled with what it was submitted for"
    assert runner_revision(kube) == rollout["toRevision"], "a driver restarting now runs the new revision"


def test_a_tick_applies_nothing_and_asks_the_driver_for_the_executor_count(world) -> None:
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    driver_pod_started(kube)
    driver.revision = app["status"]["stableRevision"]
    scaled = app_manifest("word != ''") | {"status": app["status"]}
    scaled["spec"]["executors"]["instances"] = 3
    runner_before = kube.objects[("ConfigMap", NAMESPACE, names.runner_configmap_name(APP))]
    outcome = reconciler.reconcile(scaled, full=False, periodic=True, clock=1005.0)
    assert driver.executor_requests == [3], "the live count is asked of the running driver"
    assert kube.objects[("ConfigMap", NAMESPACE, names.runner_configmap_name(APP))] == runner_before
    assert outcome.status["desiredExecutors"] == 3 and outcome.status["scaling"] == "manual"
    assert outcome.status["executors"] == 1, "the driver's own count, as it answered before the request"


def test_a_pass_records_the_status_only_when_it_changed(world) -> None:
    reconciler, kube, _ = world
    kube.apply(app_manifest("word != ''"), "test")
    reconciler.reconcile_by_name(NAMESPACE, APP)
    writes = [p for p in kube.patches if p[0] == "StreamingApp" and p[2] == "status"]
    assert len(writes) == 1 and writes[0][3]["status"]["stableRevision"]
    reconciler.reconcile_by_name(NAMESPACE, APP)  # nothing changed since
    assert [p for p in kube.patches if p[0] == "StreamingApp" and p[2] == "status"] == writes


def test_a_driver_an_earlier_release_submitted_is_kept_and_an_edit_by_hand_is_undone(world) -> None:
    """A new rendering of the running driver's SparkApplication (another operator release, other settings)
    restarts nothing: spark-operator would resubmit on any change of its spec. What this operator rendered is
    applied, so an edit by hand goes."""
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    driver_pod_started(kube)
    driver.revision = app["status"]["stableRevision"]
    key = ("SparkApplication", NAMESPACE, APP)
    ours = kube.objects[key]
    earlier = {**ours, "metadata": {**ours["metadata"], "annotations": {}}, "spec": {**ours["spec"], "sparkConf": {}}}
    kube.objects[key] = earlier  # as an earlier release submitted it: rendered otherwise, no rendering hash
    app = reconcile(reconciler, app_manifest("word != ''") | {"status": app["status"]}, clock=1005.0)
    kept = kube.objects[key]
    assert kept["spec"] == earlier["spec"], "kept as submitted: no resubmission"
    assert (
        kept["metadata"]["annotations"][names.RUNTIME_ANNOTATION]
        == ours["metadata"]["annotations"][names.RUNTIME_ANNOTATION]
    ), "the runtime it runs, stamped"
    assert kept["metadata"]["labels"] == ours["metadata"]["labels"]

    tuned = app_manifest("word != ''")
    tuned["spec"].setdefault("spark", {})["sparkConf"] = {"spark.sql.shuffle.partitions": "7"}
    app = reconcile(reconciler, tuned | {"status": app["status"]}, clock=1007.0)
    assert kube.objects[key]["spec"]["sparkConf"]["spark.sql.shuffle.partitions"] == "7", "a runtime change applies"
    assert app["status"]["stableRevision"] == app["status"]["revision"]

    applied = kube.objects[key]
    kube.objects[key] = {
        **applied,
        "spec": {**applied["spec"], "executor": {**applied["spec"]["executor"], "instances": 9}},
    }
    reconcile(reconciler, tuned | {"status": app["status"]}, clock=1010.0)
    assert kube.objects[key]["spec"] == applied["spec"], "an edit by hand of what this operator rendered is undone"


def test_a_driver_pod_spark_operator_lost_the_submission_of_is_deleted(world) -> None:
    """spark-operator's PENDING_RERUN with the driver pod it submitted running (its status write after the
    submission lost): it waits for that pod to go, forever (kubeflow/spark-operator#2905)."""
    reconciler, kube, _ = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    kube.objects[("SparkApplication", NAMESPACE, APP)]["status"] = {"applicationState": {"state": "PENDING_RERUN"}}
    kube.objects[("Pod", NAMESPACE, POD)] = {
        "metadata": {"name": POD, "namespace": NAMESPACE, "creationTimestamp": "1970-01-01T00:15:00Z"},  # 900 s
        "status": {"phase": "Running"},
    }
    app = reconcile(reconciler, app_manifest("word != ''") | {"status": app["status"]}, clock=930.0)
    assert ("Pod", POD) not in kube.deleted, "a pod started 30 s ago may still be spark-operator's to record"
    app = reconcile(reconciler, app_manifest("word != ''") | {"status": app["status"]}, clock=1000.0)
    assert ("Pod", POD) in kube.deleted
    assert [reason for _, reason, _ in app["events"]][:1] == ["DriverResubmitted"], app["events"]


def test_a_handover_s_second_driver_spark_operator_lost_the_submission_of_is_deleted(world) -> None:
    """The same loss for the second driver a fenced handover starts: its pod is deleted so spark-operator submits
    it again, and the handover goes on."""
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    driver_pod_started(kube)
    driver.revision = app["status"]["stableRevision"]
    new_image = app_manifest("word != ''")
    new_image["spec"].setdefault("spark", {})["image"] = "sluice.local/spark:next"
    app = reconcile(reconciler, new_image | {"status": app["status"]}, clock=1010.0)
    second = app["status"]["rollout"]["toDriver"]
    assert app["status"]["rollout"]["strategy"] == "fencedHandover" and ("SparkApplication", NAMESPACE, second) in (
        kube.objects
    )
    kube.objects[("SparkApplication", NAMESPACE, second)]["status"] = {"applicationState": {"state": "PENDING_RERUN"}}
    kube.objects[("Pod", NAMESPACE, f"{second}-driver")] = {
        "metadata": {"name": f"{second}-driver", "namespace": NAMESPACE, "creationTimestamp": "1970-01-01T00:16:50Z"},
        "status": {"phase": "Running"},
    }
    app = reconcile(reconciler, new_image | {"status": app["status"]}, clock=1040.0)
    assert ("Pod", f"{second}-driver") not in kube.deleted, "30 s: spark-operator may still record it"
    app = reconcile(reconciler, new_image | {"status": app["status"]}, clock=1100.0)
    assert ("Pod", f"{second}-driver") in kube.deleted and ("Pod", POD) not in kube.deleted
    assert "DriverResubmitted" in [reason for _, reason, _ in app["events"]], app["events"]
    assert app["status"]["rollout"]["toDriver"] == second
    assert app["status"]["rollout"]["phase"] not in ("RolledBack", "Failed", "Complete"), "the handover goes on"
