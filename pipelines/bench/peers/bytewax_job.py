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
import threading
import time
from datetime import timedelta
from types import FrameType

import bytewax.operators as op
from bytewax.connectors.kafka import KafkaSink, KafkaSinkMessage, KafkaSource, KafkaSourceMessage
from bytewax.dataflow import Dataflow, Stream
from bytewax.run import cli_main
from confluent_kafka import OFFSET_BEGINNING

WINDOW_MS = 5_000
MIN_WORD_LENGTH = 6
STOP_TIMEOUT_S = 8.0

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


def _stop_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def run_process(args: argparse.Namespace, process_id: int, addresses: list[str], parent: int) -> None:
    """One process of the cluster; returns after SIGTERM (Bytewax stops cleanly on KeyboardInterrupt)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    threading.Thread(target=_stop_when_orphaned, args=(parent,), daemon=True).start()
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload", required=True, choices=["frequency-count", "windowed-word-count", "filter-projection"]
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--cores", type=int, default=2)
    args = parser.parse_args()

    addresses = [f"127.0.0.1:{port}" for port in free_ports(max(1, args.cores))]
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(target=run_process, args=(args, i, addresses, os.getpid()), name=f"bytewax-{i}")
        for i in range(len(addresses))
    ]
    try:
        for process in processes:
            process.start()
        while not stop.is_set() and all(p.is_alive() for p in processes):
            stop.wait(0.5)
    finally:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
    failed = [p.name for p in processes if p.exitcode not in (0, None)]
    if failed and not stop.is_set():
        raise SystemExit(f"bytewax_job: {', '.join(failed)} failed")


if __name__ == "__main__":
    main()
