"""What a pass sees of an app's drivers (I/O, reads only): each SparkApplication's state, its driver pod and,
while spark-operator says the driver runs, the driver's own GET /v1/status."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sluice.api.contract import DriverStatus
from sluice.api.times import parse_time

from . import names
from . import spark_application as sparkapp
from .cluster import Cluster
from .driver_client import DriverClient, DriverUnavailable
from .rollout import DriverFacts
from .rollout.decide import driver_facts
from .status import Observation, driver_failure, driver_unschedulable

log = logging.getLogger("sluice.operator")


@dataclass
class Drivers:
    """The app's drivers as this pass found them: facts for the rollout, control API addresses."""

    facts: dict[str, DriverFacts] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    lost_submissions: list[str] = field(default_factory=list)  # driver pods, as lost_submission finds them


def submitted_executors(spark_app: dict[str, Any] | None, submitted: str) -> int | None:
    """The executor count a running SparkApplication was submitted with, as recorded on it (a hand edit of
    its spec is repaired back to it): changing it would make spark-operator resubmit. A driver resubmitted
    for another revision (a restart) starts with today's count (None)."""
    if spark_app is None or sparkapp.submitted_revision(spark_app) != submitted:
        return None
    recorded = (spark_app["metadata"].get("annotations") or {}).get(names.SUBMITTED_EXECUTORS_ANNOTATION, "")
    return int(recorded) if recorded.isdigit() else None


def replaced(pod: dict[str, Any] | None, submitted: str | None) -> bool:
    """A driver pod on its way out: being deleted, or started for another submission than the SparkApplication's
    (spark-operator is replacing it)."""
    meta = (pod or {}).get("metadata") or {}
    ran = (meta.get("annotations") or {}).get(names.SUBMITTED_REVISION_ANNOTATION)
    return bool(meta.get("deletionTimestamp")) or (ran is not None and submitted is not None and ran != submitted)


LOST_SUBMISSION_SECONDS = 60.0  # spark-operator deletes the old driver pod before it submits: one this old is new


def lost_submission(spark_app: dict[str, Any], pod: dict[str, Any] | None, now: float) -> str | None:
    """The driver pod of a SparkApplication spark-operator keeps in PENDING_RERUN though it submitted it: the
    status write that should have followed the submission was lost (a conflicting write of the object at that
    moment), and spark-operator waits for the pod it started to go (kubeflow/spark-operator#2905, #2283). It is
    a pod of the SparkApplication's name that has run for LOST_SUBMISSION_SECONDS; None otherwise."""
    state = (((spark_app.get("status") or {}).get("applicationState")) or {}).get("state")
    meta = (pod or {}).get("metadata") or {}
    if state != "PENDING_RERUN" or not meta.get("creationTimestamp") or meta.get("deletionTimestamp"):
        return None
    if ((pod or {}).get("status") or {}).get("phase") not in ("Pending", "Running"):
        return None
    try:
        age = now - parse_time(meta["creationTimestamp"])
    except ValueError:
        return None
    return str(meta.get("name")) if age >= LOST_SUBMISSION_SECONDS else None


class Observer:
    def __init__(self, cluster: Cluster, driver_client: DriverClient) -> None:
        self.cluster = cluster
        self.driver_client = driver_client

    def app_driver(
        self, spark_app: dict[str, Any] | None, namespace: str, obs: Observation, now: float | None = None
    ) -> None:
        """The app's driver, into `obs`: spark-operator's state, executors, the driver's answer or why not, and a
        driver pod spark-operator lost the submission of (lost_submission)."""
        if obs.suspended or spark_app is None:
            return
        status = spark_app.get("status") or {}
        obs.spark_state = (status.get("applicationState") or {}).get("state")
        if obs.spark_state == "PENDING_RERUN" and now is not None:
            pod = self.cluster.get("v1", "Pod", namespace, f"{spark_app['metadata']['name']}-driver")
            obs.lost_submission = lost_submission(spark_app, pod, now)
        obs.spark_error = (status.get("applicationState") or {}).get("errorMessage")
        executors = status.get("executorState") or {}
        if executors:
            obs.executors = sum(1 for s in executors.values() if s == "RUNNING")
        if not (status.get("driverInfo") or {}).get("podName"):
            return
        pod, answer, address, obs.driver_error = self.ask_driver(
            namespace, status, sparkapp.submitted_revision(spark_app)
        )
        if answer is not None:
            obs.driver, obs.driver_address = answer, address
            return
        obs.driver_failure = driver_failure(pod)  # not answering: failed at start, or its pod restarted
        obs.driver_unschedulable = driver_unschedulable(pod)

    def second_driver(
        self, namespace: str, name: str, spark_app: dict[str, Any] | None, drivers: Drivers, now: float
    ) -> None:
        """A handover's second driver, as the rollout sees it (the app's own is observed with the status), and its
        driver pod if spark-operator lost its submission (lost_submission)."""
        if spark_app is None:
            return
        status = spark_app.get("status") or {}
        state = (status.get("applicationState") or {}).get("state")
        if state == "PENDING_RERUN":
            lost = lost_submission(spark_app, self.cluster.get("v1", "Pod", namespace, f"{name}-driver"), now)
            if lost is not None:
                drivers.lost_submissions.append(lost)
        pod, answer, address, _ = self.ask_driver(namespace, status, sparkapp.submitted_revision(spark_app))
        if address is not None:
            drivers.addresses[name] = address
        restarts = int(status.get("executionAttempts") or 0)
        failure = driver_failure(pod)
        submitted = sparkapp.submitted_revision(spark_app) or ""
        drivers.facts[name] = driver_facts(name, submitted, state, restarts, answer, failure)

    def ask_driver(
        self, namespace: str, spark_status: dict[str, Any], submitted: str | None
    ) -> tuple[dict[str, Any] | None, DriverStatus | None, str | None, str | None]:
        """A SparkApplication's driver pod and, while spark-operator says it runs, its /v1/status: (pod, status,
        control address, why it did not answer). `submitted`: the revision the SparkApplication is submitted for;
        a pod of an earlier submission (being replaced) or one being deleted is not asked."""
        pod_name = (spark_status.get("driverInfo") or {}).get("podName")
        pod = self.cluster.get("v1", "Pod", namespace, pod_name) if pod_name else None
        pod_ip = ((pod or {}).get("status") or {}).get("podIP")
        state = (spark_status.get("applicationState") or {}).get("state")
        if (state or "").upper() != "RUNNING" or not pod_ip or replaced(pod, submitted):
            return pod, None, None, None
        address = self.driver_client.address(pod_ip, names.CONTROL_PORT)
        try:
            return pod, self.driver_client.status(address), address, None
        except DriverUnavailable as exc:
            log.debug("driver %s in %s not available: %s", pod_name, namespace, exc)
            return pod, None, None, str(exc)
