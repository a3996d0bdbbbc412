"""The autoscalers compared: ours (the operator's real policy), two field baselines and an oracle."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kubeinfer_operator.autoscaling import Observation, ScalingConfig, ScalingState, decide
from kubeinfer_operator.autoscaling.forecast import Smoothing, forecast
from kubeinfer_operator.autoscaling.policy import (
    ARRIVALS,
    ARRIVALS_MINUTE,
    ARRIVALS_WINDOW_S,
    KV_USAGE,
    OLDEST_WAIT,
    QUEUE_TIME,
    SERVED,
    WAITING,
)
from kubeinfer_operator.autoscaling.sim.cluster import STARTING, Cluster, Policy, Result, ServerModel
from kubeinfer_operator.autoscaling.sim.workload import Requests


class Every:
    """True once per interval: each autoscaler's own control loop period."""

    def __init__(self, interval_s: float, first_s: float = 0.0) -> None:
        self.interval_s, self.next_s = interval_s, first_s

    def due(self, t: float) -> bool:
        if t < self.next_s:
            return False
        self.next_s += self.interval_s
        return True


@dataclass
class Fixed:
    """No autoscaling: a steady load test, recording in-flight requests per replica each second."""

    replicas: int
    after_s: float = 120  # past the start-up transient
    in_flight: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sampler = Every(1.0, first_s=self.after_s)

    def update(self, t: float, cluster: Cluster) -> int | None:
        if self.sampler.due(t):
            self.in_flight.append(cluster.in_flight / self.replicas)
        return None


@dataclass
class Ours:
    """The operator's policy, fed what its timer would read from Prometheus (the latest scrape)."""

    config: ScalingConfig
    interval_s: float = 15
    state: ScalingState = field(default_factory=ScalingState)
    router: bool = False  # also read the router's arrival counts and queue at each decision (no scrape)
    history_step_s: float = 30  # of the forecaster's range query (as the operator's)
    season_s: float | None = None  # the traces are at most one season long: Holt's trend alone
    smoothing: Smoothing = field(default_factory=Smoothing)

    def __post_init__(self) -> None:
        self.timer = Every(self.interval_s, first_s=7)  # not aligned with the scrapes

    def update(self, t: float, cluster: Cluster) -> int | None:
        if not self.timer.due(t):
            return None
        obs = Observation(
            now=t,
            replicas=cluster.replicas,
            ready=cluster.ready,
            starting=cluster.starting,
            starting_ages=cluster.starting_ages,
            signals=self.signals(t, cluster, self.router),
            metrics_error="" if cluster.scrapes else "no scrape yet",
            forecast_rps=self.forecast(t, cluster) if self.config.predictive else None,
        )
        decision, self.state = decide(self.config, obs, self.state)
        return decision.desired

    def forecast(self, t: float, cluster: Cluster) -> float | None:
        """What the operator's range query gives the forecaster: arrivals per second in whole steps so far,
        forecast to one model load from now (a step's rate is centred on its middle)."""
        end = math.floor(t / self.history_step_s) * self.history_step_s
        arrivals = cluster.requests.arrival[: cluster.arrived]
        counts = np.bincount(
            (arrivals[arrivals < end] // self.history_step_s).astype(int),
            minlength=int(end / self.history_step_s),
        )
        horizon = t + cluster.model.load_delay_s - (end - self.history_step_s / 2)
        return forecast(
            counts / self.history_step_s, self.history_step_s, horizon, self.season_s, self.smoothing
        )

    @staticmethod
    def signals(t: float, cluster: Cluster, router: bool = False) -> dict[str, float] | None:
        """What signals.queries would return at time t; with `router`, the router's own counts too."""
        s = cluster.latest_scrape
        if s is None:
            return None
        kv = [x.kv_usage for x in cluster.scrapes[-8:] if x.time > t - 60 and not math.isnan(x.kv_usage)]
        old = next(x for x in cluster.scrapes if x.time >= s.time - 60)
        raw = {
            SERVED: (s.completed - old.completed) / (s.time - old.time) if s.time > old.time else math.nan,
            QUEUE_TIME: s.queue_time_p95_s,
            OLDEST_WAIT: s.oldest_wait_s,
            KV_USAGE: float(np.mean(kv)) if kv else math.nan,  # avg_over_time(...[1m])
            WAITING: s.waiting,
        }
        if router and t > 0:
            arrived = cluster.requests.arrival[: cluster.arrived]
            for signal, window in ((ARRIVALS, ARRIVALS_WINDOW_S), (ARRIVALS_MINUTE, 60.0)):
                count = len(arrived) - int(np.searchsorted(arrived, t - window))
                raw[signal] = count / min(window, t)
            # The router holds the queue: its length and oldest wait are read live too.
            raw[WAITING] = cluster.waiting
            raw[OLDEST_WAIT] = t - cluster.requests.arrival[cluster.head] if cluster.waiting else 0.0
        return {k: v for k, v in raw.items() if not math.isnan(v)}


@dataclass
class ConcurrencyTarget:
    """Knative's KPA, as KServe uses it: in-flight requests per pod averaged over a 60 s stable window,
    a 6 s panic window that scales up (never down) once it asks for 2x the ready pods, evaluated every 2 s."""

    target_per_pod: float
    min_replicas: int
    max_replicas: int
    stable_s: float = 60
    panic_s: float = 6
    panic_threshold: float = 2.0

    def __post_init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()
        self.sampler, self.timer = Every(1.0), Every(2.0)
        self.panic_until, self.panic_peak = -math.inf, 0

    def update(self, t: float, cluster: Cluster) -> int | None:
        if self.sampler.due(t):
            self.samples.append((t, cluster.in_flight))
            while self.samples[0][0] <= t - self.stable_s:
                self.samples.popleft()
        if not self.timer.due(t):
            return None
        stable = np.mean([c for _, c in self.samples])
        panic = np.mean([c for s, c in self.samples if s > t - self.panic_s])
        want_stable, want_panic = (
            math.ceil(stable / self.target_per_pod),
            math.ceil(panic / self.target_per_pod),
        )
        if want_panic >= self.panic_threshold * max(cluster.ready, 1):
            self.panic_until = t + self.stable_s
        if t < self.panic_until:
            self.panic_peak = desired = max(want_panic, want_stable, self.panic_peak, cluster.replicas)
        else:
            self.panic_peak = 0
            desired = max(want_stable, math.ceil(cluster.replicas / 2))  # max scale-down rate 2
        return min(max(desired, self.min_replicas), self.max_replicas)


@dataclass
class WaitingThreshold:
    """KEDA's Prometheus trigger on sum(num_requests_waiting) with AverageValue threshold, polled every
    30 s, driving an HPA (10% tolerance, max(2x, +4) scale-up, 300 s scale-down cooldown)."""

    threshold: float
    min_replicas: int
    max_replicas: int
    poll_s: float = 30
    cooldown_s: float = 300

    def __post_init__(self) -> None:
        self.timer = Every(self.poll_s, first_s=self.poll_s)
        self.history: deque[tuple[float, int]] = deque()

    def update(self, t: float, cluster: Cluster) -> int | None:
        if not self.timer.due(t):
            return None
        current, waiting = cluster.replicas, cluster.latest_scrape.waiting
        ratio = waiting / (self.threshold * current)
        rec = current if abs(ratio - 1) <= 0.1 else math.ceil(waiting / self.threshold)
        rec = min(max(rec, self.min_replicas), self.max_replicas)
        self.history.append((t, rec))
        while self.history[0][0] <= t - self.cooldown_s:
            self.history.popleft()
        if rec > current:
            return min(rec, max(2 * current, current + 4))
        return min(current, max(r for _, r in self.history))


@dataclass
class Oracle:
    """Knows every future request: runs the fewest replicas whose full-batch capacity, at utilization u,
    covers the work arriving in each 15 s bucket, ordering them load_delay ahead."""

    plan: np.ndarray  # replicas needed per bucket
    bucket_s: float
    load_delay_s: float

    def __post_init__(self) -> None:
        self.timer = Every(self.bucket_s)

    @classmethod
    def build(
        cls,
        requests: Requests,
        model: ServerModel,
        duration: float,
        utilization: float,
        min_replicas: int,
        bucket_s: float = 15,
    ) -> Oracle:
        buckets = math.ceil(duration / bucket_s)
        work = np.bincount(
            (requests.arrival // bucket_s).astype(int),
            weights=model.work_s(requests.prompt, requests.output),
            minlength=buckets,
        )[:buckets]
        plan = np.maximum(np.ceil(work / bucket_s / utilization), min_replicas).astype(int)
        return cls(plan, bucket_s, model.load_delay_s)

    def initial(self) -> int:
        return int(self.plan[:2].max())

    def update(self, t: float, cluster: Cluster) -> int | None:
        if not self.timer.due(t):
            return None
        k = int(t // self.bucket_s)
        # What is needed from the previous bucket (its requests still run) to one load delay from now.
        ahead = math.ceil(self.load_delay_s / self.bucket_s)
        return int(self.plan[max(k - 1, 0) : k + ahead + 1].max())


ORACLE_UTILIZATIONS = (0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.5, 0.4)


@dataclass(frozen=True)
class OracleRun:
    result: Result
    runs: int  # simulations it took


def cheapest_oracle(
    requests: Requests,
    model: ServerModel,
    seconds: float,
    ttft_slo_s: float,
    goal: float,
    run: Callable[[Policy, int], Result],
) -> OracleRun:
    """The oracle at the highest utilization (cheapest plan) that still meets the attainment goal, or the
    best one tried; `run(policy, initial)` simulates one."""
    best: Result | None = None
    for tried, u in enumerate(ORACLE_UTILIZATIONS, start=1):
        plan = Oracle.build(requests, model, seconds, u, min_replicas=1)
        result = run(plan, plan.initial())
        if result.attainment(ttft_slo_s) >= goal:
            return OracleRun(result, tried)
        if best is None or result.attainment(ttft_slo_s) > best.attainment(ttft_slo_s):
            best = result
    assert best is not None
    return OracleRun(best, len(ORACLE_UTILIZATIONS))


@dataclass
class ReactiveBound:
    """The most a policy can do that knows the present exactly but not the future. Each tick it sees the
    true arrival rate and the queue (no scrape, rate window or control period) and runs at once enough
    replicas for that rate at utilization u, plus enough to clear within one model load the backlog there
    will be when a replica ordered now is ready (replicas still loading counted from when they will be).
    New replicas still take the model load."""

    load: np.ndarray  # offered load per second, in replicas' worth
    replica_rps: float
    utilization: float
    min_replicas: int
    max_replicas: int

    def update(self, t: float, cluster: Cluster) -> int | None:
        rate = self.load[min(int(t), len(self.load) - 1)]
        delay = cluster.model.load_delay_s
        loading = cluster.ready_at[cluster.status == STARTING]
        # In replica-seconds of work: what waits, what arrives over one load, what the replicas serve by then.
        served = cluster.ready * delay + np.clip(t + delay - loading, 0, None).sum()
        backlog = cluster.waiting / self.replica_rps + rate * delay - served
        need = math.ceil(rate / self.utilization + max(backlog, 0.0) / delay)
        if need < cluster.replicas and (cluster.starting or cluster.waiting):
            return None  # the projection counts on the replicas it would cancel: keep them until served
        return min(max(need, self.min_replicas), self.max_replicas)
