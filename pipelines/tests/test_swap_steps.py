"""A hot swap's steps checked against the run before anything changes (swap_steps): pure, no Spark session."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.api.contract import QueryStep, RunnerConfig
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.compiler import QueryPlan
from sluice.pipelines.swap_steps import SwapRefused, steps_by_action, still_to_do

PIPELINE = PipelineSpec.model_validate(
    {
        "nodes": [
            {"name": "words", "fromKafka": {"topic": "in", "startingOffsets": "earliest"}},
            {"name": "counts", "inputs": ["words"], "toKafka": {"topic": "out"}},
        ]
    }
)


def config(revision: str = "r1", **update: Any) -> RunnerConfig:
    fields: dict[str, Any] = {"app": "a", "kafkaBootstrap": "k:9092", "checkpointRoot": "/chk", **update}
    return RunnerConfig(revision=revision, pipeline=PIPELINE, **fields)


def plan(name: str, *, final: bool = True, stateful: bool = True) -> QueryPlan:
    """What the checks read of a compiled query: whether it is stateful and its rows final per window."""
    return QueryPlan(
        name=name,
        df=None,  # type: ignore[arg-type]  # never read by the checks
        sink_op=name,
        sink=None,
        output_mode="append",
        final_time="window_time" if final else None,
        stateful=stateful,
    )


def step(name: str, action: str, rewind: int | None = None) -> QueryStep:
    return QueryStep.model_validate({"name": name, "action": action, "rewindMs": rewind})


def test_a_swap_asked_again_changes_nothing_the_second_time() -> None:
    current, new = config("r2"), config("r2")
    steps = [step("counts", "restart"), step("gone", "stop"), step("back", "restore"), step("idle", "start")]
    running = {"counts": "r2", "idle": None}  # counts already runs r2; idle is one of the run's, not active
    todo = still_to_do(steps, current=current, config=new, running=running)
    assert [(s.name, s.action) for s in todo] == [("counts", "keep"), ("back", "start"), ("idle", "start")], (
        "the stop of a query the run no longer has is dropped; a restore of one it does not run is a start"
    )
    moved = config("r2", checkpoints={"counts": "counts@r2"})
    assert still_to_do([step("counts", "migrate")], current=current, config=moved, running=running)[0].action == (
        "migrate"
    ), "the same revision on another checkpoint is still to do"


def test_the_steps_by_action_name_every_query_once() -> None:
    current = config("r1")
    new = config("r2", checkpoints={"moved": "moved@r2"})
    steps = [step("kept", "keep"), step("again", "restart"), step("moved", "migrate", 7000), step("old", "stop")]
    steps.append(step("fresh", "start"))
    plans = {name: plan(name) for name in ("kept", "again", "moved", "fresh")}
    by_action = steps_by_action(
        steps, current=current, config=new, plans=plans, running={"kept", "again", "moved", "old"}
    )
    assert by_action == {
        "restart": ["again"],
        "move": ["moved"],
        "start": ["fresh"],
        "stop": ["old"],
        "keep": ["kept"],
    }


@pytest.mark.parametrize(
    ("steps", "new", "plans", "field", "message"),
    [
        ([step("q", "keep")], config("r2", checkpointRoot="/other"), {"q"}, "config.checkpointRoot", "keeps the run's"),
        ([step("q", "keep"), step("q", "restart")], config("r2"), {"q"}, "steps[1].name", "has two steps"),
        ([step("q", "restart")], config("r2", checkpoints={"q": "q@r2"}), {"q"}, "steps[0].action", "takes migrate"),
        ([step("q", "start")], config("r2"), {"q"}, "steps[0].name", "is one of this driver's"),
        ([step("q", "stop")], config("r2"), {"q"}, "steps[0].name", "is in the new pipeline"),
        ([step("q", "restart")], config("r2"), {"q", "new"}, "steps", "no step for the queries new"),
        ([step("q", "migrate", 7000)], config("r2"), {"q"}, "steps[0].action", "needs another checkpoint"),
    ],
    ids=["run setting", "two steps", "restart moves", "start a running one", "stop a kept one", "missing", "same"],
)
def test_a_swap_that_does_not_fit_the_run_is_refused_naming_the_field(
    steps: list[QueryStep], new: RunnerConfig, plans: set[str], field: str, message: str
) -> None:
    with pytest.raises(SwapRefused, match=message) as refused:
        steps_by_action(steps, current=config(), config=new, plans={p: plan(p) for p in plans}, running={"q"})
    assert refused.value.field == field


def test_a_query_moves_to_another_checkpoint_only_with_its_output_kept_once() -> None:
    new = config("r2", checkpoints={"q": "q@r2"})
    running = {"q"}

    def by_action(action: str, rewind: int | None, **kind: bool) -> dict[str, list[str]]:
        return steps_by_action(
            [step("q", action, rewind)], current=config(), config=new, plans={"q": plan("q", **kind)}, running=running
        )

    assert by_action("migrate", 7000)["move"] == ["q"], "final rows per window: the output gate keeps them once"
    assert by_action("migrate", 0, final=False, stateful=False)["move"] == ["q"], "stateless, where the old one stopped"
    for action, rewind, kind in [("migrate", 7000, {"stateful": False}), ("restore", None, {}), ("migrate", 0, {})]:
        with pytest.raises(SwapRefused, match="not final per event-time window") as refused:
            by_action(action, rewind, final=False, **kind)
        assert refused.value.field == "steps[0].action"
