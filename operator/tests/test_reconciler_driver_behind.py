"""The reconciler's verification after a driver starts (#31, the lost update), with fakes at its I/O seam (the
API server and the driver's control API): a change applied while the driver starts completes at once, the
driver that was starting comes up on the revision before, and the next pass restarts it onto the claimed one.
The same on real pods: e2e step change_while_driver_starts."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from sluice.api.contract import RUNNER_CONFIG_FILE, DriverStatus, QueryStatus, RunnerConfig
from sluice.operator import children as ch
from sluice.operator.driver_client import DriverUnavailable
from sluice.operator.kube import KubeError
from sluice.operator.reconciler import Reconciler
from sluice.testbed.common import REPO_ROOT

NAMESPACE, APP, POD = "apps", "wordcount", "wordcount-driver"


class FakeKube:
    """Objects by (kind, namespace, name); server-side apply replaces the object's spec/data and keeps its status."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        self.deleted: list[tuple[str, str]] = []

    def apply(self, body: dict[str, Any], field_manager: str) -> dict[str, Any]:
        key = (body["kind"], body["metadata"].get("namespace"), body["metadata"]["name"])
        kept = {k: v for k, v in self.objects.get(key, {}).items() if k == "status"}
        self.objects[key] = {**copy.deepcopy(body), **kept}
        return self.objects[key]

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        key = (body["kind"], body["metadata"].get("namespace"), body["metadata"]["name"])
        if key in self.objects:
            raise KubeError(409, "exists")
        self.objects[key] = copy.deepcopy(body)
        return self.objects[key]

    def get(self, api_version: str, kind: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def list(self, api_version: str, kind: str, namespace: str | None, label_selector: str) -> list[dict[str, Any]]:
        wanted = dict(term.split("=", 1) for term in label_selector.split(","))
        return [
            copy.deepcopy(o)
            for (k, ns, _), o in self.objects.items()
            if k == kind and ns == namespace and wanted.items() <= (o["metadata"].get("labels") or {}).items()
        ]

    def patch(self, api_version: str, kind: str, namespace: str | None, name: str, patch: dict, sub: str | None = None):
        raise AssertionError("the test calls Reconciler.reconcile, which patches nothing")

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        if self.objects.pop((kind, namespace, name), None) is not None:
            self.deleted.append((kind, name))


class FakeDriver:
    """The driver's control API: not answering (None) or answering that it runs `revision`."""

    def __init__(self) -> None:
        self.revision: str | None = None

    @staticmethod
    def address(pod_ip: str, port: int) -> str:
        return f"http://{pod_ip}:{port}"

    def status(self, address: str) -> DriverStatus:
        if self.revision is None:
            raise DriverUnavailable("connection refused")
        return DriverStatus(
            app=APP,
            revision=self.revision,
            observedAt="2026-11-28T00:00:00Z",
            queries=[QueryStatus(name="out", active=True, revision=self.revision, runBatches=5)],
        )


def app_manifest(filter_: str) -> dict[str, Any]:
    app = yaml.safe_load((REPO_ROOT / "pipelines" / "examples" / "wordcount.yaml").read_text())
    app["metadata"].update(namespace=NAMESPACE, generation=1, uid="u-1")
    for topic in app["spec"]["topics"]:
        topic["management"] = "none"  # no Kafka here: the topics are not the subject
    app["spec"]["checkpoint"] = {"location": "/checkpoints", "volumeClaim": "checkpoints"}
    next(n for n in app["spec"]["pipeline"]["nodes"] if n["name"] == "non-empty")["filter"] = filter_
    return app


def driver_pod_started(kube: FakeKube) -> None:
    """spark-operator's part: the SparkApplication runs, its driver pod is up (with the submission's annotations)."""
    spark = kube.objects[("SparkApplication", NAMESPACE, APP)]
    spark["status"] = {"applicationState": {"state": "RUNNING"}, "driverInfo": {"podName": POD}}
    annotations = spark["spec"]["driver"]["annotations"]
    kube.objects[("Pod", NAMESPACE, POD)] = {
        "metadata": {"name": POD, "namespace": NAMESPACE, "annotations": dict(annotations)},
        "status": {"podIP": "10.0.0.7", "phase": "Running"},
    }


def runner_revision(kube: FakeKube) -> str:
    data = kube.objects[("ConfigMap", NAMESPACE, ch.runner_configmap_name(APP))]["data"][RUNNER_CONFIG_FILE]
    return RunnerConfig.model_validate_json(data).revision


@pytest.fixture
def world() -> tuple[Reconciler, FakeKube, FakeDriver]:
    kube, driver = FakeKube(), FakeDriver()
    return Reconciler(kube=kube, driver_client=driver), kube, driver  # type: ignore[arg-type]


def reconcile(reconciler: Reconciler, app: dict[str, Any], clock: float) -> dict[str, Any]:
    outcome = reconciler.reconcile(app, clock=clock)
    app["status"] = json.loads(json.dumps(outcome.status))
    app["events"] = outcome.events
    return app


def test_a_change_applied_while_the_driver_starts_reaches_it(world) -> None:
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    first = app["status"]["stableRevision"]
    assert runner_revision(kube) == first
    driver_pod_started(kube)  # up, but its runner not answering yet: it read the runner config of `first`

    changed = app_manifest("word != '' AND word != 'zeta'") | {"status": app["status"]}
    app = reconcile(reconciler, changed, clock=1005.0)
    claimed = app["status"]["stableRevision"]
    assert claimed != first and runner_revision(kube) == claimed
    assert (app["status"]["rollout"]["strategy"], app["status"]["rollout"]["phase"]) == ("restart", "Complete")
    assert "a driver is starting" in app["status"]["rollout"]["message"]
    assert ("Pod", POD) not in kube.deleted

    driver.revision = first  # it came up on what it had read
    app = reconcile(reconciler, app, clock=1010.0)
    assert ("Pod", POD) in kube.deleted, "the driver behind the claimed revision is restarted"
    restarted = [message for _, reason, message in app["events"] if reason == "DriverRestarted"]
    assert restarted and first in restarted[0] and claimed in restarted[0], app["events"]
    assert app["status"]["stableRevision"] == claimed and runner_revision(kube) == claimed

    driver_pod_started(kube)  # spark-operator's new pod reads the runner config: the claimed revision
    driver.revision = claimed
    kube.deleted.clear()
    app = reconcile(reconciler, app, clock=1015.0)
    assert kube.deleted == [] and app["status"]["stableRevision"] == claimed


def test_a_driver_on_a_revision_with_the_same_pipeline_is_left_alone(world) -> None:
    """A revision adopted without a rollout (nothing the driver runs changed) is not a reason to restart."""
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    first = app["status"]["stableRevision"]
    driver_pod_started(kube)
    driver.revision = first
    bigger = app_manifest("word != ''")
    bigger["spec"]["checkpoint"]["size"] = "2Gi"  # a new revision, nothing the driver runs
    app = reconcile(reconciler, bigger | {"status": app["status"]}, clock=1005.0)
    stable = app["status"]["stableRevision"]
    assert stable != first and runner_revision(kube) == stable, "adopted without a rollout"
    app = reconcile(reconciler, app, clock=1010.0)
    assert ("Pod", POD) not in kube.deleted, (first, stable, app["events"])
