"""The scaling decision realized (I/O): the running driver is asked for the desired executor count through its
control API (PUT /v1/executors) when it runs another one."""

from __future__ import annotations

import logging

from .. import names
from ..cluster import Cluster
from ..driver_client import DriverClient, DriverUnavailable
from ..status import Observation
from .plan import ScalingPlan, needs_executor_request

log = logging.getLogger("sluice.operator")


def realize_scaling(
    cluster: Cluster, driver_client: DriverClient, namespace: str, app: str, obs: Observation, plan: ScalingPlan
) -> list[tuple[str, str, str]]:
    """Ask the driver for the desired count when it runs another one (after a restart it runs none: the count is
    re-asserted); the events to post."""
    if obs.driver is None or obs.driver_address is None or plan.desired is None:
        return []
    if not needs_executor_request(obs.driver, plan.desired):
        return []
    token = cluster.control_token(namespace, app)
    if token is None:
        return [("Warning", "ScaleFailed", f"no control token in Secret {names.control_secret_name(app)}")]
    try:
        answer = driver_client.set_executors(obs.driver_address, token, plan.desired)
    except DriverUnavailable as exc:
        cluster.forget_token(namespace, app)  # a rotated Secret is read again next time
        return [("Warning", "ScaleFailed", str(exc)[:1000])]
    log.info("%s/%s: executors %s -> %s", namespace, app, answer.previous, answer.target)
    if plan.events or answer.previous == answer.target:
        return []  # the decision's own event says why
    why = (
        "the driver started without a target: the desired count is re-asserted"
        if obs.driver.executorTarget is None
        else f"spec.executors.instances is {answer.target}"
    )
    return [("Normal", "Scaled", f"{answer.previous} → {answer.target}: {why}")]
