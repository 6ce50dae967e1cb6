"""The side-by-side benchmark's report: its targets, a chart (matplotlib) and docs/benchmarks.md."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

AT_LEAST_ONCE, EXACTLY_ONCE = "at-least-once", "exactly-once"
LIMIT = "limit"
# Within each guarantee: sluice's systems first, then hand-written PySpark, then the other engines.
SYSTEM_ORDER = (
    "sluice",
    "pyflink-eos",
    "quixstreams-eos",
    "sluice-alo",
    "sluice-realtime",
    "hand-written",
    "hand-tuned",
    "pyflink",
    "quixstreams",
    "bytewax",
)
SLUICE = {EXACTLY_ONCE: "sluice", AT_LEAST_ONCE: "sluice-alo"}  # sluice micro-batch at each guarantee
REALTIME = "sluice-realtime"


def _systems(results: dict[str, Any], workload: str) -> dict[str, dict[str, Any]]:
    return results["workloads"].get(workload, {}).get("systems", {})


def guaranteeing(results: dict[str, Any], workload: str, guarantee: str) -> list[str]:
    """The workload's systems whose output has this guarantee, in SYSTEM_ORDER."""
    systems = _systems(results, workload)
    return [name for name in _ordered(systems) if systems[name].get("guarantee") == guarantee]


def _rate(results: dict[str, Any], workload: str, system: str) -> float | None:
    figure = _systems(results, workload).get(system, {}).get("records_per_s")
    return figure if isinstance(figure, int | float) else None


def ratio(results: dict[str, Any], workload: str, numerator: str, denominator: str) -> float | None:
    top, bottom = _rate(results, workload, numerator), _rate(results, workload, denominator)
    return top / bottom if top is not None and bottom else None


def _target(label: str, value: float | None, minimum: float | None = None, maximum: float | None = None) -> dict:
    met = value is not None and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    bound = f">= {_bound(minimum)}" if minimum is not None else f"<= {_bound(maximum)}"
    return {"label": label, "value": None if value is None else round(value, 3), "bound": bound, "met": met}


def _bound(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None and value >= 1000 else f"{value:g}"


def _p99(results: dict[str, Any], workload: str, system: str) -> float | None:
    return _systems(results, workload).get(system, {}).get("p99_ms")


def targets_of(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets of #37 for this 2-core machine (same run, medians of alternating runs), each with its
    measured value and whether it is met: at each guarantee sluice at least every peer's throughput and
    hand-tuned PySpark's; exactly-once at most 10% below sluice's own at-least-once; the frequency count at
    least 0.7x the raw-consumer limit; latency at half load."""
    found = []
    for workload in results["workloads"]:
        for guarantee, sluice in SLUICE.items():  # a sluice figure not measured: its targets missed, not dropped
            for peer in guaranteeing(results, workload, guarantee):
                if peer not in (sluice, REALTIME):
                    value = ratio(results, workload, sluice, peer)
                    found.append(_target(f"{workload}: {sluice} / {peer} ({guarantee})", value, minimum=1.0))
            if guarantee == EXACTLY_ONCE and "hand-tuned" in _systems(results, workload):
                value = ratio(results, workload, sluice, "hand-tuned")
                found.append(_target(f"{workload}: {sluice} / hand-tuned (across guarantees)", value, minimum=1.0))
        cost = ratio(results, workload, SLUICE[EXACTLY_ONCE], SLUICE[AT_LEAST_ONCE])
        found.append(_target(f"{workload}: exactly-once / at-least-once, sluice", cost, minimum=0.9))
    fc, wwc, fp = "frequency-count", "windowed-word-count", "filter-projection"
    found.append(_target(f"{fc}: sluice / {LIMIT}", ratio(results, fc, "sluice", LIMIT), minimum=0.7))
    found.append(_target(f"{wwc}: sluice p99 ms (half load)", _p99(results, wwc, "sluice"), maximum=1000))
    found.append(_target(f"{fp}: sluice p99 ms (exactly-once, half load)", _p99(results, fp, "sluice"), maximum=1000))
    found.append(_target(f"{fp}: {REALTIME} p99 ms (half load)", _p99(results, fp, REALTIME), maximum=50))
    return found


def ratios_of(results: dict[str, Any], workload: str, guarantee: str) -> dict[str, float | None]:
    """sluice's throughput over each other system's at one guarantee (the limit's with exactly-once)."""
    sluice = SLUICE[guarantee]
    others = [name for name in guaranteeing(results, workload, guarantee) if name != sluice]
    if guarantee == EXACTLY_ONCE:
        others += [name for name in (SLUICE[AT_LEAST_ONCE], LIMIT) if name in _systems(results, workload)]
    return {f"{sluice} / {name}": ratio(results, workload, sluice, name) for name in others}


def _ordered(systems: dict[str, Any]) -> list[str]:
    known = [s for s in SYSTEM_ORDER if s in systems]
    return known + sorted(s for s in systems if s not in SYSTEM_ORDER and s != LIMIT)


def render_chart(results: dict[str, Any], path: Path) -> Path:
    """Per workload: throughput (records/s, log scale) and p50/p99 latency (ms, log scale) per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results["workloads"])
    figure, axes = plt.subplots(len(workloads), 2, figsize=(14, 4 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        systems = _systems(results, workload)
        names = [n for n in (LIMIT, *_ordered(systems)) if n in systems]
        rates = [systems[n]["records_per_s"] or 0 for n in names]
        colors = ["tab:orange" if n.startswith("sluice") else "tab:gray" if n == LIMIT else "tab:blue" for n in names]
        hatches = ["//" if systems[n].get("guarantee") == AT_LEAST_ONCE else "" for n in names]
        throughput, latency = axes[row]
        throughput.bar(names, rates, color=colors, hatch=hatches, edgecolor="white")
        throughput.set_yscale("log")
        throughput.set_title(f"{workload}: throughput (records/s, median of runs; hatched: at-least-once)")
        for i, rate in enumerate(rates):
            throughput.annotate(f"{rate / 1000:,.0f}k", (i, rate), ha="center", va="bottom", fontsize=8)
        width = 0.4
        p50 = [systems[n].get("p50_ms") or math.nan for n in names]
        p99 = [systems[n].get("p99_ms") or math.nan for n in names]
        latency.bar([i - width / 2 for i in range(len(names))], p50, width, label="p50", color="tab:green")
        latency.bar([i + width / 2 for i in range(len(names))], p99, width, label="p99", color="tab:red")
        latency.set_xticks(range(len(names)), names)
        latency.set_yscale("log")
        latency.set_title(f"{workload}: end-to-end latency at half load (ms)")
        latency.legend()
        for axis in (throughput, latency):
            axis.tick_params(axis="x", labelrotation=30)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def _number(value: Any, unit: str = "") -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "-"
    return f"{value:,.0f}{unit}"


def guarantees_paragraph(setup: dict[str, Any]) -> str:
    """What each guarantee means for each system, with the exactly-once peers' commit intervals of the run."""
    checkpoint, commit = setup.get("pyflink_checkpoint_interval"), setup.get("quixstreams_commit_interval")
    return (
        "Each system runs at its own best settings for the guarantee of its output, and systems compare within one "
        "guarantee. **Exactly once**: sluice's `delivery: exactlyOnce` (the default); PyFlink with aligned "
        "checkpoints and transactional Kafka sinks, committed on each checkpoint"
        + (f" (every {checkpoint} in the throughput runs)" if checkpoint else "")
        + '; Quix Streams with `processing_guarantee="exactly-once"`, a transaction per commit'
        + (f" (every {commit} in the throughput runs)" if commit else "")
        + ". Their commit interval is their visibility latency's floor: their latency runs use the interval with the "
        "best p99 in a sweep at half load, named beside them. **At least once**: sluice's `delivery: atLeastOnce` "
        "and real-time mode (a task slot per partition: 4 on the 2 cores), PySpark's own Kafka sink (hand-written "
        "and hand-tuned), PyFlink without checkpointing (its latency runs use the mini-batch latency with the best "
        "p99 in a sweep), Quix Streams (its producer and consumer set for "
        "throughput, its other settings its defaults) and Bytewax at its defaults (neither Spark's Kafka sink nor "
        "Bytewax's has an exactly-once mode). The limit: raw consumers reading the topic, no processing and no "
        "output."
    )


def render_markdown(results: dict[str, Any], chart: str) -> str:
    """docs/benchmarks.md: generated by `make bench-peers` from .sluice/bench/peers.json."""
    setup, machine, versions = results["setup"], results["machine"], results["versions"]
    lines = [
        "# Benchmarks: sluice side by side",
        "",
        "Generated by `make bench-peers` (pipelines/bench/test_peers.py; its docstring has the method) from",
        "`.sluice/bench/peers.json`; do not edit by hand (`python pipelines/bench/peers_report.py` renders it again",
        "from the JSON).",
        "",
        f"![throughput and latency per system and workload]({chart})",
        "",
        f"Machine: {machine['platform']}, {machine['cores']} cores, {machine['memory_gib']} GiB; one Kafka broker"
        " (KRaft) on the same machine.",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        f"Throughput: {setup['records']:,} records per run (one word each, or lines of 5 words for the windowed "
        f"word count; a tenth for Quix Streams and Bytewax), {setup['partitions']} partitions; start-up taken out "
        f"with a {setup['startup_records']:,}-record run before each; median of {setup['repeats']} runs. "
        f"Latency: p50 and p99 the medians of {setup['repeats']} runs, at half of each system's own median throughput "
        f"(at most {setup['latency_max_rate']:,.0f} records/s), {setup['latency_warmup']:g} s warm-up + "
        f"{setup['latency_seconds']:g} s measured, producer timestamp to output visible to a read_committed "
        "consumer.",
        "",
        *textwrap.wrap(guarantees_paragraph(setup), 110, break_on_hyphens=False, break_long_words=False),
        "",
    ]
    for workload, data in results["workloads"].items():
        systems = data["systems"]
        lines += [f"## {workload}", "", f"Measured {data.get('measured_at', '-')}.", ""]
        if data.get("note"):  # what a reader should know about these figures (kept from an older run)
            lines += [data["note"], ""]
        if LIMIT in systems:
            limit = systems[LIMIT]
            lines += [
                f"The limit read {_number(limit['records_per_s'])} records/s "
                f"({' / '.join(_number(r) for r in limit['runs_records_per_s'])}); one consumer's latency at "
                f"{_number(limit.get('latency_rate'))} records/s: p50 {_number(limit.get('p50_ms'))} ms, "
                f"p99 {_number(limit.get('p99_ms'))} ms.",
                "",
            ]
        for guarantee in (EXACTLY_ONCE, AT_LEAST_ONCE):
            names = guaranteeing(results, workload, guarantee)
            if not names:
                continue
            lines += [
                f"**{guarantee.capitalize().replace('-', ' ')}**",
                "",
                "| system | records/s | runs | start-up run (s) | latency rate | p50 (ms) | p99 (ms) |",
                "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
            ]
            for name in names:
                s = systems[name]
                runs = " / ".join(_number(r) for r in s["runs_records_per_s"])
                startup = f"{s['startup_s']:.1f}" if s.get("startup_s") else "-"
                setting = s.get("latency_setting") or (
                    f"commits every {s['latency_interval']}" if s.get("latency_interval") else None
                )
                shown = f"{name} (latency: {setting})" if setting else name
                lines.append(
                    f"| {shown} | {_number(s['records_per_s'])} | {runs} | {startup} "
                    f"| {_number(s.get('latency_rate'))} | {_number(s.get('p50_ms'))} | {_number(s.get('p99_ms'))} |"
                )
            failed = [f"{name}: {'; '.join(systems[name]['errors'])}" for name in names if systems[name].get("errors")]
            if failed:
                lines += ["", "Failed (figures left out): " + " / ".join(failed) + "."]
            ratios = [f"{k} {v:.2f}x" for k, v in ratios_of(results, workload, guarantee).items() if v is not None]
            lines += ["", "Ratios: " + ", ".join(ratios) + "." if ratios else "Ratios: -.", ""]
    lines += ["## Targets", "", "| target | measured | bound | |", "| --- | ---: | --- | --- |"]
    for target in results.get("targets", []):
        value = target["value"]
        shown = "-" if value is None else f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
        lines.append(f"| {target['label']} | {shown} | {target['bound']} | {'met' if target['met'] else 'missed'} |")
    return "\n".join(lines) + "\n"


# Below this line docs/benchmarks.md holds the other benchmarks' last recorded runs: a new render keeps it.
OTHER_BENCHMARKS = "<!-- the other benchmarks: kept as they are when make bench-peers renders this page -->"


def publish(results: dict[str, Any], docs: Path, chart: Path) -> None:
    """The chart (at `chart` and beside the page) and docs/benchmarks.md, keeping the page's other benchmarks
    (from OTHER_BENCHMARKS on)."""
    render_chart(results, chart)
    docs.parent.mkdir(parents=True, exist_ok=True)
    (docs.parent / "benchmarks.png").write_bytes(chart.read_bytes())
    before = docs.read_text() if docs.exists() else ""
    kept = before[before.index(OTHER_BENCHMARKS) :] if OTHER_BENCHMARKS in before else ""
    docs.write_text(render_markdown(results, "benchmarks.png") + ("\n" + kept if kept else ""))


if __name__ == "__main__":  # render the chart and the page again from a results file
    source = Path(sys.argv[1] if len(sys.argv) > 1 else ".sluice/bench/peers.json")
    measured = json.loads(source.read_text())
    measured["targets"] = targets_of(measured)
    publish(measured, Path("docs/benchmarks.md"), source.with_suffix(".png"))
