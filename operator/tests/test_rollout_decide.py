"""The rollouts carried out with the app's one driver: a hot swap through its control API, a restart by
spark-operator, a migration in a new driver, what is refused, and which revision a (re)starting driver runs at
each phase. Pure."""

from __future__ import annotations

import pytest
from test_rollout_plan import (
    APP,
    FILTER,
    IMAGE,
    QUERIES,
    T0,
    WINDOW,
    diff_for,
    driver,
    observed,
    queries,
    strategy,
)

from sluice.api.contract import DriverStatus, Migration, QueryStatus, QueryStep, TopicStatus
from sluice.operator.rollout import (
    Activate,
    DeleteDriver,
    Drain,
    QueryFacts,
    ReleaseRevision,
    Resume,
    StartDriver,
    SwapQueries,
    Target,
)
from sluice.operator.rollout.actions import rollback_folder
from sluice.operator.rollout.decide import (
    app_driver,
    decide_rollout,
    driver_behind,
    driver_facts,
    handover_driver,
    on_standby,
    pending_swap,
    retired_drivers,
    revision_checkpoints,
    rollout_condition,
    with_driver_state,
    with_refused_swap,
)


def target(*edits: str, type_: str = "auto", to: str = "r2") -> Target:
    return Target(to, strategy(type_), diff_for(*edits) if edits else None)


def test_a_filter_change_is_swapped_in_the_running_driver_and_pins_the_new_revision_once_swapped() -> None:
    planned = decide_rollout(APP, None, "r1", target(FILTER), observed(driver()), submitted_revision="r1")
    rollout = planned.step.rollout
    assert rollout is not None and rollout.strategy == "hotSwap" and not rollout.newDriver
    assert rollout.phase == "Draining"  # the ConfigMap of r2 is there: the swap is asked for at once
    swaps = [a for a in planned.step.actions if isinstance(a, SwapQueries)]
    assert [(s.driver, s.revision) for s in swaps] == [(APP, "r2")]
    assert {s.name: s.action for s in swaps[0].steps} == {"out": "restart", "lines-dead-letters": "keep"}
    # A driver restarting now runs r2 (its queries are being swapped); the SparkApplication is not resubmitted.
    assert (planned.runner_revision, planned.submitted_revision) == ("r2", "r1")
    assert planned.keep == {"r1", "r2"}

    kept = queries("r1", batches=40, only=("lines-dead-letters",))  # never stopped: its run goes on
    swapped = driver(running=(*kept, *queries("r2", batches=3, only=("out",))))
    done = decide_rollout(APP, rollout, "r1", target(), observed(swapped, at=T0 + 20), submitted_revision="r1")
    assert done.step.rollout is not None and done.step.rollout.phase == "Complete"
    assert done.step.stable_revision == "r2"
    assert (done.runner_revision, done.submitted_revision) == ("r2", "r1")
    assert done.keep == {"r1", "r2"}, "the last rollout's revisions stay until the next one"
    assert rollout_condition(done.step, "r2") == (True, "Complete", done.step.rollout.message)


def test_a_refused_swap_rolls_back_at_once_and_the_driver_keeps_the_stable_revision() -> None:
    planned = decide_rollout(APP, None, "r1", target(FILTER), observed(driver()), submitted_revision="r1")
    swap = next(a for a in planned.step.actions if isinstance(a, SwapQueries))
    error = "a query failed to start on revision r2: [UNRESOLVED_COLUMN] `nope` cannot be resolved"
    refused = with_refused_swap(observed(driver()), swap, error)
    back = decide_rollout(APP, planned.step.rollout, "r1", target(), refused, submitted_revision="r1")
    assert back.step.rollout is not None and back.step.rollout.phase == "RollingBack"
    assert "UNRESOLVED_COLUMN" in (back.step.rollout.message or "")
    assert back.runner_revision == "r1"
    # The driver itself runs r1 untouched: nothing is left to swap back.
    back_swap = next(a for a in back.step.actions if isinstance(a, SwapQueries))
    assert back_swap.revision == "r1" and pending_swap(back_swap, driver()) is None
    rolled = decide_rollout(
        APP, back.step.rollout, "r1", target(), observed(driver(), at=T0 + 5), submitted_revision="r1"
    )
    assert rolled.step.rollout is not None and rolled.step.rollout.phase == "RolledBack"
    assert rolled.step.stable_revision == "r1" and rolled.runner_revision == "r1"
    assert rollout_condition(rolled.step, "r2")[:2] == (False, "RolledBack")
    assert rollout_condition(rolled.step, "r1")[:2] == (True, "Stable"), "the spec back on the stable revision"
    # The same spec is not tried again; the next change rolls out normally.
    again = decide_rollout(APP, rolled.step.rollout, "r1", target(FILTER), observed(driver()), submitted_revision="r1")
    assert again.step.rollout == rolled.step.rollout and not again.step.actions
    with_r3 = observed(driver(), revisions=("r1", "r3"))
    nxt = decide_rollout(APP, rolled.step.rollout, "r1", target(FILTER, to="r3"), with_r3, submitted_revision="r1")
    assert nxt.step.rollout is not None and (nxt.step.rollout.toRevision, nxt.step.rollout.phase) == ("r3", "Draining")


def test_a_restart_asked_for_restarts_the_driver_through_spark_operator() -> None:
    result = decide_rollout(
        APP, None, "r1", target(IMAGE, type_="restart"), observed(driver()), submitted_revision="r1"
    )
    rollout = result.step.rollout
    assert rollout is not None and (rollout.strategy, rollout.phase) == ("restart", "Complete")
    assert result.step.stable_revision == "r2" and not result.step.actions
    assert (result.runner_revision, result.submitted_revision) == ("r2", "r2"), "a new submitted revision resubmits"
    assert [e.reason for e in result.step.events] == ["RolloutPlanned", "RolloutRestart"]


def test_a_stateful_change_with_an_image_change_migrates_in_a_new_driver_and_rolls_back_onto_a_new_folder() -> None:
    """The new driver starts on standby with the migrated query on a checkpoint of r2 that takes over from the
    stable one; the old driver drains, the new one is activated, and once healthy it is the app's driver and
    the old folder is retired. Rolled back, the drained driver resumes on r1's config as the rollback places
    it: the old plan on a new folder takes the query's output back from the one the migration made (or from
    the one it left, if the new query wrote nothing there)."""
    for type_ in ("checkpointMigration", "auto"):  # an explicit one migrates the compatible changes too
        planned = decide_rollout(APP, None, "r1", target(WINDOW, IMAGE, type_=type_), observed(driver()), "r1")
        assert planned.step.refusal is None, planned.step.refusal
        rollout = planned.step.rollout
        assert rollout is not None and (rollout.strategy, rollout.newDriver) == ("checkpointMigration", True)
    new = rollout.toDriver
    assert handover_driver(rollout) == new and (planned.runner_revision, planned.submitted_revision) == ("r1", "r1")
    assert StartDriver(new, "r2", standby=True, steps=tuple(rollout.queries)) in planned.step.actions
    assert revision_checkpoints("r2", {}, rollout) == (
        {"out": "out@r2"},
        {"out": Migration(fromCheckpoint="out", rewindMs=12_000)},
    )
    assert revision_checkpoints("r1", {}, rollout) == ({}, {}), "the drained driver keeps its folders"

    standby = driver(new, "r2", state="standby", running=())
    draining = decide_rollout(APP, rollout, "r1", target(), observed(driver(), standby), submitted_revision="r1")
    assert draining.step.rollout is not None and Drain(APP) in draining.step.actions
    drained = with_driver_state(observed(driver(), standby), APP, "drained", ())
    starting = decide_rollout(APP, draining.step.rollout, "r1", target(), drained, submitted_revision="r1")
    assert starting.step.rollout is not None and Activate(new) in starting.step.actions
    active = with_driver_state(drained, new, "running", tuple(QueryFacts(q, "r2", active=True) for q in QUERIES))
    verifying = decide_rollout(APP, starting.step.rollout, "r1", target(), active, submitted_revision="r1")
    assert verifying.step.rollout is not None and verifying.step.rollout.phase == "Verifying"
    healthy = observed(driver(state="drained", running=()), driver(new, "r2", running=queries("r2", batches=3)))
    done = decide_rollout(APP, verifying.step.rollout, "r1", target(), healthy, submitted_revision="r1")
    assert done.step.rollout is not None and done.step.rollout.phase == "Complete", done.step.rollout
    assert app_driver(done.step.rollout, APP) == new and done.runner_revision == "r2"
    assert DeleteDriver(APP) in done.step.actions
    assert ReleaseRevision("r1", ("out",), ("out",)) in done.step.actions, "the folder out moved from is retired"

    failing = driver(new, "r2", running=queries("r2", error="spec.pipeline.nodes[3]: boom"))
    back = decide_rollout(
        APP, verifying.step.rollout, "r1", target(), observed(driver(state="drained", running=()), failing), "r1"
    )
    rolling_back = back.step.rollout
    assert rolling_back is not None and rolling_back.phase == "RollingBack" and Drain(new) in back.step.actions
    stopped = observed(driver(state="drained", running=()), driver(new, "r2", state="drained", running=()))
    resumed = decide_rollout(APP, rolling_back, "r1", target(), stopped, submitted_revision="r1")
    assert Resume(APP, "r1") in resumed.step.actions, "resumed on r1 as the rollback places its checkpoints"
    assert revision_checkpoints("r1", {}, rolling_back) == (
        {"out": "out@r1-1"},
        {"out": Migration(fromCheckpoint="out@r2", rewindMs=7_000, fallbackCheckpoint="out")},
    )
    back_on_r1 = driver(running=queries("r1", batches=1))
    rolled = decide_rollout(
        APP, rolling_back, "r1", target(), observed(back_on_r1, driver(new, "r2", "drained", running=())), "r1"
    )
    assert rolled.step.rollout is not None and rolled.step.rollout.phase == "RolledBack"
    assert ReleaseRevision("r2", ("out",), ("out@r2", "out")) in rolled.step.actions
    assert app_driver(rolled.step.rollout, APP) == APP and rolled.runner_revision == "r1"


def test_an_explicit_strategy_that_cannot_roll_out_the_change_is_refused_and_the_stable_revision_runs_on() -> None:
    result = decide_rollout(
        APP, None, "r1", target(WINDOW, type_="hotSwap"), observed(driver()), submitted_revision="r1"
    )
    assert result.step.refusal is not None and result.step.refusal.reason == "UnsafeUpdateStrategy"
    assert result.step.rollout is None and result.step.stable_revision == "r1" and not result.step.actions
    assert (result.runner_revision, result.submitted_revision) == ("r1", "r1")
    status, reason, message = rollout_condition(result.step, "r2")
    assert (status, reason) == (False, "UnsafeUpdateStrategy")
    assert "spec.pipeline.nodes[3].aggregate.window" in message and "checkpointMigration" in message, message


def test_without_a_running_driver_the_next_driver_starts_the_new_revision() -> None:
    for drivers in ((), (driver(state="pending", running=()),), (driver(state="failed", running=()),)):
        result = decide_rollout(APP, None, "r1", target(FILTER), observed(*drivers), submitted_revision="r1")
        rollout = result.step.rollout
        assert rollout is not None and (rollout.strategy, rollout.phase) == ("restart", "Complete"), drivers
        starting = bool(drivers) and drivers[0].state == "pending"
        said = "a driver is starting: it runs this revision (restarted if" if starting else "no driver runs"
        assert said in (rollout.message or ""), rollout.message
        assert result.step.stable_revision == "r2" and not result.step.actions
        assert (result.runner_revision, result.submitted_revision) == ("r2", "r1"), "nothing to resubmit"
        # What a driver could not run on its checkpoints: the next driver hands the query over as it starts it.
        moved = decide_rollout(APP, None, "r1", target(WINDOW), observed(*drivers), submitted_revision="r1")
        migration = moved.step.rollout
        assert migration is not None and (migration.strategy, migration.phase) == ("checkpointMigration", "Complete")
        assert "hand over as it starts" in (migration.message or "") and moved.runner_revision == "r2"
        folders, migrations = revision_checkpoints("r2", {}, migration)
        assert folders == {"out": "out@r2"} and migrations["out"].fromCheckpoint == "out"
    first = decide_rollout(APP, None, None, target(to="r1"), observed(), submitted_revision=None)
    assert first.step.stable_revision == "r1" and (first.runner_revision, first.submitted_revision) == ("r1", "r1")


def test_a_driver_that_started_on_the_revision_before_a_completed_rollout_is_found_behind() -> None:
    """The lost update: a change applied while the driver starts completes at once (no driver runs yet), but the
    starting driver had read the revision before; once it answers, it is found running r1 where r2 is claimed."""
    starting = driver(state="pending", running=())
    done = decide_rollout(APP, None, "r1", target(FILTER), observed(starting), submitted_revision="r1").step.rollout
    assert done is not None and done.phase == "Complete" and done.toRevision == "r2"
    came_up_on_r1 = driver_facts(APP, "r1", "RUNNING", 0, status("r1"))
    assert came_up_on_r1.runs == "r1"
    assert driver_behind(done, came_up_on_r1, "r2", "r2") == "r1"
    assert driver_behind(None, came_up_on_r1, "r2", "r2") == "r1", "a restart on a stale mount, no rollout recorded"
    assert driver_behind(done, driver_facts(APP, "r1", "RUNNING", 0, status("r2")), "r2", "r2") is None, "converged"
    assert driver_behind(done, driver_facts(APP, "r1", "SUBMITTED", 0, None), "r2", "r2") is None, "not answering"
    in_progress = done.model_copy(update={"phase": "Verifying", "finishedAt": None})
    assert driver_behind(in_progress, came_up_on_r1, "r2", "r2") is None, "a rollout in progress owns the difference"
    failed = done.model_copy(update={"phase": "Failed"})
    assert driver_behind(failed, came_up_on_r1, "r2", "r2") is None, "a failed rollout's driver is not restarted"
    rolled_back = done.model_copy(update={"phase": "RolledBack"})
    assert driver_behind(rolled_back, driver_facts(APP, "r1", "RUNNING", 0, status("r2")), "r1", "r1") == "r2"
    # An operator killed after it swapped r3 in and before it wrote the rollout: the driver runs the spec's
    # revision, ahead of the status; the rollout planned again finds it there (nothing is restarted).
    ahead = driver_facts(APP, "r1", "RUNNING", 0, status("r3"))
    assert driver_behind(done, ahead, "r2", "r3") is None


def status(revision: str) -> DriverStatus:
    return DriverStatus(
        app=APP,
        revision=revision,
        observedAt="2026-11-28T00:00:00Z",
        queries=[QueryStatus(name="out", active=True, revision=revision)],
    )


def test_a_window_change_migrates_in_the_running_driver_onto_a_checkpoint_of_the_new_revision() -> None:
    planned = decide_rollout(APP, None, "r1", target(WINDOW), observed(driver()), submitted_revision="r1")
    rollout = planned.step.rollout
    assert rollout is not None and (rollout.strategy, rollout.phase, rollout.newDriver) == (
        "checkpointMigration",
        "Draining",
        False,
    )
    swap = next(a for a in planned.step.actions if isinstance(a, SwapQueries))
    asked = pending_swap(swap, driver())
    assert asked is not None
    by_name = {s.name: s for s in asked}
    assert by_name["out"].action == "migrate" and (by_name["out"].rewindMs or 0) > 0, "the rewind goes to the driver"
    assert by_name["lines-dead-letters"].action == "restart", "its late-record filter follows the window"
    # r2 runs the query on a checkpoint of its own, taken over from the stable one; r1 keeps its folders.
    folders, migrations = revision_checkpoints("r2", {}, rollout)
    assert folders == {"out": "out@r2"}
    assert migrations == {"out": Migration(fromCheckpoint="out", rewindMs=by_name["out"].rewindMs)}
    assert revision_checkpoints("r1", {}, rollout) == ({}, {})
    assert planned.runner_revision == "r2" and planned.submitted_revision == "r1", "no resubmission"

    # A refused migration (a query without final rows per window, say) rolls back like a refused swap.
    refused = with_refused_swap(observed(driver()), swap, "migrate of query 'out': its rows are not final")
    back = decide_rollout(APP, rollout, "r1", target(), refused, submitted_revision="r1")
    assert back.step.rollout is not None and back.step.rollout.phase == "RollingBack"

    migrated = driver(running=queries("r2", batches=3))
    done = decide_rollout(APP, rollout, "r1", target(), observed(migrated, at=T0 + 20), submitted_revision="r1")
    assert done.step.rollout is not None and done.step.rollout.phase == "Complete" and done.step.stable_revision == "r2"
    stable = revision_checkpoints("r2", {}, done.step.rollout)[0]
    assert stable == {"out": "out@r2"}, "what status.checkpoints keeps"

    # Rolled back instead: the old plan goes onto a new checkpoint, taking over from r2's (or, when r2's query
    # wrote nothing there, from the one it left: the driver tells from the checkpoint).
    failing = driver(running=(*queries("r2", only=("lines-dead-letters",)), *queries("r2", only=("out",), error="x")))
    rolling = decide_rollout(APP, rollout, "r1", target(), observed(failing, at=T0 + 5), submitted_revision="r1")
    assert rolling.step.rollout is not None and rolling.step.rollout.phase == "RollingBack"
    back_swap = next(a for a in rolling.step.actions if isinstance(a, SwapQueries))
    assert back_swap.revision == "r1"
    # A driver that starts r1 now takes the query's output over as the migrate step does.
    assert revision_checkpoints("r1", {}, rolling.step.rollout) == (
        {"out": "out@r1-1"},
        {"out": Migration(fromCheckpoint="out@r2", rewindMs=7_000, fallbackCheckpoint="out")},
    )
    assert revision_checkpoints("r2", {}, rolling.step.rollout)[0] == {"out": "out@r2"}
    assert [(s.name, s.action) for s in pending_swap(back_swap, migrated) or ()] == [
        ("lines-dead-letters", "restart"),
        ("out", "migrate"),
    ]

    # The next migration of the same query moves it from the checkpoint r2 gave it.
    r3 = observed(migrated, revisions=("r2", "r3"))
    again = decide_rollout(APP, done.step.rollout, "r2", target(FILTER, WINDOW, to="r3"), r3, "r1", stable)
    assert again.step.rollout is not None and again.step.rollout.fromCheckpoints == stable
    folders, migrations = revision_checkpoints("r3", stable, again.step.rollout)
    assert folders == {"out": "out@r3"} and migrations["out"].fromCheckpoint == "out@r2"
    # ... and a change it restarts for keeps it on that checkpoint.
    swapped = decide_rollout(APP, done.step.rollout, "r2", target(FILTER, to="r3"), r3, "r1", stable)
    assert swapped.step.rollout is not None and swapped.step.rollout.strategy == "hotSwap"
    assert revision_checkpoints("r3", stable, swapped.step.rollout) == ({"out": "out@r2"}, {})


@pytest.mark.parametrize("answers", ["it wrote", "it restarts"])
def test_a_migrated_query_rolls_back_onto_a_new_checkpoint_rewound_from_its_cut(answers: str) -> None:
    """The new query may have written output before it failed: the state of the checkpoint it left does not
    know what (a window of it straddling the new query's cut would count records again), so the old plan goes
    onto out@r1-1, rewound from that cut as a migration is (the old plan's watermark delay + window), and both
    folders the rollout leaves are retired once it has completed a batch there. The same whether the driver
    answers (its query completed batches) or is restarting past the deadline: whether the new query wrote
    anything, the driver tells from its checkpoint (fallbackCheckpoint: where to take over from if not)."""
    planned = decide_rollout(APP, None, "r1", target(WINDOW), observed(driver()), submitted_revision="r1")
    rollout = planned.step.rollout
    assert rollout is not None and rollout.rollbackRewindMs == {"out": 7_000}, "2 s watermark + the 5 s window"
    wrote = driver(
        running=(
            *queries("r2", batches=5, only=("lines-dead-letters",)),
            *queries("r2", batches=2, only=("out",), error="x"),
        )
    )
    facts = observed(wrote, at=T0 + 5) if answers == "it wrote" else observed(driver(state="pending"), at=T0 + 3600)
    rolling = decide_rollout(APP, rollout, "r1", target(), facts, submitted_revision="r1")
    back = rolling.step.rollout
    assert back is not None and back.phase == "RollingBack" and back.backCheckpoints == {"out": "out@r1-1"}
    assert revision_checkpoints("r1", {}, back) == (
        {"out": "out@r1-1"},
        {"out": Migration(fromCheckpoint="out@r2", rewindMs=7_000, fallbackCheckpoint="out")},
    )
    if answers == "it restarts":
        return
    back_swap = next(a for a in rolling.step.actions if isinstance(a, SwapQueries))
    asked = {s.name: s for s in pending_swap(back_swap, wrote) or ()}
    assert (asked["out"].action, asked["out"].rewindMs) == ("migrate", 7_000)

    on_r1 = driver(running=queries("r1", batches=0, backlog=100))
    waiting = decide_rollout(APP, back, "r1", target(), observed(on_r1, at=T0 + 6), submitted_revision="r1")
    assert waiting.step.rollout is not None and waiting.step.rollout.phase == "RollingBack", (
        "no batch on out@r1-1 yet: a restart would hand over from out@r2 again"
    )
    handed_back = driver(running=queries("r1", batches=1))
    rolled = decide_rollout(APP, back, "r1", target(), observed(handed_back, at=T0 + 7), submitted_revision="r1")
    assert rolled.step.rollout is not None and rolled.step.rollout.phase == "RolledBack"
    assert ReleaseRevision("r2", ("out",), ("out@r2", "out")) in rolled.step.actions
    assert revision_checkpoints("r1", {}, rolled.step.rollout)[0] == {"out": "out@r1-1"}, "status.checkpoints"

    # Rolled back again later from there, the next new folder is out@r1-2.
    assert rollback_folder("out", "r1", "out@r1-1") == "out@r1-2"
    assert rollback_folder("out", "r1", "out@r2") == "out@r1-1"


def test_pending_swap_asks_only_for_what_the_driver_does_not_run_yet() -> None:
    steps = (
        QueryStep(name="out", action="restart"),
        QueryStep(name="lines-dead-letters", action="keep"),
        QueryStep(name="extra", action="start"),
        QueryStep(name="old", action="stop"),
    )
    swap = SwapQueries(APP, "r2", steps)
    running = driver(running=(*queries("r1"), *queries("r1", only=("old",))))
    first = pending_swap(swap, running)
    assert first is not None
    assert [(s.name, s.action) for s in first] == [
        ("out", "restart"),
        ("lines-dead-letters", "keep"),
        ("extra", "start"),
        ("old", "stop"),
    ]
    done = driver(running=(*queries("r2", only=("out", "extra")), *queries("r1", only=("lines-dead-letters",))))
    assert pending_swap(swap, done) is None
    failed = driver(running=(*queries("r2", only=("out",), error="boom"), *queries("r1", only=("lines-dead-letters",))))
    assert [(s.name, s.action) for s in pending_swap(swap, failed) or ()] == [
        ("out", "restart"),
        ("lines-dead-letters", "keep"),
        ("extra", "start"),
    ]
    # Rolling back a removed query: it starts again on the checkpoint it kept.
    restore = SwapQueries(APP, "r1", (QueryStep(name="old", action="restore"),))
    assert [(s.name, s.action) for s in pending_swap(restore, driver(running=())) or ()] == [("old", "start")]


def test_driver_facts_count_the_current_runs_batches_and_each_querys_topics_backlog() -> None:
    status = DriverStatus(
        app=APP,
        revision="r1",
        observedAt="2026-11-23T00:00:00Z",
        queries=[
            QueryStatus(name="out", active=True, batches=9, runBatches=2, revision="r2", topics=["a", "b"]),
            QueryStatus(name=QUERIES[0], active=False, error="boom", topics=[]),
        ],
        topics=[
            TopicStatus(topic="a", partitions=1, latestOffsets=10, backlog=3),
            TopicStatus(topic="b", partitions=1, latestOffsets=10, backlog=4),
        ],
    )
    facts = driver_facts(APP, "r1", "RUNNING", 1, status)
    assert (facts.state, facts.revision, facts.restarts) == ("running", "r1", 1)
    out, dead = facts.queries
    assert (out.revision, out.batches, out.backlog, out.active) == ("r2", 2, 7, True)
    assert (dead.revision, dead.backlog, dead.error) == ("r1", None, "boom")
    assert driver_facts(APP, "r1", "FAILED", 3, None).state == "failed"
    assert driver_facts(APP, "r1", "SUBMITTED", 0, None).state == "pending"


def test_an_image_change_is_handed_over_to_a_second_driver_that_takes_over_as_the_apps_driver() -> None:
    planned = decide_rollout(APP, None, "r1", target(IMAGE), observed(driver()), submitted_revision="r1")
    rollout = planned.step.rollout
    assert rollout is not None and (rollout.strategy, rollout.phase, rollout.newDriver) == (
        "fencedHandover",
        "Planned",
        True,
    )
    new = rollout.toDriver
    assert new == f"{APP}-r2" and handover_driver(rollout) == new and app_driver(rollout, APP) == APP
    assert [a for a in planned.step.actions if isinstance(a, StartDriver)] == [
        StartDriver(new, "r2", standby=True, steps=tuple(rollout.queries))
    ]
    assert not [a for a in planned.step.actions if isinstance(a, Drain)], "nothing drains before the new one waits"
    # The app's driver keeps r1 (and its SparkApplication) throughout: the new revision runs in the other one.
    assert (planned.runner_revision, planned.submitted_revision) == ("r1", "r1")
    assert (on_standby(rollout, new, APP, True), on_standby(rollout, APP, APP, True)) == (True, False)

    standby = driver(new, "r2", state="standby", running=())
    draining = decide_rollout(APP, rollout, "r1", target(), observed(driver(), standby), submitted_revision="r1")
    rollout = draining.step.rollout
    assert rollout is not None and rollout.phase == "Draining"
    assert Drain(APP) in draining.step.actions and not [a for a in draining.step.actions if isinstance(a, Activate)]
    assert on_standby(rollout, APP, APP, True) and on_standby(rollout, new, APP, True)

    # The drain answered: the same pass decides on what the drivers said, and activates the new one.
    drained = with_driver_state(observed(driver(), standby), APP, "drained", ())
    starting = decide_rollout(APP, rollout, "r1", target(), drained, submitted_revision="r1")
    rollout = starting.step.rollout
    assert rollout is not None and rollout.phase == "Starting" and Activate(new) in starting.step.actions
    assert (on_standby(rollout, APP, APP, True), on_standby(rollout, new, APP, True)) == (True, False)
    started = tuple(QueryFacts(q, "r2", active=True) for q in QUERIES)
    active = with_driver_state(drained, new, "running", started)
    verifying = decide_rollout(APP, rollout, "r1", target(), active, submitted_revision="r1")
    rollout = verifying.step.rollout
    assert rollout is not None and rollout.phase == "Verifying"
    assert (verifying.runner_revision, app_driver(rollout, APP), retired_drivers(rollout, APP)) == ("r1", APP, [])

    healthy = observed(driver(state="drained", running=()), driver(new, "r2", running=queries("r2", batches=3)))
    done = decide_rollout(APP, rollout, "r1", target(), healthy, submitted_revision="r1")
    rollout = done.step.rollout
    assert rollout is not None and rollout.phase == "Complete" and done.step.stable_revision == "r2"
    assert DeleteDriver(APP) in done.step.actions
    assert app_driver(rollout, APP) == new and handover_driver(rollout) is None
    assert retired_drivers(rollout, new) == [APP], "the old driver goes, also when its first delete failed"
    assert not on_standby(rollout, new, new, True) and done.runner_revision == "r2"


def test_a_new_driver_that_fails_is_drained_and_the_old_one_resumes() -> None:
    planned = decide_rollout(APP, None, "r1", target(IMAGE), observed(driver()), submitted_revision="r1")
    rollout = planned.step.rollout
    assert rollout is not None
    new = rollout.toDriver
    failing = driver(new, "r2", running=queries("r2", error="[UNRESOLVED_COLUMN] `nope`"))
    facts = observed(driver(state="drained", running=()), failing, at=T0 + 5)
    activated = rollout.model_copy(update={"phase": "Verifying"})
    back = decide_rollout(APP, activated, "r1", target(), facts, submitted_revision="r1")
    rollout = back.step.rollout
    assert rollout is not None and rollout.phase == "RollingBack" and "UNRESOLVED_COLUMN" in (rollout.message or "")
    assert Drain(new) in back.step.actions, "the new driver writes its last batch before the old one resumes"
    assert (on_standby(rollout, new, APP, True), on_standby(rollout, APP, APP, True)) == (True, False)
    stopped = observed(driver(state="drained", running=()), driver(new, "r2", state="drained", running=()))
    resumed = decide_rollout(APP, rollout, "r1", target(), stopped, submitted_revision="r1")
    assert any(type(a).__name__ == "Resume" and a.driver == APP for a in resumed.step.actions)
    running_again = observed(driver(), driver(new, "r2", state="drained", running=()))
    rolled = decide_rollout(APP, resumed.step.rollout, "r1", target(), running_again, submitted_revision="r1")
    rollout = rolled.step.rollout
    assert rollout is not None and rollout.phase == "RolledBack" and DeleteDriver(new) in rolled.step.actions
    assert app_driver(rollout, APP) == APP and retired_drivers(rollout, APP) == [new]
    assert rolled.step.stable_revision == "r1" and rolled.runner_revision == "r1"


def test_driver_facts_take_the_drivers_own_state() -> None:
    for state in ("standby", "running", "draining", "drained"):
        status = DriverStatus(app=APP, revision="r2", state=state, observedAt="2026-01-01T00:00:00Z")  # type: ignore[arg-type]
        assert driver_facts(APP, "r2", "RUNNING", 0, status).state == state
