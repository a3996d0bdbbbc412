"""The Canary rollout state machine: a pure function from (spec, persisted state, observations) to a decision.
(A RollingUpdate keeps no state between reconciles: rollout/rolling_update.py.)

The operator calls it on every reconcile tick::

    window = analysis_window(spec, state, now)          # is an analysis due, over which window?
    verdict = analyse(...) if window else None           # PromQL from queries.py, evaluated at window end
    decision = reconcile(spec, state, Observation(now, target_revision, desired, ready_by_revision,
                                                  verdict, command))
    # make it so: Deployment per revision (decision.state.stable_revision / canary_revision) at
    # decision.state.stable_replicas / canary_replicas (delete other revisions' Deployments),
    # router weights decision.state.canary_weight, status.rollout = decision.state.to_status(),
    # merge decision.conditions, emit decision.events.

Everything the machine needs to resume lives in `RolloutState`, which round-trips through plain JSON in
`status`; an operator restarted mid-step carries on from the same step, clock and failure count.

Manual controls (GitOps-friendly: the operator never writes them, so nothing fights a sync tool):
- pause/resume: `spec.rollout.paused: true|false`. Pausing freezes weights, replicas and every clock
  (step pause, progress deadline); resuming continues where it stopped. Abort works while paused;
  a promote waits for the resume.
- promote: annotation `serving.kubeinfer.dev/promote: "<canary revision>"` skips the remaining steps
  and analysis and hands all capacity to the canary (still gated on readiness).
- abort: annotation `serving.kubeinfer.dev/abort: "<canary revision>"` rolls back at once.
  Both are keyed by revision (status.canaryRevision), so a stale annotation never touches a later
  rollout and nobody needs to clear it. A rolled-back revision is not retried; roll out a new one
  (any change to the pod template) or revert the spec to the stable revision.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from kubeinfer_operator.conditions import Condition
from kubeinfer_operator.rollout.analysis import Outcome, Verdict
from kubeinfer_operator.rollout.capacity import Replicas, canary_replicas_for, hand_off, step_target

PROMOTE_ANNOTATION = "serving.kubeinfer.dev/promote"
ABORT_ANNOTATION = "serving.kubeinfer.dev/abort"
KEPT_VERDICTS = 5


class Phase(StrEnum):
    IDLE = "Idle"
    PROGRESSING = "Progressing"
    PROMOTING = "Promoting"
    PROMOTED = "Promoted"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"


class Command(StrEnum):
    PROMOTE = "promote"
    ABORT = "abort"


@dataclass(frozen=True)
class Step:
    weight: int
    pause_s: float


@dataclass(frozen=True)
class AnalysisSpec:
    interval_s: float = 60.0
    min_requests: int = 50
    failure_limit: int = 2


@dataclass(frozen=True)
class RolloutSpec:
    steps: tuple[Step, ...] = (Step(10, 300.0), Step(50, 300.0))
    analysis: AnalysisSpec = field(default_factory=AnalysisSpec)
    progress_deadline_s: float = 600.0
    max_surge: int = 1
    paused: bool = False

    def __post_init__(self) -> None:
        if not self.steps:
            raise ValueError("rollout.steps: a Canary rollout needs at least one step")
        for i, step in enumerate(self.steps):
            if not 0 < step.weight <= 100:
                raise ValueError(f"rollout.steps[{i}].weight: must be 1..100, got {step.weight}")
            if step.pause_s < 0:
                raise ValueError(f"rollout.steps[{i}].pause: must not be negative, got {step.pause_s}")
        if self.analysis.interval_s <= 0:
            raise ValueError(f"rollout.analysis.interval: must be positive, got {self.analysis.interval_s}")
        if self.analysis.min_requests < 0:
            raise ValueError(f"rollout.analysis.minRequests: must be >= 0, got {self.analysis.min_requests}")
        if self.analysis.failure_limit < 1:
            raise ValueError(
                f"rollout.analysis.failureLimit: must be >= 1, got {self.analysis.failure_limit}"
            )
        if self.max_surge < 0:
            raise ValueError(f"rollout.maxSurge: must be >= 0, got {self.max_surge}")


@dataclass(frozen=True)
class Observation:
    now: float  # seconds since the epoch
    target_revision: str  # the revision the spec asks for now (hash of the pod template)
    desired_replicas: int  # total serving replicas wanted (autoscaler or spec)
    ready: Mapping[str, int]  # Ready pods by revision (model loaded and warmed: the pods' readiness probe)
    verdict: Verdict | None = None  # the analysis `analysis_window` asked for, if it was due
    command: Command | None = None  # see command_from_annotations


@dataclass(frozen=True)
class _Tick:
    """An observation read against the state's revisions, once the target revision has been followed."""

    now: float
    desired_replicas: int
    stable_ready: int
    canary_ready: int
    verdict: Verdict | None
    command: Command | None

    @classmethod
    def of(cls, obs: Observation, state: RolloutState) -> _Tick:
        def ready(revision: str | None) -> int:
            return obs.ready.get(revision, 0) if revision is not None else 0

        return cls(
            obs.now,
            obs.desired_replicas,
            ready(state.stable_revision),
            ready(state.canary_revision),
            obs.verdict,
            obs.command,
        )


def command_from_annotations(annotations: Mapping[str, str], target_revision: str) -> Command | None:
    if annotations.get(ABORT_ANNOTATION) == target_revision:
        return Command.ABORT
    if annotations.get(PROMOTE_ANNOTATION) == target_revision:
        return Command.PROMOTE
    return None


@dataclass(frozen=True)
class Failure:
    reason: str
    message: str


@dataclass(frozen=True)
class RecordedVerdict:
    at: float
    step: int
    verdict: Verdict


@dataclass(frozen=True)
class RolloutState:
    phase: Phase = Phase.IDLE
    stable_revision: str | None = None
    canary_revision: str | None = None
    step_index: int = 0
    step_started_at: float | None = None  # when this step's weight took effect (canary ready)
    waiting_since: float | None = None  # since when the canary is short of ready replicas
    paused_at: float | None = None
    canary_weight: int = 0
    stable_replicas: int = 0
    canary_replicas: int = 0
    failed_analyses: int = 0
    last_analysis_at: float | None = None
    verdicts: tuple[RecordedVerdict, ...] = ()
    failure: Failure | None = None
    rolled_back_revision: str | None = None

    def to_status(self) -> dict[str, Any]:
        """Plain JSON for `status.rollout`, camelCase and RFC 3339 times; None fields left out."""
        data: dict[str, Any] = {
            "phase": str(self.phase),
            "stableRevision": self.stable_revision,
            "canaryRevision": self.canary_revision,
            "stepIndex": self.step_index,
            "stepStartedAt": _time(self.step_started_at),
            "waitingSince": _time(self.waiting_since),
            "pausedAt": _time(self.paused_at),
            "canaryWeight": self.canary_weight,
            "stableReplicas": self.stable_replicas,
            "canaryReplicas": self.canary_replicas,
            "failedAnalyses": self.failed_analyses,
            "lastAnalysisAt": _time(self.last_analysis_at),
            "verdicts": [{"at": _time(r.at), "step": r.step, **r.verdict.to_dict()} for r in self.verdicts],
            "failure": {"reason": self.failure.reason, "message": self.failure.message}
            if self.failure
            else None,
            "rolledBackRevision": self.rolled_back_revision,
        }
        return {k: v for k, v in data.items() if v is not None}

    @classmethod
    def from_status(cls, data: Mapping[str, Any] | None) -> RolloutState:
        if not data:
            return cls()
        failure = data.get("failure")
        return cls(
            phase=Phase(data.get("phase", Phase.IDLE)),
            stable_revision=data.get("stableRevision"),
            canary_revision=data.get("canaryRevision"),
            step_index=int(data.get("stepIndex", 0)),
            step_started_at=_parse_time(data.get("stepStartedAt")),
            waiting_since=_parse_time(data.get("waitingSince")),
            paused_at=_parse_time(data.get("pausedAt")),
            canary_weight=int(data.get("canaryWeight", 0)),
            stable_replicas=int(data.get("stableReplicas", 0)),
            canary_replicas=int(data.get("canaryReplicas", 0)),
            failed_analyses=int(data.get("failedAnalyses", 0)),
            last_analysis_at=_parse_time(data.get("lastAnalysisAt")),
            verdicts=tuple(
                RecordedVerdict(_parse_time(v["at"]) or 0.0, int(v["step"]), Verdict.from_dict(v))
                for v in data.get("verdicts", ())
            ),
            failure=Failure(failure["reason"], failure["message"]) if failure else None,
            rolled_back_revision=data.get("rolledBackRevision"),
        )


def _time(t: float | None) -> str | None:
    return None if t is None else datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def _parse_time(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text).timestamp()


@dataclass(frozen=True)
class RolloutEvent:
    type: str  # "Normal" | "Warning"
    reason: str
    message: str


@dataclass(frozen=True)
class RolloutDecision:
    state: RolloutState
    conditions: tuple[Condition, ...]
    events: tuple[RolloutEvent, ...]

    @property
    def weights(self) -> dict[str, int]:
        return {"stable": 100 - self.state.canary_weight, "canary": self.state.canary_weight}


def _current_step(spec: RolloutSpec, state: RolloutState) -> Step:
    # The steps may have been edited mid-rollout (they are not part of the revision): stay on the last one.
    return spec.steps[min(state.step_index, len(spec.steps) - 1)]


def analysis_window(spec: RolloutSpec, state: RolloutState, now: float) -> tuple[float, float] | None:
    """(start, end) of the analysis to run now, or None. Due every `interval` while a step runs, and once
    more when its pause ends. The window always starts when the step's weight took effect, so samples
    accumulate over the step and canary and stable are compared over exactly the same span."""
    if state.phase is not Phase.PROGRESSING or state.step_started_at is None or not spec.steps:
        return None
    if spec.paused or state.paused_at is not None:
        return None
    last = state.last_analysis_at or state.step_started_at
    pause_end = state.step_started_at + _current_step(spec, state).pause_s
    if now - last >= spec.analysis.interval_s or now >= pause_end > last:
        return state.step_started_at, now
    return None


def reconcile(spec: RolloutSpec, state: RolloutState, obs: Observation) -> RolloutDecision:
    events: list[RolloutEvent] = []
    state = _follow_target(spec, state, obs, events)
    if state.phase is Phase.PROGRESSING:  # the steps may have been edited mid-rollout
        state = replace(state, step_index=min(state.step_index, len(spec.steps) - 1))
    tick = _Tick.of(obs, state)
    if state.phase is Phase.PROGRESSING:
        state = _progressing(spec, state, tick, events)
    elif state.phase is Phase.PROMOTING:
        state = _promoting(spec, state, tick, events)
    elif state.phase is Phase.ROLLING_BACK:
        state = _rolling_back(state, tick, events)
    else:
        state = replace(state, stable_replicas=obs.desired_replicas, canary_replicas=0, canary_weight=0)
    # A promotion completing this tick renamed the tracks: read readiness against the new revisions.
    return RolloutDecision(state, _conditions(spec, state, _Tick.of(obs, state)), tuple(events))


def _follow_target(
    spec: RolloutSpec, state: RolloutState, obs: Observation, events: list[RolloutEvent]
) -> RolloutState:
    """Start, restart or cancel a rollout when the spec's revision changes."""
    target = obs.target_revision
    if state.stable_revision is None:
        events.append(RolloutEvent("Normal", "Deployed", f"serving first revision {target}"))
        return RolloutState(phase=Phase.IDLE, stable_revision=target)
    if target == state.stable_revision:
        if state.canary_revision is not None and state.phase is not Phase.ROLLING_BACK:
            events.append(
                RolloutEvent(
                    "Normal",
                    "RolloutCancelled",
                    f"spec is back at stable revision {target}: removing canary {state.canary_revision}",
                )
            )
            return replace(state, phase=Phase.ROLLING_BACK, canary_weight=0, failure=None, paused_at=None)
        if state.phase is Phase.ROLLED_BACK:
            return replace(state, phase=Phase.IDLE, failure=None, rolled_back_revision=None)
        return state
    if target == state.canary_revision or (
        state.phase is Phase.ROLLED_BACK and target == state.rolled_back_revision
    ):
        return state
    if state.canary_revision is not None:
        events.append(
            RolloutEvent(
                "Normal", "RolloutRestarted", f"revision {target} replaces canary {state.canary_revision}"
            )
        )
    plan = ", ".join(f"{s.weight}%" for s in spec.steps)
    events.append(
        RolloutEvent(
            "Normal",
            "RolloutStarted",
            f"canary {target} against stable {state.stable_revision}: steps {plan}, then promote",
        )
    )
    return RolloutState(
        phase=Phase.PROGRESSING,
        stable_revision=state.stable_revision,
        canary_revision=target,
        waiting_since=obs.now,
        stable_replicas=state.stable_replicas,
    )


def _hold_if_paused(
    spec: RolloutSpec, state: RolloutState, tick: _Tick, events: list[RolloutEvent]
) -> tuple[RolloutState, bool]:
    """(state, held). Pausing freezes everything; resuming shifts the clocks by the time spent paused."""
    if spec.paused:
        if state.paused_at is None:
            events.append(
                RolloutEvent("Normal", "RolloutPaused", f"rollout of {state.canary_revision} paused")
            )
            state = replace(state, paused_at=tick.now)
        return state, True
    if state.paused_at is None:
        return state, False
    paused_for = tick.now - state.paused_at

    def shift(t: float | None) -> float | None:
        return None if t is None else t + paused_for

    events.append(RolloutEvent("Normal", "RolloutResumed", f"resumed after {paused_for:.0f}s paused"))
    return replace(
        state,
        paused_at=None,
        step_started_at=shift(state.step_started_at),
        waiting_since=shift(state.waiting_since),
        last_analysis_at=shift(state.last_analysis_at),
    ), False


def _track_readiness(state: RolloutState, tick: _Tick, needed: int) -> RolloutState:
    if tick.canary_ready >= needed:
        return replace(state, waiting_since=None)
    return replace(state, waiting_since=state.waiting_since or tick.now)


def _deadline_message(spec: RolloutSpec, state: RolloutState, tick: _Tick, needed: int) -> str | None:
    if state.waiting_since is None or tick.now - state.waiting_since <= spec.progress_deadline_s:
        return None
    return (
        f"canary {state.canary_revision} has {tick.canary_ready}/{needed} ready replicas after "
        f"{tick.now - state.waiting_since:.0f}s (progress deadline {spec.progress_deadline_s:.0f}s, "
        f"model load time included)"
    )


def _progressing(
    spec: RolloutSpec, state: RolloutState, tick: _Tick, events: list[RolloutEvent]
) -> RolloutState:
    if tick.command is Command.ABORT:
        return _start_rollback(state, tick, "Aborted", f"aborted by annotation {ABORT_ANNOTATION}", events)
    state, held = _hold_if_paused(spec, state, tick, events)
    if held:
        return state
    if tick.command is Command.PROMOTE:
        events.append(
            RolloutEvent("Normal", "PromotedManually", f"{PROMOTE_ANNOTATION}: skipping remaining steps")
        )
        return _promoting(spec, replace(state, phase=Phase.PROMOTING, waiting_since=None), tick, events)

    step = _current_step(spec, state)
    desired, surge = tick.desired_replicas, spec.max_surge
    current = Replicas(state.stable_replicas, state.canary_replicas)
    moved = hand_off(desired, surge, step_target(step.weight, desired, surge), current, tick.canary_ready)
    state = replace(state, stable_replicas=moved.stable, canary_replicas=moved.canary)

    needed = canary_replicas_for(step.weight, desired)
    state = _track_readiness(state, tick, needed)
    if (message := _deadline_message(spec, state, tick, needed)) is not None:
        return _start_rollback(state, tick, "ProgressDeadlineExceeded", message, events)
    if state.step_started_at is None:
        if state.waiting_since is not None:
            return state  # the weight stays at the previous step's until this step's canary pods are Ready
        events.append(
            RolloutEvent(
                "Normal",
                "CanaryStep",
                f"step {state.step_index + 1}/{len(spec.steps)}: canary {state.canary_revision} "
                f"at {step.weight}% on {tick.canary_ready} ready replicas",
            )
        )
        return replace(state, step_started_at=tick.now, canary_weight=step.weight, last_analysis_at=None)

    if tick.verdict is not None:
        recorded = RecordedVerdict(tick.now, state.step_index, tick.verdict)
        state = replace(
            state, last_analysis_at=tick.now, verdicts=(*state.verdicts, recorded)[-KEPT_VERDICTS:]
        )
        if tick.verdict.outcome is Outcome.FAIL:
            failed = state.failed_analyses + 1
            state = replace(state, failed_analyses=failed)
            limit = spec.analysis.failure_limit
            events.append(
                RolloutEvent(
                    "Warning", "AnalysisFailed", f"analysis {failed}/{limit} failed: {tick.verdict.message}"
                )
            )
            if failed >= limit:
                return _start_rollback(state, tick, "AnalysisFailed", tick.verdict.message, events)

    if not _step_passed(spec, state, tick.now):
        return state
    if state.step_index + 1 < len(spec.steps):
        return replace(state, step_index=state.step_index + 1, step_started_at=None, last_analysis_at=None)
    events.append(RolloutEvent("Normal", "Promoting", f"canary {state.canary_revision} passed every step"))
    return replace(state, phase=Phase.PROMOTING, step_started_at=None, last_analysis_at=None)


def _step_passed(spec: RolloutSpec, state: RolloutState, now: float) -> bool:
    """The pause is over and the analysis run at or after its end passed."""
    if state.step_started_at is None or not state.verdicts:
        return False
    pause_end = state.step_started_at + _current_step(spec, state).pause_s
    last = state.verdicts[-1]
    return now >= pause_end and last.at >= pause_end and last.verdict.outcome is Outcome.PASS


def _promoting(
    spec: RolloutSpec, state: RolloutState, tick: _Tick, events: list[RolloutEvent]
) -> RolloutState:
    if tick.command is Command.ABORT:
        return _start_rollback(state, tick, "Aborted", f"aborted by annotation {ABORT_ANNOTATION}", events)
    state, held = _hold_if_paused(spec, state, tick, events)
    if held:
        return state
    desired = tick.desired_replicas
    current = Replicas(state.stable_replicas, state.canary_replicas)
    moved = hand_off(desired, spec.max_surge, Replicas(stable=0, canary=desired), current, tick.canary_ready)
    # Traffic follows ready capacity, so each replica carries an even share while they swap over.
    serving = tick.canary_ready + tick.stable_ready
    share = round(100 * tick.canary_ready / serving) if serving else state.canary_weight
    state = replace(
        state,
        stable_replicas=moved.stable,
        canary_replicas=moved.canary,
        canary_weight=max(state.canary_weight, share),
    )
    if tick.canary_ready >= desired and moved.stable == 0:
        events.append(
            RolloutEvent(
                "Normal",
                "Promoted",
                f"revision {state.canary_revision} is stable on {desired} replicas; "
                f"{state.stable_revision} removed",
            )
        )
        return RolloutState(
            phase=Phase.PROMOTED,
            stable_revision=state.canary_revision,
            stable_replicas=desired,
            canary_weight=0,
        )
    # A revision that passed analysis is not rolled back for want of GPUs: stable still serves, the
    # hand-off resumes when capacity appears, and Degraded says why it is stuck.
    state = _track_readiness(state, tick, moved.canary)
    message = _deadline_message(spec, state, tick, moved.canary)
    if message is not None and state.failure is None:
        events.append(RolloutEvent("Warning", "ProgressDeadlineExceeded", message))
    failure = Failure("ProgressDeadlineExceeded", message) if message else None
    return replace(state, failure=failure)


def _start_rollback(
    state: RolloutState, tick: _Tick, reason: str, message: str, events: list[RolloutEvent]
) -> RolloutState:
    revisions = f"{state.canary_revision} to {state.stable_revision}"
    events.append(RolloutEvent("Warning", "RollingBack", f"{reason}: rolling back {revisions}: {message}"))
    failing = replace(state, phase=Phase.ROLLING_BACK, failure=Failure(reason, message), paused_at=None)
    return _rolling_back(failing, tick, events)


def _rolling_back(state: RolloutState, tick: _Tick, events: list[RolloutEvent]) -> RolloutState:
    """Canary weight 0 and replicas 0 at once, stable back to full size; done once no canary pod is Ready."""
    state = replace(
        state, canary_weight=0, canary_replicas=0, stable_replicas=tick.desired_replicas, waiting_since=None
    )
    if tick.canary_ready > 0:
        return state
    if state.failure is None:  # a cancelled rollout (spec reverted): nothing went wrong
        return replace(state, phase=Phase.IDLE, canary_revision=None, step_index=0, step_started_at=None)
    events.append(
        RolloutEvent("Warning", "RolledBack", f"{state.canary_revision} rolled back: {state.failure.message}")
    )
    return replace(
        state,
        phase=Phase.ROLLED_BACK,
        canary_revision=None,
        rolled_back_revision=state.canary_revision,
        step_started_at=None,
    )


def _conditions(spec: RolloutSpec, state: RolloutState, tick: _Tick) -> tuple[Condition, ...]:
    degraded = (
        Condition("Degraded", "True", state.failure.reason, state.failure.message)
        if state.failure
        else Condition("Degraded", "False", "RolloutHealthy", "no rollout failure")
    )
    return _progress_condition(spec, state, tick), degraded


def _progress_condition(spec: RolloutSpec, state: RolloutState, tick: _Tick) -> Condition:
    canary = state.canary_revision
    match state.phase:
        case Phase.IDLE:
            return Condition("Progressing", "False", "Stable", f"serving revision {state.stable_revision}")
        case Phase.PROMOTED:
            return Condition(
                "Progressing", "False", "RolloutComplete", f"revision {state.stable_revision} promoted"
            )
        case Phase.ROLLED_BACK:
            return Condition(
                "Progressing", "False", "RolledBack", f"revision {state.rolled_back_revision} was rolled back"
            )
        case Phase.ROLLING_BACK:
            return Condition("Progressing", "True", "RollingBack", f"removing canary {canary}")
        case Phase.PROMOTING:
            message = (
                f"{tick.canary_ready}/{tick.desired_replicas} replicas of {canary} ready, "
                f"{state.stable_replicas} of {state.stable_revision} left, "
                f"canary weight {state.canary_weight}%"
            )
            return Condition("Progressing", "True", "Paused" if state.paused_at else "Promoting", message)
    step = _current_step(spec, state)
    where = f"step {state.step_index + 1}/{len(spec.steps)} ({step.weight}%), canary {canary}"
    if state.paused_at is not None:
        return Condition("Progressing", "True", "Paused", f"{where}: paused by spec.rollout.paused")
    if state.step_started_at is None or state.waiting_since is not None:
        needed = canary_replicas_for(step.weight, tick.desired_replicas)
        return Condition(
            "Progressing",
            "True",
            "WaitingForCanary",
            f"{where}: {tick.canary_ready}/{needed} canary replicas ready",
        )
    last = state.verdicts[-1].verdict if state.verdicts else None
    left = max(0.0, state.step_started_at + step.pause_s - tick.now)
    if last is not None and last.outcome is Outcome.INCONCLUSIVE and left == 0:
        return Condition("Progressing", "True", "AnalysisInconclusive", f"{where}: {last.message}")
    verdict = f"last analysis {last.outcome}" if last else "no analysis yet"
    if math.isinf(left):  # a step without a pause
        return Condition(
            "Progressing",
            "True",
            "WaitingForPromote",
            f"{where}: held until annotation {PROMOTE_ANNOTATION}={state.canary_revision}, {verdict}, "
            f"{state.failed_analyses}/{spec.analysis.failure_limit} failed",
        )
    return Condition(
        "Progressing",
        "True",
        "CanaryStep",
        f"{where}: {math.ceil(left)}s of pause left, {verdict}, "
        f"{state.failed_analyses}/{spec.analysis.failure_limit} failed",
    )
