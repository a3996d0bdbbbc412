"""The /metrics body: every name of the metric contract, labelled `model`, parseable by Prometheus' parser."""

from __future__ import annotations

import time

from prometheus_client.parser import text_string_to_metric_families

from kubeinfer_runtime.engine.types import EngineStats
from kubeinfer_runtime.server.metrics import RuntimeMetrics, StatsSnapshot


def _stats(**overrides: float) -> EngineStats:
    values = dict(
        num_waiting=0,
        num_running=0,
        oldest_waiting_age_s=0.0,
        kv_usage=0.0,
        num_blocks_total=100,
        num_blocks_free=100,
        kv_capacity_tokens=1600,
        prefix_cache_queries_total=0,
        prefix_cache_hits_total=0,
        preemptions_total=0,
    )
    return EngineStats(**{**values, **overrides})


def _samples(metrics: RuntimeMetrics) -> dict[str, list]:
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def _value(samples: dict[str, list], name: str, **labels: str) -> float:
    matching = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matching) == 1, (name, labels, samples.get(name))
    return matching[0]


def test_every_contract_name_is_served_with_the_model_label(contract_metric_names: list[str]) -> None:
    metrics = RuntimeMetrics("tiny", lambda: None)  # before the model has loaded
    samples = _samples(metrics)
    for name in contract_metric_names:
        assert name in samples, name
        assert all(s.labels["model"] == "tiny" for s in samples[name])
    outcomes = {s.labels["outcome"] for s in samples["kubeinfer_requests_total"]}
    assert outcomes == {"success", "rejected", "cancelled", "error", "timeout"}


def test_engine_gauges_and_counters_come_from_the_latest_snapshot() -> None:
    busy = _stats(
        num_waiting=3,
        num_running=2,
        oldest_waiting_age_s=1.5,
        kv_usage=0.25,
        prefix_cache_queries_total=40,
        prefix_cache_hits_total=16,
        preemptions_total=1,
    )
    snapshot = StatsSnapshot(busy, time.monotonic() - 2.0)
    metrics = RuntimeMetrics("tiny", lambda: snapshot)
    metrics.engine_stats.baseline = _stats(prefix_cache_queries_total=8)  # the warm-up's lookups
    samples = _samples(metrics)
    assert _value(samples, "kubeinfer_requests_waiting") == 3
    assert _value(samples, "kubeinfer_requests_running") == 2
    assert _value(samples, "kubeinfer_kv_cache_usage_ratio") == 0.25
    # The oldest waiting request has aged since the snapshot was taken two seconds ago.
    assert 3.5 <= _value(samples, "kubeinfer_oldest_waiting_request_age_seconds") < 4.5
    assert _value(samples, "kubeinfer_prefix_cache_queries_total") == 32
    assert _value(samples, "kubeinfer_prefix_cache_hits_total") == 16
    assert _value(samples, "kubeinfer_preemptions_total") == 1


def test_request_metrics_count_what_was_observed() -> None:
    metrics = RuntimeMetrics("tiny", lambda: None)
    metrics.ttft.observe(0.2)
    metrics.generation_tokens.inc(5)
    metrics.count_request("success")
    metrics.count_request("rejected")
    samples = _samples(metrics)
    assert _value(samples, "kubeinfer_time_to_first_token_seconds_count") == 1
    assert _value(samples, "kubeinfer_time_to_first_token_seconds_sum") == 0.2
    assert _value(samples, "kubeinfer_generation_tokens_total") == 5
    assert _value(samples, "kubeinfer_requests_total", outcome="success") == 1
    assert _value(samples, "kubeinfer_requests_total", outcome="rejected") == 1
    assert _value(samples, "kubeinfer_requests_total", outcome="timeout") == 0


def test_speculative_acceptance_counts_from_the_baseline_and_its_ratio() -> None:
    snapshot = StatsSnapshot(
        _stats(spec_draft_tokens_total=110, spec_accepted_tokens_total=66), time.monotonic()
    )
    metrics = RuntimeMetrics("tiny", lambda: snapshot)
    metrics.engine_stats.baseline = _stats(
        spec_draft_tokens_total=10, spec_accepted_tokens_total=6
    )  # warm-up
    samples = _samples(metrics)
    assert _value(samples, "kubeinfer_spec_decode_draft_tokens_total") == 100
    assert _value(samples, "kubeinfer_spec_decode_accepted_tokens_total") == 60
    assert _value(samples, "kubeinfer_spec_decode_acceptance_ratio") == 0.6
    idle = _samples(RuntimeMetrics("tiny", lambda: None))  # no snapshot yet, no draft yet: 0, not NaN
    assert _value(idle, "kubeinfer_spec_decode_acceptance_ratio") == 0
