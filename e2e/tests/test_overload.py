"""`make overload` (sluice.testbed.overload): three times what the capped executors can do, then a fifth of it,
on the local cluster; every record out once, nothing OOM-killed, batches bounded, the backlog caught up."""

from __future__ import annotations

import json

import pytest

from sluice.testbed.common import ProvisionError
from sluice.testbed.local_run import deployed_word_count
from sluice.testbed.overload import BATCH_BOUND, Overload, OverloadPlan, write_results

pytestmark = [pytest.mark.kube, pytest.mark.overload]


def overload_timeout() -> float:
    try:
        return OverloadPlan.from_env().minutes * 60 * 4 + 3600  # the overload, its catching up and the setup
    except ValueError:
        return 900  # the test says what is wrong


@pytest.mark.timeout(overload_timeout())
def test_overload(tmp_path_factory: pytest.TempPathFactory) -> None:
    try:
        plan = OverloadPlan.from_env()
    except ValueError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        with deployed_word_count(tmp_path_factory.mktemp("overload")) as suite:
            overload = Overload(suite, plan)
            try:
                summary = overload.run()
            except BaseException:  # the samples are kept when the run fails
                write_results({"incomplete": True, "pods": overload.pods}, overload.samples)
                raise
            paths = write_results(summary, overload.samples)
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
    print(f"overload: {json.dumps({k: v for k, v in summary.items() if k != 'pods'})}: {', '.join(paths)}")
    assert (summary["lost"], summary["duplicated"]) == (0, 0), summary
    assert summary["oom_killed"] == [] and summary["restarts"] == 0, summary["pods"]
    assert not summary["driver_restarted"] and summary["executors_lost_while_overloaded"] == [], summary
    assert summary["overload_factor"] >= 2, f"the load was not an overload: {summary}"
    growth = (summary["overload_rate"] - summary["capacity_per_second"]) * plan.minutes * 60
    assert summary["backlog_at_overload_end"] >= growth / 2, f"the backlog did not grow as sent - read: {summary}"
    assert 0 < summary["batch_rows_max"] <= BATCH_BOUND, summary
