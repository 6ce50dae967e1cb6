"""Rolling updates of a StreamingApp's pipeline: pure decisions, no I/O.

diff: per streaming query, what a spec change needs by Spark's rules for one checkpoint.
plan: the cheapest safe strategy (or the refusal of an unsafe explicit one) and the rollout state machine
kept in `status.rollout` (its models are in ..model).
"""

from sluice.api.contract import QueryStep

from ..model import DriverRef, RolloutStatus, Strategy
from .diff import Change, QueryChange, Reason, SpecDiff, classify
from .plan import (
    Action,
    Activate,
    ApplyRevision,
    DeleteDriver,
    Drain,
    DriverFacts,
    Event,
    Observed,
    QueryFacts,
    Refusal,
    ReleaseRevision,
    Resume,
    StartDriver,
    Step,
    SwapQueries,
    Target,
    choose_strategy,
    diff_base,
    plan,
    query_steps,
    reverse_steps,
    safe_strategies,
    step,
    unsafe_reasons,
)

__all__ = [
    "Action",
    "Activate",
    "ApplyRevision",
    "Change",
    "DeleteDriver",
    "Drain",
    "DriverFacts",
    "DriverRef",
    "Event",
    "Observed",
    "QueryChange",
    "QueryFacts",
    "QueryStep",
    "Reason",
    "Refusal",
    "ReleaseRevision",
    "Resume",
    "RolloutStatus",
    "SpecDiff",
    "StartDriver",
    "Step",
    "Strategy",
    "SwapQueries",
    "Target",
    "choose_strategy",
    "classify",
    "diff_base",
    "plan",
    "query_steps",
    "reverse_steps",
    "safe_strategies",
    "step",
    "unsafe_reasons",
]
