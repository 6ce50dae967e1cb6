"""Rolling updates of a StreamingApp's pipeline: pure decisions, no I/O.

sluice.api.rollout (shared with `sluice plan`): per streaming query, what a spec change needs by Spark's rules
for one checkpoint, and the cheapest safe strategy (or the refusal of an unsafe explicit one).
strategy: the planned rollout.
plan: the rollout state machine kept in `status.rollout` (its models are in ..model); observed: what it
reads; actions: what it says. decide: one pass of it as the operator carries it out.
"""

from sluice.api.contract import QueryStep
from sluice.api.rollout import (
    Change,
    QueryChange,
    Reason,
    Refusal,
    SpecDiff,
    choose_strategy,
    classify,
    query_steps,
    safe_strategies,
    unsafe_reasons,
)

from ..model import DriverRef, RolloutStatus, Strategy
from .actions import (
    Action,
    Activate,
    ApplyRevision,
    DeleteDriver,
    Drain,
    Event,
    ReleaseRevision,
    Resume,
    StartDriver,
    Step,
    SwapQueries,
)
from .observed import DriverFacts, Observed, QueryFacts, Target
from .plan import diff_base, reverse_steps, step
from .strategy import plan

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
