"""The Spark settings sluice starts sessions with: the local defaults (pure), and the state store commits they
give a stateful query (real Spark)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession

from sluice.pipelines.queries import JOIN_STATE_FORMAT, streaming_query_conf
from sluice.pipelines.session import BASE_CONF, STATE_STORE_PROVIDER, local_conf


def test_local_shuffle_partitions_are_the_cores_unless_set() -> None:
    def partitions(**kwargs) -> str:
        return local_conf([], **kwargs)["spark.sql.shuffle.partitions"]

    assert partitions(cores=3) == "3"
    assert partitions(cores="*") == str(os.cpu_count())
    assert partitions(cores=3, shuffle_partitions=8) == "8"
    assert partitions(cores=3, conf={"spark.sql.shuffle.partitions": "5"}) == "5"


def test_a_stateful_query_commits_the_keys_it_changed(spark_session: SparkSession, tmp_path: Path) -> None:
    """RocksDB with changelog checkpointing: every batch's commit is a `<version>.changelog` per state partition,
    not a snapshot of the store (`<version>.zip`, what a commit is without it)."""
    source, checkpoint = tmp_path / "in", tmp_path / "checkpoint"
    source.mkdir()
    for batch in range(3):
        (source / f"{batch}.json").write_text("\n".join(json.dumps({"word": w}) for w in ("a", "b", "a")))
        query = (
            spark_session.readStream.schema("word STRING")
            .json(str(source))
            .groupBy("word")
            .count()
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
    partitions = sorted(p.name for p in (checkpoint / "state" / "0").iterdir() if p.name.isdigit())
    assert partitions == [str(n) for n in range(int(spark_session.conf.get("spark.sql.shuffle.partitions") or 0))]
    assert partitions, "the query kept no state"
    for partition in partitions:
        files = {p.name for p in (checkpoint / "state" / "0" / partition).iterdir()}
        assert {"1.changelog", "2.changelog", "3.changelog"} <= files, (partition, sorted(files))


def test_spark_submit_settings_override_sluices_own(tmp_path: Path) -> None:
    """The runner on a cluster runs under spark-submit, which carries the app's sparkConf: a setting there wins
    over sluice's BASE_CONF (a session builder's setting would override it); the others stay sluice's, the Hadoop
    ones (spark.hadoop.*) in Hadoop's configuration."""
    provider, changelog = (
        "spark.sql.streaming.stateStore.providerClass",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
    )
    hdfs = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    script = tmp_path / "settings.py"
    script.write_text(
        "import json\n"
        "from sluice.pipelines.session import build_session\n"
        "spark = build_session('settings', {})\n"
        f"keys = {[provider, changelog, 'spark.sql.session.timeZone']!r}\n"
        "got = {key: spark.conf.get(key) for key in keys}\n"
        "got['hadoop s3a stream'] = spark.sparkContext._jsc.hadoopConfiguration().get('fs.s3a.input.stream.type')\n"
        "print(json.dumps(got))\n"
        "spark.stop()\n"
    )
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    settings = {provider: hdfs, "spark.sql.session.timeZone": "Europe/Paris", "spark.ui.enabled": "false"}
    command = [str(submit), "--master", "local[1]", *(f"--conf={k}={v}" for k, v in settings.items()), str(script)]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {
        provider: hdfs,
        changelog: BASE_CONF[changelog],
        "spark.sql.session.timeZone": "Europe/Paris",
        "hadoop s3a stream": "classic",  # reaches Hadoop's configuration, where S3A reads it
    }


def test_joins_keep_their_state_in_one_rocksdb_store_unless_the_app_says_otherwise() -> None:
    """Join state format 3 (one RocksDB store per join partition) for the queries of a session whose state is in
    RocksDB, on Spark 4.1 and later; nothing where the app set the format or another state store (format 3
    needs RocksDB). Exchange reuse stays off either way."""
    rocksdb = {STATE_STORE_PROVIDER: BASE_CONF[STATE_STORE_PROVIDER]}
    assert streaming_query_conf(rocksdb, "4.2.0") == {"spark.sql.exchange.reuse": "false", JOIN_STATE_FORMAT: "3"}
    hdfs = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
    for session, version in (
        ({**rocksdb, JOIN_STATE_FORMAT: "2"}, "4.2.0"),
        ({STATE_STORE_PROVIDER: hdfs}, "4.2.0"),
        ({}, "4.2.0"),  # Spark's default store: HDFS
        (rocksdb, "4.0.1"),
    ):
        assert streaming_query_conf(session, version) == {"spark.sql.exchange.reuse": "false"}, (session, version)
