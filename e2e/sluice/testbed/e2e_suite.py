"""The end-to-end suite of sluice, against any cluster reachable through a kubeconfig.

Nothing here provisions a cluster. A caller hands in a `Target` (kubeconfig, a kubectl runner, helm), the
image names and a way to reach Kafka, and runs the steps of `E2ESuite` in order (`E2ESuite.STEPS`):
install the operators (Strimzi, spark-operator, sluice with helm), wait for the Kafka cluster, deploy
the word count app with kubectl, stream data through it and check the counts, scale it with
`kubectl scale`, suspend and resume it (it continues from its checkpoint), uninstall.
tests/test_e2e_kind.py runs it on a kind cluster; a local-cluster run reuses it unchanged.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from .common import REPO_ROOT, wait_for
from .versions import STRIMZI

CHART_DIR = REPO_ROOT / "charts" / "sluice"
IMAGES_DIR = REPO_ROOT / "images"
EXAMPLES_DIR = REPO_ROOT / "pipelines" / "examples"
LINES, COUNTS = "wordcount-lines", "wordcount-counts"  # the word count example's topics
STRIMZI_CHART = "oci://quay.io/strimzi-helm/strimzi-kafka-operator"

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]
"""kubectl(*args, input=None, check=True, timeout=120) against the target; raises on failure when check
(the contract of ControlPlane.kubectl)."""

# Cluster-level waits poll kubectl: every 2 s is often enough.
wait_for = functools.partial(wait_for, interval=2.0)


# --- tools -------------------------------------------------------------------------------------------

class HelmError(RuntimeError):
    """helm exited non-zero; the message carries its stderr."""


@dataclass(frozen=True)
class Helm:
    """helm against one kubeconfig, with its config, cache and data under `home` (not the user's)."""

    binary: Path
    kubeconfig: Path
    home: Path

    def __call__(self, *args: str, timeout: float = 900) -> str:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
               **{f"HELM_{kind}_HOME": str(self.home / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}}
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env,
                                timeout=timeout)
        if result.returncode != 0:
            raise HelmError(f"helm {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout

    def _values_file(self, name: str, values: dict[str, Any]) -> Path:
        path = self.home / "values" / f"{name}.json"  # JSON is YAML
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
        return path

    def install(self, release: str, chart: str | Path, namespace: str, values: dict[str, Any] | None = None,
                *args: str, upgrade: bool = False) -> str:
        """`helm install` (or `helm upgrade`) with values; extra args (--wait, --version, ...) pass through."""
        command = ["upgrade"] if upgrade else ["install", "--create-namespace"]
        return self(*command, release, str(chart), "--namespace", namespace,
                    "-f", str(self._values_file(f"{namespace}-{release}", values or {})), *args)

    def template(self, release: str, namespace: str, values: dict[str, Any] | None = None, *args: str,
                 chart: str | Path = CHART_DIR) -> list[dict[str, Any]]:
        """The manifests `helm template` renders (empty documents dropped)."""
        out = self("template", release, str(chart), "--namespace", namespace,
                   "-f", str(self._values_file(f"template-{namespace}-{release}", values or {})), *args)
        return [doc for doc in yaml.safe_load_all(out) if doc]


@dataclass(frozen=True)
class Target:
    """A cluster: its kubeconfig, a kubectl runner for it and helm pointed at it."""

    kubeconfig: Path
    kubectl: Kubectl
    helm: Helm

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.kubectl("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
        return json.loads(result.stdout) if result.stdout.strip() else None

    def apply(self, *manifests: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                           "items": list(manifests)}))


def kubectl_runner(binary: Path, kubeconfig: Path) -> Kubectl:
    """A Kubectl for any kubeconfig (the pinned kubectl: sluice.testbed.kube.kubernetes_binaries)."""
    def kubectl(*args: str, input: str | None = None, check: bool = True,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(binary), f"--kubeconfig={kubeconfig}", *args], input=input,
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed (exit {result.returncode}): {result.stderr.strip()}")
        return result

    return kubectl


@functools.cache
def image_builder() -> Any:
    """images/build.py as a module (it is a script, outside the sluice packages)."""
    spec = importlib.util.spec_from_file_location("sluice_images_build", IMAGES_DIR / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def chart_version() -> str:
    return yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["appVersion"]


@dataclass(frozen=True)
class Images:
    operator: str
    spark: str

    @classmethod
    def release(cls, version: str | None = None) -> Images:
        """The tags `make images` builds."""
        version = version or chart_version()
        return cls(f"sluice/operator:{version}", f"sluice/spark:{version}")

    def chart_values(self) -> dict[str, Any]:
        repository, _, tag = self.operator.rpartition(":")
        return {"image": {"repository": repository, "tag": tag}}


def service_account_kubeconfig(target: Target, namespace: str, account: str, duration: str = "2h") -> str:
    """A kubeconfig (JSON) that acts as namespace/account, from a token `kubectl create token` issues."""
    token = target.kubectl("create", "token", account, "-n", namespace, f"--duration={duration}").stdout.strip()
    admin = yaml.safe_load(target.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    user = f"system:serviceaccount:{namespace}:{account}"
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa", "preferences": {},
        "clusters": [{"name": "sa", "cluster": cluster["cluster"]}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "sa", "user": user, "namespace": namespace}}],
    })


# --- Kafka --------------------------------------------------------------------------------------------

class KafkaAccess(Protocol):
    """How the suite reaches Kafka, and how apps are pointed at it."""

    def chart_values(self) -> dict[str, Any]: ...  # sluice chart values (e.g. the quick-start cluster)

    def app_kafka(self) -> dict[str, Any]: ...  # a StreamingApp's spec.kafka

    def wait_ready(self, timeout: float) -> None: ...

    def produce(self, topic: str, values: Sequence[str]) -> None: ...

    def consume(self, topic: str) -> list[str]: ...  # every value in the topic now


@dataclass(frozen=True)
class StrimziKafka:
    """The chart's quick-start Strimzi cluster in the release namespace, used through its broker pod."""

    target: Target
    namespace: str
    name: str = "sluice-kafka"

    def chart_values(self) -> dict[str, Any]:
        return {"kafkaCluster": {"enabled": True, "name": self.name}}

    def app_kafka(self) -> dict[str, Any]:
        return {"strimziCluster": {"name": self.name, "namespace": self.namespace}}

    def wait_ready(self, timeout: float) -> None:
        wait_for(lambda: self.target.get("kafka", self.name, self.namespace), timeout=60, what="the Kafka resource")
        self.target.kubectl("wait", f"kafka/{self.name}", "-n", self.namespace, "--for=condition=Ready",
                            f"--timeout={timeout:.0f}s", timeout=timeout + 30)

    def _exec(self, script: str, *args: str, input: str | None = None) -> str:
        pods = self.target.kubectl("get", "pods", "-n", self.namespace, "-o", "name", "-l",
                                   f"strimzi.io/cluster={self.name},strimzi.io/broker-role=true").stdout.split()
        assert pods, f"no broker pod of Kafka {self.namespace}/{self.name}"
        return self.target.kubectl("exec", "-i", "-n", self.namespace, pods[0], "--", f"/opt/kafka/bin/{script}",
                                   "--bootstrap-server", "localhost:9092", *args, input=input, timeout=300).stdout

    def produce(self, topic: str, values: Sequence[str]) -> None:
        self._exec("kafka-console-producer.sh", "--topic", topic, input="".join(f"{v}\n" for v in values))

    def consume(self, topic: str) -> list[str]:
        out = self._exec("kafka-console-consumer.sh", "--topic", topic, "--from-beginning", "--timeout-ms", "10000")
        return [line for line in out.splitlines() if line.strip()]


@dataclass(frozen=True)
class HostKafka:
    """A broker both this process and the cluster's pods reach at `bootstrap` (e.g. `make local-kafka`)."""

    bootstrap: str

    def chart_values(self) -> dict[str, Any]:
        return {}

    def app_kafka(self) -> dict[str, Any]:
        return {"bootstrapServers": self.bootstrap}

    def wait_ready(self, timeout: float) -> None:
        return None  # it is up before the suite starts

    def produce(self, topic: str, values: Sequence[str]) -> None:
        from .kafka_io import produce

        produce(self.bootstrap, topic, [v.encode() for v in values])

    def consume(self, topic: str) -> list[str]:
        from .kafka_io import consume_all

        return [r.value.decode() for r in consume_all(self.bootstrap, topic) if r.value is not None]


# --- installing ----------------------------------------------------------------------------------------

def install_strimzi(target: Target, namespace: str = "strimzi", version: str = STRIMZI) -> None:
    target.helm.install("strimzi", STRIMZI_CHART, namespace, {"watchAnyNamespace": True},
                        "--version", version, "--wait", "--timeout", "10m")


def install_spark_operator(target: Target, values: dict[str, Any], namespace: str = "spark-operator") -> None:
    """The pinned spark-operator chart (from its Go module), running Spark apps in every namespace."""
    from .external_crds import spark_operator_chart

    target.helm.install("spark-operator", spark_operator_chart(), namespace,
                        {"spark": {"jobNamespaces": [""]}, **values}, "--wait", "--timeout", "10m")


# --- the app --------------------------------------------------------------------------------------------

def wordcount_app(namespace: str, images: Images, kafka: dict[str, Any], *, management: str | None = None,
                  checkpoint_claim: str | None = None) -> dict[str, Any]:
    """pipelines/examples/wordcount.yaml, sized for a small cluster and pointed at the given Kafka."""
    app = yaml.safe_load((EXAMPLES_DIR / "wordcount.yaml").read_text())
    app["metadata"]["namespace"] = namespace
    spec = app["spec"]
    spec["kafka"] = kafka
    if management:
        for topic in spec["topics"]:
            topic["management"] = management
    spec["executors"] = {"instances": 1, "min": 1, "max": 3}
    small = {"cores": 1, "memory": "512m"}
    spec["spark"] = {"image": images.spark, "driver": small, "executor": small,
                     # Request a quarter core per pod so a driver and 2-3 executors fit on a laptop.
                     "sparkConf": {"spark.kubernetes.driver.request.cores": "250m",
                                   "spark.kubernetes.executor.request.cores": "250m"}}
    if checkpoint_claim:
        spec["checkpoint"] = {"location": "/checkpoints", "volumeClaim": checkpoint_claim}
    return app


def pvc(name: str, namespace: str, size: str = "1Gi") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}}


def word_counts(records: Iterable[str]) -> Counter[str]:
    """Total count per word over the windows the word count app emitted.

    Spark's Kafka sink is at-least-once: a driver stopped mid-batch (a restart after `kubectl scale`, a
    suspend) writes that batch's closed windows again on restart. Each (window, word) is a final result, so
    it counts once, and every copy must carry the same count (anything else is a real error)."""
    per_window: dict[tuple[str, str, str], int] = {}
    for record in records:
        row = json.loads(record)
        key = (row["window_start"], row["window_end"], row["word"])
        if key in per_window:
            assert per_window[key] == row["count"], f"window {key} emitted as {per_window[key]} and {row['count']}"
        per_window[key] = row["count"]
    totals: Counter[str] = Counter()
    for (_, _, word), count in per_window.items():
        totals[word] += count
    return totals


# --- the suite ------------------------------------------------------------------------------------------

@dataclass
class E2ESuite:
    """The steps, run in order (STEPS); each assumes the ones before it passed."""

    target: Target
    images: Images
    kafka: KafkaAccess
    release_namespace: str = "sluice-system"
    apps_namespace: str = "sluice-apps"
    release: str = "sluice"
    strimzi: bool = True  # install the Strimzi operator (the Kafka of StrimziKafka)
    spark_operator: dict[str, Any] | None = field(default_factory=dict)  # its chart values; None: installed
    timeout: float = 600.0
    app: dict[str, Any] = field(default_factory=dict)
    expected: Counter[str] = field(default_factory=Counter)
    failed: str | None = None  # the first step that failed: the later ones cannot run

    STEPS = ("install", "kafka_ready", "deploy_app", "stream", "scale", "suspend_resume", "uninstall")

    def run(self, step: str) -> None:
        try:
            getattr(self, step)()
        except Exception:
            self.failed = self.failed or step
            print(self.diagnostics())
            raise

    def diagnostics(self) -> str:
        """What to look at when a step failed: the resources, the operator's log and the logs of every pod
        that failed, restarted or is not running."""
        kinds = ("streamingapps", "sparkapplications", "kafkatopics", "kafkas", "pods", "pvc")
        commands = [*(("get", kind, "-A", "-o", "wide") for kind in kinds),  # one by one: some may not exist
                    ("get", "events", "-A", "--sort-by=.lastTimestamp"),
                    ("logs", "-n", self.release_namespace, f"deployment/{self.release}", "--tail=60")]
        for namespace, pod in self.troubled_pods():
            commands.append(("logs", "-n", namespace, pod, "--all-containers", "--tail=80"))
            commands.append(("logs", "-n", namespace, pod, "--all-containers", "--previous", "--tail=40"))
        out = []
        for args in commands:
            result = self.target.kubectl(*args, check=False)
            out.append(f"$ kubectl {' '.join(args)}\n{result.stdout[-6000:]}{result.stderr[-2000:]}")
        return "\n".join(out)

    def troubled_pods(self) -> list[tuple[str, str]]:
        result = self.target.kubectl("get", "pods", "-A", "-o", "json", check=False)
        if result.returncode != 0:
            return []
        troubled = []
        for pod in json.loads(result.stdout).get("items", []):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if (pod.get("status", {}).get("phase") not in ("Running", "Succeeded")
                    or any(c.get("restartCount") or not c.get("ready") for c in statuses)):
                troubled.append((pod["metadata"]["namespace"], pod["metadata"]["name"]))
        return troubled

    # -- helpers

    @property
    def app_name(self) -> str:
        return self.app["metadata"]["name"]

    def status(self) -> dict[str, Any]:
        return (self.target.get("streamingapp", self.app_name, self.apps_namespace) or {}).get("status") or {}

    def spark_application(self) -> dict[str, Any] | None:
        return self.target.get("sparkapplication", self.app_name, self.apps_namespace)

    def running_executor_pods(self) -> list[str]:
        """The app's executor pods that are Running (Spark labels them spark-role=executor)."""
        pods = json.loads(self.target.kubectl("get", "pods", "-n", self.apps_namespace, "-o", "json", "-l",
                                              "spark-role=executor").stdout)["items"]
        return [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"
                and p["metadata"].get("deletionTimestamp") is None]

    def wait_phase(self, phase: str) -> dict[str, Any]:
        return wait_for(lambda: (s := self.status()).get("phase") == phase and s, timeout=self.timeout,
                        what=f"{self.app_name} to be {phase}")

    def send(self, words: Sequence[str], lines: int = 20) -> None:
        """Lines of words; their counts become due once later data closes their windows."""
        self.kafka.produce(LINES, [" ".join(words)] * lines)
        self.expected.update({word: lines * words.count(word) for word in set(words)})

    def assert_counts(self) -> None:
        """Keep the event time moving (a flush line now and then) until every window with a word of
        ours is emitted; each word's total must be exactly what was sent."""
        def counted() -> Counter[str] | None:
            self.kafka.produce(LINES, ["flush"])
            got = word_counts(self.kafka.consume(COUNTS))
            return got if all(got[w] >= n for w, n in self.expected.items()) else None

        got = wait_for(counted, timeout=self.timeout, what=f"counts {dict(self.expected)}", interval=3)
        assert {w: got[w] for w in self.expected} == dict(self.expected)

    # -- steps

    def install(self) -> None:
        if self.strimzi:
            install_strimzi(self.target)
        if self.spark_operator is not None:
            install_spark_operator(self.target, self.spark_operator)
        values = {**self.images.chart_values(), **self.kafka.chart_values()}
        self.target.helm.install(self.release, CHART_DIR, self.release_namespace, values, "--wait", "--timeout", "5m")
        self.target.kubectl("create", "namespace", self.apps_namespace, check=False)

    def kafka_ready(self) -> None:
        self.kafka.wait_ready(self.timeout)

    def deploy_app(self) -> None:
        claim = "wordcount-checkpoints"
        self.app = wordcount_app(self.apps_namespace, self.images, self.kafka.app_kafka(), checkpoint_claim=claim)
        self.target.apply(pvc(claim, self.apps_namespace), self.app)
        if isinstance(self.kafka, StrimziKafka):  # topics before data: no auto-created topic gets there first
            wait_for(lambda: self.target.kubectl("get", "kafkatopics", "-n", self.kafka.namespace, "-o", "name")
                     .stdout.count("\n") >= len(self.app["spec"]["topics"]), timeout=120, what="the KafkaTopics")
            self.target.kubectl("wait", "kafkatopics", "--all", "-n", self.kafka.namespace, "--for=condition=Ready",
                                f"--timeout={self.timeout:.0f}s", timeout=self.timeout + 30)
        status = self.wait_phase("Running")
        assert {c["type"]: c["status"] for c in status["conditions"]}["TopicsReady"] == "True", status
        instances = self.app["spec"]["executors"]["instances"]
        wait_for(lambda: len(self.running_executor_pods()) == instances, timeout=self.timeout,
                 what=f"{instances} executor pod(s) of {self.app_name}")

    def stream(self) -> None:
        self.send(["alpha", "beta", "alpha"])
        self.assert_counts()

    def scale(self) -> None:
        self.target.kubectl("scale", "streamingapp", self.app_name, "-n", self.apps_namespace, "--replicas=2")
        wait_for(lambda: ((self.spark_application() or {}).get("spec") or {}).get("executor", {}).get("instances")
                 == 2, timeout=120, what="the SparkApplication to ask for 2 executors")
        wait_for(lambda: self.status().get("executors") == 2, timeout=self.timeout, what="2 running executors")
        wait_for(lambda: len(self.running_executor_pods()) == 2, timeout=self.timeout, what="2 executor pods")
        self.wait_phase("Running")
        self.send(["gamma", "alpha"])
        self.assert_counts()

    def suspend_resume(self) -> None:
        def patch(suspend: bool) -> None:
            self.target.kubectl("patch", "streamingapp", self.app_name, "-n", self.apps_namespace, "--type=merge",
                                "-p", json.dumps({"spec": {"suspend": suspend}}))

        patch(True)
        self.wait_phase("Suspended")
        wait_for(lambda: self.spark_application() is None, timeout=120, what="the driver to be removed")
        self.send(["delta", "beta"])  # while nothing runs: read from the checkpointed offsets on resume
        patch(False)
        self.wait_phase("Running")
        self.assert_counts()

    def uninstall(self) -> None:
        self.target.kubectl("delete", "streamingapp", self.app_name, "-n", self.apps_namespace, "--wait=true",
                            timeout=self.timeout)
        wait_for(lambda: self.spark_application() is None, timeout=120, what="the driver to be collected")
        self.target.helm("uninstall", self.release, "--namespace", self.release_namespace, "--wait")
        assert self.target.get("deployment", self.release, self.release_namespace) is None
        # Helm leaves CRDs in place: apps elsewhere survive an uninstall.
        assert self.target.kubectl("get", "crd", "streamingapps.sluice.dev", check=False).returncode == 0
