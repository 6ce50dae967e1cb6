"""Shared plumbing of the test bed: the repo, waits for tests, HTTP probes, pidfile-tracked components.

The provisioning basics (cache, tools, ports, processes, ProvisionError) are the product's, in
sluice.pipelines.local.provision (its demo broker uses them); they are re-exported here for the test bed.
"""

from __future__ import annotations

import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from sluice.pipelines.local.provision import (
    ManagedProcess,
    ProvisionError,
    cache_dir,
    free_port,
    free_ports,
    locked,
    pick_port,
    pid_alive,
    port_in_use,
    read_record,
    require_tool,
    run,
    stop_process_group,
    tail,
    wait_until,
)

__all__ = [
    "REPO_ROOT",
    "ManagedProcess",
    "PidfileProcesses",
    "ProvisionError",
    "cache_dir",
    "free_port",
    "free_ports",
    "http_status",
    "locked",
    "pick_port",
    "pid_alive",
    "port_in_use",
    "read_record",
    "require_tool",
    "run",
    "stop_process_group",
    "tail",
    "wait_for",
    "wait_until",
]

REPO_ROOT = Path(__file__).resolve().parents[3]


T = TypeVar("T")


def minutes_from_env(name: str, default: float, least: float, environ: dict[str, str] | None = None) -> float:
    """A run's length in minutes from the variable `name` (unset or empty: `default`); a ValueError naming the
    variable when it is not a number or under `least`."""
    environ = dict(os.environ) if environ is None else environ
    text = environ.get(name, "") or str(default)
    try:
        minutes = float(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: a number of minutes, e.g. {default:g}") from None
    if minutes < least:
        raise ValueError(f"{name}={text!r}: at least {least:g} minutes")
    return minutes


def wait_for(
    probe: Callable[[], T | None], *, timeout: float = 60.0, what: str = "condition", interval: float = 0.5
) -> T:
    """probe()'s first truthy result; AssertionError naming `what` and the last result on timeout (for
    checks in tests, where wait_until is for provisioning)."""
    deadline = time.monotonic() + timeout
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def http_status(url: str, context: ssl.SSLContext | None = None) -> int:
    """HTTP status of a GET; 0 when nothing answers yet (a health probe while a component starts)."""
    try:
        with urllib.request.urlopen(url, context=context, timeout=3) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, ssl.SSLError):
        return 0


class PidfileProcesses:
    """Components of one state dir, each recorded in <state_dir>/<name>.pid so that another process
    (make local-cluster-down, a later test) can find and stop what an earlier one started."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.started: dict[str, ManagedProcess] = {}

    def launch(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        process = ManagedProcess(name, cmd, self.state_dir / "logs" / f"{name}.log", env=env).start()
        self.started[name] = process
        self._pidfile(name).write_text(f"{process.pid}\n")
        return process

    def recorded_pid(self, name: str) -> int | None:
        """The pid in name's pidfile if that process is alive and still ours (pids get reused)."""
        try:
            pid = int(self._pidfile(name).read_text())
        except (FileNotFoundError, ValueError):
            return None
        if not pid_alive(pid):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return pid  # no procfs: trust the pidfile
        return pid if os.fsencode(self.state_dir) in cmdline else None

    def pids(self, names: Sequence[str]) -> dict[str, int]:
        return {name: pid for name in names if (pid := self.recorded_pid(name)) is not None}

    def stop(self, name: str) -> None:
        """Stop one component, whether this process or an earlier one started it."""
        process = self.started.pop(name, None)
        if process is not None:
            process.stop()
        elif (pid := self.recorded_pid(name)) is not None:
            stop_process_group(pid)
        self._pidfile(name).unlink(missing_ok=True)

    def _pidfile(self, name: str) -> Path:
        return self.state_dir / f"{name}.pid"
