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
