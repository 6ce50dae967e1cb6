"""The executor autoscaler against the simulated plant: load steps, noise, drops, limits, restarts."""

from __future__ import annotations

import itertools
import math

import pytest

from sluice.operator.autoscaler import AutoscalerState, Policy, autoscaler_status, decide_scaling, evaluate, observe
from sluice.operator.autoscaler.state import DecisionRecord
from sluice.operator.model import AutoscalingSpec, ExecutorsSpec
from sluice.testbed.autoscaler_plant import (
    EPOCH,
    InputRate,
    Plant,
    Timeline,
    constant,
    noisy,
    simulate,
    step,
)

RATE_PER_EXECUTOR = 1000.0  # the plant's default: one core per executor, 1000 records/s per core
LOAD = 1400.0  # 2 executors at the default 70% utilization
CHANGE_AT = 600.0


def policy_of(**spec: object) -> Policy:
    return Policy.from_spec(AutoscalingSpec(enabled=True, **spec))


def needed(rate: float, utilization: float = 0.7) -> int:
    return math.ceil(rate / (utilization * RATE_PER_EXECUTOR))


def run(
    load: InputRate,
    executors: int,
    duration: float,
    policy: Policy | None = None,
    low: int = 1,
    high: int = 20,
    restarts: frozenset[float] = frozenset(),
    **plant: object,
) -> Timeline:
    return simulate(
        Plant(load, executors, **plant),
        policy or policy_of(),
        ExecutorsSpec(instances=executors, min=low, max=high),
        duration,
        restarts,
    )


def assert_counts_follow_changes(timeline: Timeline) -> None:
    """Every change starts from the previous one's target: no hidden jumps."""
    targets = [m.decision.from_executors for m in timeline.changes]
    assert targets[1:] == [m.decision.target for m in timeline.changes][:-1]


def test_a_4x_step_settles_in_two_decisions_within_one_executor_of_the_need():
    timeline = run(step(LOAD, 4 * LOAD, CHANGE_AT), executors=2, duration=3600)
    changes = timeline.changes
    assert 1 <= len(changes) <= 2
    assert all(m.decision.kind == "up" and m.time > CHANGE_AT for m in changes)
    final = timeline.moments[-1]
    assert needed(4 * LOAD) <= final.decision.target <= needed(4 * LOAD) + 1
    assert max(timeline.targets()) == final.decision.target  # never above where it settled
    assert final.backlog == 0
    assert "backlog" in changes[0].decision.reason and "rec/s per executor" in changes[0].decision.reason
    assert_counts_follow_changes(timeline)


@pytest.mark.parametrize("trigger", [5.0, 10.0, 20.0, 30.0])
def test_a_4x_step_with_micro_batches_settles_in_two_decisions_within_one_executor_of_the_need(trigger):
    # Batches read everything available and commit at the end: after the step they run long, busy all the time,
    # and the backlog swings by a batch's records from poll to poll. With 10 s it went 2 → 4 → 8 → 10 → 8.
    timeline = run(step(LOAD, 4 * LOAD, CHANGE_AT), executors=2, duration=3600, trigger=trigger)
    changes = timeline.changes
    assert 1 <= len(changes) <= 2
    assert all(m.decision.kind == "up" and m.time > CHANGE_AT for m in changes)
    final = timeline.moments[-1]
    assert needed(4 * LOAD) <= final.decision.target <= needed(4 * LOAD) + 1
    assert max(timeline.targets()) == final.decision.target
    assert final.backlog <= 4 * LOAD * trigger * (1 + 0.7)  # only what waits for the next trigger
    assert_counts_follow_changes(timeline)


def test_a_saturated_executor_whose_batches_outlast_the_samples_looks_busy_and_scales_up():
    # The bug seen on pods: a 10 s trigger, batches that read everything and run 30 s and more, 5 s samples.
    # Per-sample clamped busy time said ~17% and progress-based offsets said no backlog: it held at 1.
    plant, policy = Plant(constant(2_000), 1, trigger=10.0), policy_of(interval="5s")
    state = observe(AutoscalerState(), plant.status(), policy)
    for now in range(5, 125, 5):  # batches 10-30 s, 30-70 s, 70-150 s
        plant.advance(now)
        state = observe(state, plant.status(), policy)
    window = [s for s in state.samples if s.time > EPOCH + 60]
    assert all(s.busy == pytest.approx(1.0) for s in window)
    evaluation = evaluate(window, policy.target_utilization, policy.target_lag)
    assert evaluation.utilization == pytest.approx(1.0)
    assert evaluation.input_rate == pytest.approx(2_000)  # what arrives, not what the batches read
    assert evaluation.rate_per_executor == pytest.approx(RATE_PER_EXECUTOR)
    assert evaluation.backlog > 2_000 * 40 and evaluation.needed_executors >= needed(2_000)

    # The step comes after the warm-up that follows the start (stabilization), as a step in a running app.
    timeline = run(step(300, 2_000, 120), executors=1, duration=1800, policy=policy, trigger=10.0)
    assert timeline.changes and timeline.changes[0].decision.kind == "up"
    final = timeline.moments[-1]
    assert final.decision.target == needed(2_000) and max(timeline.targets()) <= needed(2_000) + 1
    assert final.backlog <= 2_000 * 10 * (1 + 0.7)  # only what waits for the next trigger
    assert_counts_follow_changes(timeline)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_20_percent_noise_on_a_steady_load_changes_nothing(seed):
    steady = 0.65 * 4 * RATE_PER_EXECUTOR  # needs 3.7 executors: without the dead band, +8% would add one
    timeline = run(noisy(constant(steady), 0.2, seed), executors=4, duration=3600)
    assert timeline.changes == []
    assert {m.decision.target for m in timeline.moments} == {4}


@pytest.mark.parametrize("window", ["3m", "5m"])
def test_a_drop_to_a_quarter_scales_down_after_the_delay_to_the_right_count(window):
    policy = policy_of(scaleDownWindow=window)
    timeline = run(step(4 * LOAD, LOAD, CHANGE_AT), executors=8, duration=2400, policy=policy)
    changes = timeline.changes
    assert changes and all(m.decision.kind == "down" for m in changes)
    assert changes[0].time >= CHANGE_AT + policy.scale_down_window
    assert timeline.moments[-1].decision.target == needed(LOAD)
    assert "largest recommendation over" in changes[0].decision.reason


def test_an_over_provisioned_start_scales_down_only_once_recommendations_cover_the_window():
    policy = policy_of()
    timeline = run(constant(LOAD), executors=8, duration=1200, policy=policy)
    first_recommendation = policy.stabilization + policy.metrics_window  # the first full window after the warm-up
    assert timeline.changes[0].time >= first_recommendation + policy.scale_down_window - policy.slack
    early = next(m.decision.reason for m in timeline.moments if m.time == first_recommendation + 20)
    assert early.endswith("scale-down to 2 waits for 5m of recommendations (20s so far)")


def test_held_scale_down_says_what_it_waits_for():
    timeline = run(step(4 * LOAD, LOAD, CHANGE_AT), executors=8, duration=800)
    reasons = [m.decision.reason for m in timeline.moments if m.time > CHANGE_AT + 60]
    assert any("recommended within the last 5m" in r for r in reasons)


def test_executor_bounds_are_respected():
    up = run(step(LOAD, 4 * LOAD, CHANGE_AT), executors=2, duration=2400, high=6)
    assert max(up.targets()) == 6
    assert "capped at executors.max 6" in up.changes[-1].decision.reason
    down = run(step(4 * LOAD, LOAD, CHANGE_AT), executors=8, duration=2400, low=4)
    assert min(down.targets()) == 4
    assert down.moments[-1].decision.target == 4


def test_a_count_outside_the_bounds_is_corrected_at_once():
    policy = policy_of()
    just_scaled = AutoscalerState(last_change=DecisionRecord(EPOCH, 4, 6, "up", "4 → 6: ..."))
    shrunk = decide_scaling(policy, ExecutorsSpec(instances=3, min=1, max=3), just_scaled, EPOCH + 10)
    assert (shrunk.from_executors, shrunk.target, shrunk.kind) == (6, 3, "down")
    assert shrunk.reason == "6 → 3: executors.max is 3"
    grown = decide_scaling(policy, ExecutorsSpec(instances=1, min=2, max=10), AutoscalerState(), EPOCH)
    assert (grown.target, grown.reason) == (2, "1 → 2: executors.min is 2")


@pytest.mark.parametrize("max_step", [1, 2])
def test_max_step_is_respected(max_step):
    timeline = run(step(LOAD, 4 * LOAD, CHANGE_AT), executors=2, duration=3600, policy=policy_of(maxStep=max_step))
    steps = [m.decision.target - m.decision.from_executors for m in timeline.changes]
    assert steps and max(steps) == max_step
    assert timeline.moments[-1].decision.target >= needed(4 * LOAD)
    assert f"maxStep {max_step} toward" in timeline.changes[0].decision.reason


def test_cooldowns_are_respected():
    policy = policy_of(
        stabilization="10s",
        metricsWindow="30s",
        scaleUpCooldown="2m",
        scaleDownCooldown="4m",
        scaleDownWindow="1m",
        maxStep=1,
    )
    load = step(LOAD, 4 * LOAD, CHANGE_AT)
    timeline = run(lambda t: load(t) if t < 2400 else LOAD, executors=2, duration=4800, policy=policy)
    changes = timeline.changes
    kinds = {m.decision.kind for m in changes}
    assert kinds == {"up", "down"}
    for before, after in itertools.pairwise(changes):
        cooldown = policy.scale_up_cooldown if after.decision.kind == "up" else policy.scale_down_cooldown
        assert after.time - before.time >= cooldown
    assert any("waits for the cooldown" in m.decision.reason for m in timeline.moments)


def test_an_ineffective_scale_up_stops_scale_ups_and_says_why():
    timeline = run(step(LOAD, 4 * LOAD, CHANGE_AT), executors=2, duration=2400, sink_limit=3000.0)
    ups = timeline.changes
    last = timeline.moments[-1]
    assert last.backlog > 1_000_000  # the sink cannot keep up, whatever the executors
    assert len(ups) == 2 and last.decision.target == ups[-1].decision.target < 20
    blocked = last.decision.scale_up_blocked
    assert blocked and blocked.startswith(
        f"{ups[-1].decision.from_executors} → {ups[-1].decision.target} raised capacity by 0 rec/s of the"
    )
    assert "scale-up blocked" in last.decision.reason
    assert "scale-up blocked" in (autoscaler_status(timeline.final_state, last.decision).message or "")


def test_a_spec_change_lifts_an_ineffective_scale_up_block():
    plant = Plant(step(LOAD, 4 * LOAD, CHANGE_AT), 2, sink_limit=3000.0)
    policy, bounds = policy_of(), ExecutorsSpec(instances=2, min=1, max=20)
    state = simulate(plant, policy, bounds, 2400).final_state
    assert state.scale_up_blocked
    assert decide_scaling(policy, bounds, state, EPOCH + 2400).kind == "hold"
    wider = ExecutorsSpec(instances=2, min=1, max=30)
    assert decide_scaling(policy, wider, state, EPOCH + 2400).kind == "up"


def test_useful_tasks_cap_the_target_and_the_reason_names_the_source_partitions():
    timeline = run(step(LOAD, 4 * LOAD, CHANGE_AT), executors=2, duration=2400, partitions=6)
    assert max(timeline.targets()) == 6
    reason = timeline.changes[-1].decision.reason
    assert "6 Kafka source tasks ÷ 1 core keep only 6 busy; more needs minPartitions" in reason


def test_useful_tasks_of_a_stateful_pipeline_are_its_state_partitions():
    timeline = run(
        step(2 * LOAD, 8 * LOAD, CHANGE_AT),
        executors=2,
        duration=2400,
        cores_per_executor=2,
        rate_per_core=500.0,
        partitions=4,
        shuffle_partitions=10,
    )
    assert max(timeline.targets()) == 5
    assert (
        "10 shuffle (state) partitions ÷ 2 cores keep only 5 busy; more needs more state partitions"
        in timeline.changes[-1].decision.reason
    )


@pytest.mark.parametrize(
    "restarts",
    [frozenset({CHANGE_AT + 30, CHANGE_AT + 140, 1000.0}), frozenset(float(t) for t in range(10, 3601, 10))],
    ids=["a few restarts", "a restart every poll"],
)
def test_restarts_keep_the_history_and_the_decisions(restarts):
    def scenario(restart_at: frozenset[float]) -> Timeline:
        load = step(LOAD, 4 * LOAD, CHANGE_AT)
        return run(lambda t: load(t) if t < 2000 else LOAD, executors=2, duration=3600, restarts=restart_at)

    undisturbed, restarted = scenario(frozenset()), scenario(restarts)
    assert [m.decision for m in restarted.moments] == [m.decision for m in undisturbed.moments]
    assert restarted.final_state == undisturbed.final_state
    assert len(undisturbed.changes) >= 3


def test_state_survives_json_mid_window():
    state = run(step(LOAD, 4 * LOAD, CHANGE_AT), executors=2, duration=CHANGE_AT + 40).final_state
    assert state.samples and state.recommendations and state.last_change
    assert AutoscalerState.from_json(state.to_json()) == state
