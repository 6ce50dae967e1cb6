from sluice.operator.memory import Trimmer


def test_trims_at_most_once_per_interval():
    calls: list[int] = []
    trimmer = Trimmer(lambda pad: calls.append(pad) or 1, every=10)
    assert trimmer.maybe_trim(now=100.0)
    assert not trimmer.maybe_trim(now=105.0)
    assert trimmer.maybe_trim(now=110.0)
    assert calls == [0, 0]


def test_nothing_to_trim_without_glibc():
    assert not Trimmer(None).maybe_trim(now=100.0)
