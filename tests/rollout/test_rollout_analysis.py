"""Canary verdicts, the PromQL behind them, capacity hand-off and the traffic objects."""

from __future__ import annotations

import pytest

from kubeinfer_operator.rollout.analysis import (
    LatencyObjective,
    Outcome,
    SLOTargets,
    TrackMeasurement,
    analyse,
)
from kubeinfer_operator.rollout.capacity import Replicas, hand_off, step_target
from kubeinfer_operator.rollout.queries import measurement, track_queries
from kubeinfer_operator.rollout.traffic import router_config
from kubeinfer_runtime.router.config import parse_config

SLO = SLOTargets(
    latency=(LatencyObjective("ttft", 0.95, 0.5), LatencyObjective("tpot", 0.95, 0.06)),
    error_rate=0.01,
)


def track(requests: float = 500, errors: float = 0, ttft: float | None = 0.2, tpot: float | None = 0.03):
    return TrackMeasurement(requests, errors, {"ttft_p95": ttft, "tpot_p95": tpot})


def test_a_canary_replica_under_more_load_than_a_stable_one_is_held_to_the_slo_only() -> None:
    # 70% of the traffic on one canary replica, 30% on one stable replica: 2x slower is the load.
    busy_canary = TrackMeasurement(700, 0, {"ttft_p95": 0.4, "tpot_p95": 0.03}, replicas=1)
    quiet_stable = TrackMeasurement(300, 0, {"ttft_p95": 0.2, "tpot_p95": 0.03}, replicas=1)
    assert analyse(busy_canary, quiet_stable, SLO, min_requests=50).outcome is Outcome.PASS
    # The same latencies with the load spread evenly per replica: a regression.
    even_stable = TrackMeasurement(700, 0, {"ttft_p95": 0.2, "tpot_p95": 0.03}, replicas=1)
    assert analyse(busy_canary, even_stable, SLO, min_requests=50).outcome is Outcome.FAIL
    # Over the SLO fails whatever the load.
    slow = TrackMeasurement(700, 0, {"ttft_p95": 0.8, "tpot_p95": 0.03}, replicas=1)
    assert analyse(slow, quiet_stable, SLO, min_requests=50).outcome is Outcome.FAIL


def test_below_min_requests_is_inconclusive_not_pass() -> None:
    verdict = analyse(track(requests=49, ttft=0.1), track(), SLO, min_requests=50)
    assert verdict.outcome is Outcome.INCONCLUSIVE
    assert "49 requests" in verdict.message and "minRequests 50" in verdict.message


def test_canary_as_good_as_stable_passes() -> None:
    verdict = analyse(track(ttft=0.21), track(ttft=0.2), SLO, min_requests=50)
    assert verdict.outcome is Outcome.PASS
    assert "ttft_p95 210ms (stable 200ms)" in verdict.message


def test_breaking_the_slo_fails_naming_metric_and_values() -> None:
    verdict = analyse(track(ttft=0.9), track(ttft=0.2), SLO, min_requests=50)
    assert (verdict.outcome, verdict.metric, verdict.canary, verdict.reference) == (
        Outcome.FAIL,
        "ttft_p95",
        0.9,
        0.5,
    )
    assert "canary 900ms, stable 200ms, SLO 500ms" in verdict.message


def test_error_rate_over_target_fails() -> None:
    verdict = analyse(track(errors=25), track(errors=1), SLO, min_requests=50)
    assert (verdict.outcome, verdict.metric) == (Outcome.FAIL, "error_rate")
    assert "canary 5.00%" in verdict.message and "SLO 1.00%" in verdict.message


def test_failed_attempts_count_even_when_the_router_retried_them_and_the_verdict_says_so() -> None:
    # 120 of 500 canary attempts failed; the router retried 100 of them on stable, so clients saw only
    # 20 errors. The canary is judged on its 120.
    canary = TrackMeasurement(500, 120, {"ttft_p95": 0.2, "tpot_p95": 0.03}, retried=100)
    verdict = analyse(canary, track(), SLO, min_requests=50)
    assert (verdict.outcome, verdict.metric, verdict.canary) == (Outcome.FAIL, "error_rate", 0.24)
    assert "canary 24.00%, stable 0.00%, SLO 1.00%" in verdict.message
    assert "retried 100 of the canary's failed attempts" in verdict.message


def test_regression_within_the_slo_fails_once_it_uses_half_the_budget() -> None:
    regressed = analyse(track(ttft=0.4), track(ttft=0.2), SLO, min_requests=50)
    assert (regressed.outcome, regressed.metric, regressed.reference) == (Outcome.FAIL, "ttft_p95", 0.2)
    assert "1.5x stable" in regressed.message
    # 3x slower but only 60 ms out of a 500 ms budget: noise, not a regression.
    assert analyse(track(ttft=0.06), track(ttft=0.02), SLO, min_requests=50).outcome is Outcome.PASS


def test_both_tracks_breaking_the_slo_blames_the_canary_only_if_much_worse() -> None:
    shared = analyse(track(ttft=0.8), track(ttft=0.7), SLO, min_requests=50)
    assert shared.outcome is Outcome.INCONCLUSIVE and "stable breaks the SLO too" in shared.message
    assert analyse(track(ttft=1.5), track(ttft=0.7), SLO, min_requests=50).outcome is Outcome.FAIL


def test_stable_with_too_few_requests_leaves_only_the_slo_gate() -> None:
    assert analyse(track(ttft=0.4), track(requests=3, ttft=0.1), SLO, min_requests=50).outcome is Outcome.PASS
    assert analyse(track(ttft=0.6), track(requests=3, ttft=0.1), SLO, min_requests=50).outcome is Outcome.FAIL


def test_missing_canary_samples_are_inconclusive_and_fail_still_wins() -> None:
    missing = analyse(track(tpot=None), track(), SLO, min_requests=50)
    assert (missing.outcome, missing.metric) == (Outcome.INCONCLUSIVE, "tpot_p95")
    assert analyse(track(ttft=0.9, tpot=None), track(), SLO, min_requests=50).outcome is Outcome.FAIL


def test_zero_min_requests_and_no_traffic_passes() -> None:
    assert analyse(track(requests=0), track(), SLO, min_requests=0).outcome is Outcome.PASS


def test_track_queries_split_by_track_over_the_same_window() -> None:
    queries = track_queries("prod", "chat", "canary", "7f9c", 300.4, SLO)
    selector = 'namespace="prod",inferenceservice="chat",track="canary"'
    pods = 'namespace="prod",inferenceservice="chat",revision="7f9c"'
    assert queries == {
        # Every attempt at the track's replicas, not what the clients finally got after retries.
        "requests": f"sum(increase(kubeinfer_router_upstream_attempts_total{{{selector}}}[300s]))",
        "errors": "sum(increase(kubeinfer_router_upstream_attempts_total"
        f'{{{selector},code=~"5..|429|transport"}}[300s]))',
        "retried": f"sum(increase(kubeinfer_router_retries_total{{{selector}}}[300s]))",
        "ttft_p95": "histogram_quantile(0.95, sum by (le) "
        f"(increase(kubeinfer_router_time_to_first_token_seconds_bucket{{{selector}}}[300s])))",
        "tpot_p95": "histogram_quantile(0.95, sum by (le) "
        f"(increase(kubeinfer_time_per_output_token_seconds_bucket{{{pods}}}[300s])))",
    }
    stable = track_queries("prod", "chat", "stable", "1a2b", 300.4, SLO)
    assert stable["requests"] == queries["requests"].replace('track="canary"', 'track="stable"')
    assert 'revision="1a2b"' in stable["tpot_p95"]


def test_measurement_treats_nan_and_missing_as_no_data() -> None:
    m = measurement({"requests": 120.0, "errors": None, "ttft_p95": float("nan"), "tpot_p95": 0.04}, SLO)
    assert (m.requests, m.errors, m.error_rate) == (120.0, 0.0, 0.0)
    assert dict(m.latency) == {"ttft_p95": None, "tpot_p95": 0.04}
    assert measurement({}, SLO).error_rate is None


@pytest.mark.parametrize(
    ("weight", "desired", "surge", "expected"),
    [
        (10, 4, 1, Replicas(4, 1)),
        (50, 4, 1, Replicas(3, 2)),
        (50, 4, 2, Replicas(4, 2)),
        (100, 4, 1, Replicas(1, 4)),
        (10, 1, 1, Replicas(1, 1)),
        (10, 1, 0, Replicas(0, 1)),
    ],
)
def test_step_target_keeps_as_much_stable_as_the_budget_allows(
    weight: int, desired: int, surge: int, expected: Replicas
) -> None:
    assert step_target(weight, desired, surge) == expected


def test_hand_off_moves_only_as_canaries_become_ready() -> None:
    target = Replicas(stable=0, canary=4)
    assert hand_off(4, 1, target, Replicas(4, 0), canary_ready=0) == Replicas(4, 1)
    assert hand_off(4, 1, target, Replicas(4, 1), canary_ready=0) == Replicas(4, 1), "wait for the load"
    assert hand_off(4, 1, target, Replicas(4, 1), canary_ready=1) == Replicas(3, 2)
    assert hand_off(4, 1, target, Replicas(1, 4), canary_ready=4) == Replicas(0, 4)
    # No surge at all: stable gives up one slot so the canary can start.
    assert hand_off(2, 0, Replicas(1, 1), Replicas(2, 0), canary_ready=0) == Replicas(1, 1)
    # Rollback: canary gone, stable back to full size at once.
    assert hand_off(4, 1, Replicas(4, 0), Replicas(2, 3), canary_ready=3) == Replicas(4, 0)


def test_router_config_is_what_the_router_accepts() -> None:
    doc = router_config(10, ["http://10.0.0.2:8000", "http://10.0.0.1:8000"], [])
    assert doc["tracks"]["stable"]["endpoints"] == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert parse_config(doc).routable_weights() == {"stable": 90}


def test_without_the_router_requests_and_latencies_come_from_the_replicas_of_the_revision() -> None:
    queries = track_queries("prod", "chat", "canary", "7f9c", 60, SLO, source="replicas")
    pods = 'namespace="prod",inferenceservice="chat",revision="7f9c"'
    assert queries["requests"] == f"sum(increase(kubeinfer_requests_total{{{pods}}}[60s]))"
    assert queries["errors"] == (
        f'sum(increase(kubeinfer_requests_total{{{pods},outcome=~"error|timeout|rejected"}}[60s]))'
    )
    assert f"kubeinfer_time_to_first_token_seconds_bucket{{{pods}}}" in queries["ttft_p95"]
    assert "track=" not in "".join(queries.values())


def test_a_vllm_canary_is_judged_on_vllms_own_series() -> None:
    from kubeinfer_operator.engine_metrics import ENGINES

    queries = track_queries("prod", "chat", "canary", "7f9c", 60, SLO, engine=ENGINES["vllm"])
    assert "vllm:request_time_per_output_token_seconds_bucket" in queries["tpot_p95"]
    through_gateway = track_queries("prod", "chat", "canary", "7f9c", 60, SLO, "replicas", ENGINES["vllm"])
    assert "vllm:time_to_first_token_seconds_bucket" in through_gateway["ttft_p95"]
    assert through_gateway["requests"].startswith("sum(increase(vllm:e2e_request_latency_seconds_count")
    assert "errors" not in through_gateway  # vLLM counts no failures: not a zero error rate
    canary = measurement({"requests": 100.0, "ttft_p95": 0.1, "tpot_p95": 0.02}, SLO)
    verdict = analyse(canary, track(), SLO, min_requests=50)
    assert verdict.outcome is Outcome.INCONCLUSIVE and "counts no failed requests" in verdict.message
