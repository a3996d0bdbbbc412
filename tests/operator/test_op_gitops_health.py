"""GitOps health of an InferenceService, on objects recorded from real cluster runs
(tests/operator/fixtures/inferenceservice/, written by e2e/test_observability.py):

- the Argo CD health check the chart ships (charts/kubeinfer/docs/argocd-health.lua), run by Lua 5.1 (the
  dialect Argo CD's gopher-lua speaks) through lupa;
- kstatus itself (sigs.k8s.io/cli-utils, what Flux's health checks use), built by e2e/build_kstatus.sh;
- the kstatus conditions the operator derives (status.kstatus_conditions), as plain functions.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from gitops_health import FIXTURES, HEALTH_LUA, argocd_health, kstatus

from kubeinfer_operator.conditions import Condition
from kubeinfer_operator.status import kstatus_conditions

GITOPS_DOC = HEALTH_LUA.parent / "gitops.md"
EXPECTED = yaml.safe_load((FIXTURES / "expected.yaml").read_text())


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_argocd_health_of_recorded_objects(name: str) -> None:
    assert argocd_health(fixture(name))["status"] == EXPECTED[name]["argocd"]


def test_recordings_cover_every_health_state() -> None:
    assert {e["argocd"] for e in EXPECTED.values()} >= {"Healthy", "Progressing", "Degraded", "Suspended"}
    assert sorted(p.name for p in FIXTURES.glob("*.json")) == sorted(EXPECTED)


def test_the_docs_carry_the_script_as_shipped() -> None:
    """gitops.md shows the argocd-cm entry; its Lua must be the file the tests run."""
    doc = GITOPS_DOC.read_text()
    block = re.search(
        r"resource\.customizations\.health\.serving\.kubeinfer\.dev_InferenceService: \|\n(.*?)```", doc, re.S
    )
    assert block, "gitops.md lacks the argocd-cm health entry"
    embedded = "\n".join(line[4:] for line in block.group(1).splitlines())
    assert embedded.strip() == HEALTH_LUA.read_text().strip()


def test_argocd_health_waits_for_the_operator_to_see_a_new_generation() -> None:
    obj = fixture(next(n for n, e in EXPECTED.items() if e["argocd"] == "Healthy"))
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] + 1
    assert argocd_health(obj)["status"] == "Progressing"


@pytest.mark.slow  # kstatus-check: a Go build on first use
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_kstatus_of_recorded_objects(name: str) -> None:
    assert kstatus(fixture(name)) == EXPECTED[name]["kstatus"]


@pytest.mark.slow
def test_kstatus_reads_an_unobserved_generation_as_in_progress() -> None:
    obj = fixture(next(n for n, e in EXPECTED.items() if e["kstatus"] == "Current"))
    obj["metadata"]["generation"] = obj["status"]["observedGeneration"] + 1
    assert kstatus(obj) == "InProgress"


# --- the derivation, as plain functions ----------------------------------------------------------


def derived(*conditions: Condition) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status, c.reason) for c in kstatus_conditions(list(conditions))}


READY = Condition("Ready", "True", "Serving", "1/1")
DONE = Condition("Progressing", "False", "Complete", "done")
FINE = Condition("Degraded", "False", "AsExpected", "fine")


def test_serving_with_nothing_under_way_is_reconciled() -> None:
    assert derived(READY, DONE, FINE) == {
        "Reconciling": ("False", "Reconciled"),
        "Stalled": ("False", "AsExpected"),
    }


def test_a_rollout_under_way_is_reconciling() -> None:
    rolling = Condition("Progressing", "True", "RollingOut", "1/2")
    assert derived(READY, rolling, FINE)["Reconciling"] == ("True", "RollingOut")


def test_replicas_loading_are_reconciling_even_without_progressing() -> None:
    loading = Condition("Ready", "False", "Loading", "0/1")
    assert derived(loading, DONE, FINE)["Reconciling"] == ("True", "Loading")


def test_degraded_is_stalled_and_not_reconciling() -> None:
    crash = Condition("Degraded", "True", "CrashLoopBackOff", "exits")
    rolling = Condition("Progressing", "True", "RollingOut", "1/2")
    assert derived(READY, rolling, crash) == {
        "Reconciling": ("False", "Stalled"),
        "Stalled": ("True", "CrashLoopBackOff"),
    }


def test_scaled_to_zero_is_reconciled() -> None:
    parked = Condition("Ready", "False", "ScaledToZero", "0")
    assert derived(parked, DONE, FINE)["Reconciling"] == ("False", "Reconciled")
