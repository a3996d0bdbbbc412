"""Offline validation: the same manifests the apiserver refuses, refused here naming the same field."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubeinfer_operator.api import InferenceServiceStatus, InvalidManifest, parse_manifest

from .cases import EXAMPLES, INVALID, Invalid, load, names_field, tiny

MINIMAL = {
    "apiVersion": "serving.kubeinfer.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "m"},
    "spec": {"model": {"name": "m", "source": {"pvc": {"claimName": "models"}}}},
}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_valid_and_round_trips(path: Path) -> None:
    service = parse_manifest(load(path))
    dumped = service.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert parse_manifest(dumped) == service


def test_minimal_manifest_gets_the_documented_defaults() -> None:
    spec = parse_manifest(MINIMAL).spec
    assert (spec.runtime.engine, spec.runtime.resources.gpus, spec.runtime.resources.gpu_resource) == (
        "builtin",
        1,
        "nvidia.com/gpu",
    )
    assert (spec.scaling.min_replicas, spec.scaling.max_replicas, spec.scaling.mode) == (1, 1, "active")
    assert (spec.scaling.kv_cache_target, spec.scaling.scale_down_window) == (0.7, "5m")
    assert (spec.slo.workload_class, spec.slo.window, spec.slo.error_rate) == ("interactive", "5m", 0.01)
    assert spec.rollout.strategy == "RollingUpdate" and spec.rollout.analysis.failure_limit == 2
    assert spec.replicas is None


@pytest.mark.parametrize("case", INVALID, ids=lambda c: c.id)
def test_invalid_manifest_is_refused_naming_the_field(case: Invalid) -> None:
    with pytest.raises(InvalidManifest) as refused:
        parse_manifest(case.manifest("bad"))
    problems = refused.value.problems
    assert any(p.startswith(f"{case.field}: ") for p in problems), problems
    assert names_field(str(refused.value), case.field)


def test_types_are_not_coerced_like_the_apiserver() -> None:
    manifest = tiny("x")
    manifest["spec"]["runtime"]["maxNumSeqs"] = "8"  # YAML string: the apiserver refuses it too
    with pytest.raises(InvalidManifest, match=r"spec\.runtime\.maxNumSeqs: Input should be a valid integer"):
        parse_manifest(manifest)


@pytest.mark.parametrize(
    ("scaling", "slo", "seconds"),
    [
        ({"queueTimeTarget": "200ms"}, {"ttft": {"p95": "1s"}}, 0.2),
        ({}, {"ttft": {"p95": "1s"}}, 0.5),
        ({}, {}, 0.5),
    ],
)
def test_queue_time_target_defaults_to_half_the_ttft_target(scaling: dict, slo: dict, seconds: float) -> None:
    spec = parse_manifest({**MINIMAL, "spec": {**MINIMAL["spec"], "scaling": scaling, "slo": slo}}).spec
    assert spec.queue_time_target_seconds() == seconds


def test_status_reads_back_from_apiserver_json() -> None:
    status = InferenceServiceStatus.model_validate(
        {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Serving",
                    "message": "2 of 2 replicas ready",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ],
            "readyReplicas": 2,
            "signals": {"ttftP95": "212ms", "kvCacheUsage": 0.63},
            "scalingDecisions": [
                {
                    "time": "2026-01-02T03:04:05Z",
                    "signal": "kvCacheUsage",
                    "value": "0.83",
                    "target": "0.7",
                    "fromReplicas": 2,
                    "toReplicas": 3,
                    "reason": "kvCacheUsage 0.83 > 0.7",
                }
            ],
        }
    )
    assert status.conditions[0].last_transition_time.year == 2026
    assert status.scaling_decisions[0].to_replicas == 3
