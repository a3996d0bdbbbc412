"""Admission decisions: how many requests fit, and what Retry-After a refused one is told."""

from __future__ import annotations

from kubeinfer_runtime.server.async_engine import AdmissionLimits, admits, retry_after_s


def test_running_slots_then_queue_then_refusal() -> None:
    limits = AdmissionLimits(max_running=2, max_waiting=3, queue_timeout_s=10)
    assert [admits(n, limits) for n in range(7)] == [True] * 5 + [False] * 2


def test_retry_after_grows_with_the_queue_and_is_bounded() -> None:
    assert retry_after_s(in_flight=5, max_running=2, mean_e2e_s=0.0) == 1  # nothing measured yet
    short = retry_after_s(in_flight=4, max_running=2, mean_e2e_s=2.0)
    long = retry_after_s(in_flight=40, max_running=2, mean_e2e_s=2.0)
    assert 1 <= short < long <= 60
    assert retry_after_s(in_flight=4000, max_running=2, mean_e2e_s=30.0) == 60
