"""A Spark standalone cluster (one master, one worker) on loopback, from the pyspark installation.

A real cluster manager for drivers started elsewhere (`--master spark://…`): unlike local mode, its
executors are separate processes that the driver can ask for and kill, as on Kubernetes.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.pipelines.local.kafka import java_binary

from .common import ManagedProcess, free_ports, wait_until


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass
class StandaloneCluster:
    state_dir: Path
    worker_cores: int = 2
    worker_memory: str = "2g"
    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self.port, self.master_ui_port, self.worker_ui_port = free_ports(3)
        self.processes: list[ManagedProcess] = []

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def start(self, timeout: float = 180.0) -> StandaloneCluster:
        java_binary()  # a clear error when Java is missing or too old
        self.state_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home()),
            "SPARK_LOCAL_IP": self.host,
            "SPARK_LOG_DIR": str(self.state_dir / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
        }
        spark_class = str(spark_home() / "bin" / "spark-class")
        master = ManagedProcess(
            "spark-master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.master_ui_port),
            ],
            self.state_dir / "master.log",
            env=env,
        )
        worker = ManagedProcess(
            "spark-worker",
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                self.host,
                "--cores",
                str(self.worker_cores),
                "--memory",
                self.worker_memory,
                "--webui-port",
                str(self.worker_ui_port),
                "--work-dir",
                str(self.state_dir / "work"),
                self.master_url,
            ],
            self.state_dir / "worker.log",
            env=env,
        )
        try:
            self.processes.append(master.start())
            wait_until(
                lambda: self.master_state() is not None, timeout=timeout, what="the Spark master", process=master
            )
            self.processes.append(worker.start())
            wait_until(
                lambda: len(self.alive_workers()) == 1,
                timeout=timeout,
                what="the Spark worker to register with the master",
                process=worker,
            )
        except BaseException:
            self.stop()
            raise
        return self

    def master_state(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.master_ui_port}/json/", timeout=3) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> list[dict[str, Any]]:
        state = self.master_state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()
