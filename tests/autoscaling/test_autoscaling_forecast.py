"""The arrivals forecaster: Holt's trend on short histories, Holt-Winters once two seasons are known."""

from __future__ import annotations

import math

import pytest

from kubeinfer_operator.autoscaling.forecast import Smoothing, forecast


def test_a_steady_rate_is_forecast_as_itself() -> None:
    assert forecast([10.0] * 20, step_s=30, horizon_s=60) == pytest.approx(10.0)


def test_a_linear_ramp_is_extrapolated_one_horizon_ahead() -> None:
    ramp = [2.0 + 0.5 * i for i in range(40)]  # +0.5 req/s per 30 s step
    # The last point is 21.5; 60 s (two steps) later the ramp is at 22.5.
    assert forecast(ramp, step_s=30, horizon_s=60) == pytest.approx(22.5, abs=0.05)


def test_a_season_seen_twice_predicts_the_next_peak_before_the_rate_turns_up() -> None:
    period = 24
    day = [5 + 4 * math.sin(2 * math.pi * i / period) for i in range(period)]
    history = day * 3 + day[:18]  # ends just before the trough of the fourth day
    seasonal = forecast(history, step_s=60, horizon_s=7 * 60, season_s=period * 60)
    trend_only = forecast(history, step_s=60, horizon_s=7 * 60)
    assert seasonal == pytest.approx(day[0], abs=0.3)  # seven steps after index 17: the next day's 0
    assert trend_only is not None and trend_only < day[0] - 1  # a trend alone keeps going down


def test_less_than_two_seasons_falls_back_to_the_trend() -> None:
    history = [1.0, 2.0, 3.0, 4.0]
    assert forecast(history, 60, 60, season_s=3600) == forecast(history, 60, 60)


def test_a_forecast_is_never_negative_and_needs_two_points() -> None:
    assert forecast([9.0, 6.0, 3.0, 0.5], step_s=60, horizon_s=600) == 0.0
    assert forecast([4.0], step_s=60, horizon_s=60) is None
    assert forecast([4.0, math.nan], step_s=60, horizon_s=60) is None  # gaps in a range query are skipped


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match="step_s"):
        forecast([1.0, 2.0], step_s=0, horizon_s=60)
    with pytest.raises(ValueError, match="smoothing level"):
        Smoothing(level=0)
