"""State that sluice keeps beside a query's checkpoint, through Hadoop's FileSystem like Spark's own
checkpoint, so that s3a://, hdfs:// and local paths all work.

Every file is named after the micro-batch it belongs to and written once, to a temporary name first and
then renamed: a reader never sees half a file, and a batch replayed after a crash finds its file intact.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from pyspark.sql import SparkSession


class BatchFiles:
    """JSON files `<folder>/<batch id>`."""

    def __init__(self, spark: SparkSession, folder: str) -> None:
        jvm = spark._jvm
        assert jvm is not None
        self._jvm = jvm
        self._folder = jvm.org.apache.hadoop.fs.Path(folder)
        self._fs = self._folder.getFileSystem(spark._jsc.hadoopConfiguration())

    def _path(self, name: str):
        return self._jvm.org.apache.hadoop.fs.Path(self._folder, name)

    def write(self, batch_id: int, data: Any) -> None:
        """Write the batch's file unless it exists (then a replay of the batch wrote the same already)."""
        final = self._path(str(batch_id))
        if self._fs.exists(final):
            return
        temporary = self._path(f".{batch_id}.{uuid.uuid4().hex}.tmp")
        stream = self._fs.create(temporary, True)
        try:
            stream.write(bytearray(json.dumps(data).encode()))
        finally:
            stream.close()
        if not self._fs.rename(temporary, final):
            self._fs.delete(temporary, False)
            if not self._fs.exists(final):
                raise OSError(f"could not rename {temporary} to {final}")

    def read(self, batch_id: int) -> Any:
        return json.loads(read_bytes(self._fs, self._path(str(batch_id)), self._jvm))

    def latest(self, before: int | None = None) -> tuple[int, Any] | None:
        """The file of the highest batch id (below `before` when given), with its data; None if none."""
        if not self._fs.exists(self._folder):
            return None
        ids = [
            int(status.getPath().getName())
            for status in self._fs.listStatus(self._folder)
            if status.getPath().getName().isdigit()
        ]
        ids = [i for i in ids if before is None or i < before]
        if not ids:
            return None
        newest = max(ids)
        return newest, self.read(newest)

    def delete(self, batch_id: int) -> None:
        self._fs.delete(self._path(str(batch_id)), False)


def read_bytes(fs, path, jvm) -> bytes:
    stream = fs.open(path)
    try:
        return bytes(jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
    finally:
        stream.close()


def checkpoint_query_id(spark: SparkSession, checkpoint: str) -> str:
    """The id Spark gave the query in `<checkpoint>/metadata`: the same across restarts on that checkpoint,
    a new one for a new checkpoint (where batch ids start again from 0)."""
    jvm = spark._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/metadata")
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    first_line = read_bytes(fs, path, jvm).decode().splitlines()[0]
    return str(json.loads(first_line)["id"])
