"""The side-by-side benchmark's workloads written with Quix Streams 3.28.1 (see ../peer_workloads.py for the contract).

Quix Streams runs one message at a time in one Python thread per Application; it scales by running more
Application processes in one consumer group. So this script starts `--cores` processes in a fresh consumer group,
each with its own RocksDB state directory under a per-run temp dir, forwards SIGTERM to them and, once they have
stopped, deletes the internal topics the group created (`repartition__<group>--...`, `changelog__<group>--...`).

Counting workloads group by the word (a repartition topic) and keep their counts in state (changelogged, so a
partition that moves between processes at start-up keeps its counts). The windowed count is a plain stateful
count per (word, window start): measured twice as fast as `tumbling_window(...).count().current()`, and no
grace period to set so that nothing is dropped as late. Runs until SIGTERM.

`--guarantee exactly-once` is Quix's own `processing_guarantee="exactly-once"`: each process writes its output
and commits its input offsets in one Kafka transaction per checkpoint (every `--commit-interval`, then the
output's visibility latency floor: the benchmark passes bench_peers.QUIXSTREAMS_EOS_COMMIT_INTERVAL in throughput
runs, the best p99's of bench_peers.QUIXSTREAMS_INTERVALS in latency runs).

Run it from its own virtualenv: `python3.11 -m venv V && V/bin/pip install quixstreams==3.28.1`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import tempfile
import uuid
import warnings
from typing import TYPE_CHECKING, Any

from confluent_kafka.admin import AdminClient
from peer_process import AT_LEAST_ONCE, EXACTLY_ONCE, contract_parser, stop_when_orphaned, supervise

if TYPE_CHECKING:
    from quixstreams import Application, State

WINDOW_MS = 5_000
MIN_WORD_LENGTH = 6

# Throughput settings (librdkafka's advice for throughput): fewer, larger compressed producer batches and bigger
# fetches; measured ~35 % faster than Quix's defaults on frequency-count. A checkpoint (producer flush + offset
# commit + state write) every 5 s is Quix's default; 30 s measured no faster.
PRODUCER_CONFIG = {"linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4"}
CONSUMER_CONFIG = {"fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 8 << 20}
COMMIT_INTERVAL_S = 5.0


def count_word(word: str, state: State) -> dict[str, Any]:
    count = state.get("count", 0) + 1
    state.set("count", count)
    return {"word": word, "count": count}


def count_in_window(word: str, _key: str, timestamp: int, _headers: Any, state: State) -> dict[str, Any]:
    """The word's count in its 5 s tumbling window (the state is the word's), kept forever: no record is late."""
    window = timestamp - timestamp % WINDOW_MS
    count = state.get(str(window), 0) + 1
    state.set(str(window), count)
    return {"window_start": window, "word": word, "count": count}


def define(app: Application, workload: str, source: str, sink: str) -> None:
    """The workload's StreamingDataFrame on `app`."""
    if workload == "filter-projection":
        inp = app.topic(source, key_deserializer="bytes", value_deserializer="str")
        out = app.topic(sink, key_serializer="bytes", value_serializer="str")
        app.dataframe(inp).filter(lambda word: len(word) >= MIN_WORD_LENGTH).apply(str.upper).to_topic(out)
        return
    inp = app.topic(source, key_deserializer="bytes", value_deserializer="str")
    out = app.topic(sink, key_serializer="str", value_serializer="json")
    sdf = app.dataframe(inp)
    if workload == "windowed-word-count":
        sdf = sdf.apply(str.split, expand=True)
    sdf = sdf.group_by(
        lambda word: word,
        name="word",
        key_serializer="str",
        key_deserializer="str",
        value_serializer="str",
        value_deserializer="str",
    )
    if workload == "frequency-count":
        sdf = sdf.apply(count_word, stateful=True)
    else:
        sdf = sdf.apply(count_in_window, stateful=True, metadata=True)
    sdf.to_topic(out)


def run_app(args: argparse.Namespace, group: str, state_dir: str, parent: int) -> None:
    """One Application process of the group; returns after SIGTERM."""
    stop_when_orphaned(parent)
    # Quix's import of confluent_kafka's schema registry client warns through authlib, whose import forces its
    # warnings on: silence them after that import.
    from authlib.deprecate import AuthlibDeprecationWarning

    warnings.simplefilter("ignore", AuthlibDeprecationWarning)
    from quixstreams import Application

    app = Application(
        broker_address=args.bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        state_dir=state_dir,
        commit_interval=args.commit_interval,
        processing_guarantee=args.guarantee,
        consumer_extra_config=CONSUMER_CONFIG,
        producer_extra_config=PRODUCER_CONFIG,
        loglevel="WARNING",
    )
    define(app, args.workload, args.source, args.sink)
    app.run()


def delete_internal_topics(bootstrap: str, group: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 5})  # no info lines at exit
    topics = [t for t in admin.list_topics(timeout=5).topics if f"__{group}--" in t]
    if topics:
        for future in admin.delete_topics(topics, operation_timeout=5).values():
            try:
                future.result(timeout=5)
            except Exception as exc:
                print(f"quixstreams_job: could not delete an internal topic: {exc}", flush=True)


def main() -> None:
    parser = contract_parser(__doc__.splitlines()[0], (AT_LEAST_ONCE, EXACTLY_ONCE))
    parser.add_argument("--commit-interval", type=float, default=COMMIT_INTERVAL_S, help="seconds between commits")
    args = parser.parse_args()
    group = f"sluice-bench-quix-{uuid.uuid4().hex[:12]}"
    run_dir = tempfile.mkdtemp(prefix="sluice-bench-quix-")
    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(
            target=run_app,
            args=(args, group, os.path.join(run_dir, f"state-{i}"), os.getpid()),
            name=f"quix-app-{i}",
        )
        for i in range(max(1, args.cores))
    ]

    def cleanup() -> None:
        delete_internal_topics(args.bootstrap, group)
        shutil.rmtree(run_dir, ignore_errors=True)

    supervise("quixstreams_job", processes, cleanup)


if __name__ == "__main__":
    main()
