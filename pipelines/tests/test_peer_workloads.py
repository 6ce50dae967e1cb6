"""The side-by-side benchmark's pure parts (pipelines/bench/peer_workloads.py): the reference, the output check
and per-record latency. A wrong check would let a wrong engine output pass the benchmark."""

from __future__ import annotations

import json

import peer_workloads as peers


def count(word: str, n: int, window_start: int | None = None) -> bytes:
    row = (
        {"word": word, "count": n} if window_start is None else {"window_start": window_start, "word": word, "count": n}
    )
    return json.dumps(row).encode()


def reference(workload, records) -> object:
    found = peers.Reference(workload)
    found.add(records)
    return found


def test_a_running_count_is_complete_only_when_every_word_reached_its_count() -> None:
    ref = reference(peers.FREQUENCY_COUNT, [(None, b"a", 1), (None, b"b", 2), (None, b"a", 3)])
    assert ref.counts == {"a": 2, "b": 1}
    out = peers.OutputState(ref)
    out.add(b"a", count("a", 1))
    out.add(b"b", count("b", 1))
    assert not out.complete()
    assert out.errors() == ["1 groups short of their count, e.g. 'a': 1 of 2"]
    out.add(b"a", count("a", 2))
    out.add(b"a", count("a", 2))  # the same update again (another batch) changes nothing
    assert out.complete() and out.errors() == []


def test_a_count_above_the_input_or_a_word_not_in_it_is_an_error() -> None:
    out = peers.OutputState(reference(peers.FREQUENCY_COUNT, [(None, b"a", 1)]))
    out.add(b"a", count("a", 2))
    out.add(b"z", count("z", 1))
    assert out.errors() == ["output 'a' count 2 is above its input's 1", "output group 'z' is not in the input"]


def test_a_table_reader_sees_the_last_count_per_key_and_no_tombstone_last() -> None:
    """What a reader of the output as a table sees: a count that goes down, a group under two keys or without
    one, and a key whose last record is a tombstone are errors, though the largest count was right."""
    ref = reference(peers.FREQUENCY_COUNT, [(None, b"a", 1), (None, b"a", 2), (None, b"b", 3), (None, b"c", 4)])
    out = peers.OutputState(ref)
    out.add(b"a", count("a", 2))
    out.add(b"a", count("a", 1))  # the table now says 1
    out.add(b"b", count("b", 1))
    out.add(b"B", count("b", 1))
    out.add(None, count("c", 1))
    assert not out.complete()
    assert out.errors() == [
        "output 'a' count went down from 2 to 1",
        "output 'b' written under two keys, b'b' and b'B'",
        'output record without a key: b\'{"word": "c", "count": 1}\'',
        "2 groups short of their count, e.g. 'a': 1 of 2",
    ]

    out = peers.OutputState(ref)
    for word, n in (("a", 2), ("b", 1), ("c", 1)):
        out.add(word.encode(), count(word, n))
    out.add(b"c", None)
    assert not out.complete() and out.errors() == ["1 keys end in a tombstone, e.g. b'c'"]
    out.add(b"c", count("c", 1))  # written again after the tombstone: the table has it
    assert out.complete() and out.errors() == []


def test_the_windowed_count_groups_by_5_second_window_and_word() -> None:
    ref = reference(peers.WINDOWED_WORD_COUNT, [(None, b"a b", 4_999), (None, b"a", 5_000), (None, b"a", 9_999)])
    assert ref.counts == {(0, "a"): 1, (0, "b"): 1, (5_000, "a"): 2}
    out = peers.OutputState(ref)
    for window, word, n in [(0, "a", 1), (0, "b", 1), (5_000, "a", 2)]:
        out.add(word.encode(), count(word, n, window))
    assert out.complete() and out.errors() == []


def test_a_projection_fails_on_a_duplicate_a_wrong_value_or_a_missing_record() -> None:
    ref = reference(peers.FILTER_PROJECTION, [(b"1", b"streams", 1), (b"2", b"kafka", 2), (b"3", b"sluices", 3)])
    assert ref.projected == {b"1": b"STREAMS", b"3": b"SLUICES"}  # "kafka" is shorter than 6 letters
    out = peers.OutputState(ref)
    out.add(b"1", b"STREAMS")
    out.add(b"1", b"STREAMS")
    out.add(b"2", b"KAFKA")
    assert out.errors() == [
        "1 duplicate output records",
        "1 records missing",
        "1 records not in the input or with a wrong value",
    ]


def test_a_record_is_visible_when_its_group_first_reaches_its_occurrence() -> None:
    inputs = [(None, b"a", 300), (None, b"a", 100), (None, b"a", 200), (None, b"b", 150)]
    arrivals = [("a", 2, 250.0), ("b", 1, 400.0), ("a", 3, 400.0), ("a", 1, 500.0)]  # a late lower count: ignored
    assert sorted(peers.latencies(peers.FREQUENCY_COUNT, inputs, arrivals, since_ms=0)) == [50, 100, 150, 250]
    assert sorted(peers.latencies(peers.FREQUENCY_COUNT, inputs, arrivals, since_ms=200)) == [50, 100]


def test_a_projected_record_is_visible_when_its_key_is() -> None:
    inputs = [(b"1", b"streams", 100), (b"2", b"kafka", 100), (b"3", b"sluices", 300)]
    arrivals = [(b"1", 1, 130.0), (b"3", 1, 310.0)]
    assert peers.latencies(peers.FILTER_PROJECTION, inputs, arrivals, since_ms=0) == [30, 10]
