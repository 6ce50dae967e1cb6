"""The side-by-side benchmark's three workloads, as the same contract for every engine.

Every engine's job reads one source topic from its earliest offset and writes one sink topic:

- `frequency-count`: value = one word. Out: key = the word, value = JSON {"word", "count"}, the word's running
  count over everything read so far (updates per record or per batch; the latest is the total).
- `windowed-word-count`: value = a line of words separated by spaces; event time = the Kafka record timestamp.
  Out: key = the word, value = JSON {"window_start" (epoch ms), "word", "count"}: the word's running count in
  its 5 s tumbling window (window_start = ts - ts % 5000), emitted as updates, no record dropped as late.
- `filter-projection` (stateless, the real-time-mode case): key = a record id, value = one word. Out: the
  records whose word has at least 6 letters, key unchanged, value = the word upper-cased.

This module is pure: what the input holds (the reference), what an output record means, whether an output
is complete and right, and each input record's latency.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

WINDOW_MS = 5_000
MIN_WORD_LENGTH = 6

Group = Any  # a word, or (window_start, word)


@dataclass(frozen=True)
class Workload:
    name: str
    words_per_record: int
    keyed: bool  # the input carries a record id as its key
    stateful: bool

    def groups_of(self, value: bytes, timestamp_ms: int) -> Iterator[Group]:
        """The counting groups an input record adds one to."""
        if self.name == "windowed-word-count":
            window = timestamp_ms - timestamp_ms % WINDOW_MS
            for word in value.decode().split():
                yield (window, word)
        else:
            yield value.decode()

    def projected(self, value: bytes) -> bytes | None:
        """filter-projection: the output value of an input value, None when the record is filtered out."""
        return value.upper() if len(value) >= MIN_WORD_LENGTH else None

    def output_update(self, value: bytes) -> tuple[Group, int]:
        """A counting workload's output record value as (group, running count)."""
        row = json.loads(value)
        if self.name == "windowed-word-count":
            return (int(row["window_start"]), row["word"]), int(row["count"])
        return row["word"], int(row["count"])


FREQUENCY_COUNT = Workload("frequency-count", words_per_record=1, keyed=False, stateful=True)
WINDOWED_WORD_COUNT = Workload("windowed-word-count", words_per_record=5, keyed=False, stateful=True)
FILTER_PROJECTION = Workload("filter-projection", words_per_record=1, keyed=True, stateful=False)
WORKLOADS = {w.name: w for w in (FREQUENCY_COUNT, WINDOWED_WORD_COUNT, FILTER_PROJECTION)}

InputRecord = tuple[bytes | None, bytes, int]  # key, value, producer timestamp (ms)


@dataclass
class Reference:
    """What a correct output holds for one input topic: final count per group (counting workloads) or the
    output value per record id (filter-projection)."""

    workload: Workload
    counts: dict[Group, int] = field(default_factory=dict)
    projected: dict[bytes, bytes] = field(default_factory=dict)
    records: int = 0

    def add(self, records: Iterable[InputRecord]) -> None:
        for key, value, timestamp in records:
            self.records += 1
            if self.workload.stateful:
                for group in self.workload.groups_of(value, timestamp):
                    self.counts[group] = self.counts.get(group, 0) + 1
            else:
                out = self.workload.projected(value)
                if out is not None:
                    assert key is not None, f"{self.workload.name}: input record without a key"
                    self.projected[key] = out

    @property
    def expected_outputs(self) -> int:
        return len(self.counts) if self.workload.stateful else len(self.projected)


@dataclass
class OutputState:
    """An output topic read so far, in each partition's offset order, checked against the reference as it grows.

    Counting: what a reader of the topic as a table (the last record per key) sees. Each group's records carry
    one key, counts never go down, the last count is the group's, and no key ends in a tombstone. Projection:
    every record per key (a second record for a key is a duplicate, which fails the check)."""

    reference: Reference
    latest: dict[Group, int] = field(default_factory=dict)  # each group's last count
    keys: dict[Group, bytes] = field(default_factory=dict)  # the key each group's records carry
    deleted: set[bytes] = field(default_factory=set)  # keys whose last record is a tombstone
    done: int = 0  # groups at their final count, or keys seen
    seen: dict[bytes, bytes] = field(default_factory=dict)
    duplicates: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, key: bytes | None, value: bytes | None) -> tuple[Group, int] | None:
        """Take one output record; returns (group or key, count) for the latency bookkeeping."""
        if key is None:
            self._problem(f"output record without a key: {value!r}")
            return None
        if value is None:  # a tombstone: a table reader forgets the key (an error if nothing comes after it)
            self.deleted.add(key)
            return None
        self.deleted.discard(key)
        if self.reference.workload.stateful:
            return self._count(key, value)
        if key in self.seen:
            self.duplicates += 1
        else:
            self.seen[key] = value
            self.done += 1
        return key, 1

    def _count(self, key: bytes, value: bytes) -> tuple[Group, int]:
        group, count = self.reference.workload.output_update(value)
        if self.keys.setdefault(group, key) != key:
            self._problem(f"output {group!r} written under two keys, {self.keys[group]!r} and {key!r}")
        before = self.latest.get(group)
        if before is not None and count < before:
            self._problem(f"output {group!r} count went down from {before} to {count}")
        self.latest[group] = count
        final = self.reference.counts.get(group)
        if final is None:
            self._problem(f"output group {group!r} is not in the input")
        elif count > final:
            self._problem(f"output {group!r} count {count} is above its input's {final}")
        else:
            self.done += (count == final) - (before == final)
        return group, count

    def _problem(self, text: str) -> None:
        if len(self.problems) < 10:
            self.problems.append(text)

    def complete(self) -> bool:
        return self.done >= self.reference.expected_outputs and not self.deleted

    def errors(self) -> list[str]:
        """Why the output is wrong (empty: it equals the reference exactly)."""
        found = list(self.problems)
        if self.duplicates:
            found.append(f"{self.duplicates} duplicate output records")
        if self.deleted:
            found.append(f"{len(self.deleted)} keys end in a tombstone, e.g. {sorted(self.deleted)[0]!r}")
        if self.reference.workload.stateful:
            short = [g for g, n in self.reference.counts.items() if self.latest.get(g, 0) < n]
            if short:
                g = short[0]
                found.append(
                    f"{len(short)} groups short of their count, e.g. {g!r}: {self.latest.get(g, 0)} of "
                    f"{self.reference.counts[g]}"
                )
        else:
            missing = len(self.reference.projected) - sum(1 for k in self.reference.projected if k in self.seen)
            wrong = sum(1 for k, v in self.seen.items() if self.reference.projected.get(k) != v)
            if missing:
                found.append(f"{missing} records missing")
            if wrong:
                found.append(f"{wrong} records not in the input or with a wrong value")
        return found


Arrival = tuple[Group, int, float]  # group or key, count, first seen (epoch ms)


def latencies(
    workload: Workload, inputs: Iterable[InputRecord], arrivals: Iterable[Arrival], since_ms: float
) -> list[float]:
    """Per input record produced at or after since_ms: when its effect was first visible in the output - its
    producer timestamp (ms).

    Counting: a group's k-th occurrence (in producer-timestamp order) counts as visible when an output count
    >= k for the group is; a projected record when its key is."""
    if not workload.stateful:
        seen = {key: at for key, _, at in arrivals}
        return [
            seen[key] - ts
            for key, value, ts in inputs
            if ts >= since_ms and workload.projected(value) is not None and key in seen
        ]
    occurrences: dict[Group, list[int]] = {}
    for _, value, ts in inputs:
        for group in workload.groups_of(value, ts):
            occurrences.setdefault(group, []).append(ts)
    for stamps in occurrences.values():
        stamps.sort()
    result: list[float] = []
    reached: dict[Group, int] = {}
    for group, count, at in sorted(arrivals, key=lambda a: a[2]):
        stamps = occurrences.get(group)
        before = reached.get(group, 0)
        if stamps is None or count <= before:
            continue
        result.extend(at - ts for ts in stamps[before:count] if ts >= since_ms)
        reached[group] = count
    return result
