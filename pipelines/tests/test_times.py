"""sluice.api.times: durations as manifests write them, instants as statuses carry them."""

from __future__ import annotations

import pytest

from sluice.api.times import (
    duration_ms,
    duration_to_spark,
    format_time,
    format_time_seconds,
    parse_time,
    signed_duration_ms,
)


@pytest.mark.parametrize(
    ("text", "ms", "spark"),
    [("500ms", 500, "500 milliseconds"), ("5s", 5000, "5 seconds"), ("10m", 600_000, "10 minutes"),
     ("2h", 7_200_000, "2 hours"), ("1d", 86_400_000, "1 days")],
)  # fmt: skip
def test_a_duration_in_milliseconds_and_in_spark_s_words(text: str, ms: int, spark: str) -> None:
    assert duration_ms(text) == ms and duration_to_spark(text) == spark


def test_a_signed_duration_and_a_wrong_one_named() -> None:
    assert signed_duration_ms("-5s") == -5000 and signed_duration_ms("0s") == 0
    with pytest.raises(ValueError, match="invalid duration '5 s'"):
        duration_ms("5 s")


def test_an_instant_round_trips_and_one_without_a_zone_is_utc() -> None:
    assert format_time(1764439200.25) == "2025-11-29T18:00:00.250Z"
    assert parse_time("2025-11-29T18:00:00.250Z") == 1764439200.25
    assert parse_time("2025-11-29T18:00:00") == parse_time("2025-11-29T18:00:00+00:00") == 1764439200.0
    assert format_time_seconds(1764439200.9) == "2025-11-29T18:00:00Z"
    with pytest.raises(ValueError):
        parse_time("yesterday")
