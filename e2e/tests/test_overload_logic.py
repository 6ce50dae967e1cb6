"""The overload run's arithmetic (sluice.testbed.overload), without a cluster."""

from __future__ import annotations

import pytest

from sluice.testbed.overload import OverloadPlan, Sample, batch_rows, executors_gone, processed_per_second


def sample(t: float, read: int, batches: int, rows: int, executors: tuple[str, ...] = ("e1",)) -> Sample:
    return Sample(t, "overload", 30.0, 0, read, batches, rows, executors, None, None)


def test_batch_rows_are_the_mean_of_the_batches_between_two_samples() -> None:
    samples = [sample(0, 0, 3, 900), sample(10, 0, 4, 1300), sample(20, 0, 4, 1300), sample(30, 0, 6, 2100)]
    assert batch_rows(samples) == [400.0, 400.0]  # no batch completed between the second and third


def test_a_new_driver_s_counters_starting_over_are_not_a_batch() -> None:
    assert batch_rows([sample(0, 0, 10, 4000), sample(10, 0, 1, 400)]) == []


def test_processed_per_second_is_what_was_read_over_the_time_between() -> None:
    assert processed_per_second([sample(0, 100, 0, 0), sample(5, 150, 0, 0), sample(20, 500, 0, 0)]) == 20.0
    assert processed_per_second([sample(0, 100, 0, 0)]) is None


def test_an_executor_that_stops_running_is_gone_and_a_new_one_is_not() -> None:
    samples = [sample(0, 0, 0, 0, ("a",)), sample(10, 0, 0, 0, ("a", "b")), sample(20, 0, 0, 0, ("b", "c"))]
    assert executors_gone(samples) == ["a"]
    assert executors_gone(samples[:2]) == []


def test_the_plan_reads_its_minutes_and_names_a_wrong_value() -> None:
    assert OverloadPlan.from_env({}).minutes == 10
    assert OverloadPlan.from_env({"SLUICE_OVERLOAD_MINUTES": "3"}).minutes == 3
    with pytest.raises(ValueError, match="SLUICE_OVERLOAD_MINUTES='ten'"):
        OverloadPlan.from_env({"SLUICE_OVERLOAD_MINUTES": "ten"})
    with pytest.raises(ValueError, match="at least 2 minutes"):
        OverloadPlan.from_env({"SLUICE_OVERLOAD_MINUTES": "1"})
