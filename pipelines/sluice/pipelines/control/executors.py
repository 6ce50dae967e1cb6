"""Live executor changes through Spark's scheduler backend, for a driver without dynamic allocation.

Scaling sets the absolute total first: the Kubernetes backend starts with an empty target, so a relative
request, or a kill before any absolute request, would count from 0. Scaling down then kills the least
loaded executors.
"""

from __future__ import annotations

import threading
from typing import Any

from pyspark.sql import SparkSession

from sluice.api.contract import ExecutorsResponse, ExecutorStatus

from .errors import ApiFailure

LOCAL_MODE = "executor scaling needs a cluster manager (this driver runs Spark in local mode)"
DYNAMIC_ALLOCATION = (
    "executor scaling is off: spark.dynamicAllocation.enabled is true, so Spark sets the number of executors itself"
)


def least_loaded(executors: list[ExecutorStatus], count: int) -> list[str]:
    """The ids of the `count` executors to stop: fewest active tasks first, the newest among equals."""

    def newest_first(executor: ExecutorStatus) -> int:
        return -int(executor.id) if executor.id.isdigit() else 0

    return [e.id for e in sorted(executors, key=lambda e: (e.activeTasks, newest_first(e)))[: max(count, 0)]]


def host_of(host_port: str) -> str:
    """'10.1.2.3:40787' -> '10.1.2.3', '[::1]:4000' -> '::1'; an address without a port stays whole."""
    host, colon, port = host_port.rpartition(":")
    if colon and port.isdigit() and (":" not in host or host.startswith("[")):
        return host.strip("[]")
    return host_port


class Executors:
    """The driver's executors: who runs now, and changes of their number (one at a time)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._jvm: Any = spark._jvm
        self._context: Any = spark.sparkContext._jsc.sc()
        self._lock = threading.Lock()
        self.target: int | None = None

    def _seq(self, scala_seq: Any) -> list[Any]:
        return list(self._jvm.scala.jdk.javaapi.CollectionConverters.asJava(scala_seq))

    def _allocation_client(self) -> Any | None:
        """Spark's scheduler backend when it can change executors (not in local mode)."""
        backend = self._context.schedulerBackend()
        client = self._jvm.java.lang.Class.forName("org.apache.spark.ExecutorAllocationClient")
        return backend if client.isInstance(backend) else None

    def _conf(self, key: str, default: str) -> str:
        return self.spark.sparkContext.getConf().get(key, default) or default

    def live(self) -> list[ExecutorStatus]:
        """The executors registered now, without the driver and those being removed. Ids come from the
        scheduler; cores and tasks from the status store, which Spark's listener bus updates a moment later."""
        backend = self._allocation_client()
        if backend is None:
            return []
        summaries = {s.id(): s for s in self._seq(self._context.statusStore().executorList(True))}
        out = []
        for executor_id in sorted(self._seq(backend.getExecutorIds()), key=lambda i: (len(i), i)):
            if not backend.isExecutorActive(executor_id):
                continue
            summary = summaries.get(executor_id)
            out.append(
                ExecutorStatus(id=executor_id)
                if summary is None
                else ExecutorStatus(
                    id=executor_id,
                    host=host_of(summary.hostPort()),
                    totalCores=summary.totalCores(),
                    activeTasks=summary.activeTasks(),
                )
            )
        return out

    def task_slots(self, executors: list[ExecutorStatus]) -> int:
        """Tasks that run at once: the executors' cores, or in local mode the driver's, over spark.task.cpus."""
        if self._context.isLocal():
            driver = [s for s in self._seq(self._context.statusStore().executorList(True)) if s.id() == "driver"]
            cores = driver[0].totalCores() if driver else 0
        else:
            cores = sum(e.totalCores for e in executors)
        return cores // max(int(self._conf("spark.task.cpus", "1")), 1)

    def scale(self, target: int) -> ExecutorsResponse:
        with self._lock:
            if self._context.isLocal():
                raise ApiFailure(409, LOCAL_MODE)
            if self._conf("spark.dynamicAllocation.enabled", "false").strip().lower() == "true":
                raise ApiFailure(409, DYNAMIC_ALLOCATION)
            backend = self._allocation_client()
            if backend is None:
                name = self._context.schedulerBackend().getClass().getSimpleName()
                raise ApiFailure(409, f"executor scaling is not supported by Spark's {name}")
            live = self.live()
            python_utils = self._jvm.org.apache.spark.api.python.PythonUtils
            if not self._context.requestTotalExecutors(target, 0, python_utils.toScalaMap({})):
                raise ApiFailure(503, "Spark's cluster manager did not take the new executor total; retry")
            self.target = target
            killed: list[str] = []
            victims = least_loaded(live, len(live) - target)
            if victims:
                # The backend's kill, not SparkContext.killExecutors, which lowers the target once more per
                # executor. Arguments: adjustTargetNumExecutors=False, countFailures=False, force=True (busy too).
                killed = [
                    str(i) for i in self._seq(backend.killExecutors(python_utils.toSeq(victims), False, False, True))
                ]
            return ExecutorsResponse(target=target, previous=len(live), killed=killed)
