"""Benchmark of the executor autoscaler on the simulated plant: no cluster, no Kafka, a few seconds.

    python operator/bench/bench_autoscaler.py [--output-dir DIR] [--trigger SECONDS]

Every scenario runs the default AutoscalingSpec (interval 10s, metricsWindow 1m, stabilization 1m,
targetUtilization 0.7 ± 0.1, targetLagSeconds 30, cooldowns 1m up / 5m down, scaleDownWindow 5m, maxStep 4)
with executors.min 1 and max 20, on a plant whose executors process 1000 records/s each (one core, 64
partitions, 30 s before an added executor works), which processes records as they arrive unless said otherwise
(--trigger: every scenario as processingTime micro-batches of that interval):

    step   1.4k rec/s, four times that (5.6k) from minute 10
    ramp   1.4k rec/s rising to 5.6k between minutes 10 and 30
    sine   3.5k ± 2.1k rec/s over a one-hour period
    noise  2.6k rec/s ± 20%, a new random factor every 10 s (seed 1)
    drop   5.6k rec/s, a quarter of that (1.4k) from minute 10
    slow   micro-batches every 10 s that read everything available, 300 rec/s on 1 executor, 2k rec/s from
           minute 10: batches outlast the samples (the saturated executor that once looked idle)

Figures per scenario, printed and written to DIR/autoscaler.json as
{"scenarios": {NAME: {"decisions", "seconds_to_stable", "overshoot_executors", "flaps"}}}:

    decisions            executor changes (up or down) in the run; holds do not count
    seconds_to_stable    from the load change (step, drop: the step; ramp: its start; sine, noise: the start of
                         the run) to the last change, after which the count stays put to the end of the run;
                         0 when nothing changed after the load change
    overshoot_executors  the most executors asked beyond what the scenario's peak input rate needs at the target
                         utilization, ceil(peak / (targetUtilization * 1000 rec/s)) within min..max; 0 if never
    flaps                direction reversals (a scale-up after a scale-down, or the reverse) under FLAP_SECONDS
                         (5 min) apart

Targets, those of the unit tests (the script exits 1 when a scenario breaks one):

    step   decisions <= 2, overshoot <= 1, flaps 0
    noise  decisions 0
    drop   first change no sooner than scaleDownWindow after the drop, ends at the count the lower load needs,
           overshoot 0, flaps 0
    ramp   overshoot <= 1, flaps 0
    sine   overshoot <= 1, flaps 0
    slow   first change a scale-up after the step, ends at the count the load needs, overshoot <= 1, flaps 0

A PNG per scenario (DIR/autoscaler-NAME.png) shows input rate, backlog and executors over time, changes marked.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from sluice.operator.autoscaler import Policy
from sluice.operator.model import AutoscalingSpec, ExecutorsSpec
from sluice.testbed.autoscaler_plant import (
    InputRate,
    Plant,
    Timeline,
    constant,
    noisy,
    ramp,
    simulate,
    sine,
    step,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
FLAP_SECONDS = 300.0
RATE_PER_EXECUTOR = 1000.0
LOW, HIGH = 1400.0, 5600.0
CHANGE_AT = 600.0
MIN_EXECUTORS, MAX_EXECUTORS = 1, 20


@dataclass(frozen=True)
class Scenario:
    name: str
    load: InputRate
    executors: int  # at the start
    duration: float  # seconds
    load_change: float  # when the load starts to change
    peak_rate: float
    trigger: float | None = None  # processingTime micro-batches; None: records processed as they arrive


SCENARIOS = [
    Scenario("step", step(LOW, HIGH, CHANGE_AT), 2, 3600, CHANGE_AT, HIGH),
    Scenario("ramp", ramp(LOW, HIGH, CHANGE_AT, 1200), 2, 3600, CHANGE_AT, HIGH),
    Scenario("sine", sine((LOW + HIGH) / 2, (HIGH - LOW) / 2, 3600), 5, 3 * 3600, 0, HIGH),
    Scenario("noise", noisy(constant(2600), 0.2, seed=1), 4, 3600, 0, 2600 * 1.2),
    Scenario("drop", step(HIGH, LOW, CHANGE_AT), 8, 2400, CHANGE_AT, HIGH),
    Scenario("slow", step(300, 2000, CHANGE_AT), 1, 2400, CHANGE_AT, 2000, trigger=10.0),
]


@dataclass(frozen=True)
class Figures:
    decisions: int
    seconds_to_stable: float
    overshoot_executors: int
    flaps: int


def needed_executors(rate: float, policy: Policy) -> int:
    count = math.ceil(rate / (policy.target_utilization * RATE_PER_EXECUTOR))
    return min(max(count, MIN_EXECUTORS), MAX_EXECUTORS)


def figures_of(scenario: Scenario, timeline: Timeline, policy: Policy) -> Figures:
    changes = timeline.changes
    after_load_change = [m.time for m in changes if m.time >= scenario.load_change]
    kinds = [(m.time, m.decision.kind) for m in changes]
    flaps = sum(1 for (t1, k1), (t2, k2) in itertools.pairwise(kinds) if k1 != k2 and t2 - t1 < FLAP_SECONDS)
    return Figures(
        decisions=len(changes),
        seconds_to_stable=max(after_load_change) - scenario.load_change if after_load_change else 0.0,
        overshoot_executors=max(0, max(timeline.targets()) - needed_executors(scenario.peak_rate, policy)),
        flaps=flaps,
    )


def broken_targets(scenario: Scenario, figures: Figures, timeline: Timeline, policy: Policy) -> list[str]:
    checks = {"flaps 0": figures.flaps == 0}
    if scenario.name == "step":
        checks |= {"decisions <= 2": figures.decisions <= 2, "overshoot <= 1": figures.overshoot_executors <= 1}
    elif scenario.name == "noise":
        checks = {"decisions 0": figures.decisions == 0}
    elif scenario.name == "drop":
        first = timeline.changes[0].time if timeline.changes else math.inf
        checks |= {
            "first change after scaleDownWindow": first >= scenario.load_change + policy.scale_down_window,
            "ends at the need": timeline.moments[-1].decision.target == needed_executors(LOW, policy),
            "overshoot 0": figures.overshoot_executors == 0,
        }
    elif scenario.name == "slow":
        first = timeline.changes[0] if timeline.changes else None
        checks |= {
            "first change up after the step": first is not None
            and first.decision.kind == "up"
            and first.time >= scenario.load_change,
            "ends at the need": timeline.moments[-1].decision.target == needed_executors(scenario.peak_rate, policy),
            "overshoot <= 1": figures.overshoot_executors <= 1,
        }
    else:
        checks |= {"overshoot <= 1": figures.overshoot_executors <= 1}
    return [name for name, met in checks.items() if not met]


def plot(scenario: Scenario, timeline: Timeline, figures: Figures, path: Path) -> None:
    minutes = [m.time / 60 for m in timeline.moments]
    fig, (rate_axis, backlog_axis, executor_axis) = plt.subplots(3, 1, sharex=True, figsize=(10, 7.5))
    rate_axis.plot(minutes, [m.input_rate for m in timeline.moments], color="tab:blue")
    rate_axis.set_ylabel("input rate (rec/s)")
    rate_axis.set_ylim(bottom=0)
    backlog_axis.plot(minutes, [m.backlog for m in timeline.moments], color="tab:orange")
    backlog_axis.set_ylabel("backlog (records)")
    backlog_axis.set_ylim(0, max(1, *(m.backlog for m in timeline.moments)) * 1.1)
    executor_axis.step(
        minutes,
        [m.decision.target for m in timeline.moments],
        where="post",
        color="tab:gray",
        linestyle="--",
        label="asked",
    )
    executor_axis.step(
        minutes, [m.executors for m in timeline.moments], where="post", color="tab:green", label="working"
    )
    for kind, marker, color in (("up", "^", "tab:red"), ("down", "v", "tab:purple")):
        moments = [m for m in timeline.changes if m.decision.kind == kind]
        executor_axis.scatter(
            [m.time / 60 for m in moments],
            [m.decision.target for m in moments],
            marker=marker,
            color=color,
            zorder=3,
            label=f"scale {kind}",
        )
    for change in timeline.changes:
        for axis in (rate_axis, backlog_axis, executor_axis):
            axis.axvline(change.time / 60, color="lightgray", linewidth=0.8, zorder=0)
    executor_axis.set_ylabel("executors")
    executor_axis.set_ylim(0, max(timeline.targets()) + 2)
    executor_axis.set_xlabel("minutes")
    executor_axis.legend(loc="upper left", fontsize="small", ncol=4)
    fig.suptitle(
        f"autoscaler, {scenario.name}: {figures.decisions} decisions, {figures.seconds_to_stable:.0f} s "
        f"to stable, overshoot {figures.overshoot_executors}, flaps {figures.flaps}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark of the executor autoscaler on a simulated plant.")
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / ".sluice" / "bench")
    parser.add_argument(
        "--trigger",
        type=float,
        default=None,
        help="run every scenario as processingTime micro-batches of this many seconds",
    )
    args = parser.parse_args(argv)
    output_dir: Path = args.output_dir
    output_dir.mkdir(parents=True, exist_ok=True)
    policy = Policy.from_spec(AutoscalingSpec(enabled=True))

    batches = f", every scenario as {args.trigger:g} s micro-batches" if args.trigger else ""
    table = Table(title=f"autoscaler on the simulated plant (interval 10s{batches})")
    for column in (
        "scenario",
        "decisions",
        "seconds to stable",
        "overshoot",
        "flaps",
        "final executors",
        "peak backlog",
        "targets",
    ):
        table.add_column(column, justify="left" if column in ("scenario", "targets") else "right")
    results: dict[str, dict[str, float | int]] = {}
    failures = []
    for scenario in SCENARIOS:
        bounds = ExecutorsSpec(instances=scenario.executors, min=MIN_EXECUTORS, max=MAX_EXECUTORS)
        plant = Plant(scenario.load, scenario.executors, trigger=args.trigger or scenario.trigger)
        timeline = simulate(plant, policy, bounds, scenario.duration)
        figures = figures_of(scenario, timeline, policy)
        broken = broken_targets(scenario, figures, timeline, policy)
        failures += [f"{scenario.name}: {target}" for target in broken]
        results[scenario.name] = {
            "decisions": figures.decisions,
            "seconds_to_stable": figures.seconds_to_stable,
            "overshoot_executors": figures.overshoot_executors,
            "flaps": figures.flaps,
        }
        plot(scenario, timeline, figures, output_dir / f"autoscaler-{scenario.name}.png")
        table.add_row(
            scenario.name,
            str(figures.decisions),
            f"{figures.seconds_to_stable:.0f}",
            str(figures.overshoot_executors),
            str(figures.flaps),
            str(timeline.moments[-1].decision.target),
            f"{max(m.backlog for m in timeline.moments):,}",
            "broken: " + ", ".join(broken) if broken else "met",
        )
    (output_dir / "autoscaler.json").write_text(json.dumps({"scenarios": results}, indent=2) + "\n")
    console = Console(width=120)
    console.print(table)
    console.print(f"written: {output_dir / 'autoscaler.json'}, {output_dir}/autoscaler-<scenario>.png")
    for failure in failures:
        console.print(f"[red]target broken[/red] {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
