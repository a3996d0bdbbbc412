"""`kubeinfer status`'s screen, laid out from InferenceService objects recorded on the local cluster
(tests/operator/fixtures/inferenceservice/)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from gitops_health import FIXTURES

from kubeinfer_operator.kubectl_plugin import main as plugin_main
from kubeinfer_operator.status_screen import Burn, render, slo_rows


def fixture(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def screen(obj: dict[str, Any], **kwargs: Any) -> str:
    lines = render(obj, now=datetime(2026, 12, 1, 18, 0, tzinfo=UTC), width=100, **kwargs)
    assert len(lines) <= 40 and all(len(line) <= 100 for line in lines), "\n".join(lines)
    return "\n".join(lines)


def test_a_serving_service_shows_its_slo_replicas_and_scaling_decisions() -> None:
    obj = fixture("healthy-serving.json")
    text = screen(obj)
    status = obj["status"]
    assert f"InferenceService {obj['metadata']['namespace']}/{obj['metadata']['name']}" in text
    assert f"Replicas: desired {status['desiredReplicas']}  ready {status['readyReplicas']}" in text
    assert "Ready True (Serving)" in text
    for decision in status["scalingDecisions"][-5:]:
        assert f"{decision['fromReplicas']} -> {decision['toReplicas']}  {decision['signal']}" in text
    assert "Rollout: RollingUpdate" in text


def test_every_objective_is_a_row_with_its_target_and_reading() -> None:
    obj = fixture("healthy-serving.json")
    rows = {row[0]: row for row in slo_rows(obj["spec"], obj["status"].get("signals") or {})}
    slo = obj["spec"]["slo"]
    objectives = {
        f"{m.upper()} {p}": t for m in ("ttft", "tpot", "e2e") for p, t in (slo.get(m) or {}).items()
    }
    assert set(rows) == {*objectives, "error rate"}
    for label, target in objectives.items():
        assert rows[label][1] == target
        if not label.endswith("p95"):  # without Prometheus only status' p95 readings are there
            assert rows[label][2:] == ("-", "not read (status has p95; add --prometheus)")
    signals = obj["status"]["signals"]
    if signals.get("ttftP95"):
        assert rows["TTFT p95"][2] == signals["ttftP95"] and rows["TTFT p95"][3] in ("ok", "MISSED")


def test_a_reading_over_its_target_is_marked_missed() -> None:
    spec = {"slo": {"ttft": {"p95": "500ms"}, "errorRate": 0.01}}
    rows = {r[0]: r for r in slo_rows(spec, {"ttftP95": "640ms", "errorRate": 0.002})}
    assert rows["TTFT p95"][3] == "MISSED" and rows["error rate"][3] == "ok"


def test_percentiles_read_from_prometheus_fill_the_objectives_status_lacks() -> None:
    spec = {"slo": {"ttft": {"p50": "200ms", "p99": "1s"}}}
    assert slo_rows(spec, {})[0][3].startswith("not read")
    rows = {r[0]: r for r in slo_rows(spec, {}, {"ttft-p50": 0.12, "ttft-p99": 1.4})}
    assert rows["TTFT p50"][2:] == ("120ms", "ok")
    assert rows["TTFT p99"][2:] == ("1.4s", "MISSED")
    assert slo_rows(spec, {}, {})[0][2:] == ("-", "no data")  # asked, no requests in the window


def test_a_canary_held_at_its_step_shows_step_weight_and_reason() -> None:
    obj = fixture("suspended-waiting-for-promote.json")
    status = obj["status"]
    text = screen(obj)
    steps = len(obj["spec"]["rollout"]["steps"])
    assert f"step {status['canaryStep'] + 1}/{steps}  weight {status['canaryWeight']}%" in text
    assert f"canary {status['canaryRevision']}" in text
    assert "WaitingForPromote:" in text


def test_a_paused_rollout_says_so() -> None:
    assert "PAUSED" in screen(fixture("suspended-paused.json"))


def test_a_stalled_service_shows_why() -> None:
    obj = fixture("degraded-fail-load.json")
    stalled = next(c for c in obj["status"]["conditions"] if c["type"] == "Stalled")
    assert f"Stalled: {stalled['message']}"[:99] in screen(obj)


def test_burn_rates_join_their_objectives() -> None:
    text = screen(fixture("healthy-serving.json"), burns={"error-rate": Burn(15.2, 18.0)})
    (row,) = [line for line in text.splitlines() if line.strip().startswith("error rate")]
    assert row.rstrip().endswith("15.2x / 18.0x")


def test_firing_alerts_are_listed_once_per_objective_and_tier() -> None:
    page = {"slo": "error-rate", "severity": "page", "burn_rate": "14.4", "long_window": "1h"}
    text = screen(fixture("healthy-serving.json"), alerts=[page, dict(page)])
    assert "Alerts firing: error-rate page (14.4x over 1h)" in text
    assert "Alerts firing: none" in screen(fixture("healthy-serving.json"), alerts=[])
    assert "Alerts firing" not in screen(fixture("healthy-serving.json"))  # Prometheus not asked


def test_the_kubectl_plugin_knows_only_status(capsys: Any) -> None:
    assert plugin_main(["scale", "x"]) == 2
    assert "unknown command 'scale'" in capsys.readouterr().err
