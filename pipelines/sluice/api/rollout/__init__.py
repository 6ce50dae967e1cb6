"""What a change of a StreamingApp's spec needs, decided without a cluster: per streaming query, by Spark's rules
for one checkpoint (diff, spark_rules), and the strategy that rolls it out (choice). The operator's rollout and
`sluice plan` both decide with this code, so they cannot disagree."""

from .change_plan import ChangePlan, QueryOutcome, StrategyOption, plan_change, runs_like
from .choice import (
    STRATEGIES_CHEAPEST_FIRST,
    Refusal,
    choose_strategy,
    needs_new_driver,
    query_steps,
    safe_strategies,
    unsafe_reasons,
)
from .diff import DEAD_LETTER_SUFFIX, Change, QueryChange, Reason, SpecDiff, classify

__all__ = [
    "DEAD_LETTER_SUFFIX",
    "STRATEGIES_CHEAPEST_FIRST",
    "Change",
    "ChangePlan",
    "QueryChange",
    "QueryOutcome",
    "Reason",
    "Refusal",
    "SpecDiff",
    "StrategyOption",
    "choose_strategy",
    "classify",
    "needs_new_driver",
    "plan_change",
    "query_steps",
    "runs_like",
    "safe_strategies",
    "unsafe_reasons",
]
