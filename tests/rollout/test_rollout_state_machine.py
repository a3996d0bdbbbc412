"""Every transition of the rollout state machine, driven through a simulated cluster."""

from __future__ import annotations

from dataclasses import replace

import pytest
from rollout_sim import INCONCLUSIVE, PASS, TTFT_FAIL, SimCluster, started

from kubeinfer_operator.rollout.analysis import Outcome, Verdict
from kubeinfer_operator.rollout.state_machine import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    AnalysisSpec,
    Command,
    Phase,
    RolloutDecision,
    RolloutSpec,
    RolloutState,
    Step,
    command_from_annotations,
)

SPEC = RolloutSpec(
    steps=(Step(10, 60.0), Step(50, 60.0)),
    analysis=AnalysisSpec(interval_s=30.0, min_requests=50, failure_limit=2),
    progress_deadline_s=600.0,
    max_surge=1,
)


def condition(decision: RolloutDecision, type_: str) -> tuple[str, str, str]:
    c = next(c for c in decision.conditions if c.type == type_)
    return c.status, c.reason, c.message


def phase_is(*phases: Phase):
    return lambda d: d.state.phase in phases


def test_first_revision_is_served_as_stable_without_a_canary() -> None:
    sim = SimCluster(SPEC, desired=3)
    decision = sim.tick()
    assert decision.state.phase is Phase.IDLE
    assert (decision.state.stable_revision, decision.state.stable_replicas) == ("rev-a", 3)
    assert decision.weights == {"stable": 100, "canary": 0}
    assert sim.reasons() == ["Deployed"]
    assert condition(decision, "Progressing")[:2] == ("False", "Stable")
    assert condition(decision, "Degraded")[0] == "False"


def test_canary_gets_traffic_only_once_ready_then_steps_and_promotes() -> None:
    sim = started(SPEC, desired=4, load_s=120.0)
    decision = sim.tick()
    assert decision.state.phase is Phase.PROGRESSING
    assert (decision.state.canary_revision, decision.state.canary_replicas) == ("rev-b", 1)
    assert decision.weights == {"stable": 100, "canary": 0}
    assert condition(decision, "Progressing")[1] == "WaitingForCanary"

    weights_while_loading = []
    while sim.ready("rev-b") < 1:
        weights_while_loading.append(sim.tick().state.canary_weight)
    assert set(weights_while_loading) == {0}, "no traffic to a canary still loading its model"

    step1 = sim.tick()
    assert step1.state.canary_weight == 10
    step1_at = step1.state.step_started_at
    step2 = sim.run_until(lambda d: d.state.canary_weight == 50)
    assert step2.state.step_started_at - step1_at >= 60.0 + 120.0, "step 1's pause, then step 2's canary load"
    assert sim.windows[0][0] == step1_at, "analysis windows start when the step's weight took effect"

    promoted = sim.run_until(phase_is(Phase.PROMOTED))
    assert promoted.state.stable_revision == "rev-b" and promoted.state.canary_revision is None
    assert promoted.weights == {"stable": 100, "canary": 0}
    assert promoted.state.stable_replicas == 4
    assert sim.reasons() == [
        "Deployed",
        "RolloutStarted",
        "CanaryStep",
        "CanaryStep",
        "Promoting",
        "Promoted",
    ]
    assert condition(promoted, "Progressing")[:2] == ("False", "RolloutComplete")
    assert sim.tick().state.phase is Phase.PROMOTED
    assert set(sim.pods) == {"rev-b"}, "the old revision is gone"


def test_capacity_is_never_doubled_and_stable_shrinks_only_as_canary_takes_over() -> None:
    for desired, surge in [(1, 1), (2, 1), (4, 1), (5, 2), (3, 0)]:
        sim = started(replace(SPEC, max_surge=surge), desired=desired, load_s=40.0)
        sim.run_until(phase_is(Phase.PROMOTED))
        for decision in sim.history:
            s = decision.state
            assert s.stable_replicas + s.canary_replicas <= desired + surge, (desired, surge, s)
        promoting = [d.state for d in sim.history if d.state.phase is Phase.PROMOTING]
        stable_counts = [s.stable_replicas for s in promoting]
        assert stable_counts == sorted(stable_counts, reverse=True), (
            "stable only ever shrinks while promoting"
        )
        assert max(s.canary_weight for s in promoting) <= 100


def test_promotion_shifts_traffic_with_ready_capacity() -> None:
    sim = started(SPEC, desired=4, load_s=40.0)
    sim.run_until(phase_is(Phase.PROMOTED))
    promoting = [d.state.canary_weight for d in sim.history if d.state.phase is Phase.PROMOTING]
    assert promoting[0] >= 50 and promoting == sorted(promoting)
    assert len(set(promoting)) > 2, "weight moves in several steps as canary replicas replace stable ones"


def test_failed_analyses_roll_back_and_name_the_metric() -> None:
    sim = started(SPEC, desired=4, load_s=60.0)
    sim.verdict = lambda window: TTFT_FAIL
    first_fail = sim.run_until(lambda d: d.state.failed_analyses == 1)
    assert first_fail.state.phase is Phase.PROGRESSING, "one failure is below failureLimit 2"
    rolling_back = sim.run_until(phase_is(Phase.ROLLING_BACK, Phase.ROLLED_BACK))
    state = rolling_back.state
    assert (state.canary_weight, state.canary_replicas, state.stable_replicas) == (0, 0, 4)
    status, reason, message = condition(rolling_back, "Degraded")
    assert (status, reason) == ("True", "AnalysisFailed")
    assert "ttft_p95" in message and "900ms" in message and "500ms" in message
    warnings = [e for e in rolling_back.events if e.type == "Warning"]
    assert [e.reason for e in warnings][-2:] == ["AnalysisFailed", "RollingBack"]
    assert warnings[-1].message.startswith("AnalysisFailed: rolling back rev-b to rev-a: ttft_p95")

    rolled_back = sim.run_until(phase_is(Phase.ROLLED_BACK))
    assert rolled_back.state.rolled_back_revision == "rev-b" and rolled_back.state.canary_revision is None
    assert "RolledBack" in sim.reasons()
    for _ in range(5):  # the spec still says rev-b: it is not retried
        decision = sim.tick()
        assert decision.state.phase is Phase.ROLLED_BACK and decision.state.canary_replicas == 0
    assert condition(decision, "Degraded")[0] == "True"

    sim.target = "rev-c"
    decision = sim.tick()
    assert decision.state.phase is Phase.PROGRESSING and decision.state.canary_revision == "rev-c"
    assert condition(decision, "Degraded")[0] == "False"


def test_a_single_failure_below_the_limit_does_not_stop_the_rollout() -> None:
    sim = started(SPEC, load_s=30.0)
    verdicts = iter([TTFT_FAIL])
    sim.verdict = lambda window: next(verdicts, PASS)
    promoted = sim.run_until(phase_is(Phase.PROMOTED, Phase.ROLLING_BACK))
    assert promoted.state.phase is Phase.PROMOTED
    assert "AnalysisFailed" in sim.reasons()


def test_inconclusive_analysis_holds_the_step_until_a_human_promotes() -> None:
    sim = started(SPEC, load_s=30.0)
    sim.verdict = lambda window: INCONCLUSIVE
    sim.run_until(lambda d: d.state.canary_weight == 10)
    for _ in range(30):  # 300 s: five times the step's pause
        decision = sim.tick()
    assert (decision.state.phase, decision.state.step_index, decision.state.failed_analyses) == (
        Phase.PROGRESSING,
        0,
        0,
    )
    status, reason, message = condition(decision, "Progressing")
    assert (status, reason) == ("True", "AnalysisInconclusive") and "minRequests" in message

    sim.command = command_from_annotations({PROMOTE_ANNOTATION: "rev-b"}, sim.target)
    assert sim.command is Command.PROMOTE
    assert sim.tick().state.phase is Phase.PROMOTING
    assert sim.run_until(phase_is(Phase.PROMOTED)).state.stable_revision == "rev-b"


def test_a_step_without_a_pause_holds_for_the_promote_annotation() -> None:
    spec = replace(SPEC, steps=(Step(10, 60.0), Step(50, float("inf"))))
    sim = started(spec, load_s=30.0)
    sim.verdict = lambda window: PASS
    decision = sim.run_until(lambda d: d.state.canary_weight == 50)
    for _ in range(30):
        decision = sim.tick()
    assert (decision.state.phase, decision.state.step_index) == (Phase.PROGRESSING, 1)
    status, reason, message = condition(decision, "Progressing")
    assert (status, reason) == ("True", "WaitingForPromote") and f"{PROMOTE_ANNOTATION}=rev-b" in message
    sim.command = Command.PROMOTE
    assert sim.run_until(phase_is(Phase.PROMOTED)).state.stable_revision == "rev-b"


def test_abort_annotation_is_keyed_by_revision() -> None:
    assert command_from_annotations({ABORT_ANNOTATION: "rev-old"}, "rev-b") is None
    assert (
        command_from_annotations({ABORT_ANNOTATION: "rev-b", PROMOTE_ANNOTATION: "rev-b"}, "rev-b")
        is Command.ABORT
    )

    sim = started(SPEC, load_s=30.0)
    sim.run_until(lambda d: d.state.canary_weight == 10)
    sim.command = Command.ABORT
    decision = sim.tick()
    assert decision.state.phase is Phase.ROLLING_BACK and decision.state.canary_weight == 0
    assert condition(decision, "Degraded")[:2] == ("True", "Aborted")
    assert sim.run_until(phase_is(Phase.ROLLED_BACK)).state.stable_revision == "rev-a"


def test_pause_freezes_weights_replicas_and_clocks() -> None:
    sim = started(SPEC, load_s=30.0)
    step1 = sim.run_until(lambda d: d.state.canary_weight == 10)
    sim.tick()
    sim.spec = replace(SPEC, paused=True)
    paused = sim.tick()
    assert paused.state.paused_at is not None and "RolloutPaused" in sim.reasons()
    frozen = (paused.state.canary_weight, paused.state.stable_replicas, paused.state.canary_replicas)
    windows_before = len(sim.windows)
    for _ in range(60):  # ten minutes paused
        decision = sim.tick()
        assert (
            decision.state.canary_weight,
            decision.state.stable_replicas,
            decision.state.canary_replicas,
        ) == frozen
    assert len(sim.windows) == windows_before, "no analysis while paused"
    assert condition(decision, "Progressing")[1] == "Paused"

    sim.spec = SPEC
    resumed = sim.tick()
    assert "RolloutResumed" in sim.reasons()
    assert resumed.state.step_started_at == step1.state.step_started_at + 610.0
    step2 = sim.run_until(lambda d: d.state.step_index == 1)
    unpaused_time = step2.state.verdicts[-1].at - step1.state.step_started_at - 610.0
    assert 60.0 <= unpaused_time < 60.0 + 2 * sim.tick_s


def test_abort_works_while_paused() -> None:
    sim = started(replace(SPEC, paused=True), load_s=30.0)
    sim.tick()
    sim.command = Command.ABORT
    assert sim.tick().state.phase in (Phase.ROLLING_BACK, Phase.ROLLED_BACK)


def test_progress_deadline_rolls_back_a_canary_that_never_loads() -> None:
    sim = started(SPEC, load_s=10_000.0)
    rollout_started = sim.now
    decision = sim.run_until(phase_is(Phase.ROLLING_BACK, Phase.ROLLED_BACK))
    rolled_back_at = sim.now - sim.tick_s
    assert 600.0 < rolled_back_at - rollout_started <= 600.0 + sim.tick_s
    status, reason, message = condition(decision, "Degraded")
    assert (status, reason) == ("True", "ProgressDeadlineExceeded")
    assert "0/1 ready replicas after 610s" in message


def test_a_progress_deadline_longer_than_the_model_load_lets_a_slow_load_through() -> None:
    sim = started(replace(SPEC, progress_deadline_s=600 + 2 * 1433.6), load_s=1800.0, tick_s=60.0)
    assert sim.run_until(phase_is(Phase.PROMOTED, Phase.ROLLING_BACK)).state.phase is Phase.PROMOTED


def test_operator_restart_mid_step_resumes_where_it_was() -> None:
    steady, restarted = started(SPEC, load_s=50.0), started(SPEC, load_s=50.0, roundtrip_state=True)
    verdicts = [PASS, TTFT_FAIL, PASS, PASS, PASS, PASS, PASS, PASS]
    for sim in (steady, restarted):
        queue = iter(verdicts)
        sim.verdict = lambda window, queue=queue: next(queue, PASS)
    for _ in range(100):
        a, b = steady.tick(), restarted.tick()
        assert b.state == a.state and b.events == a.events and b.conditions == a.conditions
    assert restarted.state.phase is Phase.PROMOTED
    assert restarted.reasons().count("AnalysisFailed") == 1


def test_restart_from_serialized_status_mid_step() -> None:
    sim = started(SPEC, load_s=30.0)
    sim.run_until(lambda d: d.state.canary_weight == 50 and d.state.verdicts)
    status = sim.state.to_status()
    assert status["phase"] == "Progressing" and status["stepIndex"] == 1 and status["canaryWeight"] == 50
    assert status["stepStartedAt"].endswith("Z")
    restored = RolloutState.from_status(status)
    assert restored == sim.state
    assert RolloutState.from_status(None) == RolloutState()


def test_reverting_the_spec_cancels_the_rollout_without_degrading() -> None:
    sim = started(SPEC, load_s=30.0)
    sim.run_until(lambda d: d.state.canary_weight == 10)
    sim.target = "rev-a"
    decision = sim.tick()
    assert decision.state.phase is Phase.ROLLING_BACK and decision.state.canary_weight == 0
    assert "RolloutCancelled" in sim.reasons()
    idle = sim.run_until(phase_is(Phase.IDLE))
    assert condition(idle, "Degraded")[0] == "False"
    assert idle.state.canary_revision is None and idle.state.stable_replicas == 4


def test_a_newer_revision_replaces_the_canary_mid_rollout() -> None:
    sim = started(SPEC, load_s=30.0)
    sim.run_until(lambda d: d.state.canary_weight == 10)
    sim.target = "rev-c"
    decision = sim.tick()
    assert decision.state.canary_revision == "rev-c" and decision.state.canary_weight == 0
    assert decision.state.step_index == 0 and "RolloutRestarted" in sim.reasons()
    sim.tick()
    assert "rev-b" not in sim.pods
    assert sim.run_until(phase_is(Phase.PROMOTED)).state.stable_revision == "rev-c"


def test_promotion_stuck_on_capacity_reports_degraded_but_keeps_stable_serving() -> None:
    sim = started(SPEC, desired=2, load_s=30.0)
    sim.command = Command.PROMOTE
    sim.run_until(lambda d: d.state.phase is Phase.PROMOTING and sim.ready("rev-b") >= 1)
    sim.load_s = 10_000.0  # the next canary pod cannot be scheduled
    decision = sim.run_until(lambda d: d.state.failure is not None)
    assert decision.state.phase is Phase.PROMOTING
    assert condition(decision, "Degraded")[1] == "ProgressDeadlineExceeded"
    assert decision.state.stable_replicas >= 1 and sim.ready("rev-a") >= 1


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"steps": ()}, "rollout.steps"),
        ({"steps": (Step(0, 60.0),)}, r"rollout.steps\[0\].weight"),
        ({"steps": (Step(10, -1.0),)}, r"rollout.steps\[0\].pause"),
        ({"analysis": AnalysisSpec(failure_limit=0)}, "rollout.analysis.failureLimit"),
        ({"max_surge": -1}, "rollout.maxSurge"),
    ],
)
def test_invalid_spec_names_the_field(change: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        RolloutSpec(**change)


def test_verdict_history_is_bounded_and_serializable() -> None:
    sim = started(SPEC, load_s=30.0)
    sim.verdict = lambda window: Verdict(Outcome.INCONCLUSIVE, "few requests")
    sim.run_until(lambda d: len(sim.windows) >= 12)
    assert len(sim.state.verdicts) == 5
    assert RolloutState.from_status(sim.state.to_status()).verdicts == sim.state.verdicts


def test_editing_the_rollout_spec_mid_rollout_is_safe() -> None:
    sim = started(SPEC, load_s=30.0)
    sim.run_until(lambda d: d.state.step_index == 1)
    sim.spec = replace(SPEC, steps=(Step(20, 60.0),))
    decision = sim.tick()
    assert decision.state.step_index == 0 and decision.state.phase is Phase.PROGRESSING
    assert sim.run_until(phase_is(Phase.PROMOTED)).state.stable_revision == "rev-b"
