"""The driver JVM's memory as the JVM tells it, read at each scrape: heap and non-heap (MemoryMXBean), the
direct and mapped buffer pools, live threads, and, when Native Memory Tracking is on
(`-XX:NativeMemoryTracking=summary` in spark.driver.extraJavaOptions), the committed native memory by NMT
category. The pod's RSS less these is what the JVM does not track: glibc arenas, native libraries, Python."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from pyspark.sql import SparkSession

AMOUNT = r"reserved=(?P<reserved>\d+)(?P<unit>[KMG]?B)?, committed=(?P<committed>\d+)(?:[KMG]?B)?"
NMT_LINE = re.compile(r"^-\s+(?P<category>[A-Za-z][\w ]*?)\s+\(" + AMOUNT + r"[,)]")  # ", readonly=" may follow
NMT_TOTAL = re.compile(r"^Total: " + AMOUNT)
log = logging.getLogger(__name__)
UNITS = {None: 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}


def native_memory(summary: str) -> dict[str, int]:
    """Committed bytes per category of an NMT summary (`jcmd <pid> VM.native_memory summary`, in KB, or the
    JVM's exit statistics, in bytes), "Total" included; empty when NMT is off (the JVM then answers "Native
    memory tracking is not enabled")."""
    committed: dict[str, int] = {}
    for line in summary.splitlines():
        match = NMT_TOTAL.match(line.strip()) or NMT_LINE.match(line.strip())
        if match:
            category = match.groupdict().get("category") or "Total"
            committed[category] = int(match["committed"]) * UNITS[match["unit"]]
    return committed


def pool_label(name: str) -> str:
    """A buffer pool's name as a label value: `mapped - 'non-volatile memory'` → `mapped-non-volatile-memory`."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


class JvmCollector(Collector):
    """sluice_jvm_* of the JVM behind `spark` (py4j calls, from the scraping thread)."""

    def __init__(self, spark: SparkSession) -> None:
        jvm, gateway = spark._jvm, spark.sparkContext._gateway
        assert jvm is not None and gateway is not None
        self._jvm = jvm
        self._gateway = gateway
        self._tracking: bool | None = None  # NMT on? known after the first scrape
        self._failed = False  # the last scrape could not read the JVM (said once, not at every scrape)
        self._nmt_call: tuple[Any, Any, Any] | None = None  # the NMT summary's call, made at its first use

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Nothing when the JVM cannot be read (it is stopping): the scrape's other series still go out."""
        try:
            families = self._families()
        except Exception as error:
            if not self._failed:
                log.warning("the driver JVM's memory figures cannot be read: %s", error)
            self._failed = True
            return
        self._failed = False
        yield from families

    def _families(self) -> list[GaugeMetricFamily]:
        families = []
        management = self._jvm.java.lang.management.ManagementFactory
        memory = GaugeMetricFamily(
            "sluice_jvm_memory_bytes",
            "The driver JVM's memory (area: heap, nonheap, buffers-<pool>; kind: used, committed, after-gc)",
            labels=["area", "kind"],
        )  # fmt: skip
        bean = management.getMemoryMXBean()
        for area, usage in (("heap", bean.getHeapMemoryUsage()), ("nonheap", bean.getNonHeapMemoryUsage())):
            memory.add_metric([area, "used"], usage.getUsed())
            memory.add_metric([area, "committed"], usage.getCommitted())
        # What the heap's pools held after their last collection of each (Java's collection usage), without the
        # garbage between; a pool only a full collection reads (G1's old generation) keeps its last figure.
        heap_pools = [pool for pool in management.getMemoryPoolMXBeans() if pool.getType().name() == "HEAP"]
        after_gc = [pool.getCollectionUsage() for pool in heap_pools]
        memory.add_metric(["heap", "after-gc"], sum(usage.getUsed() for usage in after_gc if usage is not None))
        pools = management.getPlatformMXBeans(
            self._jvm.java.lang.Class.forName("java.lang.management.BufferPoolMXBean")
        )
        for pool in pools:
            memory.add_metric([f"buffers-{pool_label(pool.getName())}", "used"], pool.getMemoryUsed())
        threads = GaugeMetricFamily("sluice_jvm_threads", "Live threads of the driver JVM")
        threads.add_metric([], management.getThreadMXBean().getThreadCount())
        families += [memory, threads]
        native = self._native_memory(management)
        if native:
            family = GaugeMetricFamily(
                "sluice_jvm_native_memory_bytes",
                "Committed native memory of the driver JVM per Native Memory Tracking category",
                labels=["category"],
            )
            for category, committed in sorted(native.items()):
                family.add_metric([category], committed)
            families.append(family)
        return families

    def _native_memory(self, management: Any) -> dict[str, int]:
        """jcmd's VM.native_memory summary, through the DiagnosticCommand MBean. Called through the MBeanServer
        interface's Method: py4j finds no method on the server's own class, whose package the JDK does not export."""
        if self._tracking is False:
            return {}
        try:
            found = native_memory(self._summary(management))
        except Exception as error:  # NMT unreadable here: the other figures go on without it
            log.warning("Native Memory Tracking cannot be read: %s", error)
            found = {}
        self._tracking = bool(found)
        return found

    def _summary(self, management: Any) -> str:
        if self._nmt_call is None:  # made once: a dozen py4j round trips
            self._nmt_call = self._prepared_call(management)
        invoke, server, call = self._nmt_call
        return str(invoke.invoke(server, call))

    def _prepared_call(self, management: Any) -> tuple[Any, Any, Any]:
        """MBeanServer.invoke as a Method, the platform server, and the call's arguments."""
        jvm, gateway = self._jvm, self._gateway

        def array(kind: Any, *items: Any) -> Any:
            made = gateway.new_array(kind, len(items))
            for index, item in enumerate(items):
                made[index] = item
            return made

        class_of = jvm.java.lang.Class.forName
        invoke = class_of("javax.management.MBeanServer").getMethod(
            "invoke",
            array(
                jvm.java.lang.Class,
                *(class_of(n) for n in ("javax.management.ObjectName", "java.lang.String", "[Ljava.lang.Object;")),
                class_of("[Ljava.lang.String;"),
            ),
        )
        command = jvm.javax.management.ObjectName("com.sun.management:type=DiagnosticCommand")
        arguments = array(jvm.java.lang.Object, array(jvm.java.lang.String, "summary"))
        signature = array(jvm.java.lang.String, "[Ljava.lang.String;")
        call = array(jvm.java.lang.Object, command, "vmNativeMemory", arguments, signature)
        return invoke, management.getPlatformMBeanServer(), call
