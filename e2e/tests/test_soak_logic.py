"""Pure parts of the soak (sluice.testbed.soak); the soak itself runs in make soak."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from sluice.testbed.e2e_suite import HostKafka
from sluice.testbed.soak import (
    GROWTH_BOUND_PCT_PER_HOUR,
    JUDGED_MINUTES,
    REQUESTS,
    RESPONSES,
    PairedLoad,
    SoakPlan,
    checkpoint_kind,
    draw,
    growth_pct_per_hour,
    growth_verdict,
    host_bootstrap,
    longest_driver,
    metric_values,
    pod_figures,
    process_role,
    series_name,
    settled_rise,
    soak_app_settings,
    summarize,
    transactions_listed,
)


def test_the_length_comes_from_the_environment_and_bad_values_name_the_variable() -> None:
    assert SoakPlan.from_env({}).minutes == 180
    assert SoakPlan.from_env({"SLUICE_SOAK_MINUTES": "45"}).minutes == 45
    with pytest.raises(ValueError, match="SLUICE_SOAK_MINUTES='an hour'"):
        SoakPlan.from_env({"SLUICE_SOAK_MINUTES": "an hour"})
    with pytest.raises(ValueError, match="at least 5 minutes"):
        SoakPlan.from_env({"SLUICE_SOAK_MINUTES": "2"})


def test_the_load_falls_and_rises_like_a_day() -> None:
    plan = SoakPlan(120, base_rate=30, swing=0.5, day_minutes=60)
    assert plan.rate_at(0) == pytest.approx(15)  # night
    assert plan.rate_at(30) == pytest.approx(45)  # midday
    assert plan.rate_at(60) == pytest.approx(15)
    assert min(plan.rate_at(m / 4) for m in range(480)) >= 15 - 1e-9


def test_disturbances_are_apart_and_leave_the_end_quiet() -> None:
    plan = SoakPlan(180)
    events = plan.events()
    minutes = [m for m, _ in events]
    assert minutes == sorted(minutes)
    assert all(b - a >= 5 for a, b in itertools.pairwise(minutes))
    assert max(minutes) <= 170
    kinds = {kind for _, kind in events}
    assert kinds == {"hot_swap", "migration", "driver_kill"}
    assert sum(1 for _, k in events if k == "hot_swap") == 6  # 25, 50, … 150 (175 is in the quiet end)
    assert SoakPlan(20).events() == []  # shorter than every interval


def test_growth_is_the_slope_per_hour_in_percent_of_the_median() -> None:
    flat = [(float(m), 100.0) for m in range(60)]
    assert growth_pct_per_hour(flat, after=10) == 0
    growing = [(float(m), 100.0 + m) for m in range(0, 61)]  # +1 a minute; median after 30: 145
    assert growth_pct_per_hour(growing, after=30) == pytest.approx(60 / 145 * 100, abs=0.01)
    warmup_only = [(0.0, 10.0), (1.0, 500.0), (20.0, 500.0), (21.0, 500.0), (22.0, 500.0)]
    assert growth_pct_per_hour(warmup_only, after=15) == 0  # the warm-up's climb is left out
    assert growth_pct_per_hour([(20.0, 1.0), (21.0, 1.0)], after=15) is None


def test_a_burst_is_not_growth() -> None:
    """The 100-minute soak's operator: 6-7 threads, bursts to 11 during rollouts and at the end. A least-squares
    fit read +21.7 %/h and a rise of 4 from the first sample to the last; neither is a leak."""
    threads = [(float(m), 6.0 if m < 60 else 7.0) for m in range(30, 131)]
    bursty = [(m, 11.0 if m in (55.0, 80.0, 105.0, 128.0, 129.0, 130.0) else v) for m, v in threads]
    assert growth_pct_per_hour(bursty, after=30) == growth_pct_per_hour(threads, after=30) == 0
    assert settled_rise(bursty) == 1
    leaking = [(m, v + (m - 30) // 10) for m, v in bursty]  # one more thread every 10 minutes
    assert growth_pct_per_hour(leaking, after=30) > GROWTH_BOUND_PCT_PER_HOUR
    assert settled_rise(leaking) == 10


def test_summary_has_the_issues_shape() -> None:
    series = {"driver_pod_memory_bytes": [(0.0, 1.0), (20.0, 2.0), (30.0, 2.0), (40.0, 2.0)], "executors": [(1.0, 1)]}
    summary = summarize(series, SoakPlan(60, warmup_minutes=15), 60.4, 1000, 0, 0)
    assert {"minutes", "records", "lost", "duplicated", "series"} <= set(summary)
    assert summary["series"] == {
        "driver_pod_memory_bytes": {
            "unit": "bytes",
            "after_warmup": 2.0,
            "end": 2.0,
            "growth_pct_per_hour": 0.0,
            "rise": 0.0,
            "window": [15, 60.4],
        }
    }  # executors has no sample after the warm-up


def test_driver_series_are_read_over_the_driver_that_lived_longest() -> None:
    """A killed driver's successor starts small and warms up again: over the whole run that reads as a drop, or
    as growth. Each driver series is read from the longest-lived driver's start plus the warm-up to its end."""
    drivers = [(float(m), "first") for m in range(0, 40)] + [(float(m), "second") for m in range(40, 120)]
    memory = [(float(m), 900.0 if m < 40 else 500.0 + min(m - 40, 10) * 40) for m in range(120)]
    operator = [(float(m), 100.0) for m in range(120)]
    summary = summarize(
        {"driver_jvm_rss_bytes": memory, "operator_rss_bytes": operator},
        SoakPlan(120, warmup_minutes=15),
        120,
        1,
        0,
        0,
        drivers,
    )
    driver = summary["series"]["driver_jvm_rss_bytes"]
    assert driver["window"] == [55, 120] and driver["growth_pct_per_hour"] == 0  # the second one's, warm
    assert driver["after_warmup"] == 900.0
    assert summary["series"]["operator_rss_bytes"]["window"] == [15, 120]  # not replaced by a driver kill
    assert summary["drivers"] == 2
    assert longest_driver([], 10) is None


def test_a_longest_driver_before_a_kill_ends_before_its_successor() -> None:
    """The first driver lived longest: its window ends before the next driver's first (small) sample."""
    drivers = [(float(m), "first") for m in range(0, 80)] + [(float(m), "second") for m in range(80, 100)]
    memory = [(float(m), 1000.0 if m < 80 else 300.0) for m in range(100)]
    summary = summarize({"driver_jvm_rss_bytes": memory}, SoakPlan(100, warmup_minutes=15), 100, 1, 0, 0, drivers)
    driver = summary["series"]["driver_jvm_rss_bytes"]
    assert driver["window"] == [15, 80] and driver["end"] == 1000.0 and driver["growth_pct_per_hour"] == 0


def test_growth_is_judged_on_what_processes_hold_over_an_hour_or_more() -> None:
    def figures(
        growth: float | None, window: tuple[float, float] = (30, 140), rise: float = 100.0, unit: str = "bytes"
    ) -> dict[str, Any]:
        return {
            "growth_pct_per_hour": growth,
            "window": list(window),
            "after_warmup": 1.0,
            "end": 1.0 + rise,
            "unit": unit,
        }

    verdict = growth_verdict(
        {
            "join_driver_jvm_rss_bytes": figures(2.9),
            "operator_rss_bytes": figures(6.5),
            "join_driver_pod_anon_bytes": figures(4.9),
            "join_driver_pod_memory_bytes": figures(9.0),  # memory.current: page cache too
            "operator_threads": figures(6.0, rise=1, unit="threads"),  # 12 -> 13 threads: one more worker
            "driver_runner_open_files": figures(30.0, window=(30, 95), rise=12, unit="files"),  # a leak of files
            "driver_runner_threads": figures(12.0, window=(30, 56.5), unit="threads"),  # 26 minutes: noise
            "driver_jvm_native_memory_total_bytes": figures(4.0, window=(30, 95)),
            "checkpoint_logs_bytes": figures(0.2),
            "checkpoint_state_bytes": figures(20.0),  # follows the load
            "executor_jvm_rss_max_bytes": figures(9.0),  # executors come and go with the autoscaler
            "driver_jvm_native_memory_compiler_bytes": figures(100.0),  # a part of the RSS
            "join_driver_jvm_threads": figures(None, unit="threads"),
        }
    )
    assert verdict["judged"] == {
        "join_driver_jvm_rss_bytes": 2.9,
        "operator_rss_bytes": 6.5,
        "join_driver_pod_anon_bytes": 4.9,
        "operator_threads": 6.0,
        "driver_runner_open_files": 30.0,
        "driver_jvm_native_memory_total_bytes": 4.0,
        "checkpoint_logs_bytes": 0.2,
    }
    assert verdict["beyond"] == {"operator_rss_bytes": 6.5, "driver_runner_open_files": 30.0}
    assert verdict["too_short"] == ["driver_runner_threads", "join_driver_jvm_threads"]
    assert verdict["bound_pct_per_hour"] == GROWTH_BOUND_PCT_PER_HOUR


def test_the_word_counts_first_driver_lives_long_enough_to_be_judged() -> None:
    plan = SoakPlan(180)
    kills = [m for m, kind in plan.events() if kind == "driver_kill"]
    assert kills[0] - plan.warmup >= JUDGED_MINUTES, kills


POD_OUTPUT = """cgroup 734003200 690487296
proc 4 1 4 /usr/bin/tini -s -- /opt/entrypoint.sh driver
proc 612340 97 310 /usr/lib/jvm/java-17-openjdk-amd64/bin/java -cp /opt/spark/jars/* org.apache.spark.deploy.SparkSubmit
proc 81220 14 22 /opt/python/bin/python3 /opt/sluice/runner.py --config /etc/sluice/runner.json
proc 40100 2 9 python3 -m pyspark.daemon
"""


def test_pod_figures_read_the_cgroup_and_each_process() -> None:
    figures = pod_figures(POD_OUTPUT)
    assert (figures.memory_bytes, figures.anon_bytes) == (734003200, 690487296)
    (jvm,) = figures.of("jvm")
    assert (jvm.rss_bytes, jvm.threads, jvm.files) == (612340 * 1024, 97, 310)
    assert [p.rss_bytes for p in figures.of("runner")] == [81220 * 1024]
    assert [p.rss_bytes for p in figures.of("python-worker")] == [40100 * 1024]
    assert process_role("/usr/bin/tini -s -- /opt/entrypoint.sh") == "other"


def test_checkpoint_files_are_sorted_into_logs_state_and_side_files() -> None:
    assert checkpoint_kind("out/offsets/12") == "logs"
    assert checkpoint_kind("out@5d1c0a2e/commits/12") == "logs"
    assert checkpoint_kind("out/metadata") == "logs"
    assert checkpoint_kind("out/state/0/1/3.changelog") == "state"
    assert checkpoint_kind("out/sluice/handovers/0") == "sluice"


def test_the_drivers_jvm_figures_become_series() -> None:
    text = (
        "# TYPE sluice_jvm_memory_bytes gauge\n"
        'sluice_jvm_memory_bytes{area="heap",kind="used"} 1.5e+08\n'
        'sluice_jvm_memory_bytes{area="buffers-direct",kind="used"} 2048\n'
        "# TYPE sluice_jvm_threads gauge\nsluice_jvm_threads 97\n"
        "# TYPE sluice_jvm_native_memory_bytes gauge\n"
        'sluice_jvm_native_memory_bytes{category="Java Heap"} 5.36870912e+08\n'
        "# TYPE sluice_batches_total counter\nsluice_batches_total 3\n"
    )
    values = metric_values(text, ("sluice_jvm_memory_bytes", "sluice_jvm_threads", "sluice_jvm_native_memory_bytes"))
    assert {series_name(m): v for m, v in values.items()} == {
        "driver_jvm_heap_used_bytes": 1.5e8,
        "driver_jvm_buffers_direct_used_bytes": 2048,
        "driver_jvm_live_threads": 97,  # the process's own count from /proc is driver_jvm_threads
        "driver_jvm_native_memory_java_heap_bytes": 536870912,
    }


def test_kafkas_transaction_list_is_read_by_its_header() -> None:
    text = (
        "TransactionalId            Coordinator ProducerId TransactionState\n"
        "sluice/sluice-apps/wordcount/out/0 1 3001 CompleteCommit\n"
        "sluice/sluice-apps/wordcount/out/1 1 3002 Ongoing\n"
    )
    assert transactions_listed(text) == {
        "sluice/sluice-apps/wordcount/out/0": "CompleteCommit",
        "sluice/sluice-apps/wordcount/out/1": "Ongoing",
    }
    assert transactions_listed("") == {}
    assert host_bootstrap(HostKafka("127.0.0.1:9092")) == "127.0.0.1:9092"


def test_the_soak_app_is_autoscaled_and_runs_its_driver_with_native_memory_tracking() -> None:
    app = {"spec": {"spark": {"sparkConf": {"spark.driver.extraJavaOptions": "-Dx=1"}}, "executors": {"instances": 2}}}
    changed = soak_app_settings(app)
    assert changed["spec"]["spark"]["sparkConf"]["spark.driver.extraJavaOptions"] == (
        "-Dx=1 -XX:NativeMemoryTracking=summary"
    )
    assert changed["spec"]["autoscaling"]["enabled"] is True
    assert changed["spec"]["executors"] == {"instances": 1, "min": 1, "max": 2}
    assert app["spec"]["spark"]["sparkConf"]["spark.driver.extraJavaOptions"] == "-Dx=1"  # a copy


def test_the_picture_has_a_panel_per_series(tmp_path) -> None:
    series = {"driver_pod_memory_bytes": [(0.0, 2.0**28), (20.0, 2.0**28)], "executors": [(0.0, 1.0), (20.0, 2.0)]}
    summary = summarize(series, SoakPlan(30), 30, 10, 0, 0)
    path = draw(series, summary, tmp_path / "soak.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.dumps(summary)  # plain values only


class RecordingKafka:
    def __init__(self) -> None:
        self.topics: dict[str, list[str]] = {}

    def produce(self, topic: str, values: list[str]) -> None:
        self.topics.setdefault(topic, []).extend(values)


def test_the_join_s_load_sends_each_request_with_one_response_within_the_join_s_second() -> None:
    import datetime as dt

    kafka = RecordingKafka()
    load = PairedLoad(kafka)
    load.burst(3)
    load.burst(2)
    requests = [json.loads(v) for v in kafka.topics[REQUESTS]]
    responses = {r["id"]: r for r in map(json.loads, kafka.topics[RESPONSES])}
    assert [r["id"] for r in requests] == ["r0", "r1", "r2", "r3", "r4"] and set(responses) == set(load.sent)
    for request in requests:
        asked = dt.datetime.fromisoformat(request["ts"])
        answered = dt.datetime.fromisoformat(responses[request["id"]]["ts"])
        assert dt.timedelta(0) <= answered - asked <= dt.timedelta(milliseconds=500), request
