"""Benchmark figures: percentiles, the printed table and the JSON file the lead quotes."""

from __future__ import annotations

import json
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of values sorted ascending; NaN when there are none."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class Latency:
    records: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    batches: int | None = None  # Spark: micro-batches that read records
    mean_batch_ms: float | None = None  # Spark: their mean duration (trigger start to commit)
    catch_up_ms: float | None = None  # Spark: from the producer's last record until it was committed
    mean_phases_ms: dict[str, float] | None = None  # Spark: their mean durationMs per phase (addBatch, …)

    @classmethod
    def of(cls, values: Sequence[float]) -> Latency:
        ordered = sorted(values)
        return cls(len(ordered), percentile(ordered, 50), percentile(ordered, 99), ordered[-1] if ordered else math.nan)


@dataclass
class SystemResult:
    name: str
    runs_records_per_s: list[float] = field(default_factory=list)  # every throughput run, in order
    runs_spark_rows_per_s: list[float] = field(default_factory=list)  # Spark's processedRowsPerSecond
    latency: Latency | None = None

    @property
    def records_per_s(self) -> float:
        """The best run: the one least disturbed by everything else on the machine."""
        return max(self.runs_records_per_s, default=math.nan)

    @property
    def spark_rows_per_s(self) -> float | None:
        return max(self.runs_spark_rows_per_s) if self.runs_spark_rows_per_s else None

    def add_run(self, records: int, seconds: float, spark_rows_per_s: float) -> str:
        """Note a Spark run's throughput; its figures as the log line shows them."""
        self.runs_records_per_s.append(records / seconds)
        self.runs_spark_rows_per_s.append(spark_rows_per_s)
        return (
            f"{records:,} records in {seconds:.2f}s ({records / seconds:,.0f}/s, Spark {spark_rows_per_s:,.0f} rows/s)"
        )


@dataclass(frozen=True)
class Target:
    label: str
    numerator: str
    denominator: str
    minimum: float


TARGETS = (
    Target("sluice / hand-written PySpark", "sluice", "hand-written", 0.95),
    Target("sluice / raw consumer", "sluice", "raw consumer", 0.5),
)


def common_settings() -> dict[str, Any]:
    """The settings every Kafka benchmark reads from the environment: partitions of its topics, measured runs
    per system, and the latency run's measured seconds and warm-up."""
    env = os.environ.get
    return {
        "partitions": int(env("SLUICE_BENCH_PARTITIONS", "4")),
        "repeats": int(env("SLUICE_BENCH_REPEATS", "2")),
        "latency_seconds": float(env("SLUICE_BENCH_LATENCY_SECONDS", "30")),
        "latency_warmup": float(env("SLUICE_BENCH_LATENCY_WARMUP", "10")),
    }


@dataclass
class Report:
    title: str
    setup: dict[str, Any]
    systems: dict[str, SystemResult]
    targets: tuple[Target, ...] = TARGETS

    def ratio(self, target: Target) -> float:
        return self.systems[target.numerator].records_per_s / self.systems[target.denominator].records_per_s

    def table(self) -> Table:
        table = Table(title=self.title, caption=_caption(self.setup))
        for column in ("system", "records/s (best run)", "runs", "Spark rows/s", "p50 latency", "p99 latency"):
            table.add_column(column, justify="left" if column == "system" else "right")
        for result in self.systems.values():
            latency = result.latency
            table.add_row(
                result.name,
                f"{result.records_per_s:,.0f}",
                " ".join(f"{r:,.0f}" for r in result.runs_records_per_s),
                f"{result.spark_rows_per_s:,.0f}" if result.spark_rows_per_s else "-",
                _ms(latency.p50_ms) if latency else "-",
                _ms(latency.p99_ms) if latency else "-",
            )
        return table

    def ratios(self) -> Table:
        table = Table(title="throughput ratios (targets are informational)")
        for column in ("ratio", "value", "target", ""):
            table.add_column(column, justify="left" if column == "ratio" else "right")
        for target in self.targets:
            value = self.ratio(target)
            verdict = "[green]PASS[/]" if value >= target.minimum else "[red]MISS[/]"
            table.add_row(target.label, f"{value:.2f}x", f">= {target.minimum}x", verdict)
        return table

    def print(self, console: Console | None = None) -> None:
        console = console or Console()
        console.print()
        console.print(self.table())
        console.print(self.ratios())

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.title,
            "setup": self.setup,
            "machine": {"platform": platform.platform(), "python": platform.python_version()},
            "systems": {
                name: {
                    "records_per_s": r.records_per_s,
                    "runs_records_per_s": r.runs_records_per_s,
                    "spark_processed_rows_per_s": r.spark_rows_per_s,
                    "runs_spark_processed_rows_per_s": r.runs_spark_rows_per_s,
                    "latency": asdict(r.latency) if r.latency else None,
                }
                for name, r in self.systems.items()
            },
            "ratios": {
                t.label: {"value": self.ratio(t), "target": t.minimum, "met": self.ratio(t) >= t.minimum}
                for t in self.targets
            },
        }

    def write(self, path: Path) -> None:
        write_json(path, self.to_json())


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(data), indent=2, allow_nan=False) + "\n")


def _finite(value: Any) -> Any:
    """NaN (no figure) becomes null, so the file is strict JSON."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f} ms"


def _caption(setup: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in setup.items())
