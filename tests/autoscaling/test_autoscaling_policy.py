"""The scaling policy, one rule per test: what an operator reading status would check."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from kubeinfer_operator.autoscaling import (
    Decision,
    Observation,
    Predictive,
    ScalingConfig,
    ScalingState,
    Targets,
    decide,
)
from kubeinfer_operator.autoscaling.policy import BACKLOG, KV_USAGE, OLDEST_WAIT, QUEUE_TIME, SERVED, WAITING
from kubeinfer_operator.autoscaling.tick import decision_record

CONFIG = ScalingConfig(
    min_replicas=1,
    max_replicas=40,
    targets=Targets(queue_time_p95_s=0.5, oldest_wait_s=1.0, kv_usage=0.5, waiting_per_replica=2.0),
)
QUIET = {QUEUE_TIME: 0.05, OLDEST_WAIT: 0.0, KV_USAGE: 0.1, WAITING: 0.0}
WATCHED = ScalingState(watching_since=-10_000.0)  # has watched longer than the scale-down window


def observe(now: float = 0.0, replicas: int = 4, ready: int | None = None, **signals: float) -> Observation:
    return Observation(
        now=now, replicas=replicas, ready=replicas if ready is None else ready, signals=signals
    )


def test_within_the_tolerance_band_nothing_changes() -> None:
    inside, _ = decide(CONFIG, observe(**(QUIET | {KV_USAGE: 0.54})), ScalingState())  # 8% over target
    outside, _ = decide(CONFIG, observe(**(QUIET | {KV_USAGE: 0.56})), ScalingState())  # 12% over
    assert (inside.desired, inside.act) == (4, False)
    assert inside.reason.startswith("hold 4")
    assert (outside.desired, outside.act) == (5, True)


@pytest.mark.parametrize(
    ("signals", "term"),
    [
        ({QUEUE_TIME: 0.75}, QUEUE_TIME),
        ({OLDEST_WAIT: 1.5}, OLDEST_WAIT),
        ({KV_USAGE: 0.75}, KV_USAGE),
        ({WAITING: 12.0}, "waiting_per_replica"),  # 3 per ready replica against 2
    ],
)
def test_each_signal_scales_to_ready_times_value_over_target(signals: dict[str, float], term: str) -> None:
    decision, _ = decide(CONFIG, observe(**signals), ScalingState())
    assert decision.desired == 6  # ceil(4 x 1.5)
    assert decision.driver is not None and decision.driver.signal == term
    assert decision.reason.startswith(f"scale up 4->6: {term}=")


def test_the_signal_asking_most_wins() -> None:
    signals = QUIET | {KV_USAGE: 0.6, WAITING: 30.0}  # KV asks for 12, waiting (3 per replica) for 15
    decision, _ = decide(CONFIG, observe(replicas=10, **signals), ScalingState())
    assert decision.desired == 15
    assert {t.signal: t.proposal for t in decision.terms}[KV_USAGE] == 12
    assert decision_record(decision, CONFIG)["signal"] == "waitingPerReplica"


def test_desired_is_clamped_to_max_and_min_with_a_condition() -> None:
    high, _ = decide(
        replace(CONFIG, max_replicas=12), observe(replicas=10, **{WAITING: 200.0}), ScalingState()
    )
    assert high.desired == 12
    assert ("ScalingLimited", "True", "TooManyReplicas") in [
        (c.type, c.status, c.reason) for c in high.conditions
    ]

    low, _ = decide(
        replace(CONFIG, min_replicas=3), observe(replicas=3, **(QUIET | {KV_USAGE: 0.0})), WATCHED
    )
    assert low.desired == 3
    assert ("ScalingLimited", "True", "TooFewReplicas") in [
        (c.type, c.status, c.reason) for c in low.conditions
    ]


def test_scale_up_rate_is_bounded_by_double_or_plus_four() -> None:
    flood = QUIET | {OLDEST_WAIT: 30.0}
    small, _ = decide(CONFIG, observe(replicas=2, **flood), ScalingState())
    large, _ = decide(CONFIG, observe(replicas=10, **flood), ScalingState())
    assert (small.desired, large.desired) == (6, 20)  # +4 beats 2x for 2 replicas, 2x beats +4 for 10
    assert "rate bound" in large.reason


def test_scale_up_window_keeps_the_lowest_recent_recommendation() -> None:
    config = replace(CONFIG, scale_up_window_s=60)
    high = QUIET | {KV_USAGE: 1.0}
    state = ScalingState()
    first, state = decide(config, observe(now=0, **QUIET), state)
    second, state = decide(config, observe(now=30, **high), state)
    third, state = decide(config, observe(now=61, **high), state)
    assert (first.desired, second.desired, third.desired) == (4, 4, 8)
    assert "scale-up stabilizing" in second.reason


def test_scale_down_window_keeps_the_highest_recent_recommendation() -> None:
    busy, quiet = QUIET | {KV_USAGE: 0.5}, QUIET | {KV_USAGE: 0.02}
    state = WATCHED
    decisions = []
    config = replace(CONFIG, scale_down_window_s=180)
    for now, signals in [(0, busy), (60, quiet), (120, quiet), (181, quiet)]:
        decision, state = decide(config, observe(now=now, replicas=8, **signals), state)
        decisions.append(decision)
    assert [d.desired for d in decisions] == [8, 8, 8, 6]
    assert "scale-down stabilizing (180s window)" in decisions[2].reason
    assert "paced to 6" in decisions[3].reason  # KV asks for 2; at most a quarter goes per decision


def test_a_low_kv_reading_removes_replicas_as_its_square_root() -> None:
    # KV use grows about with the square of the load on a batching engine: a fifth of the target is 45%
    # of the load, so 8 -> 4 replicas (a linear projection would keep 2 and overload them).
    config = replace(CONFIG, max_scale_down_fraction=1.0)
    decision, _ = decide(config, observe(replicas=8, **(QUIET | {KV_USAGE: 0.1})), WATCHED)
    assert decision.desired == 4
    assert {t.signal: t.proposal for t in decision.terms}[KV_USAGE] == 4


def test_a_new_service_does_not_scale_down_before_watching_a_full_window() -> None:
    decision, state = decide(CONFIG, observe(now=0, replicas=8, **QUIET), ScalingState())
    later, _ = decide(CONFIG, observe(now=301, replicas=8, **QUIET), state)
    assert decision.desired == 8 and later.desired < 8


def test_replicas_still_starting_count_as_capacity_on_the_way() -> None:
    backlog = QUIET | {OLDEST_WAIT: 20.0, WAITING: 300.0}
    obs = replace(observe(replicas=8, ready=4, **backlog), starting=4)
    decision, state = decide(CONFIG, obs, ScalingState())
    assert decision.desired == 8 and not decision.act
    assert "scale-up held: 4 replica(s) still starting" in decision.reason
    assert state.recommendations[-1] == (0.0, 8)  # recorded as a hold, not as the backlog's proposal


def test_no_scale_up_for_a_backlog_that_is_draining_or_before_new_replicas_show_in_the_windows() -> None:
    state = ScalingState()
    _, state = decide(
        CONFIG, replace(observe(now=0, replicas=8, ready=4, **{WAITING: 300.0}), starting=4), state
    )
    ready, state = decide(CONFIG, observe(now=15, replicas=8, **{WAITING: 310.0, QUEUE_TIME: 9.0}), state)
    draining, state = decide(CONFIG, observe(now=30, replicas=8, **{WAITING: 200.0, KV_USAGE: 0.9}), state)
    settled, _ = decide(CONFIG, observe(now=91, replicas=8, **{WAITING: 210.0, KV_USAGE: 0.9}), state)
    assert (ready.desired, draining.desired) == (8, 8)
    assert "settling" in ready.reason and "queue draining (310 -> 200 waiting)" in draining.reason
    assert settled.desired == 16  # settled, and the queue stopped shrinking: the capacity is short


def test_a_queue_growing_at_a_steady_ready_count_is_not_held_by_settling() -> None:
    state = ScalingState()
    _, state = decide(CONFIG, observe(now=0, replicas=4, ready=3, **QUIET), state)
    _, state = decide(CONFIG, observe(now=15, replicas=4, **{WAITING: 20.0}), state)  # turned ready: settle
    grown, _ = decide(CONFIG, observe(now=30, replicas=4, **{WAITING: 40.0}), state)
    assert grown.desired == 8


def backlog(waiting_then: float, waiting_now: float, served: float, replicas: int = 8) -> Decision:
    """The decision 15 s after one that saw waiting_then requests queued."""
    _, state = decide(CONFIG, observe(now=0, replicas=replicas, **{WAITING: waiting_then}), ScalingState())
    signals = {WAITING: waiting_now, OLDEST_WAIT: 5.0, SERVED: served}
    return decide(CONFIG, observe(now=15, replicas=replicas, **signals), state)[0]


def test_a_growing_backlog_is_sized_to_carry_the_arrivals_and_clear_it_within_a_model_load() -> None:
    # 8 replicas serve 16 req/s (2 each); the queue grew 20 -> 50 in 15 s, so 18 req/s arrive. Within the
    # 60 s new replicas take it grows to 170 requests. To carry 18 req/s at 85% (10.6 replicas) and clear
    # 170 in 60 s (1.4 more): 13.
    decision = backlog(20.0, 50.0, served=16.0)
    assert decision.desired == 13
    assert decision.driver is not None and decision.driver.signal == BACKLOG
    assert decision.reason.startswith("scale up 8->13: backlog of 170 requests to clear in 60s proposes 13")
    record = decision_record(decision, CONFIG)  # as status.scalingDecisions shows it
    assert (record["signal"], record["value"], record["target"]) == ("backlog", "170", "1m")
    # The queue signals alone (5 s oldest wait against 1 s) would run into the rate bound.
    unsized, _ = decide(CONFIG, observe(replicas=8, **{WAITING: 50.0, OLDEST_WAIT: 5.0}), ScalingState())
    assert unsized.desired == 16


def test_a_standing_queue_that_does_not_grow_still_gets_a_replica() -> None:
    # Clients that wait for an answer before sending the next keep the queue level: it never drains.
    decision = backlog(20.0, 20.0, served=8.0, replicas=4)
    assert decision.desired == 5


def test_headroom_runs_that_much_more_than_the_signals_ask_for() -> None:
    at_target = QUIET | {KV_USAGE: 0.5}
    plain, _ = decide(CONFIG, observe(**at_target), ScalingState())
    spare, _ = decide(replace(CONFIG, headroom=0.5), observe(**at_target), ScalingState())
    assert (plain.desired, spare.desired) == (4, 6)
    assert spare.reason.endswith("headroom 50%")
    # Scale-down keeps it too: 6 replicas carrying that load read about half the KV use, which without
    # headroom would be 4 replicas' worth.
    settled = QUIET | {KV_USAGE: 0.25}
    plain, _ = decide(CONFIG, observe(replicas=6, **settled), WATCHED)
    spare, _ = decide(replace(CONFIG, headroom=0.5), observe(replicas=6, **settled), WATCHED)
    assert (plain.desired, spare.desired) == (5, 6)


def test_unschedulable_pods_stop_scale_up_and_name_the_resource() -> None:
    obs = replace(
        observe(replicas=6, ready=4, **(QUIET | {KV_USAGE: 1.0})),
        unschedulable=2,
        unschedulable_reason="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
    )
    decision, _ = decide(CONFIG, obs, ScalingState())
    limited = next(c for c in decision.conditions if c.type == "ScalingLimited")
    assert decision.desired == 6
    assert (limited.status, limited.reason) == ("True", "InsufficientNvidiaComGpu")
    assert "Insufficient nvidia.com/gpu" in limited.message and "2 pod(s)" in limited.message

    quiet, _ = decide(CONFIG, replace(obs, signals=QUIET), WATCHED)  # not stuck: scale-down still works
    assert quiet.desired < 6

    tainted, _ = decide(CONFIG, replace(obs, unschedulable_reason="1 node(s) had untolerated taint"), WATCHED)
    assert [c.reason for c in tainted.conditions if c.type == "ScalingLimited"] == ["Unschedulable"]


def test_scale_down_keeps_enough_replicas_to_stay_under_every_target() -> None:
    config = replace(CONFIG, max_scale_down_fraction=1.0)
    signals = QUIET | {KV_USAGE: 0.05, WAITING: 12.0}  # KV alone would allow 4; 1.2 waiting per replica
    decision, _ = decide(config, observe(replicas=10, **signals), WATCHED)
    # With the load moved onto 7 replicas, 12/7 = 1.7 waiting each stays under the band (2 x 0.9).
    assert decision.desired == 7
    assert "kept 7 so the remaining replicas stay under every target" in decision.reason


def test_an_idle_service_scales_all_the_way_down() -> None:
    idle = {OLDEST_WAIT: 0.0, KV_USAGE: 0.0, WAITING: 0.0}  # no requests: the percentile has no data
    state, replicas = WATCHED, 8
    for now in range(0, 1200, 15):
        decision, state = decide(CONFIG, observe(now=now, replicas=replicas, **idle), state)
        replicas = decision.desired
    assert replicas == CONFIG.min_replicas


def test_a_stale_queue_time_percentile_does_not_scale_up_once_nothing_waits() -> None:
    drained = QUIET | {QUEUE_TIME: 12.0}  # the last minute saw a backlog, the queue is empty now
    decision, _ = decide(CONFIG, observe(**drained), ScalingState())
    assert decision.desired == 4
    assert {t.signal: t.proposal for t in decision.terms}[QUEUE_TIME] == 4


def test_without_metrics_the_count_holds_and_metrics_available_is_false() -> None:
    obs = replace(
        observe(replicas=6), signals=None, metrics_error="Prometheus query failed: connection refused"
    )
    decision, state = decide(CONFIG, obs, WATCHED)
    available = next(c for c in decision.conditions if c.type == "MetricsAvailable")
    assert (decision.desired, decision.act) == (6, False)
    assert (available.status, available.reason) == ("False", "MetricsUnavailable")
    assert "connection refused" in available.message
    assert state == WATCHED  # an outage leaves no recommendation behind


def test_with_every_replica_still_loading_the_count_holds() -> None:
    obs = replace(observe(replicas=3, ready=0, **{WAITING: 50.0}), starting=3)
    decision, _ = decide(CONFIG, obs, WATCHED)
    assert (decision.desired, decision.act) == (3, False)
    assert "no ready replica" in decision.reason


def test_dry_run_decides_but_does_not_act() -> None:
    signals = QUIET | {KV_USAGE: 1.0}
    dry, _ = decide(replace(CONFIG, mode="dryRun"), observe(**signals), ScalingState())
    active, _ = decide(CONFIG, observe(**signals), ScalingState())
    assert (dry.desired, dry.act) == (8, False) and "dry run" in dry.reason
    assert (active.desired, active.act) == (8, True)


def test_state_round_trips_through_json_and_decides_the_same() -> None:
    state = ScalingState()
    for now, signals in [(0, QUIET), (15, QUIET | {WAITING: 30.0}), (30, QUIET | {KV_USAGE: 0.3})]:
        _, state = decide(CONFIG, observe(now=now, replicas=6, **signals), state)
    restored = ScalingState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored == state
    obs = observe(now=45, replicas=6, **(QUIET | {WAITING: 60.0}))
    assert decide(CONFIG, obs, restored) == decide(CONFIG, obs, state)
    with pytest.raises(ValueError, match="recommendations"):
        ScalingState.from_dict({"recommendations": [["soon", 3]]})


def test_bad_config_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"scaling\.max_replicas"):
        ScalingConfig(min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError, match=r"scaling\.targets\.kv_usage"):
        ScalingConfig(targets=Targets(kv_usage=0))
    with pytest.raises(ValueError, match=r"scaling\.mode"):
        ScalingConfig(mode="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"scaling\.headroom must be >= 0"):
        ScalingConfig(headroom=-0.1)
    with pytest.raises(ValueError, match=r"scaling\.drain_s must be > 0"):
        ScalingConfig(drain_s=0)


def test_decision_record_is_what_status_keeps() -> None:
    decision, _ = decide(CONFIG, observe(now=1234.5, **(QUIET | {KV_USAGE: 1.0})), ScalingState())
    record = decision_record(decision, CONFIG)
    assert record == {
        "time": "1970-01-01T00:20:34Z",
        "signal": "kvCacheUsage",
        "value": "1",
        "target": "0.5",
        "fromReplicas": 4,
        "toReplicas": 8,
        "reason": decision.reason,
    }
    assert json.loads(json.dumps(record)) == record


@pytest.mark.parametrize(
    ("signals", "replicas", "expected"),
    [
        ({QUEUE_TIME: 0.75}, 4, ("queueTimeP95", "750ms", "500ms")),  # seconds against seconds
        ({OLDEST_WAIT: 1.5}, 4, ("oldestWaitingAge", "1.5s", "1s")),
        ({KV_USAGE: 0.75}, 4, ("kvCacheUsage", "0.75", "0.5")),  # a ratio against a ratio
        ({WAITING: 12.0}, 4, ("waitingPerReplica", "3", "2")),  # requests per replica
        ({KV_USAGE: 1.0}, 30, ("maxReplicas", "60", "40")),  # asked for 60 replicas, the range allows 40
        ({KV_USAGE: 0.0, QUEUE_TIME: 0.0}, 1, ("minReplicas", "0", "1")),  # idle: asks for none
    ],
)
def test_decision_records_put_each_signal_in_its_own_unit(
    signals: dict[str, float], replicas: int, expected: tuple[str, str, str]
) -> None:
    decision, _ = decide(CONFIG, observe(replicas=replicas, **(QUIET | signals)), WATCHED)
    record = decision_record(decision, CONFIG)
    assert (record["signal"], record["value"], record["target"]) == expected, decision.reason


def test_a_scale_down_held_at_min_replicas_is_recorded_in_replicas_not_in_the_signal_unit() -> None:
    # 3 idle replicas, minReplicas 2: the signals ask for none, the range keeps 2. The record reads in
    # replicas ("0" against "2"), never "0ms against 500ms" under the name minReplicas.
    config = replace(CONFIG, min_replicas=2)
    decision, _ = decide(config, observe(replicas=3, **QUIET | {QUEUE_TIME: 0.0, KV_USAGE: 0.0}), WATCHED)
    record = decision_record(decision, config)
    assert decision.desired == 2
    assert (record["signal"], record["value"], record["target"]) == ("minReplicas", "0", "2")


PREDICTIVE = replace(CONFIG, requests_per_replica=2.0, predictive=Predictive())


def test_a_forecast_floor_adds_replicas_before_the_signals_ask() -> None:
    quiet = replace(observe(**QUIET), forecast_rps=19.0)  # 19 req/s at 2 per replica: 10 replicas
    decision, _ = decide(PREDICTIVE, quiet, WATCHED)
    assert (decision.desired, decision.floor, decision.act) == (10, 10, True)
    assert "forecast 19 req/s needs 10: floor applied" in decision.reason


def test_the_reactive_signals_add_above_the_floor_and_scale_down_stops_at_it() -> None:
    busy = replace(observe(**(QUIET | {KV_USAGE: 0.75})), forecast_rps=5.0)  # KV asks 6, the floor 3
    assert decide(PREDICTIVE, busy, WATCHED)[0].desired == 6
    idle = replace(observe(replicas=12, **QUIET), forecast_rps=15.0)  # quiet: would remove replicas
    decision, _ = decide(replace(PREDICTIVE, max_scale_down_fraction=1.0), idle, WATCHED)
    assert decision.desired == 8 and decision.floor == 8


def test_a_dry_run_floor_is_recorded_and_not_applied() -> None:
    config = replace(CONFIG, requests_per_replica=2.0, predictive=Predictive(mode="dryRun"))
    decision, _ = decide(config, replace(observe(**QUIET), forecast_rps=19.0), WATCHED)
    reactive, _ = decide(CONFIG, observe(**QUIET), WATCHED)
    assert (decision.desired, decision.floor) == (reactive.desired, 10)  # the reactive count, unchanged
    assert "floor not applied (predictive dryRun)" in decision.reason


def test_without_a_forecast_or_predictive_there_is_no_floor() -> None:
    assert decide(PREDICTIVE, observe(**QUIET), WATCHED)[0].floor is None
    assert decide(CONFIG, replace(observe(**QUIET), forecast_rps=19.0), WATCHED)[0].floor is None
    with pytest.raises(ValueError, match="requests_per_replica is needed by predictive"):
        replace(CONFIG, predictive=Predictive())
    with pytest.raises(ValueError, match="requests_per_replica must be > 0"):
        replace(CONFIG, requests_per_replica=0.0)
