"""What every peer job script shares (standard library only: each runs in its own engine's virtualenv): the
command-line contract, and the supervision of the worker processes an engine scales out with."""

from __future__ import annotations

import argparse
import multiprocessing.process
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

WORKLOADS = ("frequency-count", "windowed-word-count", "filter-projection")
AT_LEAST_ONCE, EXACTLY_ONCE = "at-least-once", "exactly-once"
STOP_TIMEOUT_S = 8.0


def contract_parser(description: str, guarantees: tuple[str, ...] = (AT_LEAST_ONCE,)) -> argparse.ArgumentParser:
    """The arguments every job takes (peer_workloads.py has the contract); a job adds its own. `guarantees`:
    the output guarantees the job can run with (`--guarantee`, at-least-once by default)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workload", required=True, choices=WORKLOADS)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--sink", required=True)
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--guarantee", choices=guarantees, default=AT_LEAST_ONCE)
    return parser


def stop_when_orphaned(parent: int) -> None:
    """SIGTERM this process (the engine's own graceful stop) once the launching process is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()


def supervise(
    name: str, processes: list[multiprocessing.process.BaseProcess], cleanup: Callable[[], None] = lambda: None
) -> None:
    """Start the workers and run until SIGTERM/SIGINT or one of them ends; then SIGTERM them, kill what is left
    after STOP_TIMEOUT_S and clean up. A worker that failed on its own is an error."""
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
        cleanup()
    failed = [p.name for p in processes if p.exitcode not in (0, None)]
    if failed and not stop.is_set():
        raise SystemExit(f"{name}: {', '.join(failed)} failed")
