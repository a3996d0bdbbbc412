"""The router's pure parts: weighted track choice, least-load pick, config validation, load parsing."""

from __future__ import annotations

import collections
import itertools
import re

import pytest

from kubeinfer_runtime.router.balancer import BackendLoad, TrackChooser, pick_least_loaded
from kubeinfer_runtime.router.config import ConfigError, parse_config
from kubeinfer_runtime.router.load_probe import parse_load


@pytest.mark.parametrize(
    "weights", [{"stable": 90, "canary": 10}, {"a": 1, "b": 2, "c": 7}, {"s": 0, "c": 100}]
)
def test_weighted_choice_is_exact_over_each_cycle(weights: dict[str, int]) -> None:
    chooser = TrackChooser()
    total = sum(weights.values())
    for _ in range(3):
        counts = collections.Counter(chooser.choose(weights) for _ in range(total))
        assert counts == {name: w for name, w in weights.items() if w}


def test_weighted_choice_spreads_the_canary_out() -> None:
    chooser = TrackChooser()
    picks = [chooser.choose({"stable": 90, "canary": 10}) for _ in range(100)]
    gaps = [b - a for a, b in itertools.pairwise(i for i, t in enumerate(picks) if t == "canary")]
    assert gaps == [10] * 9


def test_weighted_choice_restarts_on_new_weights_and_none_without_weight() -> None:
    chooser = TrackChooser()
    chooser.choose({"stable": 50, "canary": 50})
    assert collections.Counter(chooser.choose({"stable": 75, "canary": 25}) for _ in range(100)) == {
        "stable": 75,
        "canary": 25,
    }
    assert chooser.choose({"stable": 0}) is None
    assert chooser.choose({}) is None


def test_least_loaded_orders_by_waiting_then_kv_and_puts_unreachable_last() -> None:
    loads = {
        "a": BackendLoad(waiting=2, kv_cache_usage=0.1),
        "b": BackendLoad(waiting=1, kv_cache_usage=0.9),
        "c": BackendLoad(waiting=1, kv_cache_usage=0.3),
        "d": BackendLoad(reachable=False),
    }
    endpoints = ["a", "b", "c", "d"]
    assert pick_least_loaded(endpoints, loads, {}) == "c"
    assert pick_least_loaded(endpoints, loads, {"c": 2}) == "b"  # the router's own in-flight requests count
    assert pick_least_loaded(endpoints, loads, {}, exclude={"a", "b", "c"}) == "d"
    assert pick_least_loaded(endpoints, loads, {}, exclude=set(endpoints)) is None


def test_least_loaded_rotates_among_equals() -> None:
    picks = {pick_least_loaded(["a", "b", "c"], {}, {}, rotation=r) for r in range(3)}
    assert picks == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        ({}, "tracks"),
        ({"tracks": {"canary": {"weight": -1, "endpoints": []}}}, "tracks.canary.weight"),
        ({"tracks": {"canary": {"weight": True, "endpoints": []}}}, "tracks.canary.weight"),
        ({"tracks": {"stable": {"weight": 1, "endpoints": "http://x"}}}, "tracks.stable.endpoints"),
        ({"tracks": {"stable": {"weight": 1, "endpoints": ["10.0.0.1:8000"]}}}, "tracks.stable.endpoints[0]"),
    ],
)
def test_bad_config_names_the_field(doc: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(field)}:"):
        parse_config(doc)


def test_config_routable_weights_drop_empty_and_zero_tracks() -> None:
    config = parse_config(
        {
            "tracks": {
                "stable": {"weight": 90, "endpoints": ["http://10.0.0.1:8000/"]},
                "canary": {"weight": 10, "endpoints": []},
                "old": {"weight": 0, "endpoints": ["http://10.0.0.2:8000"]},
            }
        }
    )
    assert config.routable_weights() == {"stable": 90}
    assert config.tracks["stable"].endpoints == ("http://10.0.0.1:8000",)


def test_parse_load_reads_our_engine_and_vllm_names() -> None:
    ours = (
        "# TYPE kubeinfer_requests_waiting gauge\n"
        'kubeinfer_requests_waiting{model="a"} 3\nkubeinfer_requests_waiting{model="b"} 1\n'
        "# TYPE kubeinfer_kv_cache_usage_ratio gauge\n"
        'kubeinfer_kv_cache_usage_ratio{model="a"} 0.25\n'
        "# TYPE kubeinfer_requests_running gauge\nkubeinfer_requests_running 9\n"
    )
    assert parse_load(ours) == BackendLoad(waiting=4, kv_cache_usage=0.25)
    vllm = (
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="m"} 2.0\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
    )
    assert parse_load(vllm) == BackendLoad(waiting=2, kv_cache_usage=0.5)
