"""The docs cannot drift from the code unnoticed: the rollout diagram names every phase the state machine has,
every diagram source has its rendering (make docs), and every page the README links to exists."""

from __future__ import annotations

import re
from typing import get_args

from sluice.operator.model import RolloutPhase
from sluice.testbed.common import REPO_ROOT

DOCS = REPO_ROOT / "docs"


def test_the_rollout_diagram_names_every_phase() -> None:
    source = (DOCS / "diagrams" / "rollout-states.dot").read_text()
    named = set(re.findall(r"\b([A-Z][A-Za-z]+)\b", source))
    assert set(get_args(RolloutPhase)) <= named, set(get_args(RolloutPhase)) - named


def test_every_diagram_is_rendered() -> None:
    sources = sorted((DOCS / "diagrams").glob("*.dot"))
    assert sources
    for source in sources:
        rendered = DOCS / f"{source.stem}.svg"
        assert rendered.exists(), f"{rendered} missing: make docs"
        assert "<svg" in rendered.read_text()[:2000]


def test_the_readme_links_to_pages_that_exist() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 8
    missing = [link for link in links if not (REPO_ROOT / link).exists()]
    assert missing == []
