"""Decide: the state's samples → how many executors the app should have now, and why, in numbers.

Pure: the clock is passed in. In order:

1. executors.min/max are hard bounds: a count outside them is corrected at once.
2. After a change, and after the queries start (a cold JVM), samples are ignored for `stabilization`
   (executors warm up), then a decision waits until the samples cover a whole `metricsWindow`.
3. Dead band: no change while utilization (input rate ÷ capacity, not the busy share, which a batch
   catching up on a backlog keeps at 100%) is within target ± band and the backlog drains within
   targetLagSeconds, or within `stabilization`, before executors added now would be warm. Otherwise the
   evaluation's needed executors, capped by the executors the tasks can keep busy and by min/max, is the
   recommendation.
4. Up: not while an earlier scale-up proved ineffective (capacity grew under 10% of what the rate per
   executor promised), not within `scaleUpCooldown` of a change, at most `maxStep` at once.
5. Down: to the largest recommendation over `scaleDownWindow`, once recommendations cover that
   window, not within `scaleDownCooldown` of a change, at most `maxStep` at once. A scale-down lifts
   an ineffective-scale-up block; so does a change of the autoscaling settings or executor bounds.

`record` then folds the decision into the state; call it after realizing the decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from sluice.api.times import format_time

from ..model import AutoscalerStatus, DecisionStatus
from .collect import Sample
from .evaluate import BUSY_FLOOR, Evaluation, evaluate
from .policy import ExecutorBounds, Policy, spec_key
from .state import MAX_REASON, MAX_RECOMMENDATIONS, AutoscalerState, CapacityCheck, DecisionRecord

# A scale-up whose measured capacity gain is under this share of the expected gain was ineffective.
INEFFECTIVE_GAIN = 0.1

Kind = Literal["up", "down", "hold"]


@dataclass(frozen=True)
class ScalingDecision:
    time: float
    from_executors: int
    target: int
    kind: Kind
    reason: str  # "2 → 5: input 5.6k rec/s, ..." or "hold at 4: ..."
    recommendation: int | None = None  # what the evaluation asks for, before steps, delays, cooldowns
    evaluation: Evaluation | None = None  # None: no decision could be evaluated (bounds, warm-up, window)
    scale_up_blocked: str | None = None  # why scale-ups are off, if they are
    spec_key: str = ""

    @property
    def changes(self) -> bool:
        return self.kind != "hold"


def decide_scaling(policy: Policy, bounds: ExecutorBounds, state: AutoscalerState, now: float) -> ScalingDecision:
    key = spec_key(policy, bounds)
    current = current_executors(state, bounds)
    blocked = state.scale_up_blocked if state.spec_key == key else None

    def hold(reason: str, evaluation: Evaluation | None = None, recommendation: int | None = None) -> ScalingDecision:
        return ScalingDecision(
            now, current, current, "hold", f"hold at {current}: {reason}", recommendation, evaluation, blocked, key
        )

    def change(
        target: int, reason: str, evaluation: Evaluation | None = None, recommendation: int | None = None
    ) -> ScalingDecision:
        kind: Kind = "up" if target > current else "down"
        return ScalingDecision(
            now,
            current,
            target,
            kind,
            f"{current} → {target}: {reason}",
            recommendation,
            evaluation,
            blocked if kind == "up" else None,
            key,
        )

    if current > bounds.max:
        return change(bounds.max, f"executors.max is {bounds.max}")
    if current < bounds.min:
        return change(bounds.min, f"executors.min is {bounds.min}")
    last = state.last_change
    if last is not None and now < last.time + policy.stabilization:
        return hold(
            f"stabilizing after {last.from_executors} → {last.to} "
            f"({duration_text(last.time + policy.stabilization - now)} left)"
        )
    if state.runs_since is not None and now < state.runs_since + policy.stabilization:
        return hold(
            f"warming up after the queries started "
            f"({duration_text(state.runs_since + policy.stabilization - now)} left)"
        )
    samples = window_samples(state, policy, now)
    covered = sum(s.time - max(s.start, now - policy.metrics_window) for s in samples)
    if covered < policy.metrics_window - policy.slack:
        return hold(f"collecting samples ({duration_text(covered)} of {duration_text(policy.metrics_window)})")

    evaluation = evaluate(samples, policy.target_utilization, policy.target_lag)
    # hold() and change() read `blocked` when called, so they carry a block found just now.
    blocked = ineffective_scale_up(state.capacity_check, evaluation) or blocked
    recommendation, why = recommend(evaluation, policy, bounds, current)
    if recommendation is None:
        return hold(why, evaluation)

    def wait(reason: str) -> ScalingDecision:
        return hold(f"{why}; {reason}", evaluation, recommendation)

    if recommendation > current:
        if blocked:
            return wait(f"scale-up blocked: {blocked}")
        cooldown = _cooldown_left(state, policy.scale_up_cooldown, now)
        if cooldown > 0:
            return wait(f"scale-up to {recommendation} waits for the cooldown ({duration_text(cooldown)} left)")
        target = min(recommendation, current + policy.max_step)
        return change(target, why + _step_note(target, recommendation, policy), evaluation, recommendation)

    if recommendation < current:
        seen = now - (state.recommending_since if state.recommending_since is not None else now)
        window = duration_text(policy.scale_down_window)
        if seen < policy.scale_down_window - policy.slack:
            return wait(
                f"scale-down to {recommendation} waits for {window} of recommendations ({duration_text(seen)} so far)"
            )
        highest = max(
            [
                recommendation,
                *(n for t, n in state.recommendations if t >= now - policy.scale_down_window - policy.slack),
            ]
        )
        if highest >= current:
            return wait(f"{highest} recommended within the last {window}")
        cooldown = _cooldown_left(state, policy.scale_down_cooldown, now)
        if cooldown > 0:
            return wait(f"scale-down to {highest} waits for the cooldown ({duration_text(cooldown)} left)")
        target = max(highest, current - policy.max_step)
        return change(
            target,
            f"{why}; largest recommendation over {window}: {highest}" + _step_note(target, highest, policy),
            evaluation,
            recommendation,
        )
    return hold(why, evaluation, recommendation)


def record(state: AutoscalerState, decision: ScalingDecision, policy: Policy) -> AutoscalerState:
    """The state after `decision` was realized (or, for a hold, simply made)."""
    recommendations, since = state.recommendations, state.recommending_since
    if decision.recommendation is not None:
        oldest = decision.time - policy.scale_down_window - policy.slack
        # An earlier recommendation no larger than this one can never be the window's largest again.
        kept = [(t, n) for t, n in recommendations if t >= oldest and n > decision.recommendation]
        kept.append((decision.time, decision.recommendation))
        while len(kept) > MAX_RECOMMENDATIONS:
            # The oldest (largest) count lives on until the next one's time: a later scale-down, never an early one.
            kept[:2] = [(kept[1][0], kept[0][1])]
        recommendations = tuple(kept)
        since = decision.time if since is None else since
    evaluation = decision.evaluation
    check = state.capacity_check
    if decision.kind == "down" or (evaluation is not None and evaluation.capacity is not None):
        check = None  # the pending scale-up has been measured now, or no longer matters
    if decision.kind == "up" and evaluation is not None and evaluation.rate_per_executor is not None:
        check = CapacityCheck(
            decision.from_executors,
            decision.target,
            evaluation.rate_per_executor * evaluation.executors,
            evaluation.rate_per_executor * decision.target,
        )
    entry = DecisionRecord(
        decision.time, decision.from_executors, decision.target, decision.kind, decision.reason[:MAX_REASON]
    )
    return replace(
        state,
        recommendations=recommendations,
        recommending_since=since,
        last_change=entry if decision.changes else state.last_change,
        last_decision=entry,
        capacity_check=check,
        spec_key=decision.spec_key,
        scale_up_blocked=decision.scale_up_blocked[:MAX_REASON] if decision.scale_up_blocked else None,
    )


def autoscaler_status(state: AutoscalerState, decision: ScalingDecision) -> AutoscalerStatus:
    """The StreamingApp's status.autoscaler for a decision (lastDecision: the latest change)."""
    last = state.last_change
    if decision.changes:
        last = DecisionRecord(decision.time, decision.from_executors, decision.target, decision.kind, decision.reason)
    evaluation = decision.evaluation
    messages = [decision.reason] if not decision.changes else []
    if decision.scale_up_blocked and decision.scale_up_blocked not in decision.reason:
        messages.append(f"scale-up blocked: {decision.scale_up_blocked}")
    rate = evaluation.rate_per_executor if evaluation is not None else None
    return AutoscalerStatus(
        desiredExecutors=decision.target,
        lastDecision=None
        if last is None
        else DecisionStatus(
            time=format_time(last.time), fromExecutors=last.from_executors, to=last.to, reason=last.reason
        ),
        ratePerExecutor=None if rate is None else round(rate, 1),
        backlog=evaluation.backlog
        if evaluation is not None
        else (state.samples[-1].backlog if state.samples else None),
        message="; ".join(messages) or None,
    )


def current_executors(state: AutoscalerState, bounds: ExecutorBounds) -> int:
    """The count last asked for: the driver's own word when it is newer than the last change."""
    latest = state.samples[-1] if state.samples else None
    last = state.last_change
    if latest is not None and (last is None or latest.time > last.time):
        return latest.executor_target if latest.executor_target is not None else bounds.instances
    return last.to if last is not None else bounds.instances


def window_samples(state: AutoscalerState, policy: Policy, now: float) -> list[Sample]:
    """Samples ending within the metrics window and begun after the stabilization that follows the last
    change and the queries' start."""
    settled = max(
        -math.inf if state.last_change is None else state.last_change.time + policy.stabilization,
        -math.inf if state.runs_since is None else state.runs_since + policy.stabilization,
    )
    return [s for s in state.samples if s.time > now - policy.metrics_window and s.start >= settled - policy.slack]


def recommend(evaluation: Evaluation, policy: Policy, bounds: ExecutorBounds, current: int) -> tuple[int | None, str]:
    """Executors to have, and the figures behind it; None when no rate could be measured."""
    if evaluation.needed_executors is None:
        return None, (
            f"no rate per executor yet: utilization {percent(evaluation.utilization)}, completed "
            f"batches took under {percent(BUSY_FLOOR)} of the window"
        )
    # The input's share of the capacity, not the busy share: catching up on a backlog keeps the executors
    # busy all the time, and the backlog is weighed apart, by the time it takes to drain.
    in_band = abs(evaluation.load - policy.target_utilization) <= policy.utilization_band
    catch_up = evaluation.catch_up_seconds
    # Executors added now work only once warm (stabilization, as long as their samples are ignored): a backlog
    # the live ones drain before then would not drain sooner with more of them.
    if in_band and catch_up <= max(policy.target_lag, policy.stabilization):
        warm_up = (
            f", before executors added now would be warm ({duration_text(policy.stabilization)})"
            if catch_up > policy.target_lag
            else ""
        )
        return current, (
            f"utilization {percent(evaluation.load)} (input ÷ capacity) within "
            f"{percent(policy.target_utilization)} ± {percent(policy.utilization_band)}, "
            f"backlog {backlog_text(evaluation)} records drains in {duration_text(catch_up)}{warm_up}"
        )
    rate = evaluation.rate_per_executor
    notes = [
        f"input {compact(evaluation.input_rate)} rec/s, backlog {backlog_text(evaluation)} records, "
        f"utilization {percent(evaluation.utilization)}: need {compact(evaluation.needed_rate)} rec/s, "
        + (f"{compact(rate)} rec/s per executor" if rate else "no rate per executor measured")
    ]
    wanted = evaluation.needed_executors
    usable = evaluation.usable_executors
    if usable is not None and wanted > usable:
        notes.append(_usable_note(evaluation, wanted, usable))
        wanted = usable
    if wanted > bounds.max:
        notes.append(f"capped at executors.max {bounds.max}")
    elif wanted < bounds.min:
        notes.append(f"raised to executors.min {bounds.min}")
    return min(max(wanted, bounds.min), bounds.max), "; ".join(notes)


def backlog_text(evaluation: Evaluation) -> str:
    parts = [
        f"{compact(count)} {what}"
        for count, what in (
            (evaluation.processing, "processed by the running batch"),
            (evaluation.waiting, "normal between triggers"),
        )
        if count
    ]
    return compact(evaluation.backlog) + (f" ({', '.join(parts)})" if parts else "")


def ineffective_scale_up(check: CapacityCheck | None, evaluation: Evaluation) -> str | None:
    """Why the last scale-up counts as ineffective, measured by the first evaluation after it."""
    if check is None or evaluation.capacity is None:
        return None
    expected_gain = check.expected - check.before
    gain = evaluation.capacity - check.before
    if expected_gain <= 0 or gain >= INEFFECTIVE_GAIN * expected_gain:
        return None
    return (
        f"{check.from_executors} → {check.to} raised capacity by {compact(max(gain, 0))} rec/s of the "
        f"{compact(expected_gain)} rec/s expected (under {percent(INEFFECTIVE_GAIN)}); more executors do "
        "not help, something else (partitions, a sink, the source) limits the rate"
    )


def _usable_note(evaluation: Evaluation, wanted: int, usable: int) -> str:
    cores = f"{evaluation.cores_per_executor} core{'s' if evaluation.cores_per_executor > 1 else ''}"
    if evaluation.tasks_limited_by == "shuffle":
        tasks, remedy = "shuffle (state) partitions", "more state partitions (spark.sql.shuffle.partitions)"
    else:
        tasks, remedy = "Kafka source tasks", "minPartitions on the Kafka source or more topic partitions"
    return (
        f"{wanted} executors needed, but {evaluation.useful_tasks} {tasks} ÷ {cores} keep only {usable} "
        f"busy; more needs {remedy}"
    )


def _cooldown_left(state: AutoscalerState, cooldown: float, now: float) -> float:
    return 0.0 if state.last_change is None else state.last_change.time + cooldown - now


def _step_note(target: int, wanted: int, policy: Policy) -> str:
    return "" if target == wanted else f" (maxStep {policy.max_step} toward {wanted})"


def compact(value: float) -> str:
    """1234 → 1.2k, 48000 → 48k, 1200000 → 1.2M."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
        if abs(value) >= limit:
            scaled = value / limit
            return (f"{scaled:.1f}".removesuffix(".0") if abs(scaled) < 10 else f"{scaled:.0f}") + suffix
    return f"{value:.2g}"


def percent(fraction: float) -> str:
    return f"{fraction * 100:.0f}%"


def duration_text(seconds: float) -> str:
    """45s, 5m, 1m30s, 2h5m; 'never' for an infinite time."""
    if math.isinf(seconds):
        return "never"
    whole = max(0, math.ceil(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "m"), (secs, "s")] if hours == 0 else [(hours, "h"), (minutes, "m")]
    return "".join(f"{n}{unit}" for n, unit in parts if n) or "0s"
