"""Scale-down removes the replica with the least work: pod-deletion-cost set from each pod's requests."""

from __future__ import annotations

import math
from typing import Any

from op_fixtures import deployment, pod

from kubeinfer_operator.deletion_cost import (
    ANNOTATION,
    MAX_COST,
    cost_of,
    cost_updates,
    scaling_down,
    work_query,
)
from kubeinfer_operator.engine_metrics import engine_metrics
from kubeinfer_operator.reconcile import Plan, execute


def running(name: str, cost: str | None = None) -> dict[str, Any]:
    found = pod(name, "rev", {"phase": "Running"})
    if cost is not None:
        found["metadata"]["annotations"] = {ANNOTATION: cost}
    return found


def test_each_pod_costs_the_requests_it_is_working_on() -> None:
    pods = [running("a"), running("b", "3"), running("c", "0")]
    work = {"a": 5.0, "b": 3.0, "c": 1.0}
    assert cost_updates(pods, work) == (("a", "5"), ("c", "1"))  # b already says 3


def test_a_pod_without_a_reading_or_on_its_way_out_is_left_alone() -> None:
    leaving = running("b")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert cost_updates([running("a"), leaving], {"b": 4.0}) == ()


def test_costs_are_whole_non_negative_int32s() -> None:
    assert cost_of(0.2) == 1 and cost_of(0.0) == 0 and cost_of(-1.0) == 0
    assert cost_of(1e12) == MAX_COST and cost_of(math.nan) == MAX_COST


def test_only_a_lower_count_for_a_deployment_that_stays_is_a_scale_down() -> None:
    observed = [deployment("a", 3, 3), deployment("b", 2, 2)]

    def rendered(name: str, replicas: int) -> dict[str, Any]:
        return {"kind": "Deployment", "metadata": {"name": f"tiny-{name}"}, "spec": {"replicas": replicas}}

    assert scaling_down(observed, (rendered("a", 2),), ())
    assert scaling_down(observed, (rendered("a", 3),), (("tiny-b", 1),))
    assert not scaling_down(observed, (rendered("a", 4),), ())
    assert not scaling_down(observed, (rendered("a", 3),), (("tiny-b", 0),))  # retired whole
    assert not scaling_down(observed, (rendered("new", 1),), ())  # a Deployment still to be created


def test_the_query_sums_running_and_waiting_per_pod_for_each_engine() -> None:
    builtin = work_query(engine_metrics("builtin"), "ns", "tiny")
    assert builtin == (
        'sum by (pod) ({__name__=~"kubeinfer_requests_running|kubeinfer_requests_waiting",'
        'namespace="ns",inferenceservice="tiny"})'
    )
    assert "vllm:num_requests_running|vllm:num_requests_waiting" in work_query(
        engine_metrics("vllm"), "ns", "x"
    )


class Recorder:
    """Records what execute sends, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def annotate(self, kind: str, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.calls.append(("annotate", name))

    def scale(self, kind: str, namespace: str, name: str, replicas: int) -> None:
        self.calls.append(("scale", name))

    def apply(self, obj: dict[str, Any]) -> None:
        self.calls.append(("apply", obj["metadata"]["name"]))


def test_costs_are_set_before_the_scale_down_that_reads_them() -> None:
    kube = Recorder()
    isvc = {"metadata": {"name": "tiny", "namespace": "ns"}, "status": {}}
    deployment_obj = {"kind": "Deployment", "metadata": {"name": "tiny-rev"}, "spec": {"replicas": 1}}
    plan = Plan(
        apply=(deployment_obj,), retire=(), status={}, transitions=(), annotate=(("a", "5"), ("b", "0"))
    )
    execute(kube, isvc, plan)  # type: ignore[arg-type]
    assert kube.calls == [("annotate", "a"), ("annotate", "b"), ("apply", "tiny-rev")]
