"""The autoscaler's pieces on their own: samples from driver statuses, the evaluation's formulas, the stored
state, the decision's window rules and texts."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from sluice.api.contract import DriverStatus, ExecutorStatus, QueryStatus, TopicStatus
from sluice.operator.autoscaler import (
    AutoscalerState,
    Policy,
    Sample,
    ScalingDecision,
    add_sample,
    autoscaler_status,
    decide_scaling,
    evaluate,
    observe,
    record,
    sample_between,
)
from sluice.operator.autoscaler.decide import compact, duration_text
from sluice.operator.autoscaler.state import MAX_RECOMMENDATIONS, MAX_SAMPLES
from sluice.operator.model import AutoscalingSpec, ExecutorsSpec
from sluice.testbed.autoscaler_plant import EPOCH, Plant, constant, noisy, simulate

POLICY = Policy.from_spec(AutoscalingSpec())
BOUNDS = ExecutorsSpec(instances=2, min=1, max=10)


def driver_status(
    seconds: float,
    rows: int,
    busy_ms: int,
    offsets: int,
    backlog: int = 0,
    executors: int = 2,
    run: str = "run-1",
    revision: str = "rev-a",
    stateful: bool = False,
    source_tasks: int = 12,
    shuffle_partitions: int = 200,
) -> DriverStatus:
    return DriverStatus(
        app="app",
        revision=revision,
        observedAt=f"2026-01-01T00:{int(seconds) // 60:02d}:{int(seconds) % 60:02d}Z",
        queries=[
            QueryStatus(
                name="q", runId=run, active=True, inputRows=rows, busyMs=busy_ms, stateful=stateful, topics=["in"]
            )
        ],
        topics=[TopicStatus(topic="in", partitions=12, latestOffsets=offsets, backlog=backlog)],
        backlog=backlog,
        executors=[ExecutorStatus(id=str(i), totalCores=2) for i in range(executors)],
        executorTarget=executors,
        taskSlots=2 * executors,
        sourceTasks=source_tasks,
        shufflePartitions=shuffle_partitions,
    )


def sample(
    time: float = 0.0,
    input_rate: float = 1000.0,
    processed_rate: float = 1000.0,
    busy: float = 0.5,
    backlog: int = 0,
    executors: int = 2,
    duration: float = 10.0,
    tasks: int = 0,
    batch_busy: float | None = None,
    trigger: float = 0.0,
) -> Sample:
    return Sample(
        time=time,
        duration=duration,
        input_rate=input_rate,
        processed_rate=processed_rate,
        busy=busy,
        batch_busy=busy if batch_busy is None else batch_busy,
        trigger_interval=trigger,
        backlog=backlog,
        executors=executors,
        executor_target=executors,
        cores_per_executor=1,
        max_useful_tasks=tasks,
        tasks_limited_by="source" if tasks else "",
    )


# ---------------------------------------------------------------------------------------------- collect


def test_sample_between_two_statuses_gives_rates_over_wall_clock_time():
    got = sample_between(
        driver_status(0, rows=1_000, busy_ms=1_000, offsets=5_000),
        driver_status(10, rows=21_000, busy_ms=6_000, offsets=30_000, backlog=4_000),
    )
    assert got == Sample(
        time=EPOCH + 10,
        duration=10.0,
        input_rate=2500.0,
        processed_rate=2000.0,
        busy=0.5,
        batch_busy=0.5,
        backlog=4_000,
        executors=2,
        executor_target=2,
        cores_per_executor=2,
        max_useful_tasks=12,
        tasks_limited_by="source",
    )


def test_a_stateful_pipeline_can_use_as_many_tasks_as_it_has_state_partitions():
    got = sample_between(driver_status(0, 0, 0, 0, stateful=True), driver_status(10, 10, 10, 10, stateful=True))
    assert got is not None and (got.max_useful_tasks, got.tasks_limited_by) == (200, "shuffle")


def test_a_sample_notes_how_long_the_running_batch_has_run():
    # A batch commits its offsets when it completes: until then the backlog still holds the records it processed.
    def with_queries(status: DriverStatus, running_ms: dict[str, int]) -> DriverStatus:
        query = status.queries[0]
        return status.model_copy(
            update={
                "queries": [
                    query.model_copy(update={"name": name, "runningBatchMs": ms, "completedBusyMs": 0})
                    for name, ms in running_ms.items()
                ]
            }
        )

    earlier = driver_status(0, rows=1_000, busy_ms=1_000, offsets=5_000)
    later = driver_status(10, rows=1_000, busy_ms=11_000, offsets=30_000, backlog=29_000)
    got = sample_between(with_queries(earlier, {"a": 0, "b": 0}), with_queries(later, {"a": 12_500, "b": 2_000}))
    assert got is not None and got.running_batch == 12.5  # the longest running query's
    idle = sample_between(with_queries(earlier, {"a": 0}), with_queries(later, {"a": 0}))
    assert idle is not None and idle.running_batch == 0.0
    older = sample_between(earlier, later)  # a driver from before completedBusyMs does not say
    assert older is not None and older.running_batch is None


@pytest.mark.parametrize(
    "later",
    [
        driver_status(10, rows=500, busy_ms=6_000, offsets=30_000),  # rows went back
        driver_status(10, rows=21_000, busy_ms=900, offsets=30_000),  # busy time went back
        driver_status(10, rows=21_000, busy_ms=6_000, offsets=4_000),  # offsets went back
        driver_status(10, rows=21_000, busy_ms=6_000, offsets=30_000, run="run-2"),  # the query restarted
        driver_status(10, rows=21_000, busy_ms=6_000, offsets=30_000, revision="rev-b"),
        driver_status(0, rows=21_000, busy_ms=6_000, offsets=30_000),  # no time passed
        driver_status(10, rows=21_000, busy_ms=6_000, offsets=30_000, executors=0),
    ],
    ids=["rows", "busy", "offsets", "run", "revision", "time", "executors"],
)
def test_sample_between_is_none_when_no_rate_can_be_computed(later):
    assert sample_between(driver_status(0, rows=1_000, busy_ms=1_000, offsets=5_000), later) is None


def test_observe_skips_the_reading_after_a_driver_restart_and_carries_on():
    readings = [
        driver_status(0, 0, 0, 0),
        driver_status(10, 10_000, 5_000, 10_000),
        driver_status(20, 1_000, 500, 20_000, run="run-2"),
        driver_status(30, 11_000, 5_500, 30_000, run="run-2"),
    ]
    state = AutoscalerState()
    for reading in readings:
        state = observe(state, reading, POLICY)
    assert [s.time - EPOCH for s in state.samples] == [10, 30]


def test_the_queries_start_is_noted_when_first_seen_and_at_each_new_run():
    state = AutoscalerState()
    for seconds, run in ((0, "run-1"), (10, "run-1"), (20, "run-2"), (30, "run-2")):
        state = observe(state, driver_status(seconds, 100 * seconds, 50 * seconds, 100 * seconds, run=run), POLICY)
        assert state.runs_since == EPOCH + (0 if run == "run-1" else 20)
    assert AutoscalerState.from_json(state.to_json()).runs_since == EPOCH + 20
    older = json.loads(state.to_json())
    del older["rb"]  # stored by an operator before this field: no warm-up known, not an unreadable state
    assert AutoscalerState.from_json(json.dumps(older)).counters == state.counters


def test_a_cold_start_is_no_measure_the_samples_of_the_warm_up_are_ignored():
    """A new driver's first batches run on a cold JVM (found on pods: 27 s for a batch that takes 3.6 s warm):
    saturated-looking samples from the warm-up must not scale the app up."""
    cold = [sample(time=EPOCH + t, input_rate=3000, processed_rate=500, busy=1.0) for t in range(10, 70, 10)]
    state = replace(state_with(cold), runs_since=EPOCH)
    assert (
        decide_scaling(POLICY, BOUNDS, state, EPOCH + 50).reason
        == "hold at 2: warming up after the queries started (10s left)"
    )
    assert "collecting samples (0s of 1m)" in decide_scaling(POLICY, BOUNDS, state, EPOCH + 60).reason
    assert decide_scaling(POLICY, BOUNDS, state_with(cold), EPOCH + 60).kind == "up"  # the same samples, no start noted


# --------------------------------------------------------------------------------------------- evaluate


def test_rate_per_executor_is_the_windows_processed_records_over_its_executor_busy_time():
    evaluation = evaluate(
        [
            sample(processed_rate=1000, busy=0.5, executors=2),
            sample(processed_rate=3000, busy=0.75, executors=2),
            sample(processed_rate=10, busy=0.01, executors=2),
        ],
        0.7,
        30,
    )
    assert evaluation.rate_per_executor == pytest.approx((1000 + 3000 + 10) * 10 / ((0.5 + 0.75 + 0.01) * 10 * 2))
    assert evaluation.capacity == pytest.approx(2 * evaluation.rate_per_executor)
    assert evaluation.utilization == pytest.approx((0.5 + 0.75 + 0.01) / 3)


def test_a_batch_longer_than_a_sample_counts_whole_in_the_window():
    # One executor, a 30 s batch of 30k records seen by 5 s samples: its time shows in every sample (busy 1),
    # its records and its completed time only in the last one, whose busy time is also a little late.
    running = [
        sample(time=t, duration=5, processed_rate=0, busy=1.0, batch_busy=0, executors=1) for t in range(5, 30, 5)
    ]
    done = sample(time=30, duration=5, processed_rate=30_000 / 5, busy=1.4, batch_busy=30 / 5, executors=1)
    evaluation = evaluate([*running, done], 0.7, 30)
    assert evaluation.utilization == 1.0
    assert evaluation.rate_per_executor == pytest.approx(1000)
    assert evaluation.processed_rate == pytest.approx(1000)


def test_the_backlog_a_micro_batch_app_always_holds_needs_no_capacity():
    # A 10 s trigger at 1k rec/s holds up to 10 s x (1 + 0.7) of input between batches.
    steady = evaluate([sample(input_rate=1_000, busy=0.5, backlog=15_000, trigger=10)], 0.7, 30)
    assert (steady.waiting, steady.excess_backlog, steady.catch_up_seconds) == (15_000, 0, 0.0)
    assert steady.needed_rate == pytest.approx(1_000 / 0.7)
    behind = evaluate([sample(input_rate=1_000, busy=0.5, backlog=47_000, trigger=10)], 0.7, 30)
    assert behind.needed_rate == pytest.approx(1_000 / 0.7 + (47_000 - 17_000) / 30)


def catching_up(backlog: int, running: float, now: float = 60.0) -> list[Sample]:
    """The simulated step scenario with 10 s micro-batches 4 minutes after the step (5.6k rec/s, now 8
    executors of 1k rec/s): a minute in which batches that read the backlog ran back to back, two of them
    completing (291k records in 36.4 s, then 202k in 25.2 s), and at `now` a batch that has run `running` s."""
    rows = {now - 30: (291_200, 36.4), now - 10: (201_600, 25.2)}
    return [
        replace(
            sample(
                time=t,
                input_rate=5_600,
                processed_rate=rows.get(t, (0, 0))[0] / 10,
                busy=1.0,
                batch_busy=rows.get(t, (0, 0))[1] / 10,
                backlog=backlog,
                executors=8,
                trigger=10,
            ),
            running_batch=running if t == now else 0.0,
        )
        for t in range(int(now) - 50, int(now) + 10, 10)
    ]


def test_the_records_the_running_batch_processed_are_no_backlog_to_catch_up_on():
    # 12 s into a batch of 140k records the simulated plant's backlog read 207k: 67k arrived since the batch
    # began, 97k of its records were processed but not committed, so 110k were still to be processed.
    evaluation = evaluate(catching_up(backlog=207_200, running=12.0), 0.7, 30)
    assert evaluation.rate_per_executor == pytest.approx(1_000)
    assert evaluation.needed_rate == pytest.approx(5_600 / 0.7 + 55_200 / 30)  # was 5.6k / 0.7 + 112k / 30
    assert evaluation.catch_up_seconds == pytest.approx(55_200 / (8_000 - 5_600))  # was 47 s
    assert evaluation.processing == 12 * 8 * 1_000  # its time so far x the capacity
    assert evaluation.waiting == 5_600 * 10  # one trigger interval of input
    assert evaluation.excess_backlog == 207_200 - 96_000 - 56_000
    # What it read bounds it: the backlog less the arrivals since it began (a batch slower than the rate).
    slow = evaluate(catching_up(backlog=207_200, running=30.0), 0.7, 30)
    assert slow.processing == 207_200 - 30 * 5_600
    assert evaluate(catching_up(backlog=207_200, running=0.0), 0.7, 30).processing == 0


def test_a_healthy_micro_batch_app_holds_one_trigger_interval_still_to_process():
    # 1k rec/s, a 10 s trigger, capacity 1k / 0.7: a batch reads 10k records and runs 7 s. At its start 10k are
    # to process; 5 s in, the backlog says 15k (its 10k are committed when it completes) of which 7.1k processed.
    def healthy(backlog: int, running: float) -> Sample:
        return replace(
            sample(input_rate=1_000, processed_rate=1_000, busy=0.7, executors=1, backlog=backlog, trigger=10),
            processed_rate=1_000,
            running_batch=running,
        )

    for backlog, running in ((10_000, 0.0), (15_000, 5.0), (17_000, 7.0)):
        evaluation = evaluate([healthy(backlog, running)], 0.7, 30)
        assert evaluation.excess_backlog == 0
        assert evaluation.needed_rate == pytest.approx(1_000 / 0.7)


def test_a_step_shows_in_the_records_still_to_process_beyond_one_trigger_interval():
    # 30 s micro-batches, 2 executors of 1k rec/s, 1.4k rec/s stepping to 5.6k 10 s ago (the window's mean:
    # 2.1k): the batch that began then has processed 20k of the 46k it read, 56k arrived since. 76.6k to
    # process, 63k of them a trigger interval of input at the mean: 13.6k behind (the simulation's deficit is
    # 36k). Allowing a trigger interval x (1 + target utilization), 107k, as if the backlog were committed
    # records, hid all of it: 3 executors, and a third decision to come after the next.
    window = [sample(time=t, input_rate=1_400, processed_rate=1_400, busy=0.7, trigger=30) for t in range(10, 60, 10)]
    stepped = sample(time=60, input_rate=5_600, processed_rate=0, busy=1.0, batch_busy=0, backlog=96_600, trigger=30)
    evaluation = evaluate([*window, replace(stepped, running_batch=10.0)], 0.7, 30)
    assert (evaluation.input_rate, evaluation.rate_per_executor) == (2_100, pytest.approx(1_000))
    assert (evaluation.processing, evaluation.waiting, evaluation.excess_backlog) == (20_000, 63_000, 13_600)
    assert evaluation.needed_executors == 4  # was 3


def test_needed_executors_cover_the_input_at_target_utilization_plus_the_backlog_within_the_target_lag():
    evaluation = evaluate([sample(input_rate=7_000, processed_rate=2_000, busy=1.0, backlog=300_000)], 0.7, 30)
    assert evaluation.needed_rate == pytest.approx(7_000 / 0.7 + 300_000 / 30)  # 20k rec/s
    assert evaluation.needed_executors == 20  # at 1k rec/s each
    assert evaluation.catch_up_seconds == math.inf  # 2k capacity < 7k input


def test_usable_executors_are_the_tasks_over_the_cores():
    evaluation = evaluate([sample(tasks=12)], 0.7, 30)
    assert evaluation.usable_executors == 12
    assert evaluate([sample()], 0.7, 30).usable_executors is None


def test_catch_up_time_is_the_backlog_over_the_spare_capacity():
    evaluation = evaluate([sample(input_rate=1_000, processed_rate=1_000, busy=0.5, backlog=20_000)], 0.7, 30)
    assert evaluation.catch_up_seconds == pytest.approx(20_000 / (2 * 1000 - 1_000))


def test_without_input_or_backlog_no_executor_is_needed_even_without_a_rate():
    evaluation = evaluate([sample(input_rate=0, processed_rate=0, busy=0)], 0.7, 30)
    assert (evaluation.rate_per_executor, evaluation.needed_executors) == (None, 0)


# ----------------------------------------------------------------------------------------------- decide


def state_with(samples: list[Sample]) -> AutoscalerState:
    state = AutoscalerState()
    for each in samples:
        state = add_sample(state, each, POLICY)
    return state


def test_no_decision_before_the_window_holds_enough_samples():
    busy = [sample(time=EPOCH + t, input_rate=3000, processed_rate=2000, busy=1.0) for t in (10, 20, 30)]
    decision = decide_scaling(POLICY, BOUNDS, state_with(busy), EPOCH + 30)
    assert (decision.kind, decision.reason) == ("hold", "hold at 2: collecting samples (30s of 1m)")
    full = [sample(time=EPOCH + t, input_rate=3000, processed_rate=2000, busy=1.0) for t in range(10, 70, 10)]
    assert decide_scaling(POLICY, BOUNDS, state_with(full), EPOCH + 60).kind == "up"


def test_the_reason_gives_the_figures():
    full = [
        sample(time=EPOCH + t, input_rate=28_000, processed_rate=2000, busy=1.0, backlog=1_200_000)
        for t in range(10, 70, 10)
    ]
    decision = decide_scaling(POLICY, ExecutorsSpec(instances=2, min=1, max=200), state_with(full), EPOCH + 60)
    assert decision.reason == (
        "2 → 6: input 28k rec/s, backlog 1.2M records, utilization 100%: need 80k rec/s, "
        "1k rec/s per executor (maxStep 4 toward 80)"
    )


def test_catching_up_is_no_overload_when_the_input_needs_the_target_share_of_the_capacity():
    # 8 executors of 1k rec/s for 5.6k rec/s: 70%, the target. Batches reading the backlog keep them busy all
    # the time, and the backlog (120k just as a batch began: nothing processed, 56k what a healthy app holds)
    # drains in 64k / 2.4k rec/s spare = 27 s, within the 30 s target lag: no reason to add executors. Busy
    # 100% put it out of the dead band: in the simulation it added the catch-up's rate to the 8k, 8 → 10, and
    # five minutes later took them away again.
    window = catching_up(backlog=120_000, running=0.0)
    bounds = ExecutorsSpec(instances=8, min=1, max=20)
    decision = decide_scaling(POLICY, bounds, state_with([replace(s, time=EPOCH + s.time) for s in window]), EPOCH + 60)
    assert (decision.kind, decision.target) == ("hold", 8)  # was 8 → 9
    assert decision.reason.startswith("hold at 8: utilization 70% (input ÷ capacity) within 70% ± 10%, backlog 120k")
    evaluation = decision.evaluation
    assert evaluation is not None and evaluation.utilization == 1.0
    assert evaluation.load == pytest.approx(5_600 / 8_000)
    assert evaluation.catch_up_seconds == pytest.approx((120_000 - 56_000) / 2_400)
    # Without the capacity to spare, the same busy executors are short: 6 of them for 5.6k rec/s is 93%.
    short = [replace(s, time=EPOCH + s.time, executors=6, processed_rate=s.processed_rate * 6 / 8) for s in window]
    assert (
        decide_scaling(POLICY, bounds.model_copy(update={"instances": 6}), state_with(short), EPOCH + 60).kind == "up"
    )


def test_a_backlog_drained_before_added_executors_would_be_warm_adds_none():
    # 8 executors serve the 5.6k rec/s at 70% and drain the backlog in 52 s: over the 30 s target lag, but
    # executors asked for now work only after their warm-up (stabilization, 1m), when it is gone: adding them
    # (8 → 11) only meant taking them away again five minutes later.
    window = [replace(s, time=EPOCH + s.time) for s in catching_up(backlog=180_000, running=0.0)]
    bounds = ExecutorsSpec(instances=8, min=1, max=20)
    decision = decide_scaling(POLICY, bounds, state_with(window), EPOCH + 60)
    assert decision.evaluation is not None and decision.evaluation.catch_up_seconds == pytest.approx(124_000 / 2_400)
    assert (decision.kind, decision.target) == ("hold", 8)
    assert decision.reason.endswith("drains in 52s, before executors added now would be warm (1m)")
    # A backlog that outlasts the warm-up: more executors drain it sooner.
    later = [replace(s, backlog=300_000) for s in window]
    assert decide_scaling(POLICY, bounds, state_with(later), EPOCH + 60).kind == "up"
    # So does one that outlasts the target lag when executors warm up sooner than that.
    quick = replace(POLICY, stabilization=20.0)
    assert decide_scaling(quick, bounds, state_with(window), EPOCH + 60).kind == "up"


def test_without_a_measured_rate_the_busy_share_stands_for_the_load():
    idle = evaluate([sample(input_rate=10, processed_rate=10, busy=0.01)], 0.7, 30)
    assert idle.rate_per_executor is None and idle.load == idle.utilization == 0.01


def test_samples_during_stabilization_are_ignored():
    full = [sample(time=EPOCH + t, input_rate=3000, processed_rate=2000, busy=1.0) for t in range(10, 70, 10)]
    state = state_with(full)
    scaled = decide_scaling(POLICY, BOUNDS, state, EPOCH + 60)
    state = record(state, scaled, POLICY)
    assert decide_scaling(POLICY, BOUNDS, state, EPOCH + 100).reason == "hold at 5: stabilizing after 2 → 5 (20s left)"
    assert "collecting samples (0s of 1m)" in decide_scaling(POLICY, BOUNDS, state, EPOCH + 130).reason


def test_a_scale_down_lifts_an_ineffective_scale_up_block():
    state = AutoscalerState(
        scale_up_blocked="2 → 5 raised capacity by 0 rec/s",
        spec_key=decide_scaling(POLICY, BOUNDS, AutoscalerState(), EPOCH).spec_key,
    )
    idle = [
        sample(time=EPOCH + t, input_rate=100, processed_rate=100, busy=0.05, executors=2) for t in range(10, 370, 10)
    ]
    for each in idle:
        state = add_sample(state, each, POLICY)
        decision = decide_scaling(POLICY, BOUNDS, state, each.time)
        state = record(state, decision, POLICY)
        if decision.kind != "hold":
            break
        assert state.scale_up_blocked
    assert decision.kind == "down" and state.scale_up_blocked is None


def test_status_of_a_decision():
    full = [sample(time=EPOCH + t, input_rate=3000, processed_rate=2000, busy=1.0) for t in range(10, 70, 10)]
    decision = decide_scaling(POLICY, BOUNDS, state_with(full), EPOCH + 60)
    status = autoscaler_status(state_with(full), decision).model_dump(by_alias=True, exclude_none=True)
    assert status == {
        "desiredExecutors": 5,
        "ratePerExecutor": 1000.0,
        "backlog": 0,
        "lastDecision": {"time": "2026-01-01T00:01:00.000Z", "from": 2, "to": 5, "reason": decision.reason},
    }


@pytest.mark.parametrize(
    ("value", "text"), [(0, "0"), (950, "950"), (1234, "1.2k"), (48_000, "48k"), (1_200_000, "1.2M"), (0.5, "0.5")]
)
def test_compact_numbers(value, text):
    assert compact(value) == text


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (45, "45s"), (300, "5m"), (90, "1m30s"), (7500, "2h5m"), (math.inf, "never")]
)
def test_durations(seconds, text):
    assert duration_text(seconds) == text


# ------------------------------------------------------------------------------------------------ state


@pytest.mark.parametrize(
    "stored",
    [
        None,
        "",
        "{",
        "[]",
        "null",
        "42",
        '{"v": 2}',
        '{"v": 1}',
        json.dumps(
            {
                "v": 2,
                "k": "",
                "c": None,
                "s": [["x"] * 13],
                "r": [],
                "rs": None,
                "lc": None,
                "ld": None,
                "cc": None,
                "b": None,
            }
        ),
        json.dumps(
            {
                "v": 2,
                "k": "",
                "c": None,
                "s": [],
                "r": [[1.0, -3]],
                "rs": None,
                "lc": None,
                "ld": None,
                "cc": None,
                "b": None,
            }
        ),
        '{"v": 2, "k": "", "c": null, "s": [], "r": [], "rs": NaN, "lc": null, "ld": null, "cc": null, "b": null}',
        "[" * 15_000,
        "x" * 100_000,
    ],
    ids=[
        "none",
        "empty",
        "truncated",
        "list",
        "null",
        "number",
        "missing",
        "other version",
        "bad sample",
        "negative count",
        "nan",
        "deep",
        "huge",
    ],
)
def test_unreadable_state_gives_a_fresh_state(stored):
    assert AutoscalerState.from_json(stored) == AutoscalerState()


def test_the_running_batch_time_is_stored_and_older_samples_without_it_read_as_unknown():
    running = replace(sample(time=EPOCH + 10, backlog=20_000, trigger=10), running_batch=6.5)
    state = state_with([running])
    assert AutoscalerState.from_json(state.to_json()).samples == (running,)
    older = json.loads(state.to_json())
    older["s"] = [row[:13] for row in older["s"]]  # a sample stored before the running batch was kept
    assert AutoscalerState.from_json(json.dumps(older)).samples == (replace(running, running_batch=None),)
    longer = json.loads(state.to_json())
    longer["s"] = [[*row, 1.0] for row in longer["s"]]
    assert AutoscalerState.from_json(json.dumps(longer)) == AutoscalerState()


def test_state_json_stays_small_with_long_windows_and_many_queries():
    policy = Policy.from_spec(AutoscalingSpec(metricsWindow="1h", scaleDownWindow="1h", interval="5s"))
    plant = Plant(noisy(constant(2600), 0.2, seed=1), executors=4)
    state = simulate(plant, policy, ExecutorsSpec(instances=4, min=1, max=1000), 2 * 3600).final_state
    assert len(state.samples) == MAX_SAMPLES
    assert sum(s.duration for s in state.samples) > 3000  # merged, still spanning most of the hour
    assert len(state.to_json()) < 8 * 1024
    many = DriverStatus(
        app="sim",
        revision="r1",
        observedAt="2026-01-01T03:00:00Z",
        queries=[QueryStatus(name=f"query-{i}", runId=f"{i:036d}", active=True) for i in range(500)],
    )
    assert len(observe(state, many, policy).to_json()) < 16 * 1024


def test_a_new_revision_starts_the_measurements_over():
    state = AutoscalerState(scale_up_blocked="2 → 5 raised capacity by 0 rec/s")
    for reading in (driver_status(0, 0, 0, 0), driver_status(10, 10_000, 5_000, 10_000)):
        state = observe(state, reading, POLICY)
    assert len(state.samples) == 1 and state.scale_up_blocked
    state = observe(state, driver_status(20, 0, 0, 20_000, revision="rev-b"), POLICY)
    assert (state.samples, state.scale_up_blocked) == ((), None)
    assert observe(state, driver_status(30, 10_000, 5_000, 30_000, revision="rev-b"), POLICY).samples


def test_a_topic_read_by_two_queries_counts_twice_like_their_rows():
    def two_readers(seconds: float, rows: int, offsets: int) -> DriverStatus:
        status = driver_status(seconds, rows, rows, offsets)
        return status.model_copy(
            update={"queries": [q.model_copy(update={"name": name}) for name in ("a", "b") for q in status.queries]}
        )

    got = sample_between(two_readers(0, 0, 0), two_readers(10, 10_000, 10_000))
    assert got is not None and (got.input_rate, got.processed_rate) == (2000.0, 2000.0)


def test_policy_from_the_spec_is_in_seconds():
    policy = Policy.from_spec(AutoscalingSpec(interval="15s", metricsWindow="2m", scaleDownWindow="1h", maxStep=2))
    assert (policy.interval, policy.metrics_window, policy.scale_down_window, policy.max_step) == (15, 120, 3600, 2)
    assert (policy.stabilization, policy.scale_up_cooldown, policy.scale_down_cooldown) == (60, 60, 300)
    assert (policy.target_utilization, policy.utilization_band, policy.target_lag) == (0.7, 0.1, 30)


def test_recommendations_stay_bounded_and_keep_the_largest():
    long_window = Policy.from_spec(AutoscalingSpec(scaleDownWindow="1h"))
    state = AutoscalerState()
    for index in range(200):  # strictly falling: none may be dropped as smaller than a later one
        held = ScalingDecision(EPOCH + 10 * index, 300, 300, "hold", "hold at 300: ...", recommendation=300 - index)
        state = record(state, held, long_window)
    assert len(state.recommendations) == MAX_RECOMMENDATIONS
    assert state.recommendations[0][1] == 300 and state.recommendations[-1] == (EPOCH + 1990, 101)
