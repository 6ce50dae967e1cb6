"""`sluice graph`: the pipeline as a DOT graph (pure), live figures from a driver's answer, and the command
drawing it with Graphviz, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sluice.api.contract import DriverStatus, QueryStatus, TopicStatus
from sluice.api.graph import live_figures, pipeline_dot, queries_of
from sluice.api.pipeline import PipelineSpec
from sluice.testbed.common import ProvisionError
from sluice.testbed.node import install_packages

REPO = Path(__file__).resolve().parents[2]
WORDCOUNT = REPO / "pipelines" / "examples" / "wordcount.yaml"
README_DIAGRAM = REPO / "docs" / "diagrams" / "wordcount-pipeline.dot"


def wordcount() -> PipelineSpec:
    return PipelineSpec.model_validate(yaml.safe_load(WORDCOUNT.read_text())["spec"]["pipeline"])


def test_each_node_is_part_of_the_queries_of_the_sinks_downstream() -> None:
    pipeline = wordcount()
    pipeline.nodes.append(pipeline.nodes[-1].model_copy(update={"name": "echo", "inputs": ["words"]}))
    member = queries_of(pipeline)
    assert member["lines"] == {"out", "echo", "lines-dead-letters"}
    assert member["words"] == {"out", "echo"} and member["counts"] == {"out"} and member["echo"] == {"echo"}


def test_the_dot_graph_shows_kinds_state_queries_and_dead_letters() -> None:
    dot = pipeline_dot("wordcount", wordcount())
    assert dot.startswith('digraph "wordcount" {') and dot.rstrip().endswith("}")
    assert '"lines" -> "words";' in dot and '"counts" -> "out";' in dot
    assert '"counts" [shape=box, label="counts\\naggregate (state)' in dot and "fillcolor" in dot.split('"counts" [')[1]
    assert '"lines" [shape=cylinder' in dot and '"out" [shape=box, peripheries=2' in dot
    assert "queries: lines-dead-letters, out" in dot
    assert '"lines" -> "dead letters" [style=dashed, label="malformed"]' in dot
    assert '"counts" -> "dead letters" [style=dashed, label="late"]' in dot
    assert "late records: topic wordcount-dead-letters" in dot


def test_live_figures_put_backlogs_rates_state_and_watermarks_on_their_nodes() -> None:
    status = DriverStatus(
        app="wordcount",
        revision="r1",
        observedAt="2026-11-29T06:00:00Z",
        queries=[
            QueryStatus(name="out", id="i", runId="r", active=True, inputRowsPerSecond=12.5,
                        processedRowsPerSecond=20.0, lastBatchDurationMs=830, stateful=True, stateRows=1234,
                        watermark="2026-11-29T05:59:52.000Z"),
            QueryStatus(name="lines-dead-letters", active=True, inputRowsPerSecond=13.0),
        ],
        topics=[TopicStatus(topic="wordcount-lines", partitions=4, latestOffsets=100, backlog=42)],
    )  # fmt: skip
    figures = live_figures(wordcount(), status)
    assert figures == {
        "lines": "backlog 42 records, read 13.0/s",  # the faster of the two queries reading it
        "counts": "out: state 1,234 rows, watermark 05:59:52 UTC",
        "out": "running: in 12.5/s, processed 20.0/s, batch 830 ms\nwatermark 05:59:52 UTC",
    }
    assert "backlog 42 records" in pipeline_dot("wordcount", wordcount(), figures)
    before_any_batch = status.model_copy(update={"queries": [QueryStatus(name="out", active=True)], "topics": []})
    assert live_figures(wordcount(), before_any_batch) == {
        "lines": "backlog 0 records, read 0.0/s",
        "out": "running: in 0.0/s, processed 0.0/s",
    }


def test_the_readmes_picture_is_this_codes_drawing() -> None:
    assert README_DIAGRAM.read_text() == pipeline_dot("wordcount", wordcount()), "make docs draws it again"


def sluice(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.cli", *args], capture_output=True, input=stdin, timeout=120
    )


def test_the_command_prints_dot_and_names_an_invalid_field() -> None:
    result = sluice("graph", str(WORDCOUNT))
    assert result.returncode == 0 and result.stdout.decode() == pipeline_dot("wordcount", wordcount())
    broken = yaml.safe_load(WORDCOUNT.read_text())
    broken["spec"]["pipeline"]["nodes"][2]["inputs"] = ["nowhere"]
    result = sluice("graph", "-", stdin=yaml.safe_dump(broken).encode())
    assert result.returncode == 2 and b"spec.pipeline.nodes[2].inputs[0]" in result.stderr


@pytest.fixture(scope="module")
def graphviz() -> None:
    try:
        install_packages(("graphviz",))  # as make docs does
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.mark.parametrize("output, magic", [("svg", b"<svg"), ("png", b"\x89PNG")])
def test_the_command_draws_svg_and_png_with_graphviz(graphviz, tmp_path, output, magic) -> None:
    drawn = tmp_path / f"wordcount.{output}"
    result = sluice("graph", str(WORDCOUNT), "-o", output, "--to", str(drawn))
    assert result.returncode == 0, result.stderr
    assert magic in drawn.read_bytes()[:400]
