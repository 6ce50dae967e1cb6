"""`make soak` (sluice.testbed.soak): hours of the word count on the local cluster, its output checked exactly
once at the end and its memory, threads, files, checkpoint and Kafka sampled each minute (.sluice/soak/)."""

from __future__ import annotations

import json

import pytest

from sluice.testbed.common import ProvisionError
from sluice.testbed.local_run import deployed_word_count
from sluice.testbed.soak import SOAK_DIR, Soak, SoakPlan, planned, soak_app_settings, write_results

pytestmark = [pytest.mark.kube, pytest.mark.soak]


def soak_timeout() -> float:
    try:
        return SoakPlan.from_env().minutes * 60 + 3600  # the cluster's setup and the end check besides
    except ValueError:
        return 900  # the test says what is wrong


@pytest.mark.timeout(soak_timeout())
def test_soak(tmp_path_factory: pytest.TempPathFactory) -> None:
    try:
        plan = SoakPlan.from_env()
    except ValueError as error:
        pytest.fail(str(error), pytrace=False)
    SOAK_DIR.mkdir(parents=True, exist_ok=True)
    (SOAK_DIR / "plan.json").write_text(json.dumps(planned(plan), indent=1) + "\n")
    try:
        with deployed_word_count(tmp_path_factory.mktemp("soak"), soak_app_settings) as suite:
            soak = Soak(suite, plan)
            try:
                summary = soak.run()
            finally:  # hours of samples are kept even when the run fails
                (SOAK_DIR / "series.json").write_text(json.dumps(soak.series) + "\n")
            paths = write_results(summary, soak.series)
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)
    print(f"soak: {summary['minutes']} min, {summary['records']} records, {summary['lost']} lost, "
          f"{summary['duplicated']} duplicated: {', '.join(str(p) for p in paths)}")  # fmt: skip
    assert summary["records"] > 0 and "driver_jvm_heap_used_bytes" in summary["series"], summary
    assert "driver_jvm_native_memory_total_bytes" in summary["series"], "the soak's driver runs with NMT on"
    failed = [e for e in summary["events"] if "error" in e or e.get("phase", "Complete") != "Complete"]
    assert failed == [], failed
    assert (summary["lost"], summary["duplicated"], summary["duplicated_windows"]) == (0, 0, 0), summary
    growth = summary["growth"]
    if plan.minutes >= plan.driver_kill_every:  # the first driver lived past its warm-up for an hour
        assert "driver_jvm_rss_bytes" in growth["judged"], growth
    assert growth["beyond"] == {}, f"grew more than {growth['bound_pct_per_hour']} %/h: {growth}"
