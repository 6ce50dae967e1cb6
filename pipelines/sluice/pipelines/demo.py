"""`make demo`: the windowed word count (pipelines/examples/wordcount.yaml) end to end on a local broker.

Generates text lines whose event times arrive out of order (within the 2 s watermark), then a burst of
late lines (beyond it), then one far-future line that closes every window. Prints some windows and a
summary, and stops by itself.
"""

from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sluice.api.validation import PipelineDocument, load_documents

from .local.kafka import LOCAL_KAFKA_DIR, KafkaCluster, local_bootstrap
from .local.kafka_io import consume_all, create_topic, delete_topics, produce
from .local.spark import spark_kafka_jars
from .pipeline_run import PipelineRun
from .session import local_session, spark_log_file

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wordcount.yaml"
WORDS = (
    "stream window event time watermark spark kafka sluice record batch state late order count word "
    "topic query sink source join key value partition offset lag rate"
).split()
console = Console()


def generate_lines(count: int, start_ms: int, step_ms: int, jitter_ms: int, seed: int = 7):
    rng = random.Random(seed)
    for i in range(count):
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9)))
        yield line.encode(), start_ms + i * step_ms - rng.randint(0, jitter_ms)


def main(argv: list[str] | None = None) -> int:
    lines = int((argv or [""])[0] or 60_000)
    document = load_documents(EXAMPLE)[0]
    assert document.manifest is not None  # EXAMPLE is a StreamingApp manifest
    topics = {t["name"]: t.get("partitions", 1) for t in document.manifest["spec"]["topics"]}
    bootstrap = local_bootstrap(LOCAL_KAFKA_DIR)
    ephemeral = None
    with tempfile.TemporaryDirectory(prefix="sluice-demo-") as scratch:
        if bootstrap is None:
            console.print("starting a Kafka broker for the demo (make local-kafka keeps one running)…")
            ephemeral = KafkaCluster.on_free_ports(Path(scratch) / "kafka").start()
            bootstrap = ephemeral.bootstrap
        try:
            return run_demo(document, topics, bootstrap, lines, Path(scratch))
        finally:
            if ephemeral is not None:
                ephemeral.stop()


def run_demo(document: PipelineDocument, topics: dict[str, int], bootstrap: str, lines: int, scratch: Path) -> int:
    delete_topics(bootstrap, list(topics))
    for name, partitions in topics.items():
        create_topic(bootstrap, name, partitions)
    source, sink, dead = (
        document.pipeline["nodes"][0]["fromKafka"]["topic"],
        document.pipeline["nodes"][-1]["toKafka"]["topic"],
        document.pipeline["deadLetter"]["toKafka"]["topic"],
    )
    start_ms = int(time.time() * 1000) // 5000 * 5000 - 600_000
    on_time = list(generate_lines(lines, start_ms, 2, 1500))
    newest = max(ts for _, ts in on_time)
    late = list(generate_lines(300, newest - 30_000, 10, 0, seed=11))

    console.print(f"Kafka at {bootstrap}; producing {lines:,} lines (event times out of order by up to 1.5 s)")
    produce(bootstrap, source, [v for v, _ in on_time], timestamps_ms=[t for _, t in on_time])
    log_file = spark_log_file("sluice-demo")
    console.print(f"[dim]Spark's log: {log_file}[/]")
    spark = local_session("sluice-demo", spark_kafka_jars(), cores=2, log_file=log_file)
    run = PipelineRun.from_document(
        spark, document, checkpoint_root=str(scratch / "checkpoints"), bootstrap_servers=bootstrap
    )
    began = time.monotonic()
    try:
        run.start()
        run.wait_until_caught_up(timeout=600)
        elapsed = time.monotonic() - began
        console.print(
            f"caught up: {lines:,} lines in {elapsed:.1f} s; now {len(late)} late lines "
            "(30 s behind) and one line that closes every window"
        )
        produce(
            bootstrap, source, [v for v, _ in late] + [b"flush"], timestamps_ms=[t for _, t in late] + [newest + 60_000]
        )
        time.sleep(1.5)
        run.wait_until_caught_up(timeout=300)
        run.raise_if_failed()
    finally:
        run.stop()
        spark.stop()

    counts = [json.loads(r.value) for r in consume_all(bootstrap, sink) if r.value is not None]
    dead_letters = consume_all(bootstrap, dead)
    _print_windows(counts)
    words_in = sum(len(v.split()) for v, _ in on_time)
    summary = Table(title="summary", show_header=False)
    for label, value in [
        ("lines in (on time)", f"{lines:,}"),
        ("words in", f"{words_in:,}"),
        ("late lines -> dead letters", f"{len(dead_letters):,} of {len(late)}"),
        ("(word, window) counts out", f"{len(counts):,}"),
        ("words counted", f"{sum(c['count'] for c in counts):,}"),
        ("throughput", f"{lines / elapsed:,.0f} lines/s ({words_in / elapsed:,.0f} words/s) incl. start-up"),
    ]:
        summary.add_row(label, value)
    console.print(summary)
    ok = sum(c["count"] for c in counts) == words_in and len(dead_letters) == len(late)
    console.print(
        "[green]every on-time word counted once; every late line dead-lettered[/]"
        if ok
        else "[red]counts do not add up[/]"
    )
    return 0 if ok else 1


def _print_windows(counts: list[dict]) -> None:
    by_window: dict[str, Counter] = {}
    for row in counts:
        by_window.setdefault(row["window_start"], Counter())[row["word"]] = row["count"]
    for start in sorted(by_window)[:3]:
        top = ", ".join(f"{w}={n}" for w, n in by_window[start].most_common(5))
        console.print(f"window {start}: {sum(by_window[start].values()):,} words; top: {top}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
