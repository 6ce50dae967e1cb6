"""Fakes at the reconciler's I/O seam: the API server's objects (FakeKube) and a driver's control API
(FakeDriver), for unit tests of whole reconcile passes. Real components are in test_operator_cluster.py and the
e2e suite."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import yaml

from sluice.api.contract import (
    RUNNER_CONFIG_FILE,
    DriverStatus,
    ExecutorsResponse,
    ExecutorStatus,
    QueryStatus,
    RunnerConfig,
    SwapRequest,
    SwapResponse,
)
from sluice.operator import names
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
        self.patches: list[tuple[str, str, str | None, dict[str, Any]]] = []
        self.access_reviews: list[dict[str, Any]] = []

    def apply(self, body: dict[str, Any], field_manager: str) -> dict[str, Any]:
        key = (body["kind"], body["metadata"].get("namespace"), body["metadata"]["name"])
        kept = {k: v for k, v in self.objects.get(key, {}).items() if k == "status"}
        self.objects[key] = {**copy.deepcopy(body), **kept}
        return self.objects[key]

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        if body["kind"] == "SelfSubjectAccessReview":  # asked, not stored: every right is held here
            self.access_reviews.append(body["spec"])
            return {**body, "status": {"allowed": True}}
        key = (body["kind"], body["metadata"].get("namespace"), body["metadata"]["name"])
        if key in self.objects:
            raise KubeError(409, "exists")
        stored = copy.deepcopy(body)
        if "stringData" in stored:  # as the API server stores a Secret
            text = stored.pop("stringData")
            stored["data"] = {k: base64.b64encode(v.encode()).decode() for k, v in text.items()}
        self.objects[key] = stored
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

    def patch(
        self, api_version: str, kind: str, namespace: str | None, name: str, patch: dict, sub: str | None = None
    ) -> dict[str, Any]:
        """A merge patch, recorded (the status writes a pass makes)."""
        self.patches.append((kind, name, sub, copy.deepcopy(patch)))
        target = self.objects[(kind, namespace, name)]
        merge_patch(target, patch)
        return target

    def delete(self, api_version: str, kind: str, namespace: str | None, name: str) -> None:
        if self.objects.pop((kind, namespace, name), None) is not None:
            self.deleted.append((kind, name))


def merge_patch(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """RFC 7386, as the API server applies it: objects merge key by key, null removes, anything else replaces."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge_patch(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeDriver:
    """The driver's control API: not answering (revision None) or answering that it runs `revision`, with
    `executors` live executors and the target last asked. Writes are recorded."""

    def __init__(self) -> None:
        self.revision: str | None = None
        self.executors = 1
        self.target: int | None = None
        self.swaps: list[SwapRequest] = []
        self.executor_requests: list[int] = []

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
            queries=[
                QueryStatus(name=name, active=True, revision=self.revision, runBatches=5)
                for name in ("out", "lines-dead-letters")
            ],
            executors=[ExecutorStatus(id=str(i)) for i in range(self.executors)],
            executorTarget=self.target,
        )

    def swap(self, address: str, token: str, request: SwapRequest) -> SwapResponse:
        self.swaps.append(request)
        self.revision = request.config.revision
        restarted = [s.name for s in request.steps if s.action == "restart"]
        kept = [s.name for s in request.steps if s.action == "keep"]
        return SwapResponse(revision=self.revision, restarted=restarted, kept=kept, tookMs=5)

    def set_executors(self, address: str, token: str, target: int) -> ExecutorsResponse:
        self.executor_requests.append(target)
        previous, self.target, self.executors = self.executors, target, target
        return ExecutorsResponse(target=target, previous=previous)


def app_manifest(filter_: str) -> dict[str, Any]:
    app = yaml.safe_load((REPO_ROOT / "pipelines" / "examples" / "wordcount.yaml").read_text())
    app["metadata"].update(namespace=NAMESPACE, generation=1, uid="u-1")
    for topic in app["spec"]["topics"]:
        topic["management"] = "none"  # no Kafka here: the topics are not the subject
    app["spec"]["checkpoint"] = {"location": "/checkpoints"}  # on a claim the operator makes
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
    data = kube.objects[("ConfigMap", NAMESPACE, names.runner_configmap_name(APP))]["data"][RUNNER_CONFIG_FILE]
    return RunnerConfig.model_validate_json(data).revision


def reconcile(reconciler: Reconciler, app: dict[str, Any], clock: float) -> dict[str, Any]:
    """One pass over `app` as the API server stores it (a write in the pass lands there); `app` gets the pass's
    status and events."""
    kube: FakeKube = reconciler.kube  # type: ignore[assignment]
    stored = {k: v for k, v in app.items() if k != "events"}
    kube.objects[("StreamingApp", app["metadata"]["namespace"], app["metadata"]["name"])] = copy.deepcopy(stored)
    outcome = reconciler.reconcile(app, clock=clock)
    app["status"] = json.loads(json.dumps(outcome.status))
    app["events"] = outcome.events
    return app
