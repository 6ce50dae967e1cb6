"""The side-by-side benchmark's workloads written with Bytewax 0.21.1 (see ../peer_workloads.py for the contract).

Bytewax runs Python callbacks under one GIL per process, so `--cores N` runs the dataflow as a cluster of N
processes with one worker each (what `python -m bytewax.run -i I -a ADDRESSES` starts; `-w` workers in one
process would share the GIL). Every Kafka partition is read from its earliest offset by the worker it is
assigned to: the connector assigns partitions itself, never joins a consumer group and commits nothing, so
every run reads everything afresh. The counting workloads route by word (key_on) to a stateful_map. No
recovery, so no state on disk. Runs until SIGTERM.

Run it from its own virtualenv: `python3.11 -m venv V && V/bin/pip install bytewax==0.21.1 confluent-kafka`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import socket
from datetime import timedelta

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource, KafkaSourceMessage
from bytewax.dataflow import Dataflow, Stream
from bytewax.run import cli_main
from confluent_kafka import OFFSET_BEGINNING
from peer_process import contract_parser, stop_when_orphaned, supervise

WINDOW_MS = 5_000
MIN_WORD_LENGTH = 6

# Tuning: the connector's defaults (1000 messages per poll; librdkafka's fetch and producer settings). Bigger
# polls and fetches, lz4 and larger producer batches measured no faster (the sink flushes after every batch), nor
# did a 1 s epoch: without recovery an epoch only paces progress tracking, outputs are written as they are
# computed. 10 s is `python -m bytewax.run`'s default.
EPOCH_INTERVAL = timedelta(seconds=10)

Message = KafkaSourceMessage[bytes | None, bytes | None]
Out = KafkaSinkMessage[bytes, bytes]


def count_word(count: int | None, _word: str) -> tuple[int, int]:
    count = (count or 0) + 1
    return count, count


def frequency_record(word_count: tuple[str, int]) -> Out:
    word, count = word_count
    return KafkaSinkMessage(word.encode(), json.dumps({"word": word, "count": count}).encode())


def timed_words(msg: Message) -> list[tuple[str, int]]:
    """(word, window start) for each word of a line; event time = the record's Kafka timestamp."""
    assert msg.value is not None and msg.timestamp is not None
    ts = msg.timestamp[1]
    window = ts - ts % WINDOW_MS
    return [(word, window) for word in msg.value.decode().split()]


def count_in_window(
    windows: dict[int, int] | None, word_window: tuple[str, int]
) -> tuple[dict[int, int], tuple[int, int]]:
    """Per word: its count per window start (windows are never closed, so no record is late)."""
    windows = windows if windows is not None else {}
    window = word_window[1]
    count = windows.get(window, 0) + 1
    windows[window] = count
    return windows, (window, count)


def window_record(word_update: tuple[str, tuple[int, int]]) -> Out:
    word, (window, count) = word_update
    return KafkaSinkMessage(word.encode(), json.dumps({"window_start": window, "word": word, "count": count}).encode())


def long_enough(msg: Message) -> bool:
    return msg.value is not None and len(msg.value.decode()) >= MIN_WORD_LENGTH


def projected(msg: Message) -> Out:
    assert msg.key is not None and msg.value is not None
    return KafkaSinkMessage(msg.key, msg.value.decode().upper().encode())


def build_flow(workload: str, bootstrap: str, source: str, sink: str) -> Dataflow:
    flow = Dataflow(f"sluice-bench-{workload}")
    kafka_source = KafkaSource([bootstrap], [source], tail=True, starting_offset=OFFSET_BEGINNING)
    messages: Stream[Message] = op.input("source", flow, kafka_source)  # type: ignore[arg-type]
    out: Stream[Out]
    if workload == "frequency-count":
        words = op.map("decode", messages, lambda msg: (msg.value or b"").decode())
        counts = op.stateful_map("count", op.key_on("by-word", words, lambda word: word), count_word)
        out = op.map("encode", counts, frequency_record)
    elif workload == "windowed-word-count":
        words = op.flat_map("split", messages, timed_words)
        counts = op.stateful_map("count", op.key_on("by-word", words, lambda item: item[0]), count_in_window)
        out = op.map("encode", counts, window_record)
    else:
        out = op.map("upper", op.filter("long", messages, long_enough), projected)
    op.output("sink", out, KafkaSink([bootstrap], sink))
    return flow


def run_process(args: argparse.Namespace, process_id: int, addresses: list[str], parent: int) -> None:
    """One process of the cluster; returns after SIGTERM (Bytewax stops cleanly on KeyboardInterrupt)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    stop_when_orphaned(parent)
    flow = build_flow(args.workload, args.bootstrap, args.source, args.sink)
    with contextlib.suppress(KeyboardInterrupt):
        cli_main(flow, process_id=process_id, addresses=addresses, epoch_interval=EPOCH_INTERVAL)


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def main() -> None:
    args = contract_parser(__doc__.splitlines()[0]).parse_args()
    addresses = [f"127.0.0.1:{port}" for port in free_ports(max(1, args.cores))]
    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(target=run_process, args=(args, i, addresses, os.getpid()), name=f"bytewax-{i}")
        for i in range(len(addresses))
    ]
    supervise("bytewax_job", processes)


if __name__ == "__main__":
    main()
