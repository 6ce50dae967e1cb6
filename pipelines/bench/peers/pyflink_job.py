"""The side-by-side benchmark's three workloads on PyFlink (apache-flink 2.0.2), as pure Flink SQL.

Run from its own virtualenv (`python3.11 -m venv ~/.cache/sluice/bench-peers/pyflink-2.0.2` and
`pip install apache-flink==2.0.2`), with the Kafka SQL connector jar (flink-sql-connector-kafka 4.0.1-2.0) given by
`--jar`. The job reads `--source` from its earliest offset under a fresh consumer group and writes `--sink`:

- `frequency-count`: value = one word. GROUP BY word into upsert-kafka: key = the raw word, value = JSON
  {"word", "count"}, the running count.
- `windowed-word-count`: value = a line of words; event time = the Kafka record timestamp. Plain GROUP BY on
  (window_start = ts - ts % 5000, word) into upsert-kafka, so every update is emitted and nothing is late: key =
  JSON {"window_start", "word"} (upsert-kafka keys on the whole primary key), value = JSON {"window_start", "word",
  "count"}.
- `filter-projection`: key = a record id, value = one word. Words of at least 6 characters, upper-cased, into a
  plain Kafka sink with the key bytes unchanged.

`--guarantee at-least-once` (the default) runs without checkpointing: the state lives in the heap and is
disposable, and the sinks write as records come. `--guarantee exactly-once` is Flink's own: checkpoints every
`--checkpoint-interval` (aligned, exactly-once mode, to local files under the run's folder) and both sinks with
`sink.delivery-guarantee = exactly-once`, writing in Kafka transactions committed when a checkpoint completes, so
the output becomes visible to a read_committed reader once per checkpoint (the interval is the visibility
latency's floor).

No Python UDF: every operator runs in the JVM; Python only builds the job and waits. Tuning (a local mini-cluster on
the 2-core box, measured with 2-6 M records): parallelism 2 (4 was no faster and used more CPU per record), mini-batch
aggregation (500 ms allow-latency, up to 100,000 rows per bundle; 5,000 rows or no mini-batch cost 1.5-2x the CPU)
with local/global (two-phase) aggregation (one-phase: ~2x the output and CPU), object reuse, large Kafka fetches and
producer batches. Exactly-once adds what it needs and nothing else: checkpoints (at the interval the
benchmark passes: bench_peers.PYFLINK_CHECKPOINT_INTERVAL in throughput runs, the best p99's of
bench_peers.PYFLINK_INTERVALS in latency runs), acks=all (transactions need it) and a transaction timeout within
the broker's limit.

SIGTERM kills the JVM (the gateway server, a child of this process) and exits at once: the state is disposable.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path
from types import FrameType

from peer_process import AT_LEAST_ONCE, EXACTLY_ONCE, contract_parser
from pyflink.java_gateway import get_gateway
from pyflink.table import EnvironmentSettings, TableEnvironment

WINDOW_SECONDS = 5
MIN_WORD_LENGTH = 6

# Flink configuration of the job (the local mini-cluster runs inside the gateway JVM).
TUNING: dict[str, str] = {
    "table.local-time-zone": "UTC",
    "pipeline.object-reuse": "true",
    "table.exec.mini-batch.enabled": "true",
    "table.exec.mini-batch.allow-latency": "500 ms",
    "table.exec.mini-batch.size": "100000",
    "table.optimizer.agg-phase-strategy": "TWO_PHASE",
    "table.exec.sink.upsert-materialize": "NONE",
    "execution.buffer-timeout.interval": "10 ms",
}

# Kafka client settings, as connector options ('properties.' + the client key).
SOURCE_PROPERTIES: dict[str, str] = {
    "fetch.min.bytes": "1",
    "fetch.max.bytes": str(64 << 20),
    "max.partition.fetch.bytes": str(16 << 20),
    "max.poll.records": "10000",
    "receive.buffer.bytes": str(4 << 20),
    "enable.auto.commit": "false",
}
SINK_PROPERTIES: dict[str, str] = {
    "linger.ms": "5",
    "batch.size": str(1 << 20),
    "buffer.memory": str(256 << 20),
    "compression.type": "lz4",
    "acks": "1",
}
# Exactly-once: transactions need acks=all; Flink's default transaction timeout (1 h) is over the broker's
# transaction.max.timeout.ms (15 min by default), which refuses it.
EXACTLY_ONCE_SINK_PROPERTIES: dict[str, str] = {**SINK_PROPERTIES, "acks": "all", "transaction.timeout.ms": "900000"}


def _options(options: dict[str, str]) -> str:
    return ",\n  ".join(f"'{key}' = '{value}'" for key, value in options.items())


def _kafka(topic: str, bootstrap: str, properties: dict[str, str], **options: str) -> dict[str, str]:
    return {
        "topic": topic,
        "properties.bootstrap.servers": bootstrap,
        **{f"properties.{key}": value for key, value in properties.items()},
        **options,
    }


def source_options(args: argparse.Namespace) -> dict[str, str]:
    return _kafka(
        args.source,
        args.bootstrap,
        SOURCE_PROPERTIES,
        connector="kafka",
        **{
            "properties.group.id": f"pyflink-bench-{uuid.uuid4().hex}",
            "scan.startup.mode": "earliest-offset",
            "scan.topic-partition-discovery.interval": "0",
        },
    )


def sink_options(args: argparse.Namespace, connector: str) -> dict[str, str]:
    if args.guarantee == EXACTLY_ONCE:
        options = _kafka(args.sink, args.bootstrap, EXACTLY_ONCE_SINK_PROPERTIES, connector=connector)
        options["sink.delivery-guarantee"] = EXACTLY_ONCE
        options["sink.transactional-id-prefix"] = f"pyflink-bench-{uuid.uuid4().hex}"
        return options
    options = _kafka(args.sink, args.bootstrap, SINK_PROPERTIES, connector=connector)
    if connector == "kafka":
        options["sink.delivery-guarantee"] = AT_LEAST_ONCE
    return options


def statements(args: argparse.Namespace) -> tuple[list[str], str]:
    """The DDL of the source and sink tables, and the INSERT that runs the workload."""
    source = source_options(args)
    if args.workload == "frequency-count":
        source.update({"format": "raw"})
        sink = sink_options(args, "upsert-kafka") | {
            "key.format": "raw",
            "value.format": "json",
            "value.fields-include": "ALL",
        }
        ddl = [
            f"CREATE TABLE src (word STRING) WITH (\n  {_options(source)}\n)",
            f"CREATE TABLE snk (word STRING, `count` BIGINT, PRIMARY KEY (word) NOT ENFORCED) WITH (\n"
            f"  {_options(sink)}\n)",
        ]
        return ddl, "INSERT INTO snk SELECT word, COUNT(*) FROM src GROUP BY word"
    if args.workload == "windowed-word-count":
        source.update({"format": "raw"})
        sink = sink_options(args, "upsert-kafka") | {
            "key.format": "json",
            "value.format": "json",
            "value.fields-include": "ALL",
        }
        ddl = [
            f"CREATE TABLE src (line STRING, ts TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL) WITH (\n"
            f"  {_options(source)}\n)",
            "CREATE TABLE snk (window_start BIGINT, word STRING, `count` BIGINT,"
            f" PRIMARY KEY (window_start, word) NOT ENFORCED) WITH (\n  {_options(sink)}\n)",
        ]
        # EXTRACT(EPOCH) is whole seconds; a 5 s window starts on a whole second, so this is ts - ts % 5000.
        words = (
            f"SELECT (EXTRACT(EPOCH FROM ts) - MOD(EXTRACT(EPOCH FROM ts), {WINDOW_SECONDS})) * 1000 AS window_start,"
            " w AS word FROM src CROSS JOIN UNNEST(SPLIT(line, ' ')) AS t (w)"
        )
        return ddl, f"INSERT INTO snk SELECT window_start, word, COUNT(*) FROM ({words}) GROUP BY window_start, word"
    keyed = {"key.format": "raw", "key.fields": "id", "value.format": "raw", "value.fields-include": "EXCEPT_KEY"}
    source.update(keyed)
    sink = sink_options(args, "kafka") | keyed
    ddl = [
        f"CREATE TABLE src (id BYTES, word STRING) WITH (\n  {_options(source)}\n)",
        f"CREATE TABLE snk (id BYTES, word STRING) WITH (\n  {_options(sink)}\n)",
    ]
    return ddl, f"INSERT INTO snk SELECT id, UPPER(word) FROM src WHERE CHAR_LENGTH(word) >= {MIN_WORD_LENGTH}"


def table_environment(args: argparse.Namespace) -> TableEnvironment:
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    for key, value in TUNING.items():
        config.set(key, value)
    config.set("parallelism.default", str(args.parallelism or args.cores))
    if args.guarantee == EXACTLY_ONCE:
        config.set("execution.checkpointing.interval", args.checkpoint_interval)
        config.set("execution.checkpointing.mode", "EXACTLY_ONCE")
        config.set("execution.checkpointing.dir", (Path.cwd() / "flink-checkpoints").resolve().as_uri())
    config.set("pipeline.jars", Path(args.jar).resolve().as_uri())
    for override in args.conf:
        key, _, value = override.partition("=")
        config.set(key.strip(), value.strip())
    return env


def stop_gateway_on_sigterm() -> None:
    """On SIGTERM: kill the gateway JVM (the mini-cluster in it, and the job) and exit without any shutdown."""
    jvm_pid = int(get_gateway().jvm.java.lang.ProcessHandle.current().pid())

    def stop(signum: int, frame: FrameType | None) -> None:
        try:
            os.kill(jvm_pid, signal.SIGKILL)
            os.waitpid(jvm_pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = contract_parser(__doc__.splitlines()[0] if __doc__ else "", (AT_LEAST_ONCE, EXACTLY_ONCE))
    parser.add_argument("--jar", required=True, help="flink-sql-connector-kafka jar")
    parser.add_argument(
        "--checkpoint-interval",
        help="with --guarantee exactly-once, required: how often a checkpoint commits the output (e.g. '1 s')",
    )
    parser.add_argument("--parallelism", type=int, default=0, help="default: --cores")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Flink option")
    parser.add_argument("--explain", action="store_true", help="print the plan and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if not Path(args.jar).is_file():
        sys.exit(f"no such jar: {args.jar}")
    if args.guarantee == EXACTLY_ONCE and not args.checkpoint_interval:
        sys.exit("--guarantee exactly-once needs --checkpoint-interval")
    env = table_environment(args)
    stop_gateway_on_sigterm()
    ddl, insert = statements(args)
    for statement in ddl:
        env.execute_sql(statement)
    if args.explain:
        print(env.explain_sql(insert))
        return 0
    result = env.execute_sql(insert)
    job = result.get_job_client()
    print(f"pyflink {args.workload}: job {job.get_job_id() if job else '?'} {args.source} -> {args.sink}", flush=True)
    while True:  # until SIGTERM (polling rather than wait(), which would block inside py4j)
        time.sleep(2)
        status = str(job.get_job_status()) if job else "UNKNOWN"
        if status.endswith(("FAILED", "CANCELED", "FINISHED")):
            print(f"pyflink {args.workload}: job {status}", file=sys.stderr, flush=True)
            return 1


if __name__ == "__main__":
    sys.exit(main())
