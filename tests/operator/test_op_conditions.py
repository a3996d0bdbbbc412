"""Conditions keep their history: transition times move only when the status flips."""

from __future__ import annotations

from kubeinfer_operator.conditions import Condition, merge, transitions

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def test_transition_time_moves_only_when_status_changes() -> None:
    first = merge([], [Condition("Ready", "False", "Loading", "0/1 ready")], T0, 1)
    assert first == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Loading",
            "message": "0/1 ready",
            "lastTransitionTime": T0,
            "observedGeneration": 1,
        }
    ]
    reworded = merge(first, [Condition("Ready", "False", "CrashLoop", "exits")], T1, 1)
    assert reworded[0]["lastTransitionTime"] == T0 and reworded[0]["reason"] == "CrashLoop"
    flipped = merge(reworded, [Condition("Ready", "True", "Serving", "1/1 ready")], T1, 2)
    assert flipped[0]["lastTransitionTime"] == T1 and flipped[0]["observedGeneration"] == 2


def test_unchanged_conditions_merge_to_an_identical_list() -> None:
    desired = [
        Condition("Ready", "True", "Serving", "1/1"),
        Condition("Degraded", "False", "AsExpected", "ok"),
    ]
    once = merge([], desired, T0, 3)
    assert merge(once, desired, T1, 3) == once
    assert transitions(once, desired) == []


def test_conditions_of_other_writers_are_kept() -> None:
    slo = {
        "type": "SLOMet",
        "status": "True",
        "reason": "WithinTargets",
        "message": "",
        "lastTransitionTime": T0,
    }
    merged = merge([slo], [Condition("Ready", "True", "Serving", "1/1")], T1, 1)
    assert [c["type"] for c in merged] == ["Ready", "SLOMet"]
    assert merged[1] == slo


def test_transitions_name_new_statuses_and_new_reasons() -> None:
    before = merge([], [Condition("Ready", "False", "Loading", "")], T0, 1)
    changed = transitions(
        before, [Condition("Ready", "False", "Unschedulable", "no GPU"), Condition("X", "True", "Y", "")]
    )
    assert [(t.condition.reason, t.previous_status) for t in changed] == [
        ("Unschedulable", "False"),
        ("Y", None),
    ]
