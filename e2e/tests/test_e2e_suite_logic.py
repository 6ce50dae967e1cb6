"""Pure parts of the shared e2e suite (the suite itself runs in make e2e-local)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import get_args

import pytest
import yaml

from sluice.operator.model import TERMINAL_PHASES, RolloutPhase
from sluice.testbed.e2e_suite import (
    CHART_DIR,
    ROLLOUT_FAULTS,
    E2ESuite,
    PacedLoad,
    duplicated_windows,
    migrated_reference,
    values_the_chart_takes,
    word_counts,
    word_tally,
)
from sluice.testbed.object_store import copy_folder, restored_name


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


def test_a_migrated_reference_counts_each_record_once_across_a_cut_off_the_new_grid() -> None:
    """5 s -> 10 s windows cut at :45 (the 100-minute soak's): :40-:45 in the old plan's window, the new window
    :40-:50 with its records from :45 on."""
    records = [(at, "ant") for at in (41_000, 44_000, 46_000, 49_000, 52_000)]
    assert migrated_reference(records, 5_000, 10_000, cut=45_000) == {
        (5_000, 40_000, "ant"): 2,
        (10_000, 40_000, "ant"): 2,
        (10_000, 50_000, "ant"): 1,
    }
    assert sum(migrated_reference(records, 10_000, 5_000, cut=50_000).values()) == len(records)


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


# The known-defect mechanism, checked with a defect of its own (the suite has none known today).
DEFECT = ("restricted_namespace", "#34: Spark's pods set no securityContext", "violates PodSecurity")


@pytest.fixture
def known_defect(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.testbed.e2e_suite import E2ESuite, KnownDefect

    step, issue, symptom = DEFECT
    monkeypatch.setattr(E2ESuite, "KNOWN_DEFECTS", {step: KnownDefect(issue, symptom=symptom)})


def test_known_defects_are_steps_that_name_their_issue_and_run_as_strict_expected_failures(known_defect: None):
    import re

    from sluice.testbed.e2e_suite import E2ESuite, KnownDefectSeen

    params = {getattr(p, "values", (p,))[0]: p for p in E2ESuite.step_params()}

    assert set(E2ESuite.KNOWN_DEFECTS) <= set(E2ESuite.steps())
    for step, defect in E2ESuite.KNOWN_DEFECTS.items():
        assert re.match(r"#\d+: ", defect.issue) and defect.symptom, defect
        (mark,) = params[step].marks
        assert mark.name == "xfail"
        assert mark.kwargs == {"strict": True, "raises": KnownDefectSeen, "reason": defect.issue}
    assert all(isinstance(params[s], str) for s in E2ESuite.steps() if s not in E2ESuite.KNOWN_DEFECTS)


def _suite_failing_with(message: str):
    from sluice.testbed.e2e_suite import E2ESuite

    suite = E2ESuite.__new__(E2ESuite)
    suite.failed = None
    suite.diagnostics = lambda: ""  # type: ignore[method-assign]

    def restricted_namespace() -> None:
        raise AssertionError(message)

    suite.restricted_namespace = restricted_namespace  # type: ignore[method-assign]
    return suite


def test_a_known_defect_step_failing_with_its_symptom_is_seen_and_stops_nothing(known_defect: None):
    from sluice.testbed.e2e_suite import KnownDefectSeen

    suite = _suite_failing_with('pod refused: violates PodSecurity "restricted:latest"')
    with pytest.raises(KnownDefectSeen, match="#34"):
        suite.run("restricted_namespace")
    assert suite.failed is None


def test_a_known_defect_step_failing_otherwise_is_a_plain_failure(known_defect: None):
    from sluice.testbed.e2e_suite import KnownDefectSeen

    suite = _suite_failing_with("timed out after 600s waiting for restricted-count running")
    with pytest.raises(AssertionError, match="timed out") as raised:
        suite.run("restricted_namespace")
    assert not isinstance(raised.value, KnownDefectSeen)


def test_an_older_charts_values_drop_only_the_keys_its_schema_refuses():
    schema = {
        "additionalProperties": False,
        "properties": {
            "image": {"type": "object", "additionalProperties": False, "properties": {"tag": {}}},
            "operator": {"type": "object"},  # takes any key
        },
    }
    values = {
        "image": {"tag": "0.1.0-abc", "pullPolicy": "IfNotPresent"},
        "operator": {"tickSeconds": 4, "anything": {"x": 1}},
        "checkpoints": {"location": "s3a://b/{namespace}"},
    }
    assert values_the_chart_takes(values, schema) == {
        "image": {"tag": "0.1.0-abc"},
        "operator": {"tickSeconds": 4, "anything": {"x": 1}},
    }


def test_this_charts_values_are_all_taken_by_its_own_schema():
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values_the_chart_takes(values, schema) == values


@pytest.mark.parametrize(
    ("relative", "restored"),
    [
        ("out@5d1c0a2e/commits/12", "out/commits/12"),  # a migrated query: where a new app reads it
        ("out@5d1c0a2e/sluice/handovers/0", "out/sluice/handovers/0"),  # its output gate goes with it
        ("seen/offsets/40", "seen/offsets/40"),  # never migrated: as it was
        ("out@5d1c0a2e", "out"),
        ("seen@5d1c0a2e/metadata", "seen@5d1c0a2e/metadata"),  # only what the app's status named is renamed
    ],
)
def test_a_restore_puts_each_query_where_a_new_app_reads_it(relative: str, restored: str) -> None:
    assert restored_name(relative, {"out@5d1c0a2e": "out"}) == restored


def test_a_restore_copies_the_named_folder_and_never_merges_two(tmp_path) -> None:
    """copy_folder over pyarrow's local filesystem (the same calls as on the store): the migrated query's folder
    lands under its name, a stale folder left out stays out, and two folders meant for one are refused."""
    from pyarrow.fs import LocalFileSystem

    for path in ("out@5d1c0a2e/commits/3", "out/commits/1", "seen/offsets/7"):
        (tmp_path / "backup" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "backup" / path).write_text(path)
    store, source, target = LocalFileSystem(), str(tmp_path / "backup"), str(tmp_path / "restored")
    for folder in ("out/commits", "seen/offsets"):  # an object store needs no folders, a local filesystem does
        (tmp_path / "restored" / folder).mkdir(parents=True)
    renames = {"out@5d1c0a2e": "out"}
    with pytest.raises(
        ValueError, match=r"folders that would be copied into one: \{'out': \['out', 'out@5d1c0a2e'\]\}"
    ):
        copy_folder(store, source, target, renames)
    assert copy_folder(store, source, target, renames, leave_out={"out"}) == 2
    restored = sorted(
        str(p.relative_to(tmp_path / "restored")) for p in (tmp_path / "restored").rglob("*") if p.is_file()
    )
    assert restored == ["out/commits/3", "seen/offsets/7"]
    assert (tmp_path / "restored" / "out" / "commits" / "3").read_text() == "out@5d1c0a2e/commits/3"


def test_each_rollout_fault_strikes_in_a_forward_phase_of_its_strategy() -> None:
    """A fault's phase is one the operator's rollouts pass through (a typo would wait forever for a phase that
    never comes); a handover's old and new drivers exist only in an image change; CI's case is the hot swap's."""
    forward = set(get_args(RolloutPhase)) - set(TERMINAL_PHASES) - {"RollingBack"}
    for fault in ROLLOUT_FAULTS:
        assert fault.phase in forward, fault
        assert fault.change in ("filter", "window", "image"), fault
        assert fault.victim in ("driver", "executor") or fault.change == "image", fault
        assert fault.victim in ("driver", "executor", "old", "new", "broker"), fault
    assert (ROLLOUT_FAULTS[0].change, ROLLOUT_FAULTS[0].victim) == ("filter", "driver")
    assert len({f.name for f in ROLLOUT_FAULTS}) == len(ROLLOUT_FAULTS)
    assert "rollout_faults" in E2ESuite.STEPS and "rollout_faults" in E2ESuite.ROLLOUT_STEPS
