#!/bin/bash
# The Spark-on-Kubernetes entrypoint (the pyspark wheel has none): Spark starts driver pods with
# `driver <spark-submit args>` and executor pods with `executor`, its settings in SPARK_* variables;
# anything else runs as given. tini reaps zombies and forwards signals, as in the official image.
set -eo pipefail

if [ -z "${JAVA_HOME:-}" ]; then
  JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
fi
SPARK_CLASSPATH="${SPARK_CLASSPATH:+${SPARK_CLASSPATH}:}${SPARK_HOME}/jars/*"
if [ -n "${SPARK_CONF_DIR:-}" ] && [ -d "${SPARK_CONF_DIR}" ]; then
  SPARK_CLASSPATH="${SPARK_CONF_DIR}:${SPARK_CLASSPATH}"
fi

case "${1:-}" in
  driver)
    shift
    exec tini -s -- "${SPARK_HOME}/bin/spark-submit" \
      --conf "spark.driver.bindAddress=${SPARK_DRIVER_BIND_ADDRESS}" \
      --conf "spark.executorEnv.SPARK_DRIVER_POD_IP=${SPARK_DRIVER_BIND_ADDRESS}" \
      --deploy-mode client "$@"
    ;;
  executor)
    shift
    # The executor's JVM options arrive as SPARK_JAVA_OPT_0, SPARK_JAVA_OPT_1, ... in order.
    mapfile -t java_opts < <(env | grep '^SPARK_JAVA_OPT_' | sort -t_ -k4 -n | sed 's/^[^=]*=//')
    exec tini -s -- "${JAVA_HOME}/bin/java" "${java_opts[@]}" \
      -Xms"${SPARK_EXECUTOR_MEMORY}" -Xmx"${SPARK_EXECUTOR_MEMORY}" \
      -cp "${SPARK_CLASSPATH}${SPARK_DIST_CLASSPATH:+:${SPARK_DIST_CLASSPATH}}" \
      org.apache.spark.scheduler.cluster.k8s.KubernetesExecutorBackend \
      --driver-url "${SPARK_DRIVER_URL}" --executor-id "${SPARK_EXECUTOR_ID}" \
      --cores "${SPARK_EXECUTOR_CORES}" --app-id "${SPARK_APPLICATION_ID}" \
      --hostname "${SPARK_EXECUTOR_POD_IP}" --resourceProfileId "${SPARK_RESOURCE_PROFILE_ID:-0}" \
      --podName "${SPARK_EXECUTOR_POD_NAME}"
    ;;
  *)
    exec tini -s -- "$@"
    ;;
esac
