"""A small simulated cluster for driving the rollout state machine tick by tick: pods of each revision
become Ready `load_s` seconds after they are requested, as a model load would make them."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from kubeinfer_operator.rollout.analysis import Outcome, Verdict
from kubeinfer_operator.rollout.state_machine import (
    Command,
    Observation,
    RolloutDecision,
    RolloutEvent,
    RolloutSpec,
    RolloutState,
    analysis_window,
    reconcile,
)

PASS = Verdict(Outcome.PASS, "canary meets the SLO")
TTFT_FAIL = Verdict(
    Outcome.FAIL, "ttft_p95 breaks the SLO: canary 900ms, stable 200ms, SLO 500ms", "ttft_p95", 0.9, 0.5
)
INCONCLUSIVE = Verdict(
    Outcome.INCONCLUSIVE, "canary served 3 requests in the window, fewer than minRequests 50"
)


@dataclass
class SimCluster:
    spec: RolloutSpec
    desired: int = 4
    load_s: float = 120.0
    tick_s: float = 10.0
    now: float = 1_000_000.0
    target: str = "rev-a"
    state: RolloutState = field(default_factory=RolloutState)
    pods: dict[str, list[float]] = field(default_factory=dict)  # revision -> when each pod is Ready
    verdict: Callable[[tuple[float, float]], Verdict] = lambda window: PASS
    command: Command | None = None
    roundtrip_state: bool = False  # persist through JSON every tick, as an operator restart would
    events: list[RolloutEvent] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    history: list[RolloutDecision] = field(default_factory=list)

    def ready(self, revision: str | None) -> int:
        return sum(1 for ready_at in self.pods.get(revision or "", []) if ready_at <= self.now)

    def tick(self) -> RolloutDecision:
        window = analysis_window(self.spec, self.state, self.now)
        if window is not None:
            self.windows.append(window)
        obs = Observation(
            now=self.now,
            target_revision=self.target,
            desired_replicas=self.desired,
            ready={revision: self.ready(revision) for revision in self.pods},
            verdict=self.verdict(window) if window else None,
            command=self.command,
        )
        decision = reconcile(self.spec, self.state, obs)
        self.state = decision.state
        if self.roundtrip_state:
            self.state = RolloutState.from_status(json.loads(json.dumps(self.state.to_status())))
        self._apply(decision.state)
        self.events += decision.events
        self.history.append(decision)
        self.now += self.tick_s
        return decision

    def _apply(self, state: RolloutState) -> None:
        wanted = {state.stable_revision: state.stable_replicas, state.canary_revision: state.canary_replicas}
        self.pods = {rev: pods for rev, pods in self.pods.items() if wanted.get(rev, 0) > 0}
        for revision, count in wanted.items():
            if revision is None:
                continue
            pods = self.pods.setdefault(revision, [])
            del pods[count:]  # scale-down removes the newest pods first, as a ReplicaSet does
            pods += [self.now + self.load_s] * (count - len(pods))

    def run_until(self, done: Callable[[RolloutDecision], bool], max_ticks: int = 500) -> RolloutDecision:
        for _ in range(max_ticks):
            decision = self.tick()
            if done(decision):
                return decision
        raise AssertionError(f"not reached in {max_ticks} ticks; state {self.state}")

    def reasons(self) -> list[str]:
        return [e.reason for e in self.events]


def started(spec: RolloutSpec, **kwargs: object) -> SimCluster:
    """A cluster serving rev-a on `desired` Ready replicas, then asked for rev-b."""
    sim = SimCluster(spec, **kwargs)  # type: ignore[arg-type]
    sim.tick()
    sim.now += sim.load_s
    sim.tick()
    assert sim.ready("rev-a") == sim.desired
    sim.target = "rev-b"
    return sim
