from sluice.operator.memory import Trimmer


def test_trims_at_most_once_per_interval_during_passes():
    calls: list[int] = []
    trimmer = Trimmer(lambda pad: calls.append(pad) or 1, every=10)
    assert trimmer.after_pass(now=100.0)
    assert not trimmer.after_pass(now=105.0)
    assert trimmer.after_pass(now=110.0)
    assert calls == [0, 0]


def test_trims_once_more_when_the_passes_have_stopped():
    calls: list[int] = []
    trimmer = Trimmer(lambda pad: calls.append(pad) or 1, every=10)
    assert not trimmer.trailing(now=50.0), "no pass yet: nothing to release"
    trimmer.after_pass(now=100.0)  # trims
    trimmer.after_pass(now=104.0)  # too soon: left for the trailing trim
    assert not trimmer.trailing(now=110.0), "the passes stopped only 6 s ago"
    assert trimmer.trailing(now=114.0)
    assert not trimmer.trailing(now=130.0), "at rest: trimmed once, not again"
    assert calls == [0, 0]


def test_a_pass_that_trimmed_still_gets_the_trailing_trim():
    calls: list[int] = []
    trimmer = Trimmer(lambda pad: calls.append(pad) or 1, every=10)
    assert trimmer.after_pass(now=100.0)
    assert trimmer.trailing(now=110.0), "what the workers freed after the pass's own trim"
    assert calls == [0, 0]


def test_nothing_to_trim_without_glibc():
    trimmer = Trimmer(None)
    assert not trimmer.after_pass(now=100.0)
    assert not trimmer.trailing(now=200.0)
