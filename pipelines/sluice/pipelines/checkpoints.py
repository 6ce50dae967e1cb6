"""State that sluice keeps beside a query's checkpoint, through Hadoop's FileSystem like Spark's own
checkpoint, so that s3a://, hdfs:// and local paths all work.

Every file is named after the micro-batch it belongs to and written once, to a temporary name first and
then renamed: a reader never sees half a file, and a batch replayed after a crash finds its file intact.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import asdict, dataclass, field, fields
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


def delete_folder(spark: SparkSession, folder: str) -> bool:
    """Delete the folder and what it holds; False when it did not exist."""
    jvm = spark._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(folder)
    return bool(path.getFileSystem(spark._jsc.hadoopConfiguration()).delete(path, True))


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


class OffsetLog:
    """A query's offset log `<checkpoint>/offsets/<batch id>` (read only): Spark writes batch N's entry when it
    plans the batch, before running it. Line 1 is the version, line 2 the batch's metadata (its
    `batchWatermarkMs`), then one line per source with its end offsets (`{"topic": {"partition": offset}}`)."""

    def __init__(self, spark: SparkSession, checkpoint: str) -> None:
        jvm = spark._jvm
        assert jvm is not None
        self._jvm = jvm
        self._folder = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/offsets")
        self._fs = self._folder.getFileSystem(spark._jsc.hadoopConfiguration())
        self._entries: dict[int, tuple[int, dict[tuple[str, int], int]]] = {}  # entries never change once written

    def ids(self) -> list[int]:
        if not self._fs.exists(self._folder):
            return []
        names = (status.getPath().getName() for status in self._fs.listStatus(self._folder))
        return sorted(int(name) for name in names if name.isdigit())

    def entry(self, batch_id: int) -> tuple[int, dict[tuple[str, int], int]]:
        """The batch's watermark (ms) and end offset per (topic, partition); a topic read by two sources of
        the query counts with the first."""
        if batch_id not in self._entries:
            path = self._jvm.org.apache.hadoop.fs.Path(self._folder, str(batch_id))
            lines = read_bytes(self._fs, path, self._jvm).decode().splitlines()
            ends: dict[tuple[str, int], int] = {}
            for line in lines[2:]:
                offsets = json.loads(line) if line.strip() not in ("", "-") else None
                for topic, partitions in (offsets if isinstance(offsets, dict) else {}).items():
                    for partition, offset in partitions.items():
                        ends.setdefault((topic, int(partition)), int(offset))
            self._entries[batch_id] = (int(json.loads(lines[1]).get("batchWatermarkMs", 0)), ends)
            for old in [i for i in self._entries if i < batch_id - 1000]:
                del self._entries[old]
        return self._entries[batch_id]


def source_starts(spark: SparkSession, checkpoint: str) -> dict[tuple[str, int], int]:
    """Where the query's Kafka sources began reading: Spark's record of their initial offsets,
    `<checkpoint>/sources/<n>/0` (written before the first batch: a zero byte, `v1`, then
    `{"topic": {"partition": offset}}`), per (topic, partition) the lowest of its sources'; empty before."""
    jvm = spark._jvm
    assert jvm is not None
    folder = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/sources")
    fs = folder.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(folder):
        return {}
    starts: dict[tuple[str, int], int] = {}
    for status in fs.listStatus(folder):
        first = jvm.org.apache.hadoop.fs.Path(status.getPath(), "0")
        if not status.isDirectory() or not fs.exists(first):
            continue
        lines = read_bytes(fs, first, jvm).decode().lstrip("\x00").splitlines()
        offsets = json.loads(lines[1]) if len(lines) > 1 and lines[0].startswith("v") else None
        for topic, partitions in (offsets if isinstance(offsets, dict) else {}).items():
            for partition, offset in partitions.items():
                if int(offset) >= 0:  # Spark writes offsets it resolved, never earliest (-2) or latest (-1)
                    key = (topic, int(partition))
                    starts[key] = min(starts.get(key, int(offset)), int(offset))
    return starts


def running_query_at(spark: SparkSession, checkpoint: str) -> bool:
    """Whether a query of this session runs on the checkpoint (Spark's resolved checkpoint root)."""
    jvm = spark._jvm
    assert jvm is not None
    conf = spark._jsc.hadoopConfiguration()

    def qualified(location: str) -> str:  # file:/x and file:///x are one place
        path = jvm.org.apache.hadoop.fs.Path(location)
        return str(path.getFileSystem(conf).makeQualified(path).toString()).rstrip("/")

    wanted = qualified(checkpoint)
    return any(
        query.isActive and qualified(query._jsq.streamingQuery().resolvedCheckpointRoot()) == wanted
        for query in spark.streams.active
    )


def committed_batch(spark: SparkSession, checkpoint: str) -> int | None:
    """The id of the query's last completed batch (`<checkpoint>/commits/<id>`: its output is in the sink);
    None before its first."""
    jvm = spark._jvm
    assert jvm is not None
    folder = jvm.org.apache.hadoop.fs.Path(checkpoint.rstrip("/") + "/commits")
    fs = folder.getFileSystem(spark._jsc.hadoopConfiguration())
    if not fs.exists(folder):
        return None
    ids = [int(name) for name in (s.getPath().getName() for s in fs.listStatus(folder)) if name.isdigit()]
    return max(ids, default=None)


@dataclass(frozen=True)
class Handover:
    """How a query took over its output from another checkpoint (`<checkpoint>/sluice/handovers/<n>`, the
    newest counts; kept across restarts). cutMs: the other query's last watermark, down to the end of the last
    window it closed there (its OutputGrid); rows final before it (windows that closed at or before it) were
    written by that query, so this one drops them (the output gate).
    startingOffsets: where this checkpoint's first batch starts, per source node (Spark's startingOffsets JSON);
    Spark reads them only while the checkpoint has no offsets of its own.
    countedBeforeMs: the cut, when the other query's windows end on a grid (every record of event time before
    it is in a window that query wrote); this query's tumbling windows leave those records out, so one that
    straddles the cut (off its grid) counts only its records from the cut on, and no record is counted twice."""

    source: str  # the checkpoint the output came from
    cutMs: int | None
    startingOffsets: dict[str, str] = field(default_factory=dict)
    countedBeforeMs: int | None = None

    @staticmethod
    def folder(checkpoint: str) -> str:
        return checkpoint.rstrip("/") + "/sluice/handovers"

    @classmethod
    def latest(cls, spark: SparkSession, checkpoint: str) -> Handover | None:
        """The newest handover; fields a later version added are left out (a downgraded driver reads it)."""
        found = BatchFiles(spark, cls.folder(checkpoint)).latest()
        if found is None:
            return None
        known = {f.name for f in fields(cls)}
        return cls(**{key: value for key, value in found[1].items() if key in known})

    def write(self, spark: SparkSession, checkpoint: str) -> None:
        """Written with the fields that are set: a driver of a version before countedBeforeMs reads it too."""
        files = BatchFiles(spark, self.folder(checkpoint))
        latest = files.latest()
        document = {key: value for key, value in asdict(self).items() if value is not None or key == "cutMs"}
        files.write(0 if latest is None else latest[0] + 1, document)


@dataclass(frozen=True)
class OutputGrid:
    """Where a windowed query's output windows end (`<checkpoint>/sluice/output-grid/0`, written as it first
    starts; a window change is a new checkpoint): on multiples of everyMs. A query taking over its output
    cuts at the last of those before the watermark, so the windows of its own that end between that and the
    watermark (which the other query never wrote) are not left out."""

    everyMs: int

    @staticmethod
    def folder(checkpoint: str) -> str:
        return checkpoint.rstrip("/") + "/sluice/output-grid"

    @classmethod
    def of(cls, spark: SparkSession, checkpoint: str) -> OutputGrid | None:
        found = BatchFiles(spark, cls.folder(checkpoint)).latest()
        return None if found is None else cls(**found[1])

    def write(self, spark: SparkSession, checkpoint: str) -> None:
        BatchFiles(spark, self.folder(checkpoint)).write(0, asdict(self))

    def closed_by(self, watermark_ms: int) -> int:
        """The end of the last window closed at the watermark."""
        return watermark_ms - watermark_ms % self.everyMs
