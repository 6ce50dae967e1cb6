"""Pinned versions of every real component the test bed provisions.

One place for each version: cache keys, Maven coordinates and Go module versions all derive from
these. Kafka's is the product's (sluice.pipelines.local.kafka: the demo broker); the Spark Kafka connector
is not pinned: it always matches the installed pyspark.
"""

KUBERNETES = "1.34.4"
ETCD = "3.5.35"
HELM = "3.22.0"
COREDNS = "1.12.1"  # what kubeadm deploys with Kubernetes 1.34

SPARK_OPERATOR = "2.5.2"  # kubeflow spark-operator: SparkApplication CRD and Helm chart (Go module)
STRIMZI = "1.2.0"  # Strimzi api + crd-generator (Maven Central): KafkaTopic/Kafka/KafkaNodePool CRDs
KUBE_SCORE = "1.20.0"  # chart linter (Go module github.com/zegl/kube-score)
LOCAL_PATH_PROVISIONER = "0.0.30"  # kind's default storage (Go module github.com/rancher/local-path-provisioner)
# The NetworkPolicy agent (Go module github.com/cloudnativelabs/kube-router/v2, its firewall only). kind's own,
# sigs.k8s.io/kube-network-policies, needs nftables' queue expression, which this machine's kernel lacks.
KUBE_ROUTER = "2.1.0"  # the only version the Go proxy serves here
KIND = "0.33.0"  # kind nodes on podman (sluice.testbed.kind; Go module sigs.k8s.io/kind)
# The S3-compatible object store (Go module github.com/versity/versitygw, Apache-2.0; sluice.testbed.object_store).
VERSITYGW = "1.8.0"
# Prometheus (Go module github.com/prometheus/prometheus, Apache-2.0; its v0.3XX.Y tags are releases 3.XX.Y) and
# the Prometheus Operator's CRDs it is configured from (sluice.testbed.prometheus).
PROMETHEUS_MODULE_VERSION = "0.316.0"
PROMETHEUS_OPERATOR = "0.85.0"
