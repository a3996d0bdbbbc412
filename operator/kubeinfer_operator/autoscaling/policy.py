"""The scaling policy: a pure function from what was observed to how many replicas to run.

The core is the HPA's: desired = max over signals of ceil(ready x value / target), with a tolerance band,
stabilization windows over past recommendations and a bound on the scale-up rate. On top of it sit the
guards LLM serving needs (the operator research notes list the issues each one answers):
- a backlog is sized, not just noticed: the scale-up carries the arrival rate (requests served plus the
  queue's growth) and clears the backlog the new replicas will find within about one model load;
- capacity already there or on the way absorbs a backlog: no scale-up while replicas start, while the
  queue shrinks, or while the signal windows still show the capacity before the last change (no
  cascades on slow model loads);
- pods that cannot be scheduled stop scale-up and raise ScalingLimited naming the missing resource;
- scale-down is paced, and only to a count whose replicas stay under every target once the load moves
  onto them (KV use projected as it grows, with about the square of the load); a service not yet
  watched for a whole scale-down window does not scale down;
- no metrics holds the current count (never "zero load, drop to min");
- optional headroom runs a fixed fraction more than the signals ask for, to absorb bursts while new
  replicas load (what it costs: benchmarks/autoscaling_sim.py).
The state the stabilization needs is returned, not kept: the caller persists it (plain JSON).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from kubeinfer_operator.conditions import Condition

# Signal names, as fetched (signals.py) and as recorded in decisions.
QUEUE_TIME = "queue_time_p95_s"  # p95 of time from arrival to first scheduling, short window
OLDEST_WAIT = "oldest_wait_s"  # age of the oldest request still waiting (no histogram lag)
KV_USAGE = "kv_usage"  # KV-cache usage 0..1, averaged over replicas
WAITING = "waiting"  # waiting requests, summed over replicas (fetched)
WAITING_PER_REPLICA = "waiting_per_replica"  # WAITING / ready replicas (what is compared to its target)
SERVED = "served_rps"  # requests finished per second, summed over replicas, short window (fetched)
BACKLOG = "backlog"  # the queue new replicas will find when they serve (derived: see _backlog)
# The fast demand signal: requests arriving per second as the router counts them where they queue, read
# every few seconds (not through Prometheus scrapes and rate windows).
ARRIVALS = "arrivals_rps"  # over the last ARRIVALS_WINDOW_S (fetched)
ARRIVALS_MINUTE = "arrivals_minute_rps"  # over the last minute: the level, with half the noise (fetched)
ARRIVALS_WINDOW_S = 15.0
# A short-window rate further than this many standard deviations of Poisson noise from the minute's is a
# change of load, followed at once; nearer, the minute's rate is used. 2.5: about one false alarm an hour
# at a read every 5 s (2 gave one every few minutes, each a replica loaded for nothing).
CHANGE_Z = 2.5
DEMAND = "demand_rps"  # the arrival rate over requests_per_replica (derived: see _terms)
SIZED = (BACKLOG, DEMAND)  # terms in replicas that count those on the way: not held back while they start
QUEUE_SIGNALS = (QUEUE_TIME, OLDEST_WAIT, WAITING_PER_REPLICA)  # say that requests wait, not how many
# Replicas sized for a backlog carry the arrival rate at this share of what saturated replicas serve, the
# level the default targets hold (the simulation's KV target is measured at 85%): load that keeps growing
# while they load does not queue again the moment the backlog clears.
BACKLOG_UTILIZATION = 0.85


@dataclass(frozen=True)
class Targets:
    """Per-replica targets; None switches a signal off.

    The defaults suit a 1 s TTFT objective: a quarter of it for the queue-time p95, half for the oldest
    wait, the rest for prefill. KV use climbs steeply near saturation on an engine whose step time grows
    with the batch: on this repo's engine (CPU), 0.47 is 85% of full-batch throughput
    (benchmarks/autoscaling_sim.py measures it), so 0.5 leaves headroom where 0.7 would leave ~7%.
    """

    queue_time_p95_s: float | None = 0.25
    oldest_wait_s: float | None = 0.5
    kv_usage: float | None = 0.5
    waiting_per_replica: float | None = 2.0

    def items(self) -> list[tuple[str, float]]:
        return [(name, t) for name, t in vars(self).items() if t is not None]


@dataclass(frozen=True)
class Predictive:
    """A floor from forecast arrivals (autoscaling/forecast.py): at least the replicas the arrivals expected
    one model load ahead need, so that load that repeats or keeps rising finds its replicas loaded; the
    reactive signals add replicas above it. dryRun records the floor it would apply without applying it."""

    mode: Literal["active", "dryRun"] = "active"

    def __post_init__(self) -> None:
        if self.mode not in ("active", "dryRun"):
            raise ValueError(f"scaling.predictive.mode must be 'active' or 'dryRun' (got {self.mode!r})")


@dataclass(frozen=True)
class ScalingConfig:
    min_replicas: int = 1
    max_replicas: int = 10
    targets: Targets = field(default_factory=Targets)
    tolerance: float = 0.1
    scale_up_window_s: float = 0.0  # scale up to the lowest recommendation over this window
    # Scale down to the highest recommendation over this window (the HPA's five minutes). A replica removed
    # and needed again costs a model load and the requests that queue meanwhile: in the simulation, three
    # minutes saved 4-7% of replica-seconds but lost 10 points of attainment on bursts.
    scale_down_window_s: float = 300.0
    # Windowed signals (queue-time rate, KV average) describe the old capacity, or the saturated replicas of
    # a backlog, for about this long after the ready count changes or a backlog drains: no scaling the same
    # way meanwhile (after a scale-down, scale-up stays free).
    settle_s: float = 60.0
    # Per decision, grow to at most max(current x factor, current + pods) (the HPA's default behaviour).
    max_scale_up_factor: float = 2.0
    max_scale_up_pods: int = 4
    # Per decision, remove at most this fraction (at least one replica): the check that the survivors stay
    # under target is a projection, and queueing rises faster than any projection near saturation.
    max_scale_down_fraction: float = 0.25
    # About how long a new replica takes to serve (its model load): a scale-up for a backlog clears, within
    # this long, the queue the new replicas will find, which has grown for this long meanwhile.
    drain_s: float = 60.0
    # Extra capacity on top of what the signals ask for, as a fraction (Knative's target-burst-capacity
    # plays this part): 0.5 runs 50% more replicas, so a burst is served while new replicas still load.
    headroom: float = 0.0
    mode: Literal["active", "dryRun"] = "active"
    # Requests/s one replica carries at the targets, when known (a load test, `kubeinfer backtest`): with
    # the router's arrival counts it sizes the count from the arrival rate as the simulation's reactive
    # bound does, and it turns the forecast into the predictive floor.
    requests_per_replica: float | None = None
    predictive: Predictive | None = None  # None: reactive only

    def __post_init__(self) -> None:
        def require(ok: bool, name: str, what: str) -> None:
            if not ok:
                raise ValueError(f"scaling.{name} {what} (got {getattr(self, name)!r})")

        require(self.min_replicas >= 0, "min_replicas", "must be >= 0")
        require(self.max_replicas >= max(1, self.min_replicas), "max_replicas", "must be >= 1 and >= min")
        require(0 <= self.tolerance < 1, "tolerance", "must be in [0, 1)")
        for window in ("scale_up_window_s", "scale_down_window_s", "settle_s"):
            require(getattr(self, window) >= 0, window, "must be >= 0")
        require(self.drain_s > 0, "drain_s", "must be > 0")
        require(self.headroom >= 0, "headroom", "must be >= 0")
        require(self.max_scale_up_factor >= 1, "max_scale_up_factor", "must be >= 1")
        require(self.max_scale_up_pods >= 1, "max_scale_up_pods", "must be >= 1")
        require(0 < self.max_scale_down_fraction <= 1, "max_scale_down_fraction", "must be in (0, 1]")
        require(self.mode in ("active", "dryRun"), "mode", "must be 'active' or 'dryRun'")
        rpr = self.requests_per_replica
        require(rpr is None or rpr > 0, "requests_per_replica", "must be > 0")
        require(self.predictive is None or rpr is not None, "requests_per_replica", "is needed by predictive")
        for name, target in vars(self.targets).items():
            if target is not None and not target > 0:
                raise ValueError(f"scaling.targets.{name} must be > 0 (got {target!r})")
        if not self.targets.items():
            raise ValueError("scaling.targets must enable at least one signal")


@dataclass(frozen=True)
class Observation:
    now: float  # seconds (epoch or any origin, the same across calls)
    replicas: int  # the owned Deployment's spec.replicas
    ready: int
    starting: int = 0  # created, schedulable, not Ready yet (loading the model)
    # Seconds each starting replica has been starting, where known: how soon it will serve (see _backlog).
    starting_ages: tuple[float, ...] = ()
    unschedulable: int = 0
    unschedulable_reason: str = ""  # the scheduler's message, e.g. "Insufficient nvidia.com/gpu"
    signals: Mapping[str, float] | None = None  # None: metrics unavailable
    metrics_error: str = ""
    # Arrivals per second forecast one model load ahead (forecast.py), for config.predictive; None: none.
    forecast_rps: float | None = None


@dataclass(frozen=True)
class ScalingState:
    """What the policy remembers between decisions; round-trips through plain JSON (to_dict/from_dict)."""

    recommendations: tuple[tuple[float, int], ...] = ()  # (time, replicas), for the stabilization windows
    watching_since: float | None = None  # first decision with data: no scale-down before a full window
    last_waiting: float | None = None  # at the last decision: is the queue growing or draining?
    last_ready: int | None = None  # at the last decision: did the ready count change?
    hold_up_until: float = 0.0  # settling: see ScalingConfig.settle_s
    hold_down_until: float = 0.0
    last_time: float | None = None  # of the last decision with data: how fast the queue grows

    def to_dict(self) -> dict[str, Any]:
        return {
            "recommendations": [[t, n] for t, n in self.recommendations],
            "watchingSince": self.watching_since,
            "lastWaiting": self.last_waiting,
            "lastReady": self.last_ready,
            "holdUpUntil": self.hold_up_until,
            "holdDownUntil": self.hold_down_until,
            "lastTime": self.last_time,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScalingState:
        def get(key: str, kind: type) -> Any:
            return None if data.get(key) is None else kind(data[key])

        try:
            return cls(
                tuple((float(t), int(n)) for t, n in data.get("recommendations", [])),
                get("watchingSince", float),
                get("lastWaiting", float),
                get("lastReady", int),
                get("holdUpUntil", float) or 0.0,
                get("holdDownUntil", float) or 0.0,
                get("lastTime", float),
            )
        except (TypeError, ValueError) as e:
            raise ValueError(
                f"scaling state: want recommendations [[time, replicas], ...] and numbers: {e}"
            ) from e


@dataclass(frozen=True)
class Term:
    signal: str
    value: float
    target: float
    proposal: int


@dataclass(frozen=True)
class Decision:
    time: float
    current: int
    desired: int
    terms: tuple[Term, ...]
    reason: str
    conditions: tuple[Condition, ...]
    act: bool  # write desired to the Deployment (False when unchanged or in dryRun)
    floor: int | None = None  # replicas the forecast needs (config.predictive), applied or, in dryRun, not

    @property
    def driver(self) -> Term | None:
        """The signal asking for the most replicas."""
        return max(self.terms, key=lambda t: t.proposal, default=None)


def decide(config: ScalingConfig, obs: Observation, state: ScalingState) -> tuple[Decision, ScalingState]:
    current = obs.replicas
    limited = _unschedulable(obs)
    keep = max(config.scale_up_window_s, config.scale_down_window_s)
    recent = tuple(r for r in state.recommendations if r[0] > obs.now - keep)

    def hold(why: str, metrics: Condition) -> tuple[Decision, ScalingState]:
        desired = _clamp(config, current)
        conditions = (metrics, limited or _within_range())
        decision = _decision(config, obs, desired, (), f"{_verb(current, desired)}: {why}", conditions)
        return decision, replace(state, recommendations=recent)

    if obs.signals is None:
        unavailable = Condition("MetricsAvailable", "False", "MetricsUnavailable", obs.metrics_error)
        return hold(f"metrics unavailable ({obs.metrics_error})", unavailable)
    available = Condition("MetricsAvailable", "True", "SignalsRead", f"read {len(obs.signals)} signals")
    if obs.ready == 0:
        return hold("no ready replica to measure load on", available)
    terms = _terms(config, obs, _growth(obs, state))
    if not terms:
        return hold("no signal has data", available)

    raw = max(t.proposal for t in terms)
    recommendation = _clamp(config, raw)
    watching_since = obs.now if state.watching_since is None else state.watching_since
    after, absorbed = _remember(config, obs, state)
    if _known(terms) and max(terms, key=lambda t: t.proposal).signal in SIZED:
        # Sized from the arrivals with a known capacity, counting what is on the way: replicas still
        # starting and the signal windows' lag after a change do not bias the count, so they hold nothing.
        absorbed = ""
    notes: list[str] = []
    if recommendation > current and absorbed:
        recommendation = current  # recorded as such: the scale-up window then holds it back too
        notes.append(f"scale-up held: {absorbed}")
    history = (*recent, (obs.now, recommendation))
    up = min(n for t, n in history if t > obs.now - config.scale_up_window_s or t == obs.now)
    down = max(n for t, n in history if t > obs.now - config.scale_down_window_s or t == obs.now)
    if watching_since > obs.now - config.scale_down_window_s:
        down = max(down, current)  # not watched a whole window yet (new service, lost state): no scale-down
    desired = up if up > current else down if down < current else current
    if recommendation > current and desired == current:
        notes.append(f"scale-up stabilizing ({config.scale_up_window_s:g}s window)")
    if recommendation < current and desired > recommendation:
        notes.append(f"scale-down stabilizing ({config.scale_down_window_s:g}s window)")
    desired = _limit(config, obs, after, terms, desired, notes)
    floor = _floor(config, obs)
    if floor is not None and floor > desired:
        assert config.predictive is not None and obs.forecast_rps is not None
        forecast = f"forecast {obs.forecast_rps:.3g} req/s needs {floor}"
        if config.predictive.mode == "active":
            desired = floor
            notes.append(f"{forecast}: floor applied")
        else:
            notes.append(f"{forecast}: floor not applied (predictive dryRun)")

    conditions = (available, limited or _range(config, raw))
    driver = max(terms, key=lambda t: t.proposal)
    if driver.signal == BACKLOG:
        why = f"backlog of {driver.value:.0f} requests to clear in {driver.target:g}s"
    elif driver.signal == DEMAND:
        why = f"demand {driver.value:.3g} req/s at {driver.target:.3g} req/s per replica"
    else:
        why = f"{driver.signal}={driver.value:.3g} (target {driver.target:g})"
    reason = "; ".join([f"{_verb(current, desired)}: {why} proposes {driver.proposal}", *notes])
    if config.headroom:
        reason += f"; headroom {config.headroom:.0%}"
    decision = replace(_decision(config, obs, desired, tuple(terms), reason, conditions), floor=floor)
    state = replace(after, recommendations=history, watching_since=watching_since, last_time=obs.now)
    return decision, state


def _growth(obs: Observation, state: ScalingState) -> float | None:
    """Requests per second the queue grew by since the last decision (negative: it drains)."""
    assert obs.signals is not None
    waiting, before, then = obs.signals.get(WAITING), state.last_waiting, state.last_time
    if waiting is None or before is None or then is None or obs.now <= then:
        return None
    return (waiting - before) / (obs.now - then)


def _remember(config: ScalingConfig, obs: Observation, state: ScalingState) -> tuple[ScalingState, str]:
    """The state after this observation, and why capacity already there or on the way will absorb the
    load the signals show ('' if it will not): adding replicas for a backlog that starting replicas, or a
    queue already shrinking, will clear is how slow model loads turn into scale-up cascades."""
    assert obs.signals is not None
    waiting, before = obs.signals.get(WAITING), state.last_waiting
    backlog = (config.targets.waiting_per_replica or 1.0) * obs.ready
    grew = state.last_ready is not None and obs.ready > state.last_ready
    shrank = state.last_ready is not None and obs.ready < state.last_ready
    if before is None or waiting is None:
        draining = growing = False
    else:
        draining = backlog < before > waiting
        # A backlog growing while the ready count stood still is new load: settling does not hold it back.
        growing = not grew and waiting > max(before * (1 + config.tolerance), backlog)
    settle_until = obs.now + config.settle_s
    after = replace(
        state,
        last_waiting=waiting,
        last_ready=obs.ready,
        hold_up_until=settle_until if grew or draining else state.hold_up_until,
        hold_down_until=settle_until if grew or shrank or draining else state.hold_down_until,
    )
    if obs.starting:
        return after, f"{obs.starting} replica(s) still starting"
    if draining:
        return after, f"queue draining ({before:g} -> {waiting:g} waiting)"
    if obs.now < after.hold_up_until and not growing:
        return after, "settling: the signal windows still show the capacity before the last change"
    return after, ""


def _limit(
    config: ScalingConfig,
    obs: Observation,
    after: ScalingState,
    terms: list[Term],
    desired: int,
    notes: list[str],
) -> int:
    """Apply the rate bound, unschedulable pods, settling and the safe scale-down check."""
    current = obs.replicas
    known = _known(terms)
    if desired > current:
        bound = max(math.ceil(current * config.max_scale_up_factor), current + config.max_scale_up_pods)
        if desired > bound:
            desired = bound
            notes.append(f"scale-up rate bound {bound}")
        if obs.unschedulable:
            desired = current
            notes.append(f"scale-up stopped: {obs.unschedulable} pod(s) unschedulable")
    if desired < current and known and (obs.starting or _queued(config, obs)):
        # The sizing counted the replicas on the way and the queue they will find: keep them until served.
        desired = current
        notes.append("scale-down held: replicas starting or a queue to serve")
    if desired < current and obs.now < after.hold_down_until and not known:
        desired = current
        notes.append("scale-down held: settling")
    if desired < current and not known:
        paced = min(max(desired, math.floor(current * (1 - config.max_scale_down_fraction))), current - 1)
        if paced > desired:
            desired = paced
            notes.append(f"scale-down paced to {paced}")
    if desired < current and desired < obs.ready:
        # Remove a ready replica only if the survivors, taking its load, stay inside the tolerance band.
        safe = max(
            t.proposal
            if t.signal in SIZED
            else math.ceil(obs.ready * _need(config, t.signal, t.value, t.target) / (1 - config.tolerance))
            for t in terms
            # Known capacity: the rate sizes the count; KV use and the windowed percentile only lag it.
            if not (known and t.signal in (KV_USAGE, QUEUE_TIME))
        )
        if safe > desired:
            desired = min(safe, current)
            notes.append(f"kept {desired} so the remaining replicas stay under every target")
    return _clamp(config, desired)


def _floor(config: ScalingConfig, obs: Observation) -> int | None:
    """Replicas the forecast arrivals need, within min/max; None without predictive or a forecast."""
    if config.predictive is None or obs.forecast_rps is None or not math.isfinite(obs.forecast_rps):
        return None
    assert config.requests_per_replica is not None  # ScalingConfig checks it
    return _clamp(config, math.ceil(obs.forecast_rps / config.requests_per_replica))


def _known(terms: list[Term]) -> bool:
    """Is the count sized from the arrival rate (requests_per_replica and the router's counts)?"""
    return any(t.signal == DEMAND for t in terms)


def _arrivals(recent: float | None, minute: float | None) -> float | None:
    """The arrival rate to size for: the minute's, unless the last seconds' differ from it by more than
    Poisson noise could (CHANGE_Z standard deviations): a change of load, to follow at once."""
    if recent is None or minute is None:
        return recent if minute is None else minute
    noise = CHANGE_Z * math.sqrt(max(minute, 1e-9) * ARRIVALS_WINDOW_S) / ARRIVALS_WINDOW_S
    return recent if abs(recent - minute) > noise else minute


def _queued(config: ScalingConfig, obs: Observation) -> bool:
    assert obs.signals is not None
    waiting = obs.signals.get(WAITING)
    return waiting is not None and waiting > (config.targets.waiting_per_replica or 2.0) * obs.ready


def _clamp(config: ScalingConfig, n: int) -> int:
    return min(max(n, config.min_replicas), config.max_replicas)


def _terms(config: ScalingConfig, obs: Observation, growth: float | None) -> list[Term]:
    assert obs.signals is not None
    values = {k: v for k, v in obs.signals.items() if v is not None and math.isfinite(v)}
    served, waiting = values.pop(SERVED, None), values.get(WAITING)
    arrivals = _arrivals(values.pop(ARRIVALS, None), values.pop(ARRIVALS_MINUTE, None))
    if waiting is not None:
        values[WAITING_PER_REPLICA] = values.pop(WAITING) / obs.ready
    terms = []
    for signal, target in config.targets.items():
        if signal not in values:
            continue  # e.g. no request scheduled in the window: the percentile is undefined
        need = _need(config, signal, values[signal], target)
        proposal = obs.ready if abs(need - 1) <= config.tolerance else math.ceil(obs.ready * need)
        terms.append(Term(signal, values[signal], target, proposal))
    # The percentile lags both ways: it sees a request only once scheduled, and remembers it for the rate
    # window after the queue has drained. So it may hold replicas, but never asks for more than the
    # current queue (oldest wait, waiting requests) does.
    live = [t.proposal for t in terms if t.signal in QUEUE_SIGNALS[1:]]
    terms = [
        replace(t, proposal=min(t.proposal, max(obs.ready, *live))) if t.signal == QUEUE_TIME and live else t
        for t in terms
    ]
    known = config.requests_per_replica is not None and arrivals is not None
    if known:
        assert config.requests_per_replica is not None and arrivals is not None
        need = arrivals / config.requests_per_replica * (1 + config.headroom)
        # The tolerance band holds a count against noise going down only: requests_per_replica already
        # leaves the headroom that a band would add going up.
        keep = obs.ready * (1 - config.tolerance) <= need <= obs.ready
        demand = Term(DEMAND, arrivals, config.requests_per_replica, obs.ready if keep else math.ceil(need))
        # KV use (a steep, noisy proxy for load near its target) and the windowed percentile (which lags)
        # describe the load the arrival rate measures directly: they no longer add or hold replicas.
        terms = [demand] + [
            replace(t, proposal=min(t.proposal, demand.proposal)) if t.signal in (KV_USAGE, QUEUE_TIME) else t
            for t in terms
        ]
    backlog = _backlog(config, obs, waiting, served, growth, known)
    if backlog is None:
        return terms
    # The queue signals say that requests wait, not how many replicas clear them: the backlog term sizes.
    cap = max(backlog.proposal, obs.ready)
    return [backlog] + [
        replace(t, proposal=min(t.proposal, cap)) if t.signal in QUEUE_SIGNALS else t for t in terms
    ]


def _need(config: ScalingConfig, signal: str, value: float, target: float) -> float:
    """Replicas a signal asks for per ready replica (before rounding and the tolerance band)."""
    ratio = value / target
    if signal == KV_USAGE and ratio < 1:
        # KV use grows about with the square of the load where the step time grows with the batch (0.20 at
        # 60% and 0.47 at 85% of full-batch throughput on this engine, benchmarks/autoscaling_sim.py):
        # projected linearly, a low reading would remove far too many replicas.
        ratio = math.sqrt(ratio)
    return ratio * (1 + config.headroom)


def _backlog(
    config: ScalingConfig,
    obs: Observation,
    waiting: float | None,
    served: float | None,
    growth: float | None,
    known: bool,
) -> Term | None:
    """Replicas to carry the arrival rate and clear, within drain_s of becoming ready, the queue new
    replicas will find. Replicas serving a backlog run at full batch: served / ready is their capacity
    (or, known, requests_per_replica at BACKLOG_UTILIZATION). Known, replicas still starting serve
    part of that queue first: one that has loaded for a seconds is ready about a seconds before a replica
    ordered now (an age not known counts as half a load)."""
    ready, horizon = obs.ready, config.drain_s
    band = (config.targets.waiting_per_replica or 2.0) * ready
    if waiting is None or served is None or growth is None or waiting <= band or served <= 0:
        return None
    capacity = served / ready
    coming = 0.0
    if known and config.requests_per_replica is not None:
        capacity = config.requests_per_replica / BACKLOG_UTILIZATION
        ages = [*obs.starting_ages[: obs.starting]]
        ages += [horizon / 2] * (obs.starting - len(ages))
        coming = capacity * sum(min(max(a, 0.0), horizon) for a in ages)
    found = max(waiting + max(growth, 0.0) * horizon - coming, 0.0)
    carry = (served + growth) / (capacity * BACKLOG_UTILIZATION)
    need = (carry + found / (capacity * config.drain_s)) * (1 + config.headroom)
    return Term(BACKLOG, found, config.drain_s, max(math.ceil(need), 0))


def _decision(
    config: ScalingConfig,
    obs: Observation,
    desired: int,
    terms: tuple[Term, ...],
    reason: str,
    conditions: tuple[Condition, ...],
) -> Decision:
    if config.mode == "dryRun":
        reason += "; dry run: not applied"
    act = config.mode == "active" and desired != obs.replicas
    return Decision(obs.now, obs.replicas, desired, terms, reason, conditions, act)


def _verb(current: int, desired: int) -> str:
    if desired == current:
        return f"hold {current}"
    return f"scale {'up' if desired > current else 'down'} {current}->{desired}"


def _unschedulable(obs: Observation) -> Condition | None:
    if not obs.unschedulable:
        return None
    # "Insufficient nvidia.com/gpu" -> InsufficientNvidiaComGpu (a condition reason is CamelCase).
    match = re.search(r"Insufficient ([\w./-]+)", obs.unschedulable_reason)
    words = re.split(r"[^A-Za-z0-9]+", match.group(1)) if match else []
    reason = "Insufficient" + "".join(w[:1].upper() + w[1:] for w in words) if match else "Unschedulable"
    message = f"{obs.unschedulable} pod(s) cannot be scheduled ({obs.unschedulable_reason}); scale-up stopped"
    return Condition("ScalingLimited", "True", reason, message)


def _range(config: ScalingConfig, raw: int) -> Condition:
    if raw > config.max_replicas:
        return Condition(
            "ScalingLimited", "True", "TooManyReplicas", f"wanted {raw}, max {config.max_replicas}"
        )
    if raw < config.min_replicas:
        return Condition(
            "ScalingLimited", "True", "TooFewReplicas", f"wanted {raw}, min {config.min_replicas}"
        )
    return _within_range()


def _within_range() -> Condition:
    return Condition("ScalingLimited", "False", "DesiredWithinRange", "the desired count is within range")
