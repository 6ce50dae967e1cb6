"""The rollout state machine: strategy choice, phases, resumption, rollback."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.operator.model import StreamingAppSpec, UpdateStrategy
from sluice.operator.rollout import (
    Activate,
    ApplyRevision,
    DeleteDriver,
    Drain,
    DriverFacts,
    Observed,
    QueryFacts,
    Refusal,
    ReleaseRevision,
    Resume,
    RolloutStatus,
    SpecDiff,
    StartDriver,
    Step,
    SwapQueries,
    Target,
    classify,
    diff_base,
    plan,
    step,
)
from sluice.operator.rollout.plan import HEALTHY_BATCHES

WORDCOUNT = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "wordcount.yaml"
APP = "wc"
T0 = 1_700_000_000.0
QUERIES = ("lines-dead-letters", "out")
FILTER = "filter"
WINDOW = "window"
IMAGE = "image"
EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    FILTER: lambda s: s["pipeline"]["nodes"][2].update(filter="length(word) > 1"),
    WINDOW: lambda s: s["pipeline"]["nodes"][3]["aggregate"]["window"].update(tumbling="10s"),
    IMAGE: lambda s: s.update(spark={"image": "sluice/spark:0.2.0"}),
}


def diff_for(*edits: str) -> SpecDiff:
    raw = yaml.safe_load(WORDCOUNT.read_text())["spec"]
    changed = copy.deepcopy(raw)
    for edit in edits:
        EDITS[edit](changed)
    return classify(StreamingAppSpec.model_validate(raw), StreamingAppSpec.model_validate(changed))


def strategy(type_: str = "auto", enabled: bool = True) -> UpdateStrategy:
    return UpdateStrategy.model_validate({"type": type_, "rollback": {"enabled": enabled, "healthTimeout": "5m"}})


def queries(
    revision: str,
    *,
    batches: int = 0,
    backlog: int | None = 100,
    error: str | None = None,
    only: tuple[str, ...] = QUERIES,
) -> tuple[QueryFacts, ...]:
    return tuple(
        QueryFacts(name, revision, active=error is None, batches=batches, backlog=backlog, error=error) for name in only
    )


def driver(
    name: str = APP,
    revision: str = "r1",
    state: str = "running",
    restarts: int = 0,
    running: tuple[QueryFacts, ...] | None = None,
) -> DriverFacts:
    return DriverFacts(
        name,
        revision,
        state,
        restarts,  # type: ignore[arg-type]
        queries(revision) if running is None else running,
    )


def observed(*drivers: DriverFacts, at: float = T0, revisions: tuple[str, ...] = ("r1", "r2")) -> Observed:
    return Observed(now=at, revisions=frozenset(revisions), drivers=drivers)


def start(diff: SpecDiff, facts: Observed, type_: str = "auto", enabled: bool = True) -> Step:
    return step(APP, None, "r1", Target("r2", strategy(type_, enabled), diff), facts)


def proceed(previous: Step, facts: Observed, type_: str = "auto", enabled: bool = True, to: str = "r2") -> Step:
    return step(APP, previous.rollout, previous.stable_revision, Target(to, strategy(type_, enabled)), facts)


def phase(result: Step) -> str:
    assert result.rollout is not None
    return result.rollout.phase


# ------------------------------------------------------------------------------------- strategies


def test_explicit_hot_swap_of_a_window_change_is_refused_with_the_reason():
    result = start(diff_for(WINDOW), observed(driver()), type_="hotSwap")
    assert result.rollout is None and result.stable_revision == "r1" and not result.actions
    assert isinstance(result.refusal, Refusal)
    assert result.refusal.reason == "UnsafeUpdateStrategy"
    assert "spec.pipeline.nodes[3].aggregate.window" in result.refusal.message
    assert result.refusal.safe == ("checkpointMigration",)


def test_explicit_fenced_handover_keeps_the_checkpoint_so_a_window_change_is_refused():
    assert isinstance(plan(APP, diff_for(WINDOW), "r1", "r2", strategy("fencedHandover"), observed()), Refusal)


def test_explicit_strategies_that_are_safe_are_used():
    restart = plan(APP, diff_for(FILTER), "r1", "r2", strategy("restart"), observed(driver()))
    assert isinstance(restart, RolloutStatus) and restart.strategy == "restart" and restart.newDriver
    migration = plan(APP, diff_for(FILTER), "r1", "r2", strategy("checkpointMigration"), observed(driver()))
    assert isinstance(migration, RolloutStatus) and not migration.newDriver
    assert {q.name: q.action for q in migration.queries} == {"lines-dead-letters": "keep", "out": "migrate"}


def test_runtime_and_state_change_migrate_in_a_new_driver():
    rollout = plan(APP, diff_for(WINDOW, IMAGE), "r1", "r2", strategy(), observed(driver()))
    assert isinstance(rollout, RolloutStatus)
    assert (rollout.strategy, rollout.newDriver, rollout.toDriver) == ("checkpointMigration", True, "wc-r2")
    out = next(q for q in rollout.queries if q.name == "out")
    assert (out.action, out.rewindMs) == ("migrate", 12_000)
    assert "spec.pipeline.nodes[3].aggregate.window" in (out.reason or "")


def test_the_status_model_round_trips():
    rollout = plan(APP, diff_for(WINDOW), "r1", "r2", strategy(), observed(driver()))
    assert isinstance(rollout, RolloutStatus)
    assert RolloutStatus.model_validate(rollout.model_dump(mode="json")) == rollout


# -------------------------------------------------------------------------------------- hot swap


def test_hot_swap_runs_through_every_phase():
    planned = start(diff_for(FILTER), observed(driver(), revisions=("r1",)))
    assert phase(planned) == "Planned" and planned.rollout and planned.rollout.strategy == "hotSwap"
    assert planned.actions == (ApplyRevision("r2"),)
    assert [e.reason for e in planned.events] == ["RolloutPlanned"]
    steps = tuple(planned.rollout.queries)
    assert [(s.name, s.action) for s in steps] == [("lines-dead-letters", "keep"), ("out", "restart")]

    draining = proceed(planned, observed(driver()))
    assert phase(draining) == "Draining"
    assert draining.actions == (ApplyRevision("r2"), SwapQueries(APP, "r2", steps))

    swapped = driver(running=queries("r1", only=("lines-dead-letters",)) + queries("r2", only=("out",)))
    verifying = proceed(draining, observed(swapped))
    assert phase(verifying) == "Verifying"
    assert [e.reason for e in verifying.events] == ["RolloutStarting", "RolloutVerifying"]
    assert verifying.stable_revision == "r1"

    healthy = driver(
        running=queries("r1", only=("lines-dead-letters",), batches=50)
        + queries("r2", only=("out",), batches=HEALTHY_BATCHES)
    )
    complete = proceed(verifying, observed(healthy, at=T0 + 60))
    assert phase(complete) == "Complete" and complete.stable_revision == "r2"
    assert complete.actions == (ReleaseRevision("r1", ()),)
    assert complete.rollout and complete.rollout.finishedAt
    assert proceed(complete, observed(healthy, at=T0 + 70)) == Step(complete.rollout, "r2")


def test_a_caught_up_query_counts_as_progress():
    verifying = proceed(
        start(diff_for(FILTER), observed(driver())),
        observed(driver(running=queries("r1", only=("lines-dead-letters",)) + queries("r2", only=("out",)))),
    )
    idle = driver(
        running=queries("r1", only=("lines-dead-letters",), backlog=0) + queries("r2", only=("out",), backlog=0)
    )
    assert phase(proceed(verifying, observed(idle, at=T0 + 30))) == "Complete"


def test_a_killed_operator_resumes_with_the_same_actions():
    draining = proceed(start(diff_for(FILTER), observed(driver(), revisions=("r1",))), observed(driver()))
    facts = observed(driver(), at=T0 + 5)
    first, again = proceed(draining, facts), proceed(draining, facts)
    assert first == again
    # The status recorded before the kill, read back from the resource, gives the same next step.
    assert draining.rollout is not None
    recorded = RolloutStatus.model_validate(draining.rollout.model_dump(mode="json"))
    assert step(APP, recorded, "r1", Target("r2", strategy()), facts) == first


def test_no_progress_within_health_timeout_rolls_back_the_hot_swap():
    swapped = driver(
        running=queries("r1", only=("lines-dead-letters",), batches=9) + queries("r2", only=("out",), batches=1)
    )
    verifying = proceed(start(diff_for(FILTER), observed(driver())), observed(swapped))
    still = proceed(verifying, observed(swapped, at=T0 + 299))
    assert phase(still) == "Verifying" and not still.events

    rolling_back = proceed(verifying, observed(swapped, at=T0 + 301))
    assert phase(rolling_back) == "RollingBack"
    assert rolling_back.rollout and "not healthy within 5m: out completed 1 of 3 batches" in (
        rolling_back.rollout.message or ""
    )
    assert [e.reason for e in rolling_back.events] == ["RollingBack"]
    back_steps = tuple(s.model_copy(update={"rewindMs": None}) for s in rolling_back.rollout.queries)
    assert rolling_back.actions == (ApplyRevision("r1"), SwapQueries(APP, "r1", back_steps))

    rolled_back = proceed(rolling_back, observed(driver(), at=T0 + 310))
    assert phase(rolled_back) == "RolledBack" and rolled_back.stable_revision == "r1"
    assert rolled_back.actions == (ReleaseRevision("r2", ()),)
    assert rolled_back.events[0].reason == "RolledBack" and "not healthy" in rolled_back.events[0].message


def test_a_query_failing_analysis_rolls_back_at_once():
    failing = driver(
        running=queries("r1", only=("lines-dead-letters",))
        + queries("r2", only=("out",), error="[UNRESOLVED_COLUMN] wrd")
    )
    result = proceed(start(diff_for(FILTER), observed(driver())), observed(failing, at=T0 + 2))
    assert phase(result) == "RollingBack"
    assert result.rollout and "query out failed: [UNRESOLVED_COLUMN] wrd" in (result.rollout.message or "")


def test_without_rollback_an_unhealthy_revision_fails():
    failing = driver(running=queries("r2", only=("out",), error="boom") + queries("r1", only=QUERIES[:1]))
    result = proceed(start(diff_for(FILTER), observed(driver()), enabled=False), observed(failing), enabled=False)
    assert phase(result) == "Failed" and not result.actions and result.stable_revision == "r1"
    assert result.events[-1].reason == "RolloutFailed"
    assert diff_base(result.rollout, "r1", "r2") is None  # the failed revision is not retried


def test_in_place_rollout_without_a_driver_starts_one():
    result = start(diff_for(FILTER), observed())
    assert phase(result) == "Starting"
    assert result.rollout and result.actions[-1] == StartDriver("wc-r2", "r2", False, tuple(result.rollout.queries))


# ------------------------------------------------------------------------------ checkpoint migration


def test_migration_gives_the_changed_query_a_new_checkpoint_and_releases_the_old_one():
    planned = start(diff_for(WINDOW), observed(driver()))
    assert planned.rollout and planned.rollout.strategy == "checkpointMigration"
    steps = {s.name: s for s in planned.rollout.queries}
    assert (steps["out"].action, steps["out"].rewindMs) == ("migrate", 12_000)
    assert steps["lines-dead-letters"].action == "restart"  # its late-record rule follows the window
    assert planned.actions[-1] == SwapQueries(APP, "r2", tuple(planned.rollout.queries))
    healthy = driver(running=queries("r2", batches=HEALTHY_BATCHES))
    complete = proceed(planned, observed(healthy, at=T0 + 30))
    assert phase(complete) == "Complete"
    assert complete.actions == (ReleaseRevision("r1", ("out",), retired_folders=("out",)),)


def test_a_second_migration_retires_the_folder_the_first_one_made():
    planned = start(diff_for(WINDOW), observed(driver()))
    assert planned.rollout
    moved_before = planned.rollout.model_copy(update={"fromCheckpoints": {"out": "out@r1"}})
    healthy = observed(driver(running=queries("r2", batches=HEALTHY_BATCHES)), at=T0 + 30)
    complete = step(APP, moved_before, "r1", Target("r2", strategy()), healthy)
    assert phase(complete) == "Complete"
    assert complete.actions == (ReleaseRevision("r1", ("out",), retired_folders=("out@r1",)),)


def test_a_rolled_back_migration_retires_both_folders_it_leaves_once_back_on_a_new_one():
    """The old plan goes onto out@r1-1: the folder the rollout made (out@r2) and the one the query left (out)
    are retired once it completed a batch there (before that, a restart hands over from them again)."""
    planned = start(diff_for(WINDOW), observed(driver()))
    failing = driver(running=queries("r2", only=("out",), error="boom") + queries("r2", only=QUERIES[:1]))
    rolling_back = proceed(planned, observed(failing, at=T0 + 5))
    assert phase(rolling_back) == "RollingBack"
    assert phase(proceed(rolling_back, observed(driver(), at=T0 + 20))) == "RollingBack", "no batch on out@r1-1 yet"
    rolled_back = proceed(rolling_back, observed(driver(running=queries("r1", batches=1)), at=T0 + 20))
    assert phase(rolled_back) == "RolledBack"
    assert rolled_back.actions == (ReleaseRevision("r2", ("out",), retired_folders=("out@r2", "out")),)


# ---------------------------------------------------------------------------------- fenced handover


def test_fenced_handover_starts_waits_drains_activates():
    old = driver()
    planned = start(diff_for(IMAGE), observed(old))
    assert planned.rollout and (planned.rollout.strategy, planned.rollout.toDriver) == ("fencedHandover", "wc-r2")
    steps = tuple(planned.rollout.queries)
    standby_start = StartDriver("wc-r2", "r2", True, steps)
    assert phase(planned) == "Planned" and planned.actions == (ApplyRevision("r2"), standby_start)

    standby = driver("wc-r2", "r2", "standby", running=())
    draining = proceed(planned, observed(old, standby))
    assert phase(draining) == "Draining"
    assert draining.actions == (ApplyRevision("r2"), standby_start, Drain(APP))

    drained = driver(state="drained", running=())
    starting = proceed(draining, observed(drained, standby))
    assert phase(starting) == "Starting"
    assert starting.actions == (ApplyRevision("r2"), standby_start, Activate("wc-r2"))

    new = driver("wc-r2", "r2", running=queries("r2", batches=HEALTHY_BATCHES))
    complete = proceed(starting, observed(drained, new, at=T0 + 40))
    assert phase(complete) == "Complete" and complete.stable_revision == "r2"
    assert complete.actions == (DeleteDriver(APP), ReleaseRevision("r1", ()))


def test_a_restarted_old_driver_is_drained_again():
    standby = driver("wc-r2", "r2", "standby", running=())
    starting = proceed(
        proceed(start(diff_for(IMAGE), observed(driver())), observed(driver(), standby)),
        observed(driver(state="drained", running=()), standby),
    )
    back_up = driver(restarts=1)  # spark-operator restarted it; it runs again
    result = proceed(starting, observed(back_up, standby, at=T0 + 5))
    assert Drain(APP) in result.actions and Activate("wc-r2") in result.actions


def test_a_crash_looping_new_driver_rolls_back_to_the_drained_one():
    standby = driver("wc-r2", "r2", "standby", running=())
    drained = driver(state="drained", running=())
    starting = proceed(
        proceed(start(diff_for(IMAGE), observed(driver())), observed(driver(), standby)), observed(drained, standby)
    )
    failed = replace(driver("wc-r2", "r2", "pending", restarts=2, running=()), failure="driver failed: query out: boom")
    restarting = proceed(starting, observed(drained, failed, at=T0 + 60))
    assert phase(restarting) == "Starting"
    assert restarting.rollout and restarting.rollout.lastDriverFailure == "driver failed: query out: boom"
    looping = driver("wc-r2", "r2", restarts=3, running=queries("r2"))  # its failed pod is gone by now
    rolling_back = proceed(restarting, observed(drained, looping, at=T0 + 90))
    assert phase(rolling_back) == "RollingBack"
    assert rolling_back.rollout and (rolling_back.rollout.message or "").endswith(
        "driver wc-r2 restarted 3 times, last: driver failed: query out: boom"
    ), rolling_back.rollout.message
    assert rolling_back.actions == (ApplyRevision("r1"), DeleteDriver("wc-r2"))

    resumed = proceed(rolling_back, observed(drained, at=T0 + 100))
    assert phase(resumed) == "RollingBack" and resumed.actions == (ApplyRevision("r1"), Resume(APP))

    rolled_back = proceed(resumed, observed(driver(), at=T0 + 110))
    assert phase(rolled_back) == "RolledBack" and rolled_back.stable_revision == "r1"
    assert rolled_back.actions == (ReleaseRevision("r2", ()),)


def test_a_new_driver_whose_query_failed_is_drained_and_the_old_one_resumes_once_it_stopped():
    standby = driver("wc-r2", "r2", "standby", running=())
    drained = driver(state="drained", running=())
    starting = proceed(
        proceed(start(diff_for(IMAGE), observed(driver())), observed(driver(), standby)), observed(drained, standby)
    )
    failing = driver("wc-r2", "r2", running=queries("r2", error="spec.pipeline.nodes[2]: boom"))
    rolling_back = proceed(starting, observed(drained, failing, at=T0 + 30))
    assert phase(rolling_back) == "RollingBack"
    assert rolling_back.actions == (ApplyRevision("r1"), Drain("wc-r2")), "it may still write: drained first"

    stopping = replace(failing, state="draining")  # the failed run stops its queries at a batch boundary
    assert proceed(rolling_back, observed(drained, stopping, at=T0 + 31)).actions == (
        ApplyRevision("r1"),
        Drain("wc-r2"),
    )
    stopped = replace(failing, state="drained")  # its pod stays a while longer, to tell the failure
    resumed = proceed(rolling_back, observed(drained, stopped, at=T0 + 35))
    assert resumed.actions == (ApplyRevision("r1"), DeleteDriver("wc-r2"), Resume(APP))


def test_restart_strategy_stops_the_old_driver_before_the_new_one_starts():
    planned = start(diff_for(IMAGE), observed(driver()), type_="restart")
    assert phase(planned) == "Draining" and planned.actions == (ApplyRevision("r2"), Drain(APP))
    starting = proceed(planned, observed(driver(state="drained", running=())), type_="restart")
    assert phase(starting) == "Starting"
    assert starting.rollout and starting.actions == (
        ApplyRevision("r2"),
        DeleteDriver(APP),
        StartDriver("wc-r2", "r2", False, tuple(starting.rollout.queries)),
    )


# ------------------------------------------------------------------------------- spec changes over time


def test_a_spec_change_after_a_rollback_rolls_out_normally():
    rolling_back = proceed(
        start(diff_for(FILTER), observed(driver())), observed(driver(running=queries("r2", error="boom")))
    )
    rolled_back = proceed(rolling_back, observed(driver(), at=T0 + 10))
    assert phase(rolled_back) == "RolledBack"
    assert proceed(rolled_back, observed(driver(), at=T0 + 20)) == Step(rolled_back.rollout, "r1")

    assert diff_base(rolled_back.rollout, "r1", "r3") == "r1"
    again = step(
        APP,
        rolled_back.rollout,
        "r1",
        Target("r3", strategy(), diff_for(WINDOW)),
        observed(driver(), at=T0 + 30, revisions=("r1", "r3")),
    )
    assert again.rollout and (again.rollout.fromRevision, again.rollout.toRevision) == ("r1", "r3")
    assert again.rollout.strategy == "checkpointMigration" and phase(again) == "Draining"


def test_a_newer_revision_waits_for_the_rollout_in_progress():
    planned = start(diff_for(FILTER), observed(driver(), revisions=("r1",)))
    assert diff_base(planned.rollout, "r1", "r3") is None
    result = step(APP, planned.rollout, "r1", Target("r3", strategy()), observed(driver()))
    assert result.rollout and result.rollout.toRevision == "r2" and phase(result) == "Draining"
    assert result.waiting == "revision r3 rolls out once the rollout to r2 is over"


def test_going_back_to_the_stable_spec_mid_rollout_rolls_back():
    draining = proceed(start(diff_for(FILTER), observed(driver(), revisions=("r1",))), observed(driver()))
    swapped = driver(running=queries("r2", only=("out",)) + queries("r1", only=QUERIES[:1]))
    result = proceed(draining, observed(swapped, at=T0 + 3), to="r1")
    assert phase(result) == "RollingBack"
    assert result.rollout and result.rollout.message == "the spec went back to revision r1"


def test_the_first_revision_is_adopted_and_unaffected_changes_need_no_rollout():
    first = step(APP, None, None, Target("r1", strategy()), observed())
    assert first.stable_revision == "r1" and first.rollout is None
    unaffected = classify(*(StreamingAppSpec.model_validate(s) for s in _executors_change()))
    result = step(APP, None, "r1", Target("r2", strategy(), unaffected), observed(driver()))
    assert result.stable_revision == "r2" and result.rollout is None and not result.actions
    assert result.events[0].reason == "NoRollout" and "spec.executors" in result.events[0].message


def test_a_missing_diff_is_a_programming_error():
    with pytest.raises(ValueError, match="classify revision r2 against revision r1"):
        step(APP, None, "r1", Target("r2", strategy()), observed())


def _executors_change() -> tuple[dict[str, Any], dict[str, Any]]:
    raw = yaml.safe_load(WORDCOUNT.read_text())["spec"]
    changed = copy.deepcopy(raw)
    changed["executors"]["instances"] = 4
    return raw, changed
