"""Pod problems become messages that name the fix."""

from __future__ import annotations

from op_fixtures import pod

from kubeinfer_operator.pod_diagnosis import ResourceAsk, diagnose

ASK = ResourceAsk(gpus=4, gpu_resource="nvidia.com/gpu")
SCHEDULER = (
    "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available: "
    "2 No preemption victims found for incoming pod."
)


def _unschedulable(message: str) -> dict:
    return {
        "phase": "Pending",
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        ],
    }


def test_insufficient_gpus_names_the_field_to_lower() -> None:
    found = diagnose([pod("tiny-a-1", "a", _unschedulable(SCHEDULER))], ASK)
    assert found is not None and found.reason == "Unschedulable"
    assert "0/2 nodes are available: 2 Insufficient nvidia.com/gpu." in found.message
    assert "preemption" not in found.message
    assert "each pod asks for 4 nvidia.com/gpu" in found.message
    assert "lower spec.runtime.resources.gpus" in found.message


def test_node_selector_mismatch_points_at_the_selector() -> None:
    message = "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector."
    found = diagnose([pod("p", "a", _unschedulable(message))], ASK)
    assert found is not None and "spec.runtime.nodeSelector" in found.message


def test_crash_loop_says_how_to_see_the_logs() -> None:
    status = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "runtime",
                "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
            }
        ],
    }
    found = diagnose([pod("tiny-a-1", "a", status)], ASK)
    assert found is not None and found.reason == "CrashLoop"
    assert "3 restarts, last exit code 1" in found.message
    assert "kubectl logs -n default tiny-a-1 --previous" in found.message


def test_oom_kill_asks_for_memory() -> None:
    status = {
        "containerStatuses": [
            {
                "name": "runtime",
                "restartCount": 1,
                "state": {"running": {}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
            }
        ]
    }
    found = diagnose([pod("p", "a", status)], ASK)
    assert found is not None and found.reason == "OutOfMemory" and "resources.memory" in found.message


def test_starting_and_healthy_pods_need_no_diagnosis() -> None:
    loading = {
        "phase": "Running",
        "containerStatuses": [
            {"name": "runtime", "restartCount": 0, "state": {"running": {}}, "ready": False}
        ],
    }
    pending = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]}
    assert diagnose([pod("a", "a", loading), pod("b", "a", pending)], ASK) is None


def test_scheduling_problems_come_before_crashes() -> None:
    crashing = {
        "containerStatuses": [
            {
                "name": "runtime",
                "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1}},
            }
        ]
    }
    found = diagnose([pod("a", "a", crashing), pod("b", "a", _unschedulable(SCHEDULER))], ASK)
    assert found is not None and found.reason == "Unschedulable" and found.pod == "b"
