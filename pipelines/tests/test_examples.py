"""The example apps run for real (Kafka + Spark) and their output equals a plain-Python reference.

Each event-time test produces a seeded data set in phases (see helpers.py): out-of-order records within
the watermark, stragglers that are still on time for a window that is open, late records (produced once
the watermark has passed them) and bad records, then one far-future record that closes every window.
The reference replays Spark's watermark rules over the same phases; nothing expected is hard-coded.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    BASE_MS,
    Example,
    Harness,
    Record,
    Replay,
    assert_dead_letters,
    assert_sample,
    behind_watermark,
    epoch_ms,
    iso,
    json_bytes,
    read_dead_letters,
    replay,
    sample,
    wait_for,
    window_closed,
    window_start,
)

from sluice.api.times import duration_ms

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def watermark_delay(example: Example, source: str) -> int:
    return duration_ms(example.node(source)["fromKafka"]["watermark"])


def tumbling_ms(example: Example, aggregate: str) -> int:
    return duration_ms(example.node(aggregate)["aggregate"]["window"]["tumbling"])


def windowed_rule(size_ms: int) -> Callable[[int, int], bool]:
    return lambda event_ms, watermark_ms: window_closed(event_ms, size_ms, watermark_ms)


def assert_meaningful(expected: Replay, stragglers: list[Record], minimum: int = 5) -> None:
    """Guards the data generators: the data set must hold late records, bad records and stragglers that
    are still on time (out of order across micro-batches), or it would prove little."""
    assert len(expected.late) >= minimum, f"only {len(expected.late)} late records"
    assert expected.bad, "no bad records"
    on_time = {id(r) for r in expected.on_time}
    assert sum(id(r) in on_time for r in stragglers) >= minimum, "too few stragglers on time"


def assert_each_once(rows: list[dict[str, Any]], key: tuple[str, ...]) -> None:
    """Windowed results are appended once per window (the run has no failure to replay)."""
    counts = Counter(tuple(row[k] for k in key) for row in rows)
    assert not [k for k, n in counts.items() if n > 1], "windows emitted more than once"


# ---------------------------------------------------------------------------- (a) word count

VOCABULARY = (
    "kafka",
    "spark",
    "stream",
    "window",
    "state",
    "watermark",
    "join",
    "topic",
    "batch",
    "sink",
    "source",
    "event",
    "k8s",
    "p99",
)


def tokenize(line: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", line.lower()) if w]


def random_line(rng: random.Random) -> str:
    words = [w.capitalize() if rng.random() < 0.2 else w for w in rng.choices(VOCABULARY, k=rng.randint(0, 6))]
    return rng.choice([" ", ", ", "  ", "; ", " - "]).join(words) + rng.choice(["", ".", "!"])


def wordcount_phases(rng: random.Random, window_ms: int, delay_ms: int) -> list[list[Record]]:
    def line(text: str, ms: int) -> Record:
        return Record("wordcount-lines", text.encode(), ms, kafka_ms=ms, data=text)

    # Up to 1.5s out of order: within the 2s watermark.
    first = [line(random_line(rng), BASE_MS + i * 40 + rng.randint(-1500, 1500)) for i in range(400)]
    first.insert(
        rng.randrange(len(first)), Record("wordcount-lines", None, None, kafka_ms=BASE_MS, error="record has no value")
    )
    watermark = max(r.event_ms for r in first if r.event_ms is not None) - delay_ms
    stragglers = []
    for i in range(60):
        ms = rng.randint(watermark - 2 * window_ms, watermark + delay_ms)
        # Late lines hold words of their own: Spark counts the rows it drops after the partial
        # aggregation, so only then does the dropped-rows metric equal the number of late words.
        text = f"Late{i}a late{i}b" if window_closed(ms, window_ms, watermark) else random_line(rng)
        stragglers.append(line(text, ms))
    flush = [line("flush", watermark + delay_ms + 10 * window_ms)]  # closes every window of the data
    return [first, stragglers, flush]


def wordcount_reference(expected: Replay, window_ms: int) -> dict[tuple[int, str], int]:
    counts: Counter[tuple[int, str]] = Counter()
    for record in expected.on_time:
        assert record.event_ms is not None
        if window_closed(record.event_ms, window_ms, expected.final_watermark):
            counts.update((window_start(record.event_ms, window_ms), w) for w in tokenize(record.data))
    return dict(counts)


@pytest.mark.parametrize("late_records", [True, False], ids=["late-to-dead-letters", "late-dropped"])
def test_wordcount(harness: Harness, late_records: bool) -> None:
    """(a) windowed word count; late lines go to the dead letters only when deadLetter.lateRecords is set,
    and are never counted."""
    app = harness.load("wordcount")
    app.pipeline["deadLetter"]["lateRecords"] = late_records
    window_ms, delay_ms = tumbling_ms(app, "counts"), watermark_delay(app, "lines")
    phases = wordcount_phases(random.Random(1), window_ms, delay_ms)
    expected = replay(phases, delay_ms, windowed_rule(window_ms))
    assert_meaningful(expected, stragglers=phases[1])
    dead_letters = expected.dead_letters(late_too=late_records)

    with harness.run_phases(app, phases, "out", expected.watermarks) as run:
        late_words = sum(len(tokenize(r.data)) for r in expected.late)
        assert_sample(run, "sluice_late_records_dropped_total", late_words, query="out")
        # A text source parses nothing, so only a record without a value is bad: it is not counted as
        # malformed (that check would cost every record), but it does reach the dead letters. Its malformed
        # series is there from the query's start (a dashboard panel over it has data) and stays at 0.
        assert expected.bad
        assert sample(run, "sluice_malformed_records_total", query="out", source="lines") == 0
        assert_sample(run, "sluice_dead_letter_records_total", len(dead_letters), source="lines")

    rows = harness.read_json(app, "wordcount-counts")
    assert_each_once(rows, ("window_start", "word"))
    for row in rows:
        assert epoch_ms(row["window_end"]) - epoch_ms(row["window_start"]) == window_ms
    assert {(epoch_ms(r["window_start"]), r["word"]): r["count"] for r in rows} == wordcount_reference(
        expected, window_ms
    )
    assert_dead_letters(
        read_dead_letters(harness, app, "wordcount-dead-letters"), dead_letters, source_of=lambda _: "lines"
    )


# ----------------------------------------------------------------------- (b) frequency count

WORDS = tuple(f"word{i:02d}" for i in range(40))


def zipf_words(rng: random.Random, n: int) -> list[str]:
    return rng.choices(WORDS, weights=[1 / (i + 1) for i in range(len(WORDS))], k=n)


def word_records(words: Iterable[str]) -> list[Record]:
    return [Record("frequency-words", w.encode(), None) for w in words]


def running_counts(harness: Harness, app: Example) -> dict[str, int]:
    """The latest count of every word in the update-mode changelog; each word's counts only grow."""
    history: dict[str, list[int]] = defaultdict(list)
    for record in sorted(harness.read(app, "frequency-counts"), key=lambda r: (r.partition, r.offset)):
        assert record.key is not None and record.value is not None
        value = json.loads(record.value)
        assert value["word"] == record.key.decode()
        history[value["word"]].append(value["count"])
    for word, counts in history.items():
        assert counts == sorted(counts), f"the count of {word} went down: {counts}"
    return {word: counts[-1] for word, counts in history.items()}


def test_frequency_count(harness: Harness) -> None:
    """(b) running counts per word, updated batch after batch (update mode, no window)."""
    app = harness.load("frequency-count")
    rng = random.Random(2)
    first, second = zipf_words(rng, 1500), zipf_words(rng, 1500)
    harness.produce(app, word_records(first))
    with harness.running(app) as run:
        harness.settle(run)
        assert running_counts(harness, app) == Counter(first)
        harness.produce(app, word_records(second))
        harness.settle(run)
    assert running_counts(harness, app) == Counter(first + second)


def test_restart_from_checkpoint_mid_stream_loses_nothing(harness: Harness) -> None:
    """(i) stopped after a few batches of a backlog, then restarted from its checkpoint with more data,
    the job counts every record exactly once in its state."""
    app = harness.load("frequency-count")
    source = app.node("words")["fromKafka"]
    source["maxRecordsPerTrigger"] = 200  # the backlog takes many batches
    rng = random.Random(3)
    # 60 batches of backlog: far more than can complete between reaching 400 rows and stopping.
    before, after = zipf_words(rng, 12_000), zipf_words(rng, 700)
    harness.produce(app, word_records(before))
    with harness.running(app, checkpoint="checkpoint") as run:
        wait_for(
            lambda: (sample(run, "sluice_input_rows_total", query="out") or 0) >= 400,
            harness.timeout,
            lambda: "no two batches completed",
            check=run.raise_if_failed,
        )
    counted_at_stop = sum(running_counts(harness, app).values())
    assert 400 <= counted_at_stop < len(before), "the job should stop mid-stream"

    harness.produce(app, word_records(after))
    del source["maxRecordsPerTrigger"]
    with harness.running(app, checkpoint="checkpoint") as run:
        harness.settle(run)
    assert running_counts(harness, app) == Counter(before + after)


# ------------------------------------------------------------------- (c) latency correlation

FIRMS = ("alpha", "bravo", "charlie", "delta", "echo")
REQUESTS, RESPONSES = "latency-requests", "latency-responses"
LATENCY_SOURCES = {REQUESTS: "requests", RESPONSES: "responses"}


def request(rid: str, firm: str, ms: int) -> Record:
    return Record(REQUESTS, json_bytes({"id": rid, "firm": firm, "ts": iso(ms)}), ms, data={"id": rid, "firm": firm})


def response(rid: str, ms: int) -> Record:
    return Record(RESPONSES, json_bytes({"id": rid, "ts": iso(ms)}), ms, data={"id": rid})


def latency_phases(rng: random.Random, within_ms: int, delay_ms: int) -> list[list[Record]]:
    first: list[Record] = []
    unanswered: list[Record] = []
    for i in range(600):
        # Up to 2s out of order, within the 5s watermark.
        req = request(f"r{i}", rng.choice(FIRMS), BASE_MS + i * 300 + rng.randint(-2000, 2000))
        assert req.event_ms is not None
        first.append(req)
        roll = rng.random()
        if roll < 0.8:  # answered, some too slowly (over 1s) to be matched
            first.append(response(req.data["id"], req.event_ms + rng.randint(0, within_ms + 300)))
        elif roll < 0.85:  # a response before its request is no match either
            first.append(response(req.data["id"], req.event_ms - rng.randint(1, 500)))
        else:
            unanswered.append(req)
    first += [
        Record(REQUESTS, b'{"id": "r-cut", "firm": "alpha", "ts": ', None, error="malformed json"),
        Record(REQUESTS, b"not json at all", None, error="malformed json"),
        Record(REQUESTS, json_bytes({"id": "r-no-ts", "firm": "bravo"}), None, error="missing or invalid event time"),
        Record(RESPONSES, b'{"id": "r1"', None, error="malformed json"),
        Record(RESPONSES, json_bytes({"id": "r2"}), None, error="missing or invalid event time"),
    ]
    rng.shuffle(first)
    newest = min(max(r.event_ms for r in first if r.topic == t and r.event_ms is not None) for t in LATENCY_SOURCES)
    watermark = newest - delay_ms
    # Stragglers stay below the newest event times (the watermark stays put) and 300ms or more away from
    # the watermark, so that which side of it they fall on does not hinge on Spark's boundary details.
    stragglers: list[Record] = []
    for i in range(600, 660):
        if i % 3 == 0:  # a late pair: both dropped
            ms = rng.randint(watermark - 30_000, watermark - within_ms - 300)
            answer = ms + rng.randint(0, within_ms)
        elif i % 3 == 1:  # an on-time pair
            ms = rng.randint(watermark + 300, newest - within_ms)
            answer = ms + rng.randint(0, within_ms)
        else:  # a late request: its on-time response finds no request
            ms = watermark - rng.randint(300, 600)
            answer = ms + within_ms - rng.randint(0, 50)
        stragglers += [request(f"r{i}", rng.choice(FIRMS), ms), response(f"r{i}", answer)]
    for req in unanswered:  # late answers (dropped) and on-time answers (matched with a request in state)
        assert req.event_ms is not None
        ms = req.event_ms + rng.randint(0, within_ms)
        if ms <= newest and abs(ms - watermark) > 300:
            stragglers.append(response(req.data["id"], ms))
    rng.shuffle(stragglers)
    far = newest + 3_600_000
    flush = [request("flush", "zulu", far), response("flush", far + 1)]
    return [first, stragglers, flush]


def latency_reference(expected: Replay, within_ms: int, window_ms: int) -> dict[tuple[int, str], tuple]:
    """(window start, firm) -> (matched, max latency, avg latency) over the closed windows."""
    requests = {r.data["id"]: r for r in expected.on_time if r.topic == REQUESTS}
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    # The aggregation after the join sees the join's output watermark: the input watermark minus the
    # 1s a request waits for its response.
    closing = expected.final_watermark - within_ms
    for resp in (r for r in expected.on_time if r.topic == RESPONSES):
        req = requests.get(resp.data["id"])
        if req is None:
            continue
        assert req.event_ms is not None and resp.event_ms is not None
        latency = resp.event_ms - req.event_ms
        if 0 <= latency <= within_ms and window_closed(req.event_ms, window_ms, closing):
            groups[(window_start(req.event_ms, window_ms), req.data["firm"])].append(latency)
    return {k: (len(v), max(v), sum(v) / len(v)) for k, v in groups.items()}


def test_latency_correlation(harness: Harness) -> None:
    """(c) stream-stream join of requests and responses within 1s, then the average latency per firm over
    1-minute windows; bad records of both topics reach the dead letters while the job goes on."""
    app = harness.load("latency-correlation")
    within_ms = duration_ms(app.node("latencies")["join"]["within"])
    window_ms, delay_ms = tumbling_ms(app, "per-firm"), watermark_delay(app, "requests")
    assert watermark_delay(app, "responses") == delay_ms
    phases = latency_phases(random.Random(4), within_ms, delay_ms)
    expected = replay(phases, delay_ms, behind_watermark)  # the join drops inputs behind the watermark
    assert_meaningful(expected, stragglers=phases[1])
    reference = latency_reference(expected, within_ms, window_ms)
    assert len({start for start, _ in reference}) >= 3

    with harness.run_phases(app, phases, "out", expected.watermarks) as run:
        for topic, source in LATENCY_SOURCES.items():
            bad = sum(r.topic == topic for r in expected.bad)
            assert_sample(run, "sluice_malformed_records_total", bad, query="out", source=source)
            assert_sample(run, "sluice_dead_letter_records_total", bad, source=source)

    rows = harness.read_json(app, "latency-by-firm")
    assert_each_once(rows, ("window_start", "firm"))
    got = {(epoch_ms(r["window_start"]), r["firm"]): r for r in rows}
    assert set(got) == set(reference)
    for key, (matched, max_latency, avg_latency) in reference.items():
        row = got[key]
        assert (row["matched"], row["max_latency_ms"]) == (matched, max_latency), key
        assert float(row["avg_latency_ms"]) == pytest.approx(avg_latency, rel=1e-9), key
    assert_dead_letters(
        read_dead_letters(harness, app, "latency-dead-letters"),
        expected.dead_letters(late_too=False),
        source_of=lambda r: LATENCY_SOURCES[r.topic],
    )


# ------------------------------------------------------------------------------ (d) ad tech

PUBLISHERS = ("news", "sports", "games", "video", "mail")


def read_campaigns(path: str) -> dict[str, tuple[str, str]]:
    with Path(path).open(newline="") as handle:
        return {row["campaign_id"]: (row["advertiser"], row["country"]) for row in csv.DictReader(handle)}


def ad_event(rng: random.Random, campaigns: list[str], ms: int) -> Record:
    kind = rng.choices(["impression", "click", "view"], weights=[85, 12, 3])[0]
    cents = rng.randint(1, 60) if kind == "impression" else rng.randint(40, 900)
    data: dict[str, Any] = {
        "event_time": iso(ms),
        "campaign_id": rng.choice(campaigns) if rng.random() < 0.95 else "c99",  # c99: no such campaign
        "publisher": rng.choice(PUBLISHERS),
        "type": kind,
        "price": -cents / 100 if rng.random() < 0.02 else cents / 100,  # negative: invalid
    }
    if rng.random() < 0.5:
        data["advertiser_id"] = f"adv-{rng.randint(1, 9)}"  # optional
    if rng.random() < 0.02:
        del data["campaign_id"]  # invalid
    return Record("adtech-events", json_bytes(data), ms, data=data)


def bad_ad_events(rng: random.Random, n: int) -> list[Record]:
    out = []
    for i in range(n):
        if i % 2:
            out.append(Record("adtech-events", b'{"event_time": "2023-11-14T22:13:2', None, error="malformed json"))
        else:
            data = {"campaign_id": "c01", "type": "click", "price": rng.randint(1, 9), "publisher": "news"}
            out.append(Record("adtech-events", json_bytes(data), None, error="missing or invalid event time"))
    return out


def adtech_phases(rng: random.Random, campaigns: list[str], window_ms: int, delay_ms: int) -> list[list[Record]]:
    # Up to 4s out of order, within the 5s watermark.
    first = [ad_event(rng, campaigns, BASE_MS + i * 50 + rng.randint(-4000, 4000)) for i in range(900)]
    first += bad_ad_events(rng, 4)
    rng.shuffle(first)
    newest = max(r.event_ms for r in first if r.event_ms is not None)
    stragglers = [ad_event(rng, campaigns, rng.randint(newest - delay_ms - 3 * window_ms, newest)) for _ in range(120)]
    stragglers += bad_ad_events(rng, 2)  # the job went on after the first bad records
    rng.shuffle(stragglers)
    flush = [ad_event(rng, campaigns, newest + 10 * window_ms)]
    return [first, stragglers, flush]


def adtech_reference(expected: Replay, campaigns: dict[str, tuple[str, str]], window_ms: int, limit: int) -> set[tuple]:
    """{(window start, advertiser, country, impressions, clicks, revenue)}: the top `limit` of each window."""
    groups: dict[tuple[int, str, str], list] = defaultdict(lambda: [0, 0, Decimal(0)])
    for record in expected.on_time:
        data, ms = record.data, record.event_ms
        assert ms is not None
        valid = data["type"] in ("impression", "click") and data.get("campaign_id") in campaigns and data["price"] >= 0
        if valid and window_closed(ms, window_ms, expected.final_watermark):
            group = groups[(window_start(ms, window_ms), *campaigns[data["campaign_id"]])]
            group[0 if data["type"] == "impression" else 1] += 1
            group[2] += Decimal(str(data["price"]))
    by_window: dict[int, list[tuple]] = defaultdict(list)
    for (start, advertiser, country), (impressions, clicks, revenue) in groups.items():
        by_window[start].append((start, advertiser, country, impressions, clicks, revenue))
    return {row for rows in by_window.values() for row in sorted(rows, key=lambda r: (-r[5], r[1], r[2]))[:limit]}


def test_adtech(harness: Harness) -> None:
    """(d) filter, enrich from the static campaign table, aggregate per advertiser and country over 10s
    windows, top 5 by revenue per window; bad and late events reach the dead letters."""
    app = harness.load("adtech")
    campaigns = read_campaigns(app.node("enriched")["lookup"]["path"])
    window_ms, delay_ms = tumbling_ms(app, "per-dimension"), watermark_delay(app, "events")
    limit = app.node("top-revenue")["topN"]["limit"]
    phases = adtech_phases(random.Random(5), sorted(campaigns), window_ms, delay_ms)

    def valid(record: Record) -> bool:  # the `valid` filter (an unknown campaign passes it: the lookup drops it)
        data = record.data
        return data["type"] in ("impression", "click") and data.get("campaign_id") is not None and data["price"] >= 0

    expected = replay(phases, delay_ms, windowed_rule(window_ms), valid)
    assert any(not r.bad and not valid(r) for r in phases[1]), "no straggler the filter leaves out"
    assert_meaningful(expected, stragglers=phases[1])
    reference = adtech_reference(expected, campaigns, window_ms, limit)
    assert len({row[0] for row in reference}) >= 4
    dead_letters = expected.dead_letters(late_too=app.pipeline["deadLetter"]["lateRecords"])

    with harness.run_phases(app, phases, "out", expected.watermarks) as run:
        assert_sample(run, "sluice_malformed_records_total", len(expected.bad), query="out", source="events")
        assert_sample(run, "sluice_dead_letter_records_total", len(dead_letters), source="events")

    rows = harness.read_json(app, "adtech-top-revenue")
    assert_each_once(rows, ("window_start", "advertiser", "country"))
    got = {
        (
            epoch_ms(r["window_start"]),
            r["advertiser"],
            r["country"],
            r["impressions"],
            r["clicks"],
            Decimal(r["revenue"]),
        )
        for r in rows
    }
    assert got == reference
    assert_dead_letters(
        read_dead_letters(harness, app, "adtech-dead-letters"), dead_letters, source_of=lambda _: "events"
    )
