"""Where each record goes: Kafka's default partitioner (murmur2 of the key, or of the value without one,
mod the partition count), as a Spark SQL column for the executors and in Python for the driver."""

from __future__ import annotations

import functools

import numpy as np  # pandas's, a runner dependency
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

PARTITION_COLUMN = "_sluice_partition"
_M = 0x5BD1E995  # murmur2's multiplier


def _mul32(x: str) -> str:
    """x * m mod 2^32 in BIGINT arithmetic, for 0 <= x < 2^32: m < 2^31, so the product stays below 2^63 (as
    two 16-bit halves, the whole partition expression took 1.7x as long per record)."""
    return f"((({x}) * {_M}) & 4294967295)"


def _xorshift(x: str, bits: int) -> str:
    return f"(({x}) ^ shiftright({x}, {bits}))"


# murmur2's steps, shared by its two SQL forms: the seed for a length, a 4-byte block's mixing, the hash with a
# mixed block, and the final mixing.
def _seeded(length: str) -> str:
    return f"((2538058380 ^ {length}) & 4294967295)"


def _mixed(block: str) -> str:
    return _mul32(_xorshift(_mul32(block), 24))


def _with_block(hashed: str, mixed_block: str) -> str:
    return f"({_mul32(hashed)} ^ {mixed_block})"


def _finished(hashed: str) -> str:
    return _xorshift(_mul32(_xorshift(hashed, 13)), 15)


def _byte(at: str) -> str:
    """The byte at a 0-based position of _sluice_latin1 (the bytes read as ISO-8859-1: a character each)."""
    return f"cast(ascii(substring(_sluice_latin1, ({at}) + 1, 1)) as bigint)"


def _murmur2() -> str:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) of _sluice_latin1's bytes (_sluice_length
    of them) as a Spark SQL expression: 32-bit unsigned arithmetic on BIGINT, one lambda over the 4-byte blocks."""
    block = " + ".join(f"{_byte(f'4 * i + {o}')} * {1 << 8 * o}" for o in range(4))
    blocks = f"transform(IF(_sluice_length >= 4, sequence(0, _sluice_length div 4 - 1), array()), i -> {block})"
    base = "_sluice_length - _sluice_length % 4"
    tail = (
        f"h ^ IF(_sluice_length % 4 = 3, shiftleft({_byte(f'{base} + 2')}, 16), 0)"
        f" ^ IF(_sluice_length % 4 >= 2, shiftleft({_byte(f'{base} + 1')}, 8), 0) ^ {_byte(base)}"
    )
    final = _finished("t")  # on a lambda variable: copies of it are cheap
    with_tail = f"element_at(transform(array(IF(_sluice_length % 4 = 0, h, {_mul32(tail)})), t -> {final}), 1)"
    step = _with_block("h", _mixed("k"))
    return f"aggregate({blocks}, {_seeded('_sluice_length')}, (h, k) -> {step}, h -> {with_tail})"


def _let(name: str, value: str, body: str) -> str:
    """`body` with `name` bound to `value`, computed once per row (a lambda over a one-element array)."""
    return f"element_at(transform(array({value}), {name} -> {body}), 1)"


@functools.cache
def _kafka_partition_sql(placed_by: str, partitions: int) -> str:
    hashed = _let("_sluice_length", "length(_sluice_latin1)", f"pmod({_murmur2()} & 2147483647, {partitions})")
    latin1 = f"decode(CAST({placed_by} AS BINARY), 'ISO-8859-1')"
    return f"CAST({_let('_sluice_latin1', latin1, f'IF(_sluice_latin1 IS NULL, 0, {hashed})')} AS INT)"


def with_kafka_partition(records: DataFrame, partitions: int) -> DataFrame:
    """The records with the partition Kafka's default partitioner gives their key, murmur2(key) mod N (a record
    without a key: by its value), in PARTITION_COLUMN. Computed in the JVM (no Python stage before the shuffle),
    in one projection: each DataFrame step makes Spark analyse the micro-batch's whole plan again."""
    if partitions == 1:
        return records.withColumn(PARTITION_COLUMN, F.lit(0))
    placed_by = "coalesce(key, value)" if "key" in records.columns else "value"
    return records.withColumn(PARTITION_COLUMN, F.expr(_kafka_partition_sql(placed_by, partitions)))


UNROLLED_BLOCKS = 10  # keys (or unkeyed values) of up to 40 bytes, a UUID among them, are placed by compiled code


def _big_endian(position: str, count: int) -> str:
    """The big-endian value of `count` bytes of _sluice_bytes from a 0-based position (fewer at its end): one
    substring of the binary, not one per byte of a decoded string."""
    return f"cast(conv(hex(substring(_sluice_bytes, ({position}) + 1, {count})), 16, 10) as bigint)"


def _little_endian_block(index: int) -> str:
    value = _big_endian(str(4 * index), 4)
    return (
        f"((({value}) & 255) * 16777216 + (shiftright({value}, 8) & 255) * 65536"
        f" + (shiftright({value}, 16) & 255) * 256 + shiftright({value}, 24))"
    )


def with_kafka_partition_in_stream(records: DataFrame, partitions: int) -> DataFrame:
    """with_kafka_partition for a plan analysed once (a streaming query's): murmur2 unrolled over the first
    UNROLLED_BLOCKS 4-byte blocks, all compiled (the lambdas of the one-expression form run interpreted). 3M
    records on 2 cores: 11-byte keys 6.7 -> 2.7 s, UUIDs 16.9 -> 3.6 s. Longer keys take the one-expression
    form. Slower to analyse (~200-260 ms against ~30-40), so the per-batch paths keep with_kafka_partition.
    A topic of one partition needs no hash: its expression cost ~40 ms of executor CPU per task and batch (the
    stage is too large for whole-stage code, so each task generates its projection's code again)."""
    if partitions == 1:
        return with_kafka_partition(records, partitions)
    placed_by = "coalesce(key, value)" if "key" in records.columns else "value"
    columns = records.columns
    staged = records.select("*", F.expr(f"CAST({placed_by} AS BINARY)").alias("_sluice_bytes"))
    staged = staged.select("*", F.expr("length(_sluice_bytes)").alias("_sluice_length"))
    tail = _big_endian("(_sluice_length div 4) * 4", 3)  # the 0-3 bytes after the last block, big-endian
    little_endian_tail = (
        f"CASE _sluice_length % 4 WHEN 0 THEN 0 WHEN 1 THEN {tail}"
        f" WHEN 2 THEN (({tail} & 255) * 256 + shiftright({tail}, 8))"
        f" ELSE (({tail} & 255) * 65536 + ({tail} & 65280) + shiftright({tail}, 16)) END"
    )
    staged = staged.select(
        "*",
        F.expr(little_endian_tail).alias("_sluice_tail"),
        *(F.expr(_mixed(_little_endian_block(j))).alias(f"_sluice_block{j}") for j in range(UNROLLED_BLOCKS)),
    )
    # The hash after j blocks, for each j: the key's own block count picks one (the blocks after it are unused).
    after = [_seeded("_sluice_length")]
    for j in range(UNROLLED_BLOCKS):
        after.append(_with_block(after[-1], f"_sluice_block{j}"))
    blocks = "CASE _sluice_length div 4 " + " ".join(f"WHEN {j} THEN {h}" for j, h in enumerate(after)) + " END"
    hashed = f"IF(_sluice_length % 4 = 0, {blocks}, {_mul32(f'{blocks} ^ _sluice_tail')})"
    staged = staged.select("*", F.expr(hashed).alias("_sluice_hash"))
    final = _finished("_sluice_hash")
    partition = (
        f"CAST(IF(_sluice_bytes IS NULL, 0, IF(_sluice_length > {4 * UNROLLED_BLOCKS}, "
        f"{_kafka_partition_sql(placed_by, partitions)}, pmod({final} & 2147483647, {partitions}))) AS INT)"
    )
    return staged.select(*columns, F.expr(partition).alias(PARTITION_COLUMN))


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's hash() of an INT (Murmur3_x86_32.hashInt with Spark's seed 42), a signed 32-bit int."""

    def mul(x: int, m: int) -> int:
        return (x * m) & 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF

    k1 = mul(rotl(mul(value & 0xFFFFFFFF, 0xCC9E2D51), 15), 0x1B873593)
    h1 = (rotl(seed ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF
    h1 ^= 4  # the input's length in bytes
    h1 = mul(h1 ^ (h1 >> 16), 0x85EBCA6B)
    h1 = mul(h1 ^ (h1 >> 13), 0xC2B2AE35)
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 >= 1 << 31 else h1


@functools.cache
def routes(partitions: int) -> tuple[int, ...]:
    """Per partition p an INT that repartition(N, it) sends to Spark partition p (pmod(hash(it), N) = p):
    routed by them, Spark partition p holds exactly Kafka partition p's records. Computed here, not by a
    Spark job: a new query's first batch would wait for one per sink."""
    found: dict[int, int] = {}
    route = 0
    while len(found) < partitions:
        found.setdefault(spark_hash_int(route) % partitions, route)
        route += 1
    return tuple(found[p] for p in range(partitions))


# ------------------------------------------------------------------------------------------ in Python


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) as an unsigned 32-bit value."""
    mask = 0xFFFFFFFF
    h = (0x9747B28C ^ len(data)) & mask
    end = len(data) & ~3
    for i in range(0, end, 4):
        k = (int.from_bytes(data[i : i + 4], "little") * _M) & mask
        h = ((h * _M) & mask) ^ (((k ^ (k >> 24)) * _M) & mask)
    tail = len(data) & 3
    if tail == 3:
        h ^= data[end + 2] << 16
    if tail >= 2:
        h ^= data[end + 1] << 8
    if tail:
        h = ((h ^ data[end]) * _M) & mask
    h = ((h ^ (h >> 13)) * _M) & mask
    return h ^ (h >> 15)


def kafka_partition(placed_by: str | bytes | None, partitions: int) -> int:
    """The partition the Java client's default partitioner gives a key (a str: its UTF-8 bytes); 0 for none. One
    key at a time, in Python: the reference kafka_partitions (the driver's, vectorised) is checked against."""
    if placed_by is None:
        return 0
    data = placed_by.encode() if isinstance(placed_by, str) else placed_by
    return (murmur2(data) & 0x7FFFFFFF) % partitions


def kafka_partitions(placed_by: pa.Array | pa.ChunkedArray, partitions: int) -> np.ndarray:
    """kafka_partition of every value of a BINARY or STRING column (a string: its UTF-8 bytes; null: 0), murmur2
    vectorised with numpy over the values' 4-byte blocks: one step per block position, each on the values that
    long (a 12-byte key: 3 steps). 0.1 us a value, against ~5 us in Python for a key not seen before."""
    column = placed_by.combine_chunks() if isinstance(placed_by, pa.ChunkedArray) else placed_by
    column = column.cast(pa.large_binary())
    count = len(column)
    if count == 0:
        return np.zeros(0, np.int32)
    _, offsets_buffer, data_buffer = column.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64, count + 1, column.offset * 8)
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    mask, m = np.uint64(0xFFFFFFFF), np.uint64(_M)
    hashed = (np.uint64(0x9747B28C) ^ lengths.astype(np.uint64)) & mask

    def byte(at: np.ndarray) -> np.ndarray:
        return data[at].astype(np.uint64)

    for block in range(int(lengths.max()) // 4):
        rows = np.nonzero(lengths >= 4 * (block + 1))[0]
        at = starts[rows] + 4 * block
        k = byte(at) | byte(at + 1) << np.uint64(8) | byte(at + 2) << np.uint64(16) | byte(at + 3) << np.uint64(24)
        k = (k * m) & mask
        k = ((k ^ (k >> np.uint64(24))) * m) & mask
        hashed[rows] = ((hashed[rows] * m) & mask) ^ k
    tails, ends = lengths & 3, starts + (lengths & ~3)
    for size, shift in ((3, 16), (2, 8)):
        rows = np.nonzero(tails >= size)[0]
        hashed[rows] ^= byte(ends[rows] + size - 1) << np.uint64(shift)
    rows = np.nonzero(tails >= 1)[0]
    hashed[rows] = ((hashed[rows] ^ byte(ends[rows])) * m) & mask
    hashed = ((hashed ^ (hashed >> np.uint64(13))) * m) & mask
    hashed ^= hashed >> np.uint64(15)
    placed = ((hashed & np.uint64(0x7FFFFFFF)) % np.uint64(partitions)).astype(np.int32)
    if column.null_count:
        placed[np.asarray(column.is_null())] = 0
    return placed


def with_kafka_partition_in_driver(table: pa.Table, partitions: int) -> pa.Table:
    """with_kafka_partition for a batch the driver collected. Computed here, not in the plan: the SQL form's
    lambdas cannot be compiled, so the aggregation's last stage ran interpreted, and planning it took ~60 ms a
    batch (both measured on the windowed word count's batches)."""
    if partitions == 1:
        return table.append_column(PARTITION_COLUMN, pa.repeat(pa.scalar(0, pa.int32()), table.num_rows))
    placed_by = table.column("value").cast(pa.large_binary())
    if "key" in table.column_names:
        keys = table.column("key").cast(pa.large_binary())
        placed_by = pc.if_else(pc.is_null(keys), placed_by, keys)
    return table.append_column(PARTITION_COLUMN, pa.array(kafka_partitions(placed_by, partitions), pa.int32()))
