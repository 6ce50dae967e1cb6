"""A real Apache Kafka (KRaft) from Maven Central jars: one node by default, three for fault tests.

The developer broker (`make local-kafka`, in LOCAL_KAFKA_DIR) that `sluice run` and `make demo` use when it
is up; the demo starts a throwaway one otherwise. The test bed starts its brokers with it too.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .maven import fetch_jars
from .provision import (
    ManagedProcess,
    ProvisionError,
    cache_dir,
    free_ports,
    pick_port,
    pid_alive,
    port_in_use,
    read_record,
    require_tool,
    run,
    stop_process_group,
    wait_until,
)

KAFKA = "4.1.1"
SCALA_BINARY = "2.13"
LOG4J = "2.24.3"
MIN_JAVA = 17
LOCAL_PORT = 9092
LOCAL_CONTROLLER_PORT = 9093
# The developer broker's state (pids, bootstrap, logs), in the checkout: make local-kafka / local-kafka-down.
LOCAL_KAFKA_DIR = Path(__file__).resolve().parents[4] / ".local-kafka"

_LOG4J2_CONFIG = """status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.apache.name = org.apache.kafka
logger.apache.level = WARN
"""


def kafka_jars() -> list[Path]:
    coordinates = [
        f"org.apache.kafka:kafka_{SCALA_BINARY}:{KAFKA}",
        f"org.apache.logging.log4j:log4j-core:{LOG4J}",
        f"org.apache.logging.log4j:log4j-slf4j2-impl:{LOG4J}",
    ]
    return fetch_jars("kafka", coordinates, cache_dir("kafka", KAFKA) / "libs")


def java_binary() -> str:
    java = require_tool("java", f"install a JDK >= {MIN_JAVA} (apt-get install openjdk-17-jdk-headless)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < MIN_JAVA:
        raise ProvisionError(
            f"Kafka {KAFKA} and Spark 4 need Java >= {MIN_JAVA}; `java -version` says: "
            f"{out.splitlines()[0] if out else 'nothing'} (apt-get install openjdk-17-jdk-headless)"
        )
    return java


def new_cluster_id() -> str:
    """Kafka cluster ids are a base64url UUID without padding; like Kafka's own generator, never one that
    starts with '-', which command lines would read as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass(frozen=True)
class KafkaNode:
    node_id: int
    port: int
    controller_port: int
    secured_port: int | None = None  # the SASL_SSL listener's, when the cluster has one
    mtls_port: int | None = None  # the SSL listener's (client certificates required), when the cluster has one


SCRAM_MECHANISM = "SCRAM-SHA-512"


@dataclass(frozen=True)
class SecuredListener:
    """A SASL_SSL listener: TLS with the broker's key and certificate chain, SCRAM-SHA-512 logins for `users`;
    beside it an SSL listener that logs clients in by their certificate (mTLS: one the CA signed).

    Both files are PEM: `keystore` holds the broker's PKCS#8 private key (unencrypted) and its certificate
    chain, `truststore` the CA that clients verify the brokers against. The users exist from the first start:
    their credentials are written into the storage when it is formatted.
    """

    keystore: Path
    truststore: Path
    users: Mapping[str, str] = field(default_factory=dict)  # name -> password


def server_properties(
    node: KafkaNode,
    nodes: list[KafkaNode],
    log_dir: Path,
    host: str = "127.0.0.1",
    secured: SecuredListener | None = None,
) -> str:
    """With a secured listener, clients on `host` get SASL_SSL only; the plaintext one moves to loopback, for the
    host's own tools and the brokers among themselves."""
    voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in nodes)
    replication = min(3, len(nodes))
    plain_host = "127.0.0.1" if secured else host
    listeners = [f"PLAINTEXT://{plain_host}:{node.port}"]
    if secured and node.secured_port:
        listeners.append(f"SASL_SSL://{host}:{node.secured_port}")
    if secured and node.mtls_port:
        listeners.append(f"SSL://{host}:{node.mtls_port}")
    settings: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": voters,
        "listeners": ",".join([*listeners, f"CONTROLLER://127.0.0.1:{node.controller_port}"]),
        "advertised.listeners": ",".join(listeners),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL",
        "log.dirs": log_dir,
        "num.partitions": 1,
        "default.replication.factor": replication,
        "min.insync.replicas": max(1, replication - 1),
        "offsets.topic.replication.factor": replication,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": replication,
        "transaction.state.log.min.isr": max(1, replication - 1),
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "true",
        "log.retention.hours": 24,
        "delete.topic.enable": "true",
    }
    if secured:
        settings |= {
            "sasl.enabled.mechanisms": SCRAM_MECHANISM,
            f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": secured.keystore,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": secured.truststore,
            "ssl.client.auth": "none",
            "listener.name.ssl.ssl.client.auth": "required",
        }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


class KafkaCluster:
    """KRaft brokers, each a combined broker+controller process with its own log dir. Clients reach them on
    `host` (loopback by default; the local cluster's node address for brokers its pods use)."""

    def __init__(
        self,
        state_dir: Path,
        nodes: list[KafkaNode],
        heap: str = "768m",
        host: str = "127.0.0.1",
        secured: SecuredListener | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.nodes = nodes
        self.heap = heap
        self.host = host
        self.secured = secured
        self.processes: list[ManagedProcess] = []

    @classmethod
    def on_free_ports(
        cls, state_dir: Path, size: int = 1, host: str = "127.0.0.1", secured: SecuredListener | None = None
    ) -> KafkaCluster:
        per_node = 4 if secured else 2
        ports = free_ports(per_node * size)
        nodes = []
        for i in range(size):
            port, controller_port, *secured_ports = ports[per_node * i : per_node * (i + 1)]
            nodes.append(KafkaNode(i + 1, port, controller_port, *secured_ports))
        return cls(state_dir, nodes, host=host, secured=secured)

    @property
    def plaintext_host(self) -> str:
        return "127.0.0.1" if self.secured else self.host

    @property
    def bootstrap(self) -> str:
        """The plaintext listeners' addresses: on `host`, or on loopback only when the cluster is secured."""
        return ",".join(f"{self.plaintext_host}:{n.port}" for n in self.nodes)

    @property
    def secured_bootstrap(self) -> str:
        if not self.secured:
            raise ProvisionError("this Kafka cluster has no secured listener")
        return ",".join(f"{self.host}:{n.secured_port}" for n in self.nodes)

    @property
    def mtls_bootstrap(self) -> str:
        """The SSL listeners' addresses: clients log in with a certificate the cluster's CA signed."""
        if not self.secured:
            raise ProvisionError("this Kafka cluster has no secured listener")
        return ",".join(f"{self.host}:{n.mtls_port}" for n in self.nodes)

    def start(self, timeout: float = 90.0) -> KafkaCluster:
        java = java_binary()
        classpath = str(kafka_jars()[0].parent / "*")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log4j = self.state_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2_CONFIG)
        cluster_id = new_cluster_id()
        jvm = [
            java,
            f"-Xmx{self.heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            "-cp",
            classpath,
        ]
        for node in self.nodes:
            if port_in_use(node.port, self.plaintext_host) or port_in_use(node.controller_port):
                raise ProvisionError(f"Kafka port {node.port} or {node.controller_port} is already in use")
            node_dir = self.state_dir / f"node-{node.node_id}"
            config = node_dir / "server.properties"
            shutil.rmtree(node_dir, ignore_errors=True)  # a fresh cluster id needs fresh storage
            node_dir.mkdir(parents=True)
            config.write_text(server_properties(node, self.nodes, node_dir / "data", self.host, self.secured))
            run(
                [
                    *jvm,
                    "kafka.tools.StorageTool",
                    "format",
                    "--cluster-id",
                    cluster_id,
                    "--config",
                    config,
                    "--ignore-formatted",
                    *self._scram_arguments(),
                ],
                what=f"formatting Kafka storage for node {node.node_id}",
                hint=f"the Kafka jars in the cache may be incomplete; delete {cache_dir('kafka', KAFKA)} and retry",
                log=node_dir / "format.log",
            )
            process = ManagedProcess(
                f"kafka-{node.node_id}", [*jvm, "kafka.Kafka", str(config)], node_dir / "kafka.log"
            )
            self.processes.append(process.start())
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self._write_state()
        return self

    def wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        for node, process in zip(self.nodes, self.processes, strict=True):
            wait_until(
                lambda n=node: port_in_use(n.port, self.plaintext_host),
                timeout=timeout,
                what=f"Kafka node {node.node_id} on port {node.port}",
                process=process,
            )
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000})

        def all_brokers_registered() -> bool:
            for process in self.processes:
                process.check_alive()
            try:
                return len(admin.list_topics(timeout=2).brokers) == len(self.nodes)
            except Exception:
                return False

        wait_until(all_brokers_registered, timeout=timeout, what=f"Kafka brokers at {self.bootstrap}")

    def _scram_arguments(self) -> list[str]:
        users = self.secured.users if self.secured else {}
        return [
            argument
            for name, password in users.items()
            for argument in ("--add-scram", f"{SCRAM_MECHANISM}=[name={name},password={password}]")
        ]

    def stop(self) -> None:
        for process in self.processes:
            process.stop()
        self.processes.clear()

    def _write_state(self) -> None:
        state = {"bootstrap": self.bootstrap, "pids": [p.pid for p in self.processes]}
        (self.state_dir / "state.json").write_text(json.dumps(state))
        (self.state_dir / "bootstrap").write_text(self.bootstrap + "\n")


def read_state(state_dir: Path) -> dict | None:
    return read_record(state_dir / "state.json")


def local_up(state_dir: Path, size: int = 1, host: str = "127.0.0.1") -> str:
    """Start (or find running) the developer broker in `state_dir`, detached; return its bootstrap."""
    state = read_state(state_dir)
    if state and all(pid_alive(pid) for pid in state["pids"]):
        return state["bootstrap"]
    local_down(state_dir)
    if size == 1:
        nodes = [KafkaNode(1, pick_port(LOCAL_PORT), pick_port(LOCAL_CONTROLLER_PORT))]
    else:
        # The 3-broker mode sits on other ports so it can run beside the single broker.
        nodes = [KafkaNode(i + 1, pick_port(19092 + 2 * i), pick_port(19093 + 2 * i)) for i in range(size)]
    return KafkaCluster(state_dir, nodes, host=host).start().bootstrap


def local_down(state_dir: Path) -> bool:
    state = read_state(state_dir)
    for pid in state["pids"] if state else []:
        stop_process_group(pid)
    shutil.rmtree(state_dir, ignore_errors=True)
    return state is not None


def local_bootstrap(state_dir: Path) -> str | None:
    state = read_state(state_dir)
    if state and all(pid_alive(pid) for pid in state["pids"]):
        return state["bootstrap"]
    return None
