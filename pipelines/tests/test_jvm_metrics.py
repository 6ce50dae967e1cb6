"""The driver JVM's own memory figures (sluice.pipelines.jvm_metrics), from a real JVM."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from sluice.pipelines.jvm_metrics import JvmCollector, native_memory, pool_label

# Java 17's own summary (its exit statistics, in bytes), cut to a few categories; jcmd's is the same in KB.
SUMMARY_IN_BYTES = """
Native Memory Tracking:

Total: reserved=8020291175, committed=483757671
       malloc: 7259063 #3701
       mmap:   reserved=8013029376, committed=476495872

-                 Java Heap (reserved=6320816128, committed=406847488)
                            (mmap: reserved=6320816128, committed=406847488)

-                    Thread (reserved=12625448, committed=575016)
                            (thread #13)
                            (stack: reserved=12582912, committed=532480)

-    Native Memory Tracking (reserved=64176, committed=64176)
"""


def test_native_memory_reads_each_category_in_bytes() -> None:
    assert native_memory(SUMMARY_IN_BYTES) == {
        "Total": 483757671,
        "Java Heap": 406847488,
        "Thread": 575016,
        "Native Memory Tracking": 64176,
    }
    in_kb = SUMMARY_IN_BYTES.replace("committed=575016)", "committed=561KB)").replace(
        "reserved=12625448,", "reserved=12329KB,"
    )
    assert native_memory(in_kb)["Thread"] == 561 * 1024


def test_a_category_line_with_more_after_committed_is_read() -> None:
    """Newer JVMs print `, readonly=` after committed on the shared class space's line."""
    line = "-        Shared class space (reserved=16777216, committed=12349440, readonly=0)"
    assert native_memory(line) == {"Shared class space": 12349440}


def test_a_jvm_that_cannot_be_read_leaves_the_scrape_its_other_series(caplog) -> None:
    """A stopping driver's JVM (py4j fails): no sluice_jvm_* series, no error out of the scrape, one warning."""

    class Gone:
        def __getattr__(self, name: str):
            raise ConnectionError("Answer from Java side is empty")

    collector = JvmCollector.__new__(JvmCollector)
    collector._jvm, collector._gateway, collector._tracking, collector._failed = Gone(), Gone(), None, False
    registry = CollectorRegistry()
    registry.register(collector)
    for _ in range(3):
        assert list(registry.collect()) == []
    assert [r.getMessage() for r in caplog.records].count(
        "the driver JVM's memory figures cannot be read: Answer from Java side is empty"
    ) == 1


def test_native_memory_without_tracking_is_empty() -> None:
    assert native_memory("Native memory tracking is not enabled\n") == {}


def test_buffer_pools_keep_their_whole_name() -> None:
    """Java 17 has two mapped pools: a label of the first word alone made two series of one name."""
    assert [pool_label(n) for n in ("direct", "mapped", "mapped - 'non-volatile memory'")] == [
        "direct",
        "mapped",
        "mapped-non-volatile-memory",
    ]


def test_the_collector_reads_the_running_jvm(spark_session) -> None:
    registry = CollectorRegistry()
    registry.register(JvmCollector(spark_session))
    heap_used = registry.get_sample_value("sluice_jvm_memory_bytes", {"area": "heap", "kind": "used"})
    heap_committed = registry.get_sample_value("sluice_jvm_memory_bytes", {"area": "heap", "kind": "committed"})
    max_heap = spark_session._jvm.java.lang.Runtime.getRuntime().maxMemory()
    assert heap_used is not None and heap_committed is not None
    assert 0 < heap_used <= heap_committed <= max_heap
    assert registry.get_sample_value("sluice_jvm_memory_bytes", {"area": "nonheap", "kind": "used"}) > 0
    spark_session._jvm.java.lang.System.gc()
    after_gc = registry.get_sample_value("sluice_jvm_memory_bytes", {"area": "heap", "kind": "after-gc"})
    assert 0 < after_gc <= max_heap  # what the pools held after the collection just made
    assert registry.get_sample_value("sluice_jvm_memory_bytes", {"area": "buffers-direct", "kind": "used"}) >= 0
    families = [m for m in registry.collect() if m.name == "sluice_jvm_memory_bytes"]
    keys = [(s.labels["area"], s.labels["kind"]) for m in families for s in m.samples]
    assert len(keys) == len(set(keys)), keys  # one series per pool
    threads = spark_session._jvm.java.lang.Thread.activeCount()
    assert registry.get_sample_value("sluice_jvm_threads") >= threads > 0
    # The test session runs without Native Memory Tracking: no per-category series.
    assert registry.get_sample_value("sluice_jvm_native_memory_bytes", {"category": "Total"}) is None


NMT_SCRIPT = """
import json, sys
import pytest
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession
from sluice.pipelines.jvm_metrics import JvmCollector
spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.extraJavaOptions", "-XX:NativeMemoryTracking=summary").getOrCreate())
registry = CollectorRegistry()
registry.register(JvmCollector(spark))
def native():
    return {s.labels.get("category"): s.value for m in registry.collect() if m.name == "sluice_jvm_native_memory_bytes"
            for s in m.samples}
samples, again = native(), native()  # the second scrape reuses the call the first one made
heap = spark._jvm.java.lang.management.ManagementFactory.getMemoryMXBean().getHeapMemoryUsage().getCommitted()
print(json.dumps({"native": samples, "again": sorted(again), "heap_committed": heap}))
spark.stop()
"""


def test_with_native_memory_tracking_each_category_is_read(tmp_path) -> None:
    """A driver JVM started with NMT on (the soak's): its categories through the DiagnosticCommand MBean."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", NMT_SCRIPT], capture_output=True, text=True, timeout=300, cwd=tmp_path, check=True
    )
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    native = figures["native"]
    assert native["Java Heap"] == pytest.approx(figures["heap_committed"], rel=0.1)  # the heap, as NMT sees it
    assert native["Total"] > native["Java Heap"] > 0
    assert {"Class", "Thread", "Code", "GC"} <= set(native)
    assert figures["again"] == sorted(native)
