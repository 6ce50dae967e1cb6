"""Benchmark (make bench-operator): the operator with SLUICE_BENCH_APPS apps (default 1,000).

The apps but the last 100 are created in a burst (throughput: apps and reconciles per second). Then 50 are
applied with kubectl one a second, each timed from the apply to its SparkApplication (target: p99 <= 1 s), and 50
more the same way while every other app's status changes once per tick, as a running app's tick changes it (the
operator's watch carries those events; reported, no target).
Then at rest for one resync period (SLUICE_BENCH_QUIET_SECONDS, default the operator's
resync): its reconciles per second (its own counter), the API requests per app per minute (the kube-apiserver's
apiserver_request_total, for the kinds the operator reads and writes) and its RSS (target <= 150 MB; the peak
is reported too). The operator runs as its image runs it: with only the image's packages (operator_env). No
driver runs here (no spark-operator): the apps are Pending, and the bench fails otherwise. Figures are printed
and written to .sluice/bench/operator.json; only correctness is asserted.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import OperatorProcess
from kubernetes import client, config, watch
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import ProtocolError

from sluice.operator.settings import SETTINGS

pytestmark = pytest.mark.bench

APPS = int(os.environ.get("SLUICE_BENCH_APPS", "1000"))
TIMED_APPS = min(50, APPS // 3)  # at rest, then as many in each of the two status churns
TIMED_INTERVAL_S = 1.0
RESYNC_S = SETTINGS.resync_seconds  # the operator's defaults
TICK_S = SETTINGS.tick_seconds
FIGURES_S = max(SETTINGS.status_figures_seconds, TICK_S)  # 0: every tick
# At rest for one resync period: each app's resync lands in it once.
QUIET_S = float(os.environ.get("SLUICE_BENCH_QUIET_SECONDS", str(RESYNC_S)))
SETTLE_S = 10
OUTPUT = Path(".sluice/bench/operator.json")
# What the operator reads and writes: at rest the control plane's own requests (leases) are left out.
OPERATOR_RESOURCES = {
    "streamingapps",
    "sparkapplications",
    "configmaps",
    "secrets",
    "services",
    "serviceaccounts",
    "rolebindings",
    "networkpolicies",
    "persistentvolumeclaims",
    "pods",
    "events",
    "kafkatopics",
    "kopfpeerings",
    "clusterkopfpeerings",
}


def app_manifest(name: str) -> dict:
    """A small valid app whose topics the operator leaves alone, so only the operator is measured."""
    return {
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "StreamingApp",
        "metadata": {"name": name},
        "spec": {
            "kafka": {"bootstrapServers": "kafka.invalid:9092"},
            "topics": [{"name": f"{name}-in", "management": "none"}],
            "pipeline": {
                "nodes": [
                    {"name": "src", "fromKafka": {"topic": f"{name}-in"}},
                    {"name": "upper", "inputs": ["src"], "select": ["upper(value) AS value"]},
                    {"name": "out", "inputs": ["upper"], "toConsole": {}},
                ]
            },
        },
    }


class CreationWatch:
    """Records when each SparkApplication first appears, from a watch on the API server."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        config.load_kube_config(str(kubeconfig))
        self.api = client.CustomObjectsApi()
        self.namespace = namespace
        self.seen: dict[str, float] = {}
        self.resumes = 0
        self._watch = watch.Watch()
        self._stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                for event in self._watch.stream(
                    self.api.list_namespaced_custom_object,
                    "sparkoperator.k8s.io",
                    "v1beta2",
                    self.namespace,
                    "sparkapplications",
                    timeout_seconds=3600,
                    # A loaded API server may end a watch early: it resumes from the last event seen (None at
                    # first: the client leaves it out), missing none.
                    resource_version=self._watch.resource_version,
                ):
                    if event["type"] == "ADDED":
                        self.seen.setdefault(event["object"]["metadata"]["name"], time.monotonic())
            except ProtocolError:
                if not self._stopped.is_set():
                    self.resumes += 1

    def start(self) -> CreationWatch:
        self.thread.start()
        time.sleep(1)
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._watch.stop()
        self.thread.join(timeout=10)

    def wait(self, name: str, timeout: float = 120) -> float:
        deadline = time.monotonic() + timeout
        while name not in self.seen:
            assert time.monotonic() < deadline, f"SparkApplication {name} never appeared"
            time.sleep(0.01)
        return self.seen[name]


class StatusChurn:
    """Every app's status changed once per period (status.observedAt), as running apps' passes write theirs: a
    running app's figures once per FIGURES_S, an autoscaled one's state annotation once per tick. The
    operator's watch then carries APPS / period events a second that kopf's workers must get through, spread
    over the period as the apps' timers are."""

    def __init__(self, api: client.CustomObjectsApi, namespace: str, names: list[str], period_s: float) -> None:
        self.api, self.namespace, self.names, self.period_s = api, namespace, names, period_s
        self.patches = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _patch(self, name: str, observed_at: str) -> None:
        body = {"status": {"observedAt": observed_at}}
        self.api.patch_namespaced_custom_object_status(
            "sluice.dev", "v1alpha1", self.namespace, "streamingapps", name, body
        )

    def _run(self) -> None:
        spacing = self.period_s / len(self.names)
        with ThreadPoolExecutor(max_workers=16) as pool:
            while not self._stop.is_set():
                started = time.monotonic()
                observed_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())  # a new value each round
                patched = []
                for i, name in enumerate(self.names):
                    if self._stop.wait(max(0.0, started + i * spacing - time.monotonic())):
                        break
                    patched.append(pool.submit(self._patch, name, observed_at))
                for patch in patched:
                    patch.result()
                    self.patches += 1
                self._stop.wait(max(0.0, started + self.period_s - time.monotonic()))

    def start(self) -> StatusChurn:
        self.started = time.monotonic()
        self.thread.start()
        return self

    def stop(self) -> float:
        """Patches per second while it ran."""
        self._stop.set()
        self.thread.join(timeout=60)
        return self.patches / (time.monotonic() - self.started)


class RssSampler:
    """The operator's VmRSS every half second, for its peak."""

    def __init__(self, operator: OperatorProcess) -> None:
        self.operator = operator
        self.samples: list[int] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.samples.append(self.operator.rss_bytes())

    def start(self) -> RssSampler:
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)


def reconciles(operator: OperatorProcess) -> Counter[str]:
    """sluice_operator_reconciles by trigger, as the operator counts them."""
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(operator.metrics()):
        if family.name == "sluice_operator_reconciles":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["trigger"]] += int(sample.value)
    return counts


def api_requests(plane) -> Counter[tuple[str, str]]:
    """apiserver_request_total by (verb, resource) for the operator's kinds, watches left out (one each)."""
    text = plane.kubectl("get", "--raw", "/metrics").stdout
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name == "apiserver_request":
            for sample in family.samples:
                verb, resource = sample.labels.get("verb", ""), sample.labels.get("resource", "")
                # PATCH events: the persistent volume controller repeating FailedBinding on the claims no volume
                # binds here (the operator only creates events).
                ours = resource in OPERATOR_RESOURCES and (verb, resource) != ("PATCH", "events")
                if sample.name.endswith("_total") and verb != "WATCH" and ours:
                    subresource = sample.labels.get("subresource")
                    counts[(verb, f"{resource}/{subresource}" if subresource else resource)] += int(sample.value)
    return counts


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def wait_at_rest(pid: int, timeout: float = 600) -> float:
    """Until the operator has digested what it was sent (under 10% of a core for 3 s); returns the wait."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        used = cpu_seconds(pid)
        time.sleep(3)
        if cpu_seconds(pid) - used < 0.3:
            break
    return time.monotonic() - started


def body_sizes(apps: list[dict[str, Any]]) -> dict[str, float]:
    """Median JSON bytes of an app as listed, and of its parts."""

    def size(value: Any) -> int:
        return len(json.dumps(value, separators=(",", ":")))

    return {
        part: statistics.median(size(pick(app)) for app in apps)
        for part, pick in {
            "whole": lambda app: app,
            "spec": lambda app: app.get("spec"),
            "status": lambda app: app.get("status"),
            "annotations": lambda app: app["metadata"].get("annotations"),
            "managed_fields": lambda app: app["metadata"].get("managedFields"),
        }.items()
    }


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def test_operator_at_scale(crds_installed, tmp_path):
    namespace = "bench"
    crds_installed.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(
        crds_installed.kubeconfig, tmp_path / "operator.log", resync_seconds=RESYNC_S, as_deployed=True
    )
    names = [f"app-{i:04d}" for i in range(APPS)]
    burst = names[: APPS - 3 * TIMED_APPS]
    timed, timed_in_churn, timed_in_tick_churn = (
        names[APPS - (3 - i) * TIMED_APPS : APPS - (2 - i) * TIMED_APPS or None] for i in range(3)
    )
    try:
        operator.wait_alive()
        rss_idle = operator.rss_bytes()
        rss = RssSampler(operator).start()
        created = CreationWatch(crds_installed.kubeconfig, namespace).start()

        before = reconciles(operator)
        started = time.monotonic()
        for name in burst:
            created.api.create_namespaced_custom_object(
                "sluice.dev", "v1alpha1", namespace, "streamingapps", app_manifest(name)
            )
        for name in burst:
            created.wait(name, timeout=1800)
        burst_s = time.monotonic() - started
        burst_reconciles = sum((reconciles(operator) - before).values())
        # The SparkApplications come mid-pass: the status patches and kopf's own bookkeeping follow.
        burst_settle_s = wait_at_rest(operator.proc.pid)

        def timed_applies(apps: list[str]) -> list[float]:
            taken = []
            for name in apps:
                started = time.monotonic()
                crds_installed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(app_manifest(name)))
                taken.append(created.wait(name) - started)
                time.sleep(max(0.0, started + TIMED_INTERVAL_S - time.monotonic()))
            return taken

        latencies = timed_applies(timed)
        # Then while every other app changes as if they all ran: their figures, then every tick (autoscaled).
        churn = StatusChurn(created.api, namespace, burst + timed, FIGURES_S).start()
        latencies_in_churn = timed_applies(timed_in_churn)
        churn_rate = churn.stop()
        tick_churn = StatusChurn(created.api, namespace, burst + timed + timed_in_churn, TICK_S).start()
        latencies_in_tick_churn = timed_applies(timed_in_tick_churn)
        tick_churn_rate = tick_churn.stop()
        created.stop()

        time.sleep(SETTLE_S)
        quiet_from = len(rss.samples)
        requests_before, reconciles_before, quiet_started = (
            api_requests(crds_installed),
            reconciles(operator),
            time.monotonic(),
        )
        time.sleep(QUIET_S)
        requests = api_requests(crds_installed) - requests_before
        quiet_reconciles = reconciles(operator) - reconciles_before
        quiet_s = time.monotonic() - quiet_started
        rss.stop()
        rss_rest = statistics.median(rss.samples[quiet_from:])
        rss_peak = max(rss.samples)
        apps = created.api.list_namespaced_custom_object("sluice.dev", "v1alpha1", namespace, "streamingapps")
        phases = Counter(app.get("status", {}).get("phase") for app in apps["items"])
        body_bytes = body_sizes(apps["items"])
        failed = {
            app["metadata"]["name"]: app["status"].get("message")
            for app in apps["items"]
            if app.get("status", {}).get("phase") == "Failed"
        }
    finally:
        operator.stop()

    def figures(taken: list[float]) -> dict[str, Any]:
        ordered = sorted(taken)
        return {
            "apps_timed": len(taken),
            "interval_s": TIMED_INTERVAL_S,
            "p50": statistics.median(ordered),
            "p99": percentile(ordered, 0.99),
            "max": ordered[-1],
            "each_in_order": [round(x, 3) for x in taken],
        }

    per_app_minute = sum(requests.values()) / APPS / (quiet_s / 60)
    result = {
        "apps": APPS,
        "watch_resumes": created.resumes,  # the bench's own watch of SparkApplications, ended early and resumed
        "burst": {
            "apps": len(burst),
            "seconds": burst_s,
            "then_at_rest_after_s": burst_settle_s,
            "apps_per_s": len(burst) / burst_s,
            "reconciles_per_s": burst_reconciles / burst_s,
        },
        "apply_to_sparkapplication_s": figures(latencies),
        "apply_to_sparkapplication_while_figures_change_s": {
            **figures(latencies_in_churn),
            "status_patches_per_s": churn_rate,
            "each_app_every_s": FIGURES_S,
        },
        "apply_to_sparkapplication_while_statuses_change_s": {  # every tick (before: every running app)
            **figures(latencies_in_tick_churn),
            "status_patches_per_s": tick_churn_rate,
            "each_app_every_s": TICK_S,
        },
        "at_rest": {
            "seconds": quiet_s,
            "reconciles_per_s": sum(quiet_reconciles.values()) / quiet_s,
            "reconciles_by_trigger": dict(quiet_reconciles),
            "api_requests_per_app_per_min": per_app_minute,
            "api_requests_by_verb_resource": {f"{v} {r}": n for (v, r), n in sorted(requests.items()) if n},
        },
        "app_phases": dict(phases),
        "app_body_bytes": body_bytes,  # as the API server sends it; kopf keeps it without managedFields
        "operator_rss_mb": {"idle": rss_idle / 2**20, "peak": rss_peak / 2**20, "at_rest": rss_rest / 2**20},
        "operator_settings": {"resync_s": RESYNC_S, "tick_s": TICK_S, "status_figures_s": FIGURES_S},
        "targets": {"p99_s": 1.0, "rss_mb": 150},
    }
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps(result, indent=2))
    timing, rest = result["apply_to_sparkapplication_s"], result["at_rest"]
    in_churn = result["apply_to_sparkapplication_while_figures_change_s"]
    in_tick_churn = result["apply_to_sparkapplication_while_statuses_change_s"]
    print(
        f"\n{APPS} apps; burst of {len(burst)}: {burst_s:.0f} s, {len(burst) / burst_s:.1f} apps/s, "
        f"{burst_reconciles / burst_s:.1f} reconciles/s; the operator at rest {burst_settle_s:.0f} s later"
        f"\napply -> SparkApplication over {len(timed)} apps, one a second: p50 {timing['p50']:.2f} s, "
        f"p99 {timing['p99']:.2f} s (target <= 1 s)"
        f"\nthe same over {len(timed_in_churn)} more while every other app's status changes once per "
        f"{FIGURES_S:.0f} s, as a running app's figures ({churn_rate:.0f} patches/s): p50 {in_churn['p50']:.2f} s, "
        f"p99 {in_churn['p99']:.2f} s"
        f"\nand {len(timed_in_tick_churn)} more while every other app changes once per {TICK_S:.0f} s tick, as an "
        f"autoscaled app's state ({tick_churn_rate:.0f} patches/s): p50 {in_tick_churn['p50']:.2f} s, "
        f"p99 {in_tick_churn['p99']:.2f} s"
        f"\nat rest ({quiet_s:.0f} s): {rest['reconciles_per_s']:.1f} reconciles/s, "
        f"{per_app_minute:.2f} API requests per app per minute"
        f"\noperator RSS: idle {rss_idle / 2**20:.0f} MB, peak {rss_peak / 2**20:.0f} MB, "
        f"at rest {rss_rest / 2**20:.0f} MB (target <= 150 MB)\napps by phase: {dict(phases)}\n"
        f"an app's JSON (median bytes): {body_bytes}\nwritten to {OUTPUT}"
    )
    assert set(names) <= set(created.seen)
    assert not failed, f"{len(failed)} apps failed, e.g. {next(iter(failed.items()))}"
    assert phases == {"Pending": APPS}, f"apps by phase: {dict(phases)}"
