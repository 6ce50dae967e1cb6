"""`sluice plan` and the operator's rollout decide alike: over every class of change (change_cases), the plan the
CLI prints is the step the operator's rollout state machine takes for a running app."""

from __future__ import annotations

import pytest
from change_cases import CASES, ChangeCase, changed, wordcount_spec

from sluice.api.app import revision
from sluice.api.rollout import plan_change, runs_like
from sluice.operator import spark_application as sparkapp
from sluice.operator.model import StreamingAppSpec
from sluice.operator.rollout import DriverFacts, Observed, QueryFacts, Target, classify, diff_base, step

APP = "wc"
T0 = 1_700_000_000.0


def running_driver(old: StreamingAppSpec, rev: str) -> DriverFacts:
    names = [n.name for n in old.pipeline.nodes if n.kind == "sink"] + ["lines-dead-letters"]
    return DriverFacts(APP, rev, "running", 0, tuple(QueryFacts(n, rev, active=True, batches=5) for n in names))


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
    assert planned.resubmit == case.resubmit
    assert {q.name: q.action for q in planned.queries if q.name in case.actions} == case.actions

    # The operator: a rollout when the revision changes (diff_base), else the driver's SparkApplication as
    # rendered from the new spec (spark-operator resubmits on a change of it).
    stable, target = revision(old), revision(new)
    base = diff_base(None, stable, target)
    if base is None:
        assert not planned.rollout
        before = sparkapp.spark_application(APP, "apps", old)
        submitted = old.executors.instances  # the operator keeps the count submitted (executors go live)
        after = sparkapp.spark_application(APP, "apps", new, submitted_executors=submitted)
        assert (before["spec"] != after["spec"]) == planned.resubmit
        assert sparkapp.kept_as_submitted(before, after) is False, "a runtime change is applied, not kept"
        return
    facts = Observed(now=T0, revisions=frozenset({stable, target}), drivers=(running_driver(old, stable),))
    operator = step(APP, None, stable, Target(target, new.updateStrategy, classify(old, new)), facts)
    if case.refused:
        assert operator.rollout is None and operator.refusal is not None
        assert operator.refusal.message == planned.refusal
    elif case.strategy is None:
        assert operator.refusal is None and not planned.rollout
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
