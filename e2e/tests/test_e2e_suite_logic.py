"""Pure parts of the shared e2e suite (the suite itself runs in make e2e-local)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from sluice.testbed.e2e_suite import PacedLoad, duplicated_windows, word_counts, word_tally


def row(start: str, word: str, count: int) -> str:
    return json.dumps({"window_start": start, "window_end": start + "+5s", "word": word, "count": count})


def test_every_result_counts_as_written() -> None:
    """A window written again (a duplicate) is not hidden: it counts twice, and duplicated_windows names it."""
    records = [row("t0", "alpha", 2), row("t0", "beta", 1), row("t5", "alpha", 3), row("t0", "alpha", 2)]
    assert word_counts(records) == {"alpha": 7, "beta": 1}
    assert word_counts(records[:3]) == {"alpha": 5, "beta": 1}


def test_duplicated_windows_names_each_result_written_twice():
    records = [row("t0", "alpha", 2), row("t0", "beta", 1), row("t1", "alpha", 3), row("t0", "alpha", 2)]
    assert duplicated_windows(records) == [("t0", "t0+5s", "alpha")]
    assert duplicated_windows(records[:3]) == []


def test_word_tally_counts_each_record():
    assert word_tally(["ant", "bee", "ant"]) == {"ant": 2, "bee": 1}


class Sink:
    """What a PacedLoad sends, kept in order (the KafkaAccess it needs, without Kafka: a pure check)."""

    def __init__(self) -> None:
        self.values: list[str] = []

    def produce(self, topic: str, values: Sequence[str]) -> None:
        self.values += values


def test_a_paced_load_sends_every_word_in_turn_across_bursts():
    """Bursts of 2 at 4 records/s must not always send the first 2 words (the third was never sent)."""
    sink = Sink()
    load = PacedLoad(sink, "lines", words=("kappa", "lambda", "sigma"))  # type: ignore[arg-type]
    for count in (2, 2, 2, 1, 2):
        load.burst(count)
    assert sink.values == ["kappa", "lambda", "sigma", "kappa", "lambda", "sigma", "kappa", "lambda", "sigma"]
    assert load.sent == {"kappa": 3, "lambda": 3, "sigma": 3}
