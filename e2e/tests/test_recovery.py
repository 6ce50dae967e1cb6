"""The output pause a fault caused, read from commit times (sluice.testbed.recovery), without Spark."""

from __future__ import annotations

import os
from pathlib import Path

from sluice.testbed.recovery import commit_times, output_pause, pauses_summary


def test_a_kill_costs_the_time_to_the_next_commit() -> None:
    assert output_pause([1.0, 2.0, 9.5, 10.5], start=3.0) == 6.5


def test_an_outage_costs_its_longest_stretch_without_a_commit() -> None:
    # a broker down from 10 to 30: commits went on at 12 and 14, then stalled until 27
    assert output_pause([9.0, 12.0, 14.0, 27.0, 33.0, 34.0], start=10.0, end=30.0) == 13.0


def test_output_that_never_advanced_again_is_none() -> None:
    assert output_pause([1.0, 2.0], start=3.0) is None
    assert output_pause([1.0, 5.0], start=3.0, end=6.0) is None


def test_the_summary_names_faults_never_recovered() -> None:
    assert pauses_summary([4.04, None, 10.0, 2.0]) == {
        "per_fault_s": [4.0, None, 10.0, 2.0],
        "median_s": 4.0,
        "max_s": 10.0,
        "never_recovered": 1,
    }
    assert pauses_summary([])["median_s"] is None


def test_commit_times_are_the_commit_files_times_in_order(tmp_path: Path) -> None:
    for batch, mtime in (("0", 100.0), ("2", 300.0), ("1", 200.0), (".1.crc", 50.0)):
        (tmp_path / batch).write_text("v1")
        os.utime(tmp_path / batch, (mtime, mtime))
    assert commit_times(tmp_path) == [100.0, 200.0, 300.0]
