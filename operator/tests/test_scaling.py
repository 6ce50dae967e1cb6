"""The operator's scaling step (sluice.operator.autoscaler.plan): who sets the live count, and to what.
Driven through the simulated plant's driver answers, with the autoscaler's state kept in annotations as on
the resource."""

from __future__ import annotations

from pathlib import Path

import yaml

from sluice.api.times import parse_time
from sluice.operator.autoscaler import AutoscalerState
from sluice.operator.autoscaler.plan import (
    INSTANCES_ANNOTATION,
    SCALING_STATE_ANNOTATION,
    needs_executor_request,
    plan_scaling,
)
from sluice.operator.model import StreamingAppSpec
from sluice.testbed.autoscaler_plant import EPOCH, Plant, constant, step

EXAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "frequency-count.yaml"
FAST = {
    "enabled": True,
    "interval": "10s",
    "metricsWindow": "30s",
    "stabilization": "30s",
    "scaleUpCooldown": "30s",
    "scaleDownCooldown": "1m",
    "scaleDownWindow": "2m",
    "maxStep": 4,
}


def spec_with(instances: int = 1, low: int = 1, high: int = 8, **autoscaling: object) -> StreamingAppSpec:
    raw = yaml.safe_load(EXAMPLE.read_text())["spec"]
    raw["executors"] = {"instances": instances, "min": low, "max": high}
    raw["autoscaling"] = {**FAST, **autoscaling}
    return StreamingAppSpec.model_validate(raw)


def drive(
    spec: StreamingAppSpec, plant: Plant, seconds: float, annotations: dict[str, str] | None = None, tick: float = 5.0
) -> tuple[dict[str, str], list[tuple[float, list[str], int | None]]]:
    """Ticks of the operator against the plant: the plan's count is realized like the driver would."""
    annotations = dict(annotations or {})
    history = []
    end = plant.time + seconds
    while plant.time < end:
        plant.advance(plant.time + tick)
        plan = plan_scaling(spec, annotations, plant.status(), EPOCH + plant.time, periodic=True)
        annotations.update(plan.annotations)
        if plan.desired is not None and plan.desired != plant.target:
            plant.set_executors(plan.desired)
        history.append((plant.time, [message for _, _, message in plan.events], plan.desired))
    return annotations, history


def test_manual_scaling_is_the_spec_count():
    spec = spec_with(instances=3, enabled=False)
    plan = plan_scaling(spec, {}, Plant(constant(100), 3).status(), EPOCH, periodic=True)
    assert (plan.desired, plan.status["scaling"], plan.annotations) == (3, "manual", {})


def test_the_tick_scales_up_a_load_step_and_says_why_in_numbers():
    spec = spec_with()
    plant = Plant(step(500, 2000, at=120), 1)
    plant.set_executors(1)
    annotations, history = drive(spec, plant, 420)
    changes = [(t, messages) for t, messages, _ in history if messages]
    assert changes, "the 4x step must scale up"
    first_time, first = changes[0]
    assert first_time > 120 and first[0].startswith("1 → ")
    assert "rec/s per executor" in first[0] and "backlog" in first[0]
    assert plant.target is not None and plant.target >= 3
    assert SCALING_STATE_ANNOTATION in annotations and annotations[INSTANCES_ANNOTATION] == "1"


def test_other_passes_ask_for_the_stored_count_without_deciding():
    spec = spec_with()
    plant = Plant(step(500, 2000, at=60), 1)
    plant.set_executors(1)
    annotations, _ = drive(spec, plant, 300)
    plan = plan_scaling(spec, annotations, plant.status(), EPOCH + plant.time, periodic=False)
    assert plan.desired == plant.target and plan.annotations == {} and plan.events == []
    assert plan.status["autoscaler"]["lastDecision"]["to"] == plant.target


def test_kubectl_scale_while_autoscaling_is_a_new_starting_point():
    spec = spec_with(instances=1)
    plant = Plant(constant(500), 1)
    plant.set_executors(1)
    annotations, _ = drive(spec, plant, 120)
    scaled = spec_with(instances=4)
    plan = plan_scaling(scaled, annotations, plant.status(), EPOCH + plant.time, periodic=True)
    assert plan.desired == 4
    assert "kubectl scale" in plan.events[0][2] and plan.kinds[0] == "manual"
    assert plan.annotations[INSTANCES_ANNOTATION] == "4"
    plant.set_executors(4)
    later = plan_scaling(scaled, plan.annotations, plant.status(), EPOCH + plant.time + 5, periodic=True)
    assert later.desired == 4 and not later.events, "the nudge starts the cooldowns: no change right after"


def test_a_kubectl_scale_beyond_the_bounds_is_clamped():
    spec = spec_with(instances=1, low=1, high=3)
    annotations = {INSTANCES_ANNOTATION: "1"}
    nudged = spec_with(instances=3, low=2, high=3)
    plan = plan_scaling(nudged, annotations, None, EPOCH, periodic=True)
    assert plan.desired == 3
    assert plan_scaling(spec, {}, None, EPOCH, periodic=True).desired == 1


def test_a_decision_is_never_older_than_the_driver_answer_it_was_made_on():
    """The driver's clock stamps samples, the operator's the decisions: a change made on an answer stamped
    later than the operator's `now` must still be newer than that answer's sample."""
    spec = spec_with()
    plant = Plant(step(500, 2000, at=60), 1)
    plant.set_executors(1)
    annotations, _ = drive(spec, plant, 300)
    late_now = EPOCH + plant.time - 3  # the operator's clock 3 s behind the driver's
    plan = plan_scaling(spec, annotations, plant.status(), late_now, periodic=True)
    state = AutoscalerState.from_json(plan.annotations[SCALING_STATE_ANNOTATION])
    assert state.last_decision is not None
    assert state.last_decision.time >= parse_time(plant.status().observedAt)


def test_the_driver_is_asked_again_when_it_runs_more_executors_than_its_target():
    plant = Plant(constant(100), 2)
    plant.set_executors(1)  # the plant keeps target 1 with 2 working until told
    plant.executors, plant.target = 2, 1
    assert needs_executor_request(plant.status(), 1), "one executor too many must be removed"
    plant.executors = 1
    assert not needs_executor_request(plant.status(), 1)
    assert needs_executor_request(plant.status(), 3), "a scale-up is asked once"
    plant.target = None
    assert needs_executor_request(plant.status(), 1), "a restarted driver (no target) gets the count again"
