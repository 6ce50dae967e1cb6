"""The docs cannot drift from the code unnoticed: the rollout diagram names every phase the state machine has,
every diagram source has its rendering (make docs), and every page the README links to exists."""

from __future__ import annotations

import re
from typing import get_args

from sluice.operator.model import ConditionType, RolloutPhase
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


def written_reasons() -> set[str]:
    """The CamelCase reasons the operator writes into conditions: its named reasons, the literals where the
    conditions are made, the rollout's phases and refusals."""
    import inspect

    from sluice.api.rollout import choice
    from sluice.operator import status
    from sluice.operator.rollout import decide

    named = {value for name, value in vars(status).items() if name.isupper() and isinstance(value, str)}
    makers = (status.conditions_for, status.with_ready, status.checkpoint_condition, decide.rollout_condition)
    literals = {m for f in makers for m in re.findall(r'"([A-Z][a-z]+(?:[A-Z][a-z]+)*)"', inspect.getsource(f))}
    refusals = set(re.findall(r'reason="([A-Za-z]+)"', inspect.getsource(choice))) | {choice.Refusal.reason}
    found = {r for r in named | literals | refusals if re.fullmatch(r"[A-Z][A-Za-z]+", r)} | set(get_args(RolloutPhase))
    not_reasons = {*get_args(ConditionType), "True", "False", "Bound", *(m for m in found if m.startswith("ReadWrite"))}
    return found - not_reasons  # condition types, statuses, a claim's phase and access modes


def test_the_troubleshooting_page_names_every_reason_the_operator_writes() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    reasons = written_reasons()
    assert {"InvalidSpec", "KafkaLoginFailed", "ClaimPending", "DriverUnschedulable", "StrategyNotAvailable"} <= reasons
    assert sorted(r for r in reasons if f"`{r}`" not in page) == []
