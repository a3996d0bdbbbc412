"""The scaling policy: a pure function from what was observed to how many replicas to run.

The core is the HPA's: desired = max over signals of ceil(ready x value / target), with a tolerance band,
stabilization windows over past recommendations and a bound on the scale-up rate. On top of it sit the
guards LLM serving needs (see the operator research notes for the issues each one answers):
- replicas still loading the model are capacity on the way: no scale-up while they start, and the
  scale-up window then gives the queue they inherit time to drain (no cascades on slow model loads);
- pods that cannot be scheduled stop scale-up and raise ScalingLimited naming the missing resource;
- scale-down only to a count whose replicas stay under every target once the load moves onto them;
- no metrics holds the current count (never "zero load, drop to min").
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Signal names, as fetched (signals.py) and as recorded in decisions.
QUEUE_TIME = "queue_time_p95_s"  # p95 of time from arrival to first scheduling, short window
OLDEST_WAIT = "oldest_wait_s"  # age of the oldest request still waiting (no histogram lag)
KV_USAGE = "kv_usage"  # KV-cache usage 0..1, averaged over replicas
WAITING = "waiting"  # waiting requests, summed over replicas (fetched)
WAITING_PER_REPLICA = "waiting_per_replica"  # WAITING / ready replicas (what is compared to its target)


@dataclass(frozen=True)
class Targets:
    """Per-replica targets; None switches a signal off."""

    queue_time_p95_s: float | None = 0.5
    oldest_wait_s: float | None = 1.0
    kv_usage: float | None = 0.7
    waiting_per_replica: float | None = 2.0

    def items(self) -> list[tuple[str, float]]:
        return [(name, t) for name, t in vars(self).items() if t is not None]


@dataclass(frozen=True)
class ScalingConfig:
    min_replicas: int = 1
    max_replicas: int = 10
    targets: Targets = field(default_factory=Targets)
    tolerance: float = 0.1
    # Scale-up needs the recommendation to hold for this long; it is also how long a queue left behind by
    # starting replicas gets to drain once they are ready (their hold recommendations sit in the window).
    scale_up_window_s: float = 30.0
    scale_down_window_s: float = 300.0
    # Per decision, grow to at most max(current x factor, current + pods) (HPA's default behaviour).
    max_scale_up_factor: float = 2.0
    max_scale_up_pods: int = 4
    mode: Literal["active", "dryRun"] = "active"

    def __post_init__(self) -> None:
        def require(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ValueError(f"scaling.{name} {what} (got {getattr(self, name)!r})")

        require(self.min_replicas >= 0, "min_replicas", "must be >= 0")
        require(self.max_replicas >= max(1, self.min_replicas), "max_replicas", "must be >= 1 and >= min")
        require(0 <= self.tolerance < 1, "tolerance", "must be in [0, 1)")
        require(self.scale_up_window_s >= 0, "scale_up_window_s", "must be >= 0")
        require(self.scale_down_window_s >= 0, "scale_down_window_s", "must be >= 0")
        require(self.max_scale_up_factor >= 1, "max_scale_up_factor", "must be >= 1")
        require(self.max_scale_up_pods >= 1, "max_scale_up_pods", "must be >= 1")
        require(self.mode in ("active", "dryRun"), "mode", "must be 'active' or 'dryRun'")
        for name, target in vars(self.targets).items():
            if target is not None and not target > 0:
                raise ValueError(f"scaling.targets.{name} must be > 0 (got {target!r})")
        if not self.targets.items():
            raise ValueError("scaling.targets must enable at least one signal")


@dataclass(frozen=True)
class Observation:
    now: float  # seconds (epoch or any monotonic origin, the same across calls)
    replicas: int  # the owned Deployment's spec.replicas
    ready: int
    starting: int = 0  # created, schedulable, not Ready yet (loading the model)
    unschedulable: int = 0
    unschedulable_reason: str = ""  # the scheduler's message, e.g. "Insufficient nvidia.com/gpu"
    signals: Mapping[str, float] | None = None  # None: metrics unavailable
    metrics_error: str = ""


@dataclass(frozen=True)
class ScalingState:
    """What the policy remembers between decisions; round-trips through plain JSON (to_dict/from_dict)."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (time, replicas), for the stabilization windows
    watching_since: float | None = None  # first decision with metrics: no scale-down before a full window
    last_waiting: float | None = None  # waiting requests at the last decision: is the queue draining?

    def to_dict(self) -> dict[str, Any]:
        return {
            "recommendations": [[t, n] for t, n in self.recommendations],
            "watchingSince": self.watching_since,
            "lastWaiting": self.last_waiting,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScalingState:
        def number(key: str) -> float | None:
            return None if data.get(key) is None else float(data[key])

        try:
            recommendations = tuple((float(t), int(n)) for t, n in data.get("recommendations", []))
            return cls(recommendations, number("watchingSince"), number("lastWaiting"))
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"scaling state: expected recommendations [[time, replicas], ...], watchingSince and "
                f"lastWaiting numbers: {e}"
            ) from e


@dataclass(frozen=True)
class Term:
    signal: str
    value: float
    target: float
    proposal: int


@dataclass(frozen=True)
class Condition:
    type: str
    status: Literal["True", "False"]
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    time: float
    current: int
    desired: int
    terms: tuple[Term, ...]
    reason: str
    conditions: tuple[Condition, ...]
    act: bool  # write desired to the Deployment (False when unchanged or in dryRun)

    @property
    def driver(self) -> Term | None:
        """The signal asking for the most replicas."""
        return max(self.terms, key=lambda t: t.proposal, default=None)

    def record(self) -> dict[str, Any]:
        """One entry of status' bounded decision history."""
        d = self.driver
        return {
            "signal": d.signal if d else None,
            "value": d.value if d else None,
            "target": d.target if d else None,
            "from": self.current,
            "to": self.desired,
            "reason": self.reason,
            "time": self.time,
        }


def decide(config: ScalingConfig, obs: Observation, state: ScalingState) -> tuple[Decision, ScalingState]:
    current = obs.replicas
    clamp = lambda n: min(max(n, config.min_replicas), config.max_replicas)  # noqa: E731
    limited = _scaling_limited(obs)
    keep = max(config.scale_up_window_s, config.scale_down_window_s)
    recent = tuple(r for r in state.recommendations if r[0] > obs.now - keep)

    def hold(why: str, metrics: Condition) -> tuple[Decision, ScalingState]:
        desired = clamp(current)
        conditions = (metrics, limited or _within_range())
        decision = _decision(config, obs, desired, (), f"{_verb(current, desired)}: {why}", conditions)
        return decision, ScalingState(recent, state.watching_since, state.last_waiting)

    if obs.signals is None:
        unavailable = Condition("MetricsAvailable", "False", "MetricsUnavailable", obs.metrics_error)
        return hold(f"metrics unavailable ({obs.metrics_error})", unavailable)
    available = Condition("MetricsAvailable", "True", "SignalsRead", f"read {len(obs.signals)} signals")
    if obs.ready == 0:
        return hold("no ready replica to measure load on", available)
    terms = _terms(config, obs)
    if not terms:
        return hold("no signal has data", available)

    raw = max(t.proposal for t in terms)
    recommendation = clamp(raw)
    notes: list[str] = []
    waiting = obs.signals.get(WAITING)
    if recommendation > current:
        # Capacity on the way or a queue already shrinking will absorb the backlog the signals show;
        # adding replicas for it is how slow model loads turn into scale-up cascades.
        if obs.starting:
            recommendation = current
            notes.append(f"scale-up held: {obs.starting} replica(s) still starting")
        elif _draining(config, obs.ready, state.last_waiting, waiting):
            recommendation = current
            notes.append(f"scale-up held: queue draining ({state.last_waiting:g} -> {waiting:g} waiting)")
    history = (*recent, (obs.now, recommendation))
    watching_since = obs.now if state.watching_since is None else state.watching_since
    up = min(n for t, n in history if t > obs.now - config.scale_up_window_s or t == obs.now)
    down = max(n for t, n in history if t > obs.now - config.scale_down_window_s or t == obs.now)
    if watching_since > obs.now - config.scale_down_window_s:
        down = max(down, current)  # not watched a whole window yet (new service, lost state): no scale-down
    desired = up if up > current else down if down < current else current
    if recommendation > current and desired == current:
        notes.append(f"scale-up stabilizing ({config.scale_up_window_s:g}s window)")
    if recommendation < current and desired > recommendation:
        notes.append(f"scale-down stabilizing ({config.scale_down_window_s:g}s window)")

    if desired > current:
        bound = max(math.ceil(current * config.max_scale_up_factor), current + config.max_scale_up_pods)
        if desired > bound:
            desired = bound
            notes.append(f"scale-up rate bound {bound}")
        if obs.unschedulable:
            desired = current
            notes.append(f"scale-up stopped: {obs.unschedulable} pod(s) unschedulable")
    if desired < current and desired < obs.ready:
        # Remove a ready replica only if the survivors, taking its load, stay inside the tolerance band.
        safe = max(math.ceil(obs.ready * t.value / (t.target * (1 - config.tolerance))) for t in terms)
        if safe > desired:
            desired = min(safe, current)
            notes.append(f"kept {desired} so the remaining replicas stay under every target")
    desired = clamp(desired)

    conditions = (available, limited or _range_condition(config, raw))
    driver = max(terms, key=lambda t: t.proposal)
    why = f"{driver.signal}={driver.value:.3g} (target {driver.target:g}) proposes {driver.proposal}"
    reason = "; ".join([f"{_verb(current, desired)}: {why}", *notes])
    decision = _decision(config, obs, desired, tuple(terms), reason, conditions)
    return decision, ScalingState(history, watching_since, waiting)


def _draining(config: ScalingConfig, ready: int, before: float | None, now: float | None) -> bool:
    """A real backlog (over the waiting target) that shrank since the last decision."""
    per_replica = config.targets.waiting_per_replica or 1.0
    return before is not None and now is not None and now < before and before > per_replica * ready


def _terms(config: ScalingConfig, obs: Observation) -> list[Term]:
    assert obs.signals is not None
    values = {k: v for k, v in obs.signals.items() if v is not None and math.isfinite(v)}
    if WAITING in values:
        values[WAITING_PER_REPLICA] = values.pop(WAITING) / obs.ready
    terms = []
    for signal, target in config.targets.items():
        if signal not in values:
            continue  # e.g. no request scheduled in the window: the percentile is undefined
        value = values[signal]
        ratio = value / target
        proposal = obs.ready if abs(ratio - 1) <= config.tolerance else math.ceil(obs.ready * ratio)
        terms.append(Term(signal, value, target, proposal))
    # The percentile lags both ways: it sees a request only once scheduled, and remembers it for the rate
    # window after the queue has drained. So it may hold replicas, but never asks for more than the
    # current queue (oldest wait, waiting requests) does.
    now = [t.proposal for t in terms if t.signal in (OLDEST_WAIT, WAITING_PER_REPLICA)]
    return [
        Term(t.signal, t.value, t.target, min(t.proposal, max(obs.ready, *now)))
        if t.signal == QUEUE_TIME and now
        else t
        for t in terms
    ]


def _decision(
    config: ScalingConfig,
    obs: Observation,
    desired: int,
    terms: tuple[Term, ...],
    reason: str,
    conditions: tuple[Condition, ...],
) -> Decision:
    act = config.mode == "active" and desired != obs.replicas
    if config.mode == "dryRun":
        reason += "; dry run: not applied"
    return Decision(obs.now, obs.replicas, desired, terms, reason, conditions, act)


def _verb(current: int, desired: int) -> str:
    if desired == current:
        return f"hold {current}"
    return f"scale {'up' if desired > current else 'down'} {current}->{desired}"


def _scaling_limited(obs: Observation) -> Condition | None:
    if not obs.unschedulable:
        return None
    # "Insufficient nvidia.com/gpu" -> InsufficientNvidiaComGpu (a condition reason is CamelCase).
    match = re.search(r"Insufficient ([\w./-]+)", obs.unschedulable_reason)
    words = re.split(r"[^A-Za-z0-9]+", match.group(1)) if match else []
    reason = "Insufficient" + "".join(w[:1].upper() + w[1:] for w in words) if match else "Unschedulable"
    message = f"{obs.unschedulable} pod(s) cannot be scheduled ({obs.unschedulable_reason}); scale-up stopped"
    return Condition("ScalingLimited", "True", reason, message)


def _range_condition(config: ScalingConfig, raw: int) -> Condition:
    if raw > config.max_replicas:
        return Condition("ScalingLimited", "True", "TooManyReplicas", f"wanted {raw}, max {config.max_replicas}")
    if raw < config.min_replicas:
        return Condition("ScalingLimited", "True", "TooFewReplicas", f"wanted {raw}, min {config.min_replicas}")
    return _within_range()


def _within_range() -> Condition:
    return Condition("ScalingLimited", "False", "DesiredWithinRange", "the desired count is within range")
