"""`sluice plan` and the operator's rollout decide alike: over every class of change (change_cases), the plan the
CLI prints is the step the operator's rollout state machine takes for a running app."""

from __future__ import annotations

import pytest
from change_cases import CASES, ChangeCase, changed, wordcount_spec

from sluice.api.rollout import plan_change, runs_like
from sluice.operator.model import StreamingAppSpec
from sluice.operator.rollout import DriverFacts, Observed, QueryFacts, Target, classify, step

APP = "wc"
T0 = 1_700_000_000.0


def running_driver(old: StreamingAppSpec) -> DriverFacts:
    names = [n.name for n in old.pipeline.nodes if n.kind == "sink"] + ["lines-dead-letters"]
    return DriverFacts(APP, "r1", "running", 0, tuple(QueryFacts(n, "r1", active=True, batches=5) for n in names))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_sluice_plan_says_what_the_operators_rollout_does(case: ChangeCase) -> None:
    old = StreamingAppSpec.model_validate(wordcount_spec())
    new = StreamingAppSpec.model_validate(changed(case))
    planned = plan_change(old, runs_like(new, old))
    assert (planned.strategy, planned.new_driver, bool(planned.refusal)) == (
        case.strategy,
        case.new_driver,
        case.refused,
    )
    assert {q.name: q.action for q in planned.queries if q.name in case.actions} == case.actions

    diff = classify(old, new)
    facts = Observed(now=T0, revisions=frozenset({"r1", "r2"}), drivers=(running_driver(old),))
    operator = step(APP, None, "r1", Target("r2", new.updateStrategy, diff), facts)
    if case.refused:
        assert operator.rollout is None and operator.refusal is not None
        assert operator.refusal.message == planned.refusal
    elif case.strategy is None:
        assert operator.refusal is None and (operator.rollout is None or operator.rollout.strategy is None)
        assert not planned.rollout
    else:
        rollout = operator.rollout
        assert rollout is not None and operator.refusal is None
        assert (rollout.strategy, rollout.newDriver) == (planned.strategy, planned.new_driver)
        assert {q.name: (q.action, q.rewindMs) for q in rollout.queries} == {
            q.name: (q.action, q.rewind_ms) for q in planned.queries
        }


def test_a_change_that_names_what_the_operator_filled_in_changes_nothing() -> None:
    """The running revision's spec has the operator's defaults filled in; a file leaving them out, or naming the
    same ones, plans no rollout."""
    old = StreamingAppSpec.model_validate(
        {
            **wordcount_spec(),
            "spark": {"image": "sluice/spark:0.1.0", "version": "4.2.0"},
            "checkpoint": {"location": "s3a://b/apps"},
        }
    )
    same = StreamingAppSpec.model_validate(wordcount_spec())
    assert not plan_change(old, runs_like(same, old)).changes
    moved = StreamingAppSpec.model_validate({**wordcount_spec(), "checkpoint": {"location": "s3a://other/apps"}})
    assert plan_change(old, runs_like(moved, old)).rollout
