"""The observer's readings (observer.py): pure, and a handover's second driver over a fake API server."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import NAMESPACE, FakeDriver, FakeKube

from sluice.operator.cluster import Cluster
from sluice.operator.observer import LOST_SUBMISSION_SECONDS, Drivers, Observer, lost_submission

CREATED = 1000.0  # 1970-01-01T00:16:40Z


def spark_app(state: str) -> dict[str, Any]:
    return {"metadata": {"name": "wordcount"}, "status": {"applicationState": {"state": state}}}


def pod(phase: str = "Running", deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "wordcount-driver", "creationTimestamp": "1970-01-01T00:16:40Z"}
    if deleting:
        meta["deletionTimestamp"] = "1970-01-01T00:20:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def test_a_driver_pod_that_runs_long_in_pending_rerun_is_a_lost_submission() -> None:
    later = CREATED + LOST_SUBMISSION_SECONDS
    assert lost_submission(spark_app("PENDING_RERUN"), pod(), later) == "wordcount-driver"
    assert lost_submission(spark_app("PENDING_RERUN"), pod("Pending"), later) == "wordcount-driver"


@pytest.mark.parametrize(
    ("state", "the_pod", "age"),
    [
        ("PENDING_RERUN", pod(), LOST_SUBMISSION_SECONDS - 1),  # spark-operator may still record it
        ("RUNNING", pod(), 600),
        ("SUBMITTED", pod(), 600),
        ("PENDING_RERUN", None, 600),  # gone: spark-operator submits
        ("PENDING_RERUN", pod(deleting=True), 600),
        ("PENDING_RERUN", pod("Failed"), 600),  # an old attempt's pod spark-operator deletes itself
    ],
)
def test_anything_else_is_not(state: str, the_pod: dict[str, Any] | None, age: float) -> None:
    assert lost_submission(spark_app(state), the_pod, CREATED + age) is None


def test_a_handover_s_second_driver_spark_operator_lost_the_submission_of_is_found() -> None:
    kube = FakeKube()
    kube.objects[("Pod", NAMESPACE, "wordcount-driver")] = pod()
    observer = Observer(Cluster(kube), FakeDriver())  # type: ignore[arg-type]
    found, early = Drivers(), Drivers()
    observer.second_driver(NAMESPACE, "wordcount", spark_app("PENDING_RERUN"), found, CREATED + 600)
    observer.second_driver(NAMESPACE, "wordcount", spark_app("PENDING_RERUN"), early, CREATED + 30)
    assert found.lost_submissions == ["wordcount-driver"]
    assert early.lost_submissions == []
    assert "wordcount" in found.facts, "the second driver is observed as before"
