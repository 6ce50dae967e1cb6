"""Plumbing for provisioning real local components (the demo broker, connector jars): cache, tools, ports,
processes, clear errors. The test bed builds on it too."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from argparse import ArgumentParser
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class ProvisionError(RuntimeError):
    """A provisioning step could not get what it needs. The message is one line for the user."""


def cache_dir(*parts: str) -> Path:
    """Download/build cache outside the repo, keyed by the caller (usually component-version)."""
    root = Path(os.environ.get("SLUICE_CACHE", Path.home() / ".cache" / "sluice"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def require_tool(name: str, how_to_get: str) -> str:
    found = shutil.which(name)
    if not found:
        raise ProvisionError(f"'{name}' is not on PATH: {how_to_get}")
    return found


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise concurrent builds of the same cache entry (parallel test sessions, make targets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    what: str,
    hint: str,
    log: Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Run a provisioning command; on failure raise one line naming the step, the hint and the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n$ {' '.join(map(str, cmd))}\n".encode())
        out.flush()
        try:
            code = subprocess.call(
                list(map(str, cmd)), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        except FileNotFoundError as exc:
            raise ProvisionError(f"{what}: '{cmd[0]}' not found: {hint}") from exc
    if code != 0:
        raise ProvisionError(f"{what} failed (exit {code}): {hint}; see {log}")


def virtualenv(root: Path, requirements: Sequence[str]) -> Path:
    """A virtualenv at `root` with these pip requirements, made once (a half-made one is made again); its
    interpreter. Key `root` by the requirements' versions: a made one is not checked against them."""
    python = root / "bin" / "python"
    done = root / ".complete"
    with locked(root.parent / f".{root.name}.lock"):
        if not done.exists():
            log = root.parent / f"{root.name}.install.log"
            run([sys.executable, "-m", "venv", "--clear", root], what=f"creating {root}", hint="", log=log)
            pip: list[str | os.PathLike[str]] = [python, "-m", "pip", "install", "--disable-pip-version-check", "-q"]
            run(
                [*pip, *requirements],
                what=f"installing {' '.join(requirements)}",
                hint="PyPI must be reachable",
                log=log,
            )
            done.write_text("\n".join(requirements) + "\n")
    return python


def read_record(path: Path) -> dict | None:
    """What an earlier start() recorded in a JSON file (ports, pids, addresses), or None when it is
    missing or torn."""
    try:
        record = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so they cannot repeat)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def pick_port(preferred: int) -> int:
    """The preferred port when it is free, otherwise any free one (a port in use is not an error)."""
    return free_port() if port_in_use(preferred) else preferred


@dataclass
class ManagedProcess:
    """A long-running component started in its own process group, logging to a file."""

    name: str
    cmd: list[str]
    log: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> ManagedProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was not started"
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise ProvisionError(
                f"{self.name} exited early; last lines of {self.log}: " + " | ".join(tail(self.log, 5))
            )

    def stop(self, grace: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        stop_process_group(self.proc.pid, grace)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)


def stop_process_group(pid: int, grace: float = 15.0) -> None:
    """SIGTERM the group led by pid, then SIGKILL whatever is left after `grace` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.1)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    # Someone else's zombie (a component started by an earlier command) has exited too; its parent, often
    # an init that reaps every few seconds, just has not collected it yet.
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return not Path("/proc/self").is_dir()  # gone meanwhile; without procfs, trust kill(0)
    except (OSError, IndexError):
        return True


def wait_until(
    predicate, *, timeout: float, what: str, process: ManagedProcess | None = None, interval: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if process is not None:
            process.check_alive()
        time.sleep(interval)
    detail = f"; see {process.log}" if process is not None else ""
    raise ProvisionError(f"timed out after {timeout:.0f}s waiting for {what}{detail}")


def tail(path: Path, lines: int) -> list[str]:
    try:
        return path.read_text(errors="replace").strip().splitlines()[-lines:]
    except FileNotFoundError:
        return []


def run_command(parser: ArgumentParser, argv: list[str] | None = None) -> int:
    """A provisioning command line: parse argv, run the chosen subcommand's `func`; a ProvisionError is one
    line on stderr and exit code 2."""
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ProvisionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
