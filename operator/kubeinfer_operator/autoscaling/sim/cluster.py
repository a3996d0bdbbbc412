"""A fixed-tick simulation of replicas behind a router, with Prometheus-style scrapes.

Each replica is an engine with iteration-level batching: up to max_batch sequences decode together, one
token each per step, and a step takes a + b x batch seconds. Admitted prompts are prefilled first, at
prefill_tok_s, stalling decode (a prefill-priority scheduler). The router keeps one FIFO queue and hands
the head to the least-loaded ready replica with a free slot (what least-outstanding-requests routing
approximates). New replicas take load_delay_s to load the model before they are ready; removed replicas
stop taking work and finish what they run. A replica costs from creation until it is gone.

Time advances in fixed ticks (0.1 s) rather than event by event: a tick is a few numpy operations over the
running sequences, which keeps an hour of up to 40 replicas near a second of CPU. Queue time resolves to
a tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kubeinfer_operator.autoscaling.sim.workload import Requests

NONE, STARTING, READY, DRAINING = 0, 1, 2, 3


@dataclass(frozen=True)
class ServerModel:
    # Calibrated on this repo's engine on CPU: ~10 ms per decode step at batch 1, ~35 ms at batch 16.
    step_base_s: float = 0.0083
    step_per_seq_s: float = 0.00167
    prefill_tok_s: float = 2400
    max_batch: int = 16
    kv_capacity_tokens: float = 16 * (256 + 128)  # max_batch sequences of average length fit
    load_delay_s: float = 60
    scrape_interval_s: float = 15
    rate_window_s: float = 60  # the [1m] of rate() under the queue-time percentile

    def step_s(self, batch: np.ndarray | float) -> np.ndarray | float:
        return self.step_base_s + self.step_per_seq_s * batch

    def work_s(self, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
        """Replica-seconds a request costs when the replica runs at full batch."""
        return prompt / self.prefill_tok_s + output * self.step_s(self.max_batch) / self.max_batch


@dataclass(frozen=True)
class Scrape:
    time: float
    waiting: int
    oldest_wait_s: float
    kv_usage: float  # mean over ready replicas; NaN when none is ready
    queue_time_p95_s: float  # NaN when nothing was scheduled in the rate window
    completed: int  # requests finished so far (a counter, as kubeinfer_requests_total)


class Policy(Protocol):
    def update(self, t: float, cluster: Cluster) -> int | None:
        """Called every tick; returns the replica count to run now, or None to leave it."""


@dataclass
class Result:
    ttft_s: np.ndarray  # per request; NaN when it never got its first token
    replica_s: float
    times: np.ndarray  # timeline, one point per second
    pods: np.ndarray  # replicas existing (what is paid for)
    ready: np.ndarray
    scale_events: int = 0

    def attainment(self, ttft_slo_s: float) -> float:
        return float(np.mean(np.nan_to_num(self.ttft_s, nan=np.inf) <= ttft_slo_s))


@dataclass
class Cluster:
    model: ServerModel
    requests: Requests
    max_replicas: int
    dt: float = 0.1
    status: np.ndarray = field(init=False)
    scrapes: list[Scrape] = field(default_factory=list)

    def __post_init__(self) -> None:
        slots = 2 * self.max_replicas + 8  # room for draining replicas next to a full set
        n = len(self.requests.arrival)
        self.status = np.zeros(slots, dtype=np.int8)
        self.ready_at = np.zeros(slots)
        self.prefill_backlog = np.zeros(slots)  # seconds of prefill queued on each replica
        self.run_rep = np.zeros(0, dtype=np.int64)  # running sequences: replica, tokens left, KV tokens
        self.run_left = np.zeros(0)
        self.run_kv = np.zeros(0)
        self.head = 0  # first request not yet admitted (the router's FIFO queue is head..arrived)
        self.arrived = 0
        self.completed = 0
        self.admit_t = np.full(n, np.nan)
        self.queue_s = np.full(n, np.nan)
        self.ttft_s = np.full(n, np.nan)
        self.t = 0.0

    # What autoscalers can see.
    @property
    def replicas(self) -> int:
        return int(np.count_nonzero((self.status == STARTING) | (self.status == READY)))

    @property
    def ready(self) -> int:
        return int(np.count_nonzero(self.status == READY))

    @property
    def starting(self) -> int:
        return int(np.count_nonzero(self.status == STARTING))

    @property
    def starting_ages(self) -> tuple[float, ...]:
        """Seconds each starting replica has been loading (the operator reads pods' creation times)."""
        created = self.ready_at[self.status == STARTING] - self.model.load_delay_s
        return tuple(float(self.t - c) for c in created)

    @property
    def waiting(self) -> int:
        return self.arrived - self.head

    @property
    def in_flight(self) -> int:
        return self.waiting + len(self.run_rep)

    @property
    def latest_scrape(self) -> Scrape | None:
        return self.scrapes[-1] if self.scrapes else None

    def scale_to(self, n: int) -> None:
        active = np.flatnonzero((self.status == STARTING) | (self.status == READY))
        if n > len(active):
            new = np.flatnonzero(self.status == NONE)[: n - len(active)]
            self.status[new] = STARTING
            self.ready_at[new] = self.t + self.model.load_delay_s
        elif n < len(active):
            # As a ReplicaSet does: not-ready pods first, newest first; then the ready ones with least work.
            running = np.bincount(self.run_rep, minlength=len(self.status))[active]
            order = np.lexsort((-self.ready_at[active], running, self.status[active] == READY))
            self.status[active[order[: len(active) - n]]] = DRAINING

    def run(
        self, policy: Policy, initial: int, until: float, warmup_s: float = 60, tail_s: float = 120
    ) -> Result:
        """Simulate [0, until) under policy, then tail_s more without arrivals to finish the queue.

        The policy watches from the start but acts only after warmup_s: the replicas start empty, which no
        running service does.
        """
        self.scale_to(initial)
        self.status[self.status == STARTING] = READY
        times, pods, ready, events = [], [], [], 0
        replica_s = 0.0
        next_scrape, next_sample = self.model.scrape_interval_s, 0.0
        for tick in range(int((until + tail_s) / self.dt)):
            self.t = t = tick * self.dt
            in_trace = t < until
            self.status[(self.status == STARTING) & (self.ready_at <= t)] = READY
            if in_trace:
                self.arrived = int(np.searchsorted(self.requests.arrival, t, side="right"))
            if t >= next_scrape:
                self.scrapes.append(self._scrape())
                next_scrape += self.model.scrape_interval_s
            if in_trace:
                desired = policy.update(t, self)
                if desired is not None and desired != self.replicas and t >= warmup_s:
                    self.scale_to(desired)
                    events += 1
            self._admit()
            self._advance()
            if in_trace:
                replica_s += np.count_nonzero(self.status) * self.dt
                if t >= next_sample:
                    times.append(t)
                    pods.append(np.count_nonzero(self.status))
                    ready.append(self.ready)
                    next_sample += 1.0
        return Result(self.ttft_s, replica_s, np.array(times), np.array(pods), np.array(ready), events)

    def _admit(self) -> None:
        if self.head == self.arrived:
            return
        ready = np.flatnonzero(self.status == READY)
        if not len(ready):
            return
        free = self.model.max_batch - np.bincount(self.run_rep, minlength=len(self.status))[ready]
        k = min(self.arrived - self.head, int(free.sum()))
        if k <= 0:
            return
        req = self.requests
        reps, kv, left = [], [], []
        for i in range(self.head, self.head + k):
            j = int(np.argmax(free))
            free[j] -= 1
            r = ready[j]
            self.prefill_backlog[r] += req.prompt[i] / self.model.prefill_tok_s
            self.queue_s[i] = self.t - req.arrival[i]
            self.ttft_s[i] = self.queue_s[i] + self.prefill_backlog[r]
            reps.append(r)
            kv.append(req.prompt[i])
            left.append(req.output[i])
        self.admit_t[self.head : self.head + k] = self.t
        self.head += k
        self.run_rep = np.concatenate([self.run_rep, reps])
        self.run_kv = np.concatenate([self.run_kv, kv])
        self.run_left = np.concatenate([self.run_left, left])

    def _advance(self) -> None:
        if len(self.run_rep):
            batch = np.bincount(self.run_rep, minlength=len(self.status))
            decode_s = self.dt - np.minimum(self.prefill_backlog, self.dt)  # prefill goes first
            tokens = (decode_s / self.model.step_s(batch))[self.run_rep]
            self.run_left -= tokens
            self.run_kv += tokens
            alive = self.run_left > 0
            self.completed += int(np.count_nonzero(~alive))
            self.run_rep, self.run_left, self.run_kv = (
                self.run_rep[alive],
                self.run_left[alive],
                self.run_kv[alive],
            )
        self.prefill_backlog = np.maximum(self.prefill_backlog - self.dt, 0)
        idle = np.bincount(self.run_rep, minlength=len(self.status)) == 0
        self.status[(self.status == DRAINING) & idle] = NONE

    def _scrape(self) -> Scrape:
        ready = self.status == READY
        kv = np.bincount(self.run_rep, weights=self.run_kv, minlength=len(self.status))[ready]
        admitted = self.admit_t[: self.head]
        lo = int(np.searchsorted(admitted, self.t - self.model.rate_window_s, side="right"))
        window = self.queue_s[lo : self.head]
        return Scrape(
            time=self.t,
            waiting=self.waiting,
            oldest_wait_s=self.t - self.requests.arrival[self.head] if self.waiting else 0.0,
            kv_usage=float(kv.mean() / self.model.kv_capacity_tokens) if len(kv) else math.nan,
            queue_time_p95_s=float(np.percentile(window, 95)) if len(window) else math.nan,
            completed=self.completed,
        )
